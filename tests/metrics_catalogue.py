"""clawray's metrics three ways, for the tests that keep them in agreement: as documented (the table in
docs/metrics.md), as defined in the code (every `ray.util.metrics` constructor call, found by parsing the
source), and as Prometheus serves them (the text format of a node's metrics export port).

Names here are Prometheus names (`ray_` + the name given in the code; Ray adds the prefix).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "metrics.md"
GRAFANA = REPO / "cluster" / "grafana" / "clawray.json"
SOURCE_DIRS = ("cluster", "core", "evolve", "harness", "memory", "rewards", "serve", "train")
TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}
PROM_PREFIX = "ray_"
_ROW = re.compile(r"^\|\s*`(ray_clawray_\w+)`\s*\|\s*(counter|gauge|histogram)\s*\|([^|]*)\|([^|]+)\|")


@dataclass(frozen=True)
class Metric:
    name: str  # Prometheus name
    type: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    where: str  # documented meaning, or the defining file:line


def documented() -> dict[str, Metric]:
    """The catalogue table of docs/metrics.md: `| `name` | type | `label`, ... | meaning | ... |`."""
    out: dict[str, Metric] = {}
    for line in DOC.read_text().splitlines():
        if m := _ROW.match(line):
            name, kind, labels, meaning = m.groups()
            assert name not in out, f"{name} is documented twice"
            out[name] = Metric(name, kind, tuple(sorted(re.findall(r"`(\w+)`", labels))), meaning.strip())
    return out


def _ray_metrics_imported(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("ray.util.metrics", "ray.util"):
            if node.module == "ray.util.metrics" or any(a.name == "metrics" for a in node.names):
                return True
    return False


def _call_type(node: ast.Call) -> str | None:
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return TYPES.get(name or "")


def defined() -> tuple[dict[str, Metric], list[str]]:
    """Every metric the code defines, and the constructor calls whose name is not a literal (which no
    test could check against the docs)."""
    out: dict[str, Metric] = {}
    unreadable: list[str] = []
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            if not _ray_metrics_imported(tree):
                continue  # `Counter` there is collections.Counter
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or (kind := _call_type(node)) is None:
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    unreadable.append(where)
                    continue
                tags = next((k.value for k in node.keywords if k.arg == "tag_keys"), None)
                labels = tuple(sorted(ast.literal_eval(tags))) if tags is not None else ()
                name = PROM_PREFIX + arg.value
                assert name not in out, f"{name} defined twice: {out[name].where} and {where}"
                out[name] = Metric(name, kind, labels, where)
    return out, unreadable


def prometheus_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name (`x_total`, `x_count`, `x_bucket`, a gauge's name) -> [(labels, value)] of the clawray
    metrics in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(PROM_PREFIX + "clawray_"):
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def sample_name(metric: Metric) -> str:
    """The sample that carries a metric's value: a counter's own name, a histogram's `_count`."""
    return metric.name + "_count" if metric.type == "histogram" else metric.name
