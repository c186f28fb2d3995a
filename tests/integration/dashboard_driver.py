"""The clawray system as an operator sees it in the Ray dashboard and in Prometheus.

Run as a subprocess by tests/integration/test_dashboard_metrics.py (it needs a Ray cluster of its own,
with the dashboard, which the suite's cluster does not start):
    python -m tests.integration.dashboard_driver --out result.json

A head node started like `ray start --head --metrics-export-port=... --dashboard-port=...` (token auth,
as clawray runs Ray), the whole system joined to it (`start_system`, configs/local.yaml with env
overrides, storage in a temp dir), a short workload (tests/integration/loadgen.py: OpenAI SDK sessions,
streamed and not) and one training window (a manual trigger, one GRPO step, the adapter hot-swapped).
Then, polling with a deadline (Ray's metrics agent exports every few seconds):
(a) the dashboard's HTTP API: the state API's actors (every named system actor alive) and the Serve
    applications endpoint (every deployment of the app, healthy);
(b) the head's metrics export port: every metric in docs/metrics.md scraped with a sane value (RULES),
    and still there after QUIET_S without traffic (Ray drops gauges that are not set again).
The summary goes to `--out` as JSON; the exit code is 0 only when nothing is missing.
"""

from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: every process of the cluster must agree

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402

from core.config import REPO_ROOT, load_config  # noqa: E402
from tests.metrics_catalogue import GRAFANA, documented, prometheus_samples, sample_name  # noqa: E402
from tests.servers import free_port  # noqa: E402
from train.replay_store import STATES  # noqa: E402

RUN = "grpo"  # the Controller's training run
POLL_S = 180.0  # how long the dashboard and the exporter get to show everything
# Ray drops a gauge not set for two export intervals (20 s by default): after this long without traffic
# every gauge must still be there (core/metrics.py holds them).
QUIET_S = 40.0


def where(samples, **labels):
    return [(lb, v) for lb, v in samples if all(lb.get(k) == x for k, x in labels.items())]


def total(samples) -> float:
    return sum(v for _, v in samples)


def _in(lo: float, hi: float):
    return lambda s: all(lo <= v <= hi for _, v in s)


def _pos(**labels):
    return lambda s: total(where(s, **labels)) > 0


def _zero(s) -> bool:
    return total(s) == 0


def _finite(s) -> bool:
    return all(math.isfinite(v) for _, v in s)


def _every_state(s) -> bool:
    return {lb.get("state") for lb, _ in s} >= set(STATES) and all(v >= 0 for _, v in s)


# What a healthy run of the workload below must show, per documented metric (Prometheus name); a
# histogram's rule applies to its `_count` samples.
RULES = {
    "ray_clawray_proxy_requests_total": _pos(route="chat", status="200"),
    "ray_clawray_proxy_latency_seconds": _pos(route="chat"),
    "ray_clawray_proxy_tokens_total": lambda s: _pos(kind="prompt")(s) and _pos(kind="completion")(s),
    "ray_clawray_proxy_turns_total": _pos(turn_type="main"),
    "ray_clawray_proxy_dead_letters_total": _zero,  # nothing failed scoring
    "ray_clawray_engine_active_adapter_version": _in(1, 1e6),  # the window's adapter, hot-swapped
    "ray_clawray_engine_inflight_requests": _zero,  # the load has stopped
    "ray_clawray_engine_loaded_adapters": _in(1, 1e6),
    "ray_clawray_engine_adapter_activations_total": _pos(),
    "ray_clawray_evolutions_triggered_total": _pos(),  # sessions that ended with failures
    "ray_clawray_evolutions_accepted_total": _in(0, 1e6),
    "ray_clawray_evolutions_rejected_total": _in(0, 1e6),
    "ray_clawray_skills_accepted_total": _in(0, 1e6),
    "ray_clawray_skills_rejected_total": _in(0, 1e6),
    "ray_clawray_skills": _in(0, 1e6),
    "ray_clawray_skill_generation": _in(0, 1e6),
    "ray_clawray_replay_samples": lambda s: _every_state(s) and total(s) > 0,
    "ray_clawray_replay_samples_current_generation": _every_state,
    "ray_clawray_replay_stale_retired": _in(0, 1e6),
    "ray_clawray_replay_generation": _in(0, 1e6),
    "ray_clawray_replay_oldest_fresh_age_s": _in(0, 86400),
    "ray_clawray_replay_dead_letters": _zero,
    "ray_clawray_train_loss": _finite,
    "ray_clawray_train_reward_mean": _in(-1, 1),
    "ray_clawray_train_step_s": _in(1e-6, 3600),
    "ray_clawray_train_kl": _in(0, 1e6),
    "ray_clawray_train_clip_frac": _in(0, 1),
    "ray_clawray_train_tokens_trained": _in(1, 1e9),
    "ray_clawray_train_steps_total": _pos(),
    "ray_clawray_omls_window_state": _in(0, 3),
    "ray_clawray_omls_signal_idle": lambda s: where(s, signal="proxy_inactivity") != [] and _in(0, 1)(s),
    "ray_clawray_omls_transitions_total": _pos(src="idle_wait", dst="window_open"),
    "ray_clawray_memory_units": _pos(),
    "ray_clawray_memory_turns_total": lambda s: _pos(outcome="queued")(s) and _pos(outcome="ingested")(s),
    "ray_clawray_memory_units_written_total": _pos(action="inserted"),
    "ray_clawray_memory_extraction_fallbacks_total": _zero,  # the offline extractor has nothing to fall from
    "ray_clawray_memory_ingestion_lag_seconds": _pos(),
    "ray_clawray_memory_retrieval_seconds": _pos(),
    "ray_clawray_memory_injected_tokens": _pos(),
}


