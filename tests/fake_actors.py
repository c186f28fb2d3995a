"""Stand-ins for other planes' named actors in rewards integration tests (importable by Ray workers)."""

from __future__ import annotations

from typing import Any


class RecordingEvolver:
    """`Evolver.observe(turn, sample)`: records what it was told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float | None]] = []

    def observe(self, turn: Any, sample: Any) -> None:
        self.seen.append((turn.turn_id, None if sample is None else sample.reward))

    def observed(self) -> list[tuple[str, float | None]]:
        return self.seen


class MemoryReplay:
    """`Replay.append(samples) -> int`, ignoring duplicate sample ids (like the real one)."""

    def __init__(self) -> None:
        self.samples: dict[str, Any] = {}

    def append(self, samples: list[Any]) -> int:
        new = [s for s in samples if s.sample_id not in self.samples]
        self.samples.update((s.sample_id, s) for s in new)
        return len(new)

    def ids(self) -> list[str]:
        return list(self.samples)
