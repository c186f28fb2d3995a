"""A bridge from inside an agent's private network namespace to a live clawray, recording every HTTP
exchange that crosses it.

    python agent_bridge.py PORT SOCKET TIMEOUT_S [--tty] -- COMMAND...    (the inside half, in the namespace)

tests/integration/test_agents_live.py runs each agent in `unshare -rnpf`: no network but its own loopback,
and every process it starts dies with it. The inside half listens on 127.0.0.1:PORT there, runs COMMAND
with a timeout (its stdin: nothing, or with --tty the terminal the bridge runs in, for an agent driven
interactively in tmux: tests/integration/agent_tmux.py) and relays each connection to SOCKET, a unix
socket: a path in the file system, which both network namespaces see. `Forwarder` (the outside half, in
the test's process) accepts on SOCKET and relays to clawray's TCP port. Bytes pass unchanged in both
directions (the agent reads clawray's own stream format); the Forwarder also parses them as they pass
(h11, httpx's HTTP/1.1 parser) into one record per exchange: method, path, status, the request's JSON
body, the response's headers and body.

Hand-written because this machine has no socat (`command -v socat`): the inside half would be
`socat TCP-LISTEN:PORT,fork,reuseaddr UNIX-CONNECT:SOCKET`, and socat records nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11

MAX_RECORDED_BODY = 32 * 1024 * 1024  # bytes of a response body kept in its record


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                seen: Callable[[bytes], None] | None = None) -> None:
    """Copy one direction until EOF, then pass the EOF on (half-close), as a TCP relay does."""
    try:
        while data := await reader.read(65536):
            if seen is not None:
                seen(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()  # the other side is gone: so is this connection


async def _relay(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 a_to_b: Callable[[bytes], None] | None = None,
                 b_to_a: Callable[[bytes], None] | None = None) -> None:
    try:
        await asyncio.gather(_pump(a[0], b[1], a_to_b), _pump(b[0], a[1], b_to_a))
    finally:
        for w in (a[1], b[1]):
            w.close()


# ---- the inside half ------------------------------------------------------------------------------

async def _inside(port: int, sock: str, timeout_s: float, cmd: list[str], tty: bool = False) -> int:
    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_unix_connection(sock)
            await _relay((reader, writer), upstream)
        except OSError:
            writer.close()
        except asyncio.CancelledError:
            # The command ended and asyncio.run cancels the relays still open: that is the end of them
            # (re-raised, Python 3.11's stream callback would print each one as an error).
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", port)
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=None if tty else asyncio.subprocess.DEVNULL)
    try:
        return await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()  # its children die with the namespace when this process (its PID 1) exits
        return 124
    finally:
        server.close()


# ---- the outside half -----------------------------------------------------------------------------

class ExchangeTap:
    """Reads one connection's two byte streams as HTTP/1.1 and reports each finished exchange.

    Two h11 state machines in step: `requests` (server role) parses what the agent sends, `responses`
    (client role) what clawray answers; each is told the other side's events, so both know where every
    message starts and ends (keep-alive, chunked streams). A parse error stops the tap, never the relay:
    it is reported as the exchange's `tap_error`."""

    def __init__(self, report: Callable[[dict[str, Any]], None]):
        self.report = report
        self.requests = h11.Connection(h11.SERVER)
        self.responses = h11.Connection(h11.CLIENT)
        self.open: deque[dict[str, Any]] = deque()  # exchanges in order, oldest unanswered first
        self.error: str | None = None

    def from_agent(self, data: bytes) -> None:
        self._guard(self.requests.receive_data, data)

    def from_clawray(self, data: bytes) -> None:
        self._guard(self.responses.receive_data, data)

    def closed(self) -> None:
        """The connection ended: report what is still open (an answer cut off, or none at all)."""
        while self.open:
            self.report({**self._finish(self.open.popleft()), "complete": False})

    def _guard(self, feed: Callable[[bytes], None], data: bytes) -> None:
        if self.error is not None:
            return
        try:
            feed(data)
            self._drain()
        except h11.ProtocolError as e:
            self.error = f"{type(e).__name__}: {e}"
            for ex in self.open:
                ex["tap_error"] = self.error

    def _drain(self) -> None:
        progressed = True
        while progressed:
            progressed = self._step(self.requests, self.responses, self._on_request)
            progressed = self._step(self.responses, self.requests, self._on_response) or progressed
            if self.requests.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE} and \
                    self.responses.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
                self.requests.start_next_cycle()
                self.responses.start_next_cycle()
                progressed = True

    @staticmethod
    def _step(conn: h11.Connection, mirror: h11.Connection, on: Callable[[Any], None]) -> bool:
        event = conn.next_event()
        if event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed):
            return False
        mirror.send(event)  # the bytes it would write are already on the wire
        on(event)
        return True

    def _on_request(self, event: Any) -> None:
        if isinstance(event, h11.Request):
            self.open.append({"method": event.method.decode(), "path": event.target.decode(),
                              "request_headers": _headers(event.headers), "request_body": bytearray(),
                              "status": None, "response_headers": {}, "response_body": bytearray(),
                              "started": time.time()})
        elif isinstance(event, h11.Data):
            self.open[-1]["request_body"] += event.data

    def _on_response(self, event: Any) -> None:
        ex = self.open[0]
        if isinstance(event, h11.Response):
            ex["status"] = event.status_code
            ex["response_headers"] = _headers(event.headers)
            ex["answered"] = time.time()  # when the status line came (a stream: at its first event)
        elif isinstance(event, h11.Data):
            room = MAX_RECORDED_BODY - len(ex["response_body"])
            ex["response_body"] += event.data[:max(room, 0)]
        elif isinstance(event, h11.EndOfMessage):
            self.report({**self._finish(self.open.popleft()), "complete": True})

    @staticmethod
    def _finish(ex: dict[str, Any]) -> dict[str, Any]:
        ex["ended"] = time.time()
        body = bytes(ex.pop("request_body"))
        try:
            ex["request"] = json.loads(body) if body else None
        except ValueError:
            ex["request"] = None
        ex["response_body"] = bytes(ex["response_body"]).decode("utf-8", errors="replace")
        return ex


