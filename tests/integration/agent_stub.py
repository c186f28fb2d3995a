"""Run one command next to a stub model endpoint that records every request and refuses it.

    python agent_stub.py PORT LOG TIMEOUT_S -- COMMAND...

The stub listens on 127.0.0.1:PORT, appends one JSON line per request to LOG (method, path, headers, the
body's `model`) and answers 400 with an error body both OpenAI and Anthropic clients parse, so an agent
stops after its first turn. The command runs with a timeout (its exit status does not matter: the
requests are the evidence). tests/integration/test_agents_config.py runs this inside a fresh network
namespace (`unshare -rn`), so the agent reaches nothing but the stub.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR = json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "agent_stub: no model here"}}).encode()


def main() -> int:
    port, log, timeout_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    cmd = sys.argv[sys.argv.index("--") + 1:]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                model = json.loads(body).get("model") if body else None
            except (ValueError, AttributeError):
                model = None
            row = {"method": self.command, "path": self.path, "model": model,
                   "headers": {k.lower(): v for k, v in self.headers.items()}}
            with lock, open(log, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(ERROR)))
            self.end_headers()
            self.wfile.write(ERROR)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return 124
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
