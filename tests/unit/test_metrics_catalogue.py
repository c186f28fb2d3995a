"""The metrics catalogue holds together: every metric the code defines is in docs/metrics.md with its type
and labels (and nothing else is), every metric name the README and docs mention exists, counters are
named as Prometheus shows them, the Grafana dashboard (cluster/grafana/clawray.json) queries only
documented metrics and shows every one, and counters of rare events are exported at 0 from the start.
What Ray's metrics agent really exports is tested on a live cluster: tests/integration/test_dashboard_metrics.py.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.metrics_catalogue import DOC, GRAFANA, REPO, defined, documented

# Families of metric names (anything else named clawray_* in the docs is a resource, a request field...).
FAMILIES = re.compile(r"\b(?:ray_)?(clawray_(?:proxy|engine|memory|replay|omls|train|evolutions|skills?)_\w+"
                      r"|clawray_skills\b)")


def test_metric_names_in_code_are_literals_so_the_docs_can_be_checked():
    _, unreadable = defined()
    assert unreadable == [], f"metric constructors with a computed name: {unreadable}"


def test_counter_names_end_in_total_as_prometheus_shows_them():
    # Ray's exporter appends `_total` to a counter that lacks it: the name in the code would not be the
    # name an operator queries.
    code, _ = defined()
    bad = sorted(f"{m.name} ({m.where})" for m in code.values() if m.type == "counter" and not m.name.endswith("_total"))
    assert bad == []


def test_every_metric_in_code_is_documented_with_its_type_and_labels_and_nothing_else_is():
    code, _ = defined()
    docs = documented()
    assert sorted(set(code) - set(docs)) == [], "defined in the code, missing from docs/metrics.md"
    assert sorted(set(docs) - set(code)) == [], "documented in docs/metrics.md, defined nowhere"
    wrong = {n: ((m.type, m.labels), (docs[n].type, docs[n].labels)) for n, m in code.items()
             if (m.type, m.labels) != (docs[n].type, docs[n].labels)}
    assert wrong == {}, "(code, docs) type and labels differ"


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))])
def test_every_metric_name_the_docs_mention_exists(doc):
    path = REPO / doc if doc == "README.md" else REPO / "docs" / doc
    code, _ = defined()
    known = {n.removeprefix("ray_") for n in code} | set(code)
    hist = {n.removeprefix("ray_") for n, m in code.items() if m.type == "histogram"}
    mentioned = set(FAMILIES.findall(path.read_text()))
    unknown = sorted(n for n in mentioned
                     if n not in known and re.sub(r"_(bucket|count|sum)$", "", n) not in hist)
    assert unknown == [], f"{doc} names metrics that do not exist"


def _panels(node):
    for p in node.get("panels", []):
        yield p
        yield from _panels(p)  # rows nest their panels


def _exprs(dashboard: dict) -> list[tuple[str, str]]:
    return [(p.get("title", "?"), t["expr"]) for p in _panels(dashboard) for t in p.get("targets", [])]


def test_grafana_panels_query_only_documented_metrics_and_show_every_one():
    docs = documented()
    hist = {n for n, m in docs.items() if m.type == "histogram"}
    dashboard = json.loads(GRAFANA.read_text())
    exprs = _exprs(dashboard)
    assert exprs, "no panel has a query"
    used = set()
    for title, expr in exprs:
        names = set(re.findall(r"\bray_clawray_\w+", expr))
        assert names, f"panel {title!r} queries no clawray metric: {expr}"
        for n in names:
            base = re.sub(r"_(bucket|count|sum)$", "", n)
            assert n in docs or base in hist, f"panel {title!r} queries {n}, not in {DOC.name}"
            used.add(n if n in docs else base)
    assert sorted(set(docs) - used) == [], "documented metrics no panel shows"


def test_grafana_dashboard_uses_the_datasource_variable_like_rays_own():
    # Ray's generated dashboards pick their Prometheus through a `datasource` variable; ours does too, so it
    # loads next to them (or into any Grafana) without editing a datasource uid.
    dashboard = json.loads(GRAFANA.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in _panels(dashboard):
        if p.get("targets"):
            assert p["datasource"] == "${datasource}", p.get("title")
    assert dashboard["uid"] and dashboard["title"]


class FakeMetric:
    """Stands in for ray.util.metrics' classes: records what reaches Ray (`_record` is what `inc`,
    `set` and `observe` end in)."""

    made: dict[str, FakeMetric] = {}

    def __init__(self, name, description="", tag_keys=None, boundaries=None):
        self.name, self.default, self.records = name, {}, []
        FakeMetric.made[name] = self

    def set_default_tags(self, tags):
        self.default = dict(tags)
        return self

    def _record(self, value, tags=None):
        self.records.append((value, {**self.default, **(tags or {})}))

    def inc(self, value=1.0, tags=None):
        assert value > 0
        self._record(value, tags)

    set = observe = _record


@pytest.fixture
def fake_metrics(monkeypatch):
    import ray.util.metrics as ray_metrics

    FakeMetric.made = {}
    for cls in ("Counter", "Gauge", "Histogram"):
        monkeypatch.setattr(ray_metrics, cls, FakeMetric)
    return FakeMetric.made


def test_rare_event_counters_are_exported_at_zero_before_their_first_event(fake_metrics):
    # Prometheus sees an event as the change of a series it already has: a counter whose series appears
    # at its first increment hides that increment from increase() and from alert rules.
    from memory.metrics import IngestMetrics
    from serve.metrics import EngineMetrics, ProxyMetrics

    ProxyMetrics()
    EngineMetrics("vllm")
    IngestMetrics()
    assert fake_metrics["clawray_proxy_dead_letters_total"].records == [(0, {})]
    assert fake_metrics["clawray_engine_adapter_activations_total"].records == [(0, {"backend": "vllm"})]
    assert fake_metrics["clawray_memory_extraction_fallbacks_total"].records == [(0, {})]


def test_gauges_are_set_again_while_their_value_holds(fake_metrics):
    # Ray 2.60 drops a gauge series that was not set for two export intervals (20 s by default): a value
    # that holds (the active adapter overnight, the last step's loss, the buffer's sizes) would vanish.
    from core.metrics import HELD
    from memory.metrics import IngestMetrics
    from serve.metrics import EngineMetrics

    EngineMetrics("vllm").adapters("policy-v0003", 2)
    IngestMetrics().gauges({"by_kind_level": {"semantic/user": 2}})
    before = {n: len(m.records) for n, m in fake_metrics.items()}
    HELD.refresh()
    for name, last in [("clawray_engine_active_adapter_version", (3, {"backend": "vllm"})),
                       ("clawray_engine_loaded_adapters", (2, {"backend": "vllm"})),
                       ("clawray_engine_inflight_requests", (0, {"backend": "vllm"})),
                       ("clawray_memory_units", (2, {"kind": "semantic", "level": "user"}))]:
        records = fake_metrics[name].records
        assert len(records) > before[name] and records[-1] == last, name


def test_the_inflight_gauge_is_sampled_under_load_and_exact_when_idle(fake_metrics):
    from serve.metrics import EngineMetrics

    m = EngineMetrics("upstream")
    gauge = fake_metrics["clawray_engine_inflight_requests"]
    start = len(gauge.records)
    for _ in range(50):  # a burst: 50 requests overlapping, within a few microseconds
        m.begin()
    for _ in range(49):
        m.end()
    assert len(gauge.records) - start <= 3  # not two Ray calls per request
    m.end()
    assert gauge.records[-1] == (0, {"backend": "upstream"})  # idle: the gauge says so at once
