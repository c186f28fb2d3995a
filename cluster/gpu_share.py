"""One GPU for the engine and the trainer: when the engine sleeps and wakes around the Controller's runs.

With `engine.share_gpu_with_training: sleep` (core/config.py `gpu_sharing` resolves `auto`) a run on the
shared GPU goes: engine sleep (vLLM sleep mode level 1: weights to CPU memory, KV cache freed; requests
wait) -> GRPO run (each step publishes its adapter; the sleeping engine writes the active pointer and
loads nothing) -> the run's thread ends (its workers are gone, their GPU memory with them) -> engine wake
(vLLM wakes, loads the adapter the pointer names, then lets the waiting requests in) -> serving.

The Controller records "the engine sleeps because of us" in its persisted state *before* it asks the
engine to sleep, and clears it only after the engine answered a wake. `engine_action` is asked on every
tick, so whatever ended the run (finished, failed, stopped when the users came back, a start that failed
after the sleep, the previous Controller killed mid-window) the next tick with no run going wakes the
engine, and a wake that failed is asked again on the tick after. Pure: no Ray, no engine.
"""

from __future__ import annotations

SLEEP = "sleep"  # ask the engine to sleep: a run is about to start on the shared GPU (idempotent there)
WAKE = "wake"  # ask the engine to wake: it sleeps because of us and no run of ours trains (idempotent)


def engine_action(sharing: bool, slept: bool, run_going: bool, starting: bool) -> str | None:
    """The engine call the Controller makes now (None: none).

    Args:
        sharing: the config's `engine.share_gpu_with_training` resolved to `sleep`.
        slept: the persisted flag: this Controller (or a previous incarnation) put the engine to sleep and
            no wake has been answered since.
        run_going: a run of this Controller trains (its thread is alive).
        starting: a run is about to start.

    Sleep is asked before every start while sharing, even when `slept` says it sleeps already: the engine's
    replica may have restarted awake since. Wake does not depend on `sharing`: an engine put to sleep under
    an older config is woken all the same.
    """
    if starting:
        return SLEEP if sharing else None
    if slept and not run_going:
        return WAKE
    return None
