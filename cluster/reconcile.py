"""What the Controller (cluster/controller.py) does on each tick: a pure policy.

Level-triggered: on every tick (every `scheduler.poll_s`; the first tick of a restarted Controller too)
the Controller reads OMLS's state and compares it with its own run (is the run's thread alive?), and
does the one thing that makes them agree (`reconcile`): start the window's run, tell OMLS a start or an
end it missed, or stop a run whose window has closed. OMLS's actions are edge-triggered hints and only
logged. So a lost acknowledgement (the Controller killed between saving its state and telling OMLS, OMLS
restarting), a run that crashed or failed to start, and a window that opened while a manual or `rl` run
was going all end in a state from which the next window opens; OMLS never says UPDATING or PAUSING
while nothing trains. A window that opens during a manual run waits for it, then gets a run of its own;
closing a window stops only the window's run.
"""

from __future__ import annotations

# What `reconcile` asks for.
START = "start"  # start (or resume) the window's run, then tell OMLS training_started
ACK_STARTED = "ack_started"  # tell OMLS training_started: the window's run runs, OMLS missed it
ACK_STOPPED = "ack_stopped"  # tell OMLS training_stopped: no window run (ended, lost, failed, declined)
STOP = "stop"  # stop the window's run at its next step boundary: its window has closed


def reconcile(mode: str, omls_state: str, run: str | None, resume: bool) -> str | None:
    """The one action that brings OMLS's state and the Controller's own run into agreement (None: they
    agree). Pure; called on every tick, so every answer must be safe to repeat.

    Args:
        mode: `scheduler.mode`.
        omls_state: OMLS's `state` (idle_wait, window_open, updating, pausing).
        run: the reason of the Controller's run going now ("window", "manual", "rl"), or None.
        resume: a window run died with the previous Controller process and is not resumed yet.
    """
    window = run == "window"
    if omls_state == "window_open":
        if mode != "auto":
            return ACK_STOPPED  # this mode does not train in windows: decline it
        if window:
            return ACK_STARTED
        return START if run is None else None  # after a manual run the window gets a run of its own
    if omls_state == "updating":
        if window:
            return None
        return START if run is None and resume and mode == "auto" else ACK_STOPPED
    if omls_state == "pausing":
        return STOP if window else ACK_STOPPED
    return STOP if window else None  # idle_wait: a window run without a window (its ack raced a close)