def metric_problems(text: str) -> dict[str, str]:
    """Documented metric -> what is wrong with it in this scrape (absent, a label missing, not sane)."""
    docs = documented()
    scraped = prometheus_samples(text)
    problems = {n: "documented, but the test has no rule for it" for n in set(docs) - set(RULES)}
    problems |= {n: "has a rule but is not documented" for n in set(RULES) - set(docs)}
    for name, metric in docs.items():
        samples = scraped.get(sample_name(metric), [])
        if not samples:
            problems[name] = "not exported"
        elif missing := [lb for lb, _ in samples if not set(metric.labels) <= set(lb)]:
            problems[name] = f"series without the documented labels {metric.labels}: {missing[:2]}"
        elif name in RULES and not RULES[name](samples):
            problems[name] = f"value not sane: {[(lb_short(lb), v) for lb, v in samples][:6]}"
    return problems


def lb_short(labels: dict[str, str]) -> dict[str, str]:
    """A series' own labels (without the ones Ray adds to every series)."""
    ray_added = {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "otel_scope_name",
                 "otel_scope_schema_url", "otel_scope_version"}
    return {k: v for k, v in labels.items() if k not in ray_added}


def dashboard_problems(base: str, headers: dict, actors: list[str], deployments: tuple[str, ...],
                       app: str, namespace: str) -> tuple[dict[str, str], dict]:
    """Named actor / deployment -> what the dashboard's HTTP API says is wrong with it; and what it saw."""
    r = httpx.get(f"{base}/api/v0/actors", params={"limit": 10000}, headers=headers, timeout=30)
    r.raise_for_status()
    rows = r.json()["data"]["result"]["result"]
    alive = {a["name"]: a for a in rows if a.get("name") and a["state"] == "ALIVE"}
    problems = {n: "not an ALIVE actor in the state API" for n in actors if n not in alive}
    problems |= {n: f"in namespace {alive[n].get('ray_namespace')!r}" for n in actors
                 if n in alive and alive[n].get("ray_namespace", namespace) != namespace}
    r = httpx.get(f"{base}/api/serve/applications/", headers=headers, timeout=30)
    r.raise_for_status()
    apps = r.json()["applications"]
    got = apps.get(app, {}).get("deployments", {})
    problems |= {d: f"deployment status {got.get(d, {}).get('status')!r}" for d in deployments
                 if got.get(d, {}).get("status") != "HEALTHY"}
    seen = {"named_actors": sorted(alive), "applications": {a: sorted(v.get("deployments", {}))
                                                             for a, v in apps.items()},
            "replica_classes": sorted({a["class_name"] for a in rows if a["class_name"].startswith("ServeReplica")
                                       and a["state"] == "ALIVE"})}
    return problems, seen


def config(workdir: Path, address: str):
    env = dict(os.environ)
    env.update({
        "CLAWRAY__STORAGE_ROOT": str(workdir / "storage"),
        "CLAWRAY__RAY__ADDRESS": address,
        "CLAWRAY__PROXY__PORT": str(free_port()),
        "CLAWRAY__PROXY__COLOCATE": "false",  # both deployments, as configs/gpu.yaml runs them
        "CLAWRAY__PROXY__SESSION_IDLE_TIMEOUT_S": "3600",
        # No automatic window (tests open one by hand); the inactivity signal stays, busy: its gauge is 0.
        "CLAWRAY__SCHEDULER__SLEEP_START": "", "CLAWRAY__SCHEDULER__SLEEP_END": "",
        "CLAWRAY__SCHEDULER__IDLE_MINUTES": "600", "CLAWRAY__SCHEDULER__POLL_S": "1",
        "CLAWRAY__TRAIN__BATCH_SIZE": "4", "CLAWRAY__TRAIN__MIN_FRESH_SAMPLES": "4",
        "CLAWRAY__TRAIN__MAX_STEPS_PER_WINDOW": "1",
    })
    return load_config(REPO_ROOT / "configs" / "local.yaml", env=env)


