"""What `make demo` promises, as checkable stages (pure: evidence in, verdicts out; no Ray).

The demo collects evidence while it runs (`Evidence`); `evaluate` turns it into one verdict per stage, in
the order the loop runs them. The demo prints the verdicts and exits non-zero naming the first stage that
did not happen, so a run that "finished" without closing the loop can never look like a success.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# (name, what it promises) in loop order.
STAGES: tuple[tuple[str, str], ...] = (
    ("serving", "clawray came up: Ray, Replay, PRM, Evolver, the Serve app with vLLM, OMLS, Controller"),
    ("scoring", "every main turn of day 1 was scored by the PRM into Replay and seen by the Evolver"),
    ("skills_evolved", "the morning's failures became skills: a new skill generation, support samples"),
    ("query_samples", "turns served after the evolution are fresh query samples, enough for a window"),
    ("grpo_steps", "the users went quiet, OMLS opened a window and GRPO steps ran on Ray Train"),
    ("separation", "no support sample and no sample of an older generation was trained"),
    ("hot_swap", "the window published an adapter and serving activated it"),
    ("next_day", "day 2 was served by that adapter"),
    ("memory", "every simulated user's sessions left long-term memories, each user's only in their own scope"),
    ("collective", "the collective job decided over every user's sessions of day 1, behind its validation gate, "
                   "and day 2 was measured per user with the loop on and off"),
)


@dataclass
class Evidence:
    """What the demo observed. Counts are of main turns / samples; None = never observed."""

    serving: bool = False
    day1_turns: int = 0  # main turns day 1 stored in the session store
    day1_scored: int = 0  # samples Replay gained during day 1
    day1_observed: int = 0  # turns the Evolver observed during day 1
    generation_before: int | None = None  # skill generation before the first evolution
    generation_after: int | None = None  # ... after it
    skills_after: int = 0
    support: int = 0  # samples marked support by that evolution
    fresh_before_window: int = 0  # leasable samples of the current generation when the users left
    min_fresh_samples: int = 1
    steps: int = 0  # GRPO steps of the window's run
    run_error: str | None = None
    window_opened: bool | None = None  # whether a window's run started after the users left
    run_stop_reason: str | None = None  # why the window's run ended (train/job.py), when it did
    evening: list[str] = field(default_factory=list)  # Controller events and OMLS state from the evening on
    trained_ids: list[str] = field(default_factory=list)
    trained_violations: list[str] = field(default_factory=list)  # trained ids that were support or stale
    adapters: list[str] = field(default_factory=list)  # published by the window's run
    active_after_window: str | None = None
    day2_adapters: list[str | None] = field(default_factory=list)  # adapter_version of each day-2 turn
    users: list[str] = field(default_factory=list)  # the simulated users
    memory_by_user: dict[str, int] = field(default_factory=dict)  # active memory units per user id
    collective_sessions: list[str] | None = None  # day-1 sessions the collective job read (None: it never ran)
    collective_groups: int = 0
    collective_decisions: list[str] = field(default_factory=list)  # "group: action -> outcome"
    collective_published: list[str] = field(default_factory=list)
    # user -> {"day01", "day02", "day02_on", "day02_off"}: served rewards, and day 2's tasks replayed with the
    # night's publishes as served vs undone (evolve/impact.py; equal to what was served when none published)
    collective_on_off: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    stage: str
    promise: str
    passed: bool
    detail: str


def _grpo_detail(e: Evidence) -> str:
    """What the window did; when it trained nothing, also why (no window, the run's stop reason) and the
    evening's events, so a failed run says where to look."""
    detail = f"{e.steps} steps, {len(e.trained_ids)} samples trained"
    if e.window_opened is False:
        detail += ", no window opened"
    elif e.run_stop_reason:
        detail += f", run ended: {e.run_stop_reason}"
    if e.run_error:
        detail += f", error: {e.run_error}"
    if not e.steps and e.evening:
        detail += "; evening: " + " | ".join(e.evening)
    return detail


def _on_off_missing(e: Evidence) -> list[str]:
    """The users whose day-2 reward with the collective loop on or off was not measured."""
    keys = ("day01", "day02", "day02_on", "day02_off")
    return [u for u in e.users if any(e.collective_on_off.get(u, {}).get(k) is None for k in keys)]


def _checks(e: Evidence) -> dict[str, tuple[bool, str]]:
    published = e.adapters[-1] if e.adapters else None
    day2 = set(e.day2_adapters)
    return {
        "serving": (e.serving, "up" if e.serving else "the system did not come up"),
        "scoring": (e.day1_turns > 0 and e.day1_scored >= e.day1_turns and e.day1_observed >= e.day1_turns,
                    f"{e.day1_turns} turns, {e.day1_scored} samples stored, {e.day1_observed} observed"),
        "skills_evolved": (
            e.generation_after is not None and e.generation_before is not None
            and e.generation_after > e.generation_before and e.skills_after > 0 and e.support > 0,
            f"generation {e.generation_before} -> {e.generation_after}, {e.skills_after} skills, "
            f"{e.support} support samples"),
        "query_samples": (e.fresh_before_window >= e.min_fresh_samples,
                          f"{e.fresh_before_window} fresh (window needs {e.min_fresh_samples})"),
        "grpo_steps": (e.steps > 0 and e.run_error is None and bool(e.trained_ids), _grpo_detail(e)),
        "separation": (bool(e.trained_ids) and not e.trained_violations,
                       "held" if not e.trained_violations else f"violated by {e.trained_violations[:5]}"),
        "hot_swap": (published is not None and e.active_after_window == published,
                     f"published {e.adapters or 'nothing'}, serving {e.active_after_window or 'base'}"),
        "next_day": (published is not None and bool(e.day2_adapters) and day2 == {published},
                     f"day-2 turns served by {sorted(str(a) for a in day2) or 'nothing'}"),
        "memory": (bool(e.users) and all(e.memory_by_user.get(u, 0) > 0 for u in e.users)
                   and set(e.memory_by_user) <= set(e.users),
                   ", ".join(f"{u}: {e.memory_by_user.get(u, 0)}" for u in e.users) + " unit(s)"
                   + (f"; units of unknown users {sorted(set(e.memory_by_user) - set(e.users))}"
                      if set(e.memory_by_user) - set(e.users) else "")),
        "collective": (e.collective_sessions is not None and len(e.collective_sessions) == len(e.users) > 0
                       and e.collective_groups > 0 and len(e.collective_decisions) >= e.collective_groups
                       and not _on_off_missing(e),
                       "never ran" if e.collective_sessions is None else
                       f"{len(e.collective_sessions)}/{len(e.users)} users' sessions, {e.collective_groups} group(s), "
                       f"{len(e.collective_decisions)} decision(s), published {e.collective_published or 'none'}"
                       + (f"; on/off not measured for {_on_off_missing(e)}" if _on_off_missing(e) else
                          "; on/off measured for every user")),
    }


def evaluate(e: Evidence) -> list[Verdict]:
    """One verdict per stage, in loop order. A stage after a failed one is judged on its own evidence."""
    checks = _checks(e)
    return [Verdict(name, promise, *checks[name]) for name, promise in STAGES]


def first_failure(verdicts: list[Verdict]) -> Verdict | None:
    return next((v for v in verdicts if not v.passed), None)