def _headers(headers: Any) -> dict[str, str]:
    return {k.decode().lower(): v.decode("latin-1") for k, v in headers}


class Forwarder:
    """The outside half: a unix socket relayed to clawray at host:port, on an event loop in its own
    thread; `exchanges` holds a record per HTTP exchange, in the order they finished."""

    def __init__(self, sock: Path, host: str, port: int):
        self.sock, self.host, self.port = sock, host, port
        self.exchanges: list[dict[str, Any]] = []
        self._taps: set[ExchangeTap] = set()  # the connections open now
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-bridge", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> Forwarder:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._accept, str(self.sock)), self._loop).result(timeout=10)
        return self

    def since(self, mark: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.exchanges[mark:])

    def in_flight(self) -> int:
        """Requests sent and not yet answered to their end, over the connections open now."""
        with self._lock:
            return sum(len(t.open) for t in self._taps)

    def mark(self) -> int:
        with self._lock:
            return len(self.exchanges)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.sock.unlink(missing_ok=True)

    def _report(self, ex: dict[str, Any]) -> None:
        with self._lock:
            self.exchanges.append(ex)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tap = ExchangeTap(self._report)
        try:
            upstream = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        with self._lock:
            self._taps.add(tap)
        try:
            await _relay((reader, writer), upstream, tap.from_agent, tap.from_clawray)
        finally:
            with self._lock:
                self._taps.discard(tap)
            tap.closed()


def main() -> int:
    port, sock, timeout_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    cut = sys.argv.index("--")
    return asyncio.run(_inside(port, sock, timeout_s, sys.argv[cut + 1:], tty="--tty" in sys.argv[4:cut]))


if __name__ == "__main__":
    sys.exit(main())