def wait(pred, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def workload(base: str) -> dict:
    """A few simulated users, two sessions each at least (each ends: evolutions, memory ingestion)."""
    from tests.integration.loadgen import Load

    load = Load(base, tag="dash", users=3, stream_users=1, rounds_per_session=2, max_tokens=8).start()
    wait(lambda: sum(r.ok for r in load.snapshot()) >= 12, 300, "the workload's answers")
    load.stop()
    reqs = load.snapshot()
    return {"sent": len(reqs), "ok": sum(r.ok for r in reqs), "sessions": len(load.sessions)}


def train_window(cfg, handles) -> dict:
    """One window by hand: trainable samples in Replay, trigger, one GRPO step, the adapter hot-swapped."""
    import ray

    from tests.integration.test_controller_windows import make_samples

    replay, omls = handles["Replay"], handles["OMLS"]
    controller = ray.get_actor("Controller", namespace=cfg.ray.namespace)
    generation = ray.get(replay.stats.remote())["generation"]
    ray.get(replay.append.remote(make_samples(cfg, "dash-train", generation, cfg.train.batch_size)))
    since = len(ray.get(controller.history_events.remote()))
    ray.get(omls.trigger_now.remote())
    done = wait(lambda: [e for e in ray.get(controller.history_events.remote())[since:]
                         if e["event"] == "run_finished"], 600, "the window's training run")
    wait(lambda: ray.get(omls.state.remote())["state"] == "idle_wait", 60, "OMLS back to idle_wait")
    return {k: done[0].get(k) for k in ("steps", "stop_reason", "error", "adapters")}


def grafana_folder(head) -> dict:
    """Ray's Grafana dashboards folder of this session (docs/metrics.md loads ours there)."""
    folder = Path(head.get_session_dir_path()) / "metrics" / "grafana" / "dashboards"
    shutil.copy(GRAFANA, folder / GRAFANA.name)
    return {"folder": str(folder), "files": sorted(p.name for p in folder.glob("*.json"))}


def observe(cfg, dash: str, mport: int) -> dict:
    """Poll the dashboard's HTTP API and the metrics export port until everything shows, or POLL_S."""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    from core import names

    headers = get_auth_headers_if_auth_enabled({})  # what `ray get-auth-token` prints, as a header
    actors = [*names.names_for(cfg).actors, names.control_name(RUN)]
    t0, out = time.monotonic(), {}
    while True:
        dash_problems, seen = dashboard_problems(dash, headers, actors, (names.PROXY, names.ENGINE),
                                                 names.APP, cfg.ray.namespace)
        text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=30).text
        out = {"dashboard_problems": dash_problems, "dashboard": seen, "metric_problems": metric_problems(text),
               "expected_actors": actors, "poll_s": round(time.monotonic() - t0, 1)}
        if not (dash_problems or out["metric_problems"]) or time.monotonic() - t0 > POLL_S:
            break
        time.sleep(3)
    time.sleep(QUIET_S)  # no request, no training: what an idle night looks like to Prometheus
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=30).text
    out["metric_problems_after_quiet"] = metric_problems(text)
    scraped = prometheus_samples(text)
    out["scraped"] = {n: [(lb_short(lb), v) for lb, v in s] for n, s in sorted(scraped.items())
                      if not n.endswith("_bucket")}
    out["unauthenticated_dashboard_status"] = httpx.get(f"{dash}/api/v0/actors", timeout=30).status_code
    return out


def run(workdir: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from cluster.system import start_system

    dport, mport = free_port(), free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 8, "include_dashboard": True, "dashboard_port": dport, "metrics_export_port": mport})
    result: dict = {"timings": {}}
    t0 = time.monotonic()
    try:
        cfg = config(workdir, cluster.address)
        system = start_system(cfg)
        result["timings"]["system_s"] = round(time.monotonic() - t0, 1)
        result["node_metrics_ports"] = [n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]]
        result["metrics_port"] = mport
        result["workload"] = workload(system.base_url)
        result["timings"]["workload_s"] = round(time.monotonic() - t0, 1)
        result["training"] = train_window(cfg, system.handles)
        result["timings"]["training_s"] = round(time.monotonic() - t0, 1)
        result["grafana"] = grafana_folder(cluster.head_node)
        result.update(observe(cfg, f"http://127.0.0.1:{dport}", mport))
        result["timings"]["observed_s"] = round(time.monotonic() - t0, 1)
    finally:
        try:
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawray-dash-") as tmp:
        try:
            result = run(Path(tmp))
        except Exception:  # noqa: BLE001 - the test reads the traceback from the JSON
            result = {"error": traceback.format_exc()}
    ok = "error" not in result and not any(
        result[k] for k in ("dashboard_problems", "metric_problems", "metric_problems_after_quiet"))
    result["ok"] = ok
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "scraped"}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
