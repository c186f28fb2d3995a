"""Serving-plane metrics through `ray.util.metrics` (Ray's metrics agent exports them to Prometheus and
the dashboard). Names: `clawray_proxy_*` (ingress) and `clawray_engine_*` (engine deployment); the
catalogue with labels and meanings is docs/metrics.md.

Cheap on the hot path: metric objects are built once per replica; one request costs a counter increment
and a histogram observation (each a buffered call into Ray's core worker, no I/O).
"""

from __future__ import annotations

import time

from core.contracts import parse_adapter_name
from core.metrics import hold, zero_counter

INFLIGHT_EVERY_S = 0.1
LATENCY_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]


class ProxyMetrics:
    """Requests by route and status, end-to-end latency by route, tokens, captured turns, and turns the
    outbox moved to its dead letters (`clawray_proxy_dead_letters_total`, exported at 0 from the start;
    `clawray dlq list` shows them).

    Counters are summed in the replica and handed to Ray once a second (`flush`, run by the Proxy's
    background loop): per request that leaves one histogram observation on the hot path.
    """

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Histogram

        self.requests = Counter("clawray_proxy_requests_total", "Proxy requests by route and HTTP status.",
                                tag_keys=("route", "status"))
        self.latency = Histogram("clawray_proxy_latency_seconds",
                                 "Proxy request latency (until the reply or the end of the stream).",
                                 boundaries=LATENCY_BOUNDARIES_S, tag_keys=("route",))
        self.tokens = Counter("clawray_proxy_tokens_total", "Tokens of captured turns (prompt, completion).",
                              tag_keys=("kind",))
        self.turns = Counter("clawray_proxy_turns_total", "Captured turns by type (main, side).",
                             tag_keys=("turn_type",))
        self.dead = zero_counter(Counter(
            "clawray_proxy_dead_letters_total",
            "Turns that failed scoring proxy.max_delivery_attempts times and left the outbox as dead letters."))
        self._counts: dict[tuple, float] = {}  # (counter name, tag value(s)) -> pending increment
        self._dead_seen = 0  # the dispatcher's running total at the last call of `dead_letters`

    def _add(self, key: tuple, n: float) -> None:
        self._counts[key] = self._counts.get(key, 0) + n

    def request(self, route: str, status: int, seconds: float) -> None:
        self._add(("requests", route, str(status)), 1)
        self.latency.observe(seconds, {"route": route})

    def captured(self, turn_type: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._add(("turns", turn_type), 1)
        self._add(("tokens", "prompt"), prompt_tokens)
        self._add(("tokens", "completion"), completion_tokens)

    def dead_letters(self, total: int) -> None:
        """The outbox dispatcher's running total of dead letters; the increase since the last call is
        counted."""
        self._add(("dead",), total - self._dead_seen)
        self._dead_seen = total

    def flush(self) -> None:
        counts, self._counts = self._counts, {}
        for key, n in counts.items():
            if not n:
                continue
            if key[0] == "dead":
                self.dead.inc(n)
            elif key[0] == "requests":
                self.requests.inc(n, {"route": key[1], "status": key[2]})
            elif key[0] == "turns":
                self.turns.inc(n, {"turn_type": key[1]})
            else:
                self.tokens.inc(n, {"kind": key[1]})


class EngineMetrics:
    """Active adapter version (0 = base model), requests in flight, loaded adapters, swaps. The gauges are
    held (core/metrics.py): set again while they hold, or Ray would drop them between requests."""

    def __init__(self, backend: str) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = {"backend": backend}
        self.active = Gauge("clawray_engine_active_adapter_version",
                            "Version number of the active LoRA adapter (0 = base model).",
                            tag_keys=("backend",)).set_default_tags(tags)
        self.inflight = Gauge("clawray_engine_inflight_requests", "Requests being generated.",
                              tag_keys=("backend",)).set_default_tags(tags)
        self.loaded = Gauge("clawray_engine_loaded_adapters", "LoRA adapter versions loaded.",
                            tag_keys=("backend",)).set_default_tags(tags)
        self.swaps = zero_counter(Counter("clawray_engine_adapter_activations_total", "Adapter activations.",
                                          tag_keys=("backend",)).set_default_tags(tags))
        self._inflight = 0
        self._sampled_at = float("-inf")
        hold(self.active, 0)
        hold(self.inflight, 0)

    def begin(self) -> None:
        self._inflight += 1
        self._sample()

    def end(self) -> None:
        self._inflight -= 1
        self._sample()

    def _sample(self) -> None:
        """The in-flight gauge, set at most every INFLIGHT_EVERY_S under load (two Ray metric calls per
        request were ~2% of a busy upstream replica's CPU), and always when the engine goes idle, so an
        idle engine never reports requests in flight."""
        now = time.monotonic()
        if self._inflight == 0 or now - self._sampled_at >= INFLIGHT_EVERY_S:
            self._sampled_at = now
            hold(self.inflight, self._inflight)

    def adapters(self, active: str | None, loaded: int, swapped: bool = True) -> None:
        hold(self.active, parse_adapter_name(active) if active else 0)
        hold(self.loaded, loaded)
        if swapped:
            self.swaps.inc()
