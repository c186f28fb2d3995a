"""A real agent's interactive terminal UI, driven in tmux, inside the private network namespace and through
the recording bridge that tests/integration/test_agents_live.py runs headless agents in
(tests/integration/agent_bridge.py, with --tty: the agent's stdin is the tmux pane).

Interactive use is where agents send most of their side requests (titles, next-prompt suggestions,
compaction, ...): a headless `-p` run sends few of them or none. The tmux server is a private one (its
own socket in a temporary folder), so no other tmux session on the machine is seen or touched, and
closing kills that server, whose pane holds the namespace: every process of the agent ends with it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration.agent_bridge import Forwarder

BRIDGE = Path(__file__).with_name("agent_bridge.py")
AGENT_PORT = 18080  # inside the agent's namespace: free by construction
COLUMNS, ROWS = 200, 50
PASTE_WINDOW_S = 0.5  # > Codex's 120 ms Enter-after-paste window
SUBMIT_WAIT_S = 20  # a submitted prompt's first request reaches the bridge within this


class TmuxAgent:
    """`with TmuxAgent(...) as tty:` starts the agent in a tmux pane of its own; `type`, `screen`,
    `wait_screen`, `wait_settled` drive and watch it; `exchanges` are the HTTP exchanges recorded so far."""

    def __init__(self, binary: str, args: list[str], home: Path, cwd: Path, clawray_port: int,
                 timeout_s: float = 300, env: dict[str, str] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="cr-tty-", dir="/tmp"))  # unix socket paths: ~108 bytes
        self.tmux = ["tmux", "-S", str(self.dir / "tmux")]
        self.forwarder = Forwarder(self.dir / "s", "127.0.0.1", clawray_port)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "TERM": "xterm-256color",
               "LANG": "C.UTF-8", **(env or {})}
        self.command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()),
                        "unshare", "-rnpf", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                        sys.executable, str(BRIDGE), str(AGENT_PORT), str(self.dir / "s"), str(timeout_s),
                        "--tty", "--", binary, *args]
        self.cwd = cwd

    def __enter__(self) -> TmuxAgent:
        self.forwarder.start()
        # remain-on-exit: a pane whose agent exited stays, with its last screen, for the failure message.
        subprocess.run([*self.tmux, "new-session", "-d", "-x", str(COLUMNS), "-y", str(ROWS), "-c", str(self.cwd),
                        shlex.join(self.command), ";", "set-option", "-w", "remain-on-exit", "on"],
                       check=True, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=30)
        time.sleep(0.5)  # the relay reports an exchange when its last byte has passed
        self.forwarder.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def screen(self, history: int = 0) -> str:
        """The pane's visible screen (and `history` lines above it)."""
        p = subprocess.run([*self.tmux, "capture-pane", "-p", "-S", str(-history)], capture_output=True, text=True,
                           timeout=30)
        return p.stdout

    def exited(self) -> str | None:
        """None while the agent runs; once it exited, its exit status and last screen (what it said)."""
        p = subprocess.run([*self.tmux, "display-message", "-p", "#{pane_dead} #{pane_dead_status}"],
                           capture_output=True, text=True, timeout=30)
        dead, _, status = p.stdout.strip().partition(" ")
        if dead != "1":
            return None
        return f"the agent exited with status {status or '?'}; its last screen:\n{self.screen(history=ROWS)}"

    def wait_screen(self, text: str, timeout: float = 120) -> bool:
        """Until the pane shows `text` (the agent's UI reached that state)."""
        return self._poll(lambda: text in self.screen(), timeout)

    def type(self, text: str) -> None:
        """Type `text` into the agent's prompt box and submit it: Enter only once the text is shown and the
        input has been still for longer than the agents' paste windows (Codex treats an Enter that comes
        within 120 ms of a fast run of characters as a newline in a paste: PASTE_ENTER_SUPPRESS_WINDOW in
        codex-rs/tui/src/bottom_pane/paste_burst.rs), and again if no request followed it (a swallowed
        Enter left the message unsent; on an empty prompt box another Enter does nothing)."""
        subprocess.run([*self.tmux, "send-keys", "-l", text], check=True, timeout=30)
        assert self.wait_screen(text[:40], 30), self.screen()
        for _ in range(3):
            time.sleep(PASTE_WINDOW_S)  # a UI's input-timing window, not an interleaving of ours
            gone = self.exited()
            assert gone is None, gone
            subprocess.run([*self.tmux, "send-keys", "Enter"], check=True, timeout=30)
            if self._poll(lambda: bool(self.exchanges()) or self.forwarder.in_flight(), SUBMIT_WAIT_S):
                return

    def exchanges(self) -> list[dict[str, Any]]:
        return self.forwarder.since(0)

    def wait_settled(self, done: Callable[[list[dict[str, Any]]], bool], quiet_s: float = 8,
                     timeout: float = 300) -> bool:
        """Until `done(exchanges)` holds and for `quiet_s` seconds no request was open and none ended (an
        agent's background requests come a moment after the reply it shows)."""
        last, since = -1, time.monotonic()

        def settled() -> bool:
            nonlocal last, since
            ex = self.exchanges()
            if len(ex) != last or self.forwarder.in_flight():
                last, since = len(ex), time.monotonic()
            return done(ex) and time.monotonic() - since >= quiet_s
        return self._poll(settled, timeout)

    @staticmethod
    def _poll(check: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.5)
        return check()
