"""Memory-plane metrics through `ray.util.metrics` (exported by Ray's metrics agent to Prometheus).

Ingestion side (the `Memory` actor): `clawray_memory_units{kind,level}` (active units), counters of
turns (`outcome`: queued, ignored, ingested), written units (`action`: inserted, merged, superseded)
and extraction fallbacks (exported at 0 from the start), and the ingestion lag histogram (turn created ->
its units written).
Read side (each Proxy replica): retrieval latency and the tokens injected per turn.
Built only inside a Ray worker (the metric objects need one). Catalogue: docs/metrics.md.
"""

from __future__ import annotations

from typing import Any

from core.metrics import hold, zero_counter

LAG_BOUNDARIES_S = [0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400]
LATENCY_BOUNDARIES_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]
TOKEN_BOUNDARIES = [1, 16, 32, 64, 128, 256, 512, 1024, 2048]


class IngestMetrics:
    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        self.units = Gauge("clawray_memory_units", "Active memory units by kind and scope level.",
                           tag_keys=("kind", "level"))
        self.turns = Counter("clawray_memory_turns_total", "Turns the Memory actor received, by outcome.",
                             tag_keys=("outcome",))
        self.written = Counter("clawray_memory_units_written_total", "Units written by ingestion, by action.",
                               tag_keys=("action",))
        self.fallbacks = zero_counter(Counter("clawray_memory_extraction_fallbacks_total",
                                              "Batches the LLM extractor failed on, extracted by the offline rules."))
        self.lag = Histogram("clawray_memory_ingestion_lag_seconds",
                             "From a turn's creation to its units being written.", boundaries=LAG_BOUNDARIES_S)
        self._kinds: set[tuple[str, str]] = set()

    def gauges(self, stats: dict[str, Any]) -> None:
        seen = set()
        for kl, n in stats["by_kind_level"].items():
            kind, level = kl.split("/")
            hold(self.units, n, {"kind": kind, "level": level})  # set again between sweeps
            seen.add((kind, level))
        for kind, level in self._kinds - seen:  # a forgotten scope's gauge goes to 0, not stale
            hold(self.units, 0, {"kind": kind, "level": level})
        self._kinds = seen


class ReadMetrics:
    def __init__(self) -> None:
        from ray.util.metrics import Histogram

        self.latency = Histogram("clawray_memory_retrieval_seconds",
                                 "Memory retrieval at the Proxy (query encoding, search, fusion, budgeting).",
                                 boundaries=LATENCY_BOUNDARIES_S)
        self.tokens = Histogram("clawray_memory_injected_tokens", "Memory tokens injected per main turn.",
                                boundaries=TOKEN_BOUNDARIES)
