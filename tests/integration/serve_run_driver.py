"""`serve run` of the shipped Serve config, exactly as an operator runs it, is the whole system.

Run as a subprocess by tests/integration/test_serve_run.py (it drives a Ray cluster of its own):
    python -m tests.integration.serve_run_driver --out result.json

1. `ray start --head --block` (the operator's cluster; its own process group, stopped by its pid),
2. `serve run <copy of configs/serve.yaml> --address ...` in its own process, the copy differing only in
   the port and in `args.config` (a copy of configs/local.yaml with a temp storage root), nothing else
   started by hand,
3. simulated users through the HTTP endpoint (tests/integration/loadgen.py: OpenAI SDK, checker specs)
   -> turns scored into Replay; `Evolver.evolve_now` -> a skill evolved; more users; `OMLS.trigger_now`
   -> the Controller's window run trains -> an adapter is published and hot-swapped into serving;
4. a redeploy (the builder run again, as `serve deploy` would) attaches to the actors: each named actor
   exists exactly once afterwards;
5. `serve shutdown` and the head stopped. The summary goes to `--out`; exit 0 only when every check held.
"""

from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: the head and every client must agree

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
import yaml  # noqa: E402

from core.config import REPO_ROOT  # noqa: E402
from tests.servers import free_port  # noqa: E402

NAMES = ("Replay", "Evolver", "Memory", "OMLS", "Controller", "PRM-0")


def _wait(pred, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if got := pred():
                return got
        except Exception:  # noqa: BLE001 - a part still starting: asked again until the deadline
            pass
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def write_configs(tmp: Path) -> tuple[Path, int]:
    """The operator's two files: the Serve config (port) and the clawray profile (storage root)."""
    profile = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    profile["storage_root"] = str(tmp / "storage")
    profile["cache_dir"] = str(REPO_ROOT / ".cache")
    # Evolution happens when the test asks (evolve_now), not on its own during the load.
    profile["evolver"].update(on_session_end=False, every_n_turns=0, failure_rate_threshold=1.0)
    profile["scheduler"].update({"sleep_start": None, "sleep_end": None, "idle_minutes": None, "poll_s": 1})
    (tmp / "clawray.yaml").write_text(yaml.safe_dump(profile))
    port = free_port()
    serve_cfg = yaml.safe_load((REPO_ROOT / "configs" / "serve.yaml").read_text())
    serve_cfg["http_options"]["port"] = port
    serve_cfg["applications"][0]["args"]["config"] = str(tmp / "clawray.yaml")
    (tmp / "serve.yaml").write_text(yaml.safe_dump(serve_cfg))
    return tmp / "serve.yaml", port


QUESTION = "Before changing config.json, what do you do first?\nA. edit it\nB. back it up\nAnswer with \\bbox{X}."
SPEC = {"type": "multi_choice", "options": {"A": "edit in place", "B": "backup first"}, "answer": ["B"]}
LESSON = "B is correct: you must create a .bak backup before modifying a file."


def failed_session_with_feedback(base: str) -> str:
    """A user's session that fails the checker and then says what was wrong (the next state the feedback
    evolver learns from), ended: what a skill is distilled from."""
    sid = "sr-failed-backup"
    msgs = [{"role": "user", "content": QUESTION}]
    with httpx.Client(base_url=base, timeout=120) as c:
        r = c.post("/v1/chat/completions", headers={"X-Session-Id": sid, "X-User-Id": "op"}, json={
            "model": "clawray-policy", "messages": msgs, "max_tokens": 8, "clawray_eval": SPEC})
        r.raise_for_status()
        msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""},
                 {"role": "user", "content": f"[Previous Feedback] {LESSON}\n\nAnd the next file?"}]
        c.post("/v1/chat/completions", headers={"X-Session-Id": sid, "X-User-Id": "op", "X-Session-Done": "true"},
               json={"model": "clawray-policy", "messages": msgs, "max_tokens": 8, "clawray_eval": SPEC}
               ).raise_for_status()
    return sid


def run(tmp: Path) -> dict:
    import ray
    from ray import serve

    from tests.integration.loadgen import Load

    bindir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_TRAIN_V2_ENABLED": "1"}
    gcs = free_port()
    head = subprocess.Popen([str(bindir / "ray"), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=8",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env, cwd=REPO_ROOT,
                            stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    serve_proc = None
    result: dict = {}
    try:
        address = f"127.0.0.1:{gcs}"
        serve_yaml, port = write_configs(tmp)
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: subprocess.run([str(bindir / "ray"), "status", f"--address={address}"], env=env,
                                     capture_output=True).returncode == 0, 90, "the Ray head")
        serve_proc = subprocess.Popen([str(bindir / "serve"), "run", f"--address={address}", str(serve_yaml)],
                                      env=env, cwd=REPO_ROOT, stdout=open(tmp / "serve.log", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: httpx.get(base + "/healthz", timeout=5).status_code == 200, 400, "`serve run` to be healthy")
        ray.init(address=address, namespace="clawray", log_to_driver=False)
        actors = {n: ray.get_actor(n, namespace="clawray") for n in NAMES}  # all brought up by `serve run`
        result["actors_started_by_serve_run"] = sorted(actors)

        # ---- turns scored, then a skill evolved from a failed session
        gen0 = ray.get(actors["Evolver"].generation.remote())
        load = Load(base, tag="sr1", users=3, stream_users=1, rounds_per_session=2, max_tokens=8).start()
        _wait(lambda: ray.get(actors["Replay"].stats.remote())["by_state"], 180, "scored turns in Replay",
              every=2)
        _wait(lambda: sum(ray.get(actors["Replay"].stats.remote())["by_state"].values()) >= 6, 180, "6 samples")
        load.stop()
        result["samples_before_evolution"] = sum(ray.get(actors["Replay"].stats.remote())["by_state"].values())
        sid = failed_session_with_feedback(base)
        # That session's own turns: the load's last turns, scored after it stopped, arrive meanwhile too (a
        # wait on the total count was satisfied by them, and evolve_now found nothing of this session).
        _wait(lambda: ray.get(actors["Evolver"].pending.remote()).get(sid, 0) >= 2, 120,
              "the failed session's two turns at the Evolver")
        report = ray.get(actors["Evolver"].evolve_now.remote(sid))
        result["evolved"] = report
        result["generation"] = [gen0, ray.get(actors["Evolver"].generation.remote())]

        # ---- fresh samples of the new generation, then a window: trains, publishes, hot-swaps
        batch = 16
        load = Load(base, tag="sr2", users=4, stream_users=1, rounds_per_session=2, max_tokens=8).start()
        _wait(lambda: ray.get(actors["Replay"].stats.remote())["trainable"] >= batch, 300,
              f"{batch} trainable samples", every=2)
        load.stop()
        engine = serve.get_deployment_handle("PolicyEngine", app_name="clawray")
        before = engine.models.remote().result()["active"]
        ray.get(actors["OMLS"].trigger_now.remote())
        finished = _wait(lambda: [e for e in ray.get(actors["Controller"].history_events.remote())
                                  if e["event"] == "run_finished"], 400, "the window's run to finish", every=2)
        result["run"] = finished[-1]
        active = _wait(lambda: (a := engine.models.remote().result()["active"]) != before and a, 120,
                       "the new adapter to be active in serving")
        result["adapter"] = {"before": before, "active": active}
        r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "clawray-policy", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        result["served_after_swap"] = r.status_code

        # ---- a redeploy attaches to the running actors, never duplicates them
        from cluster.serve_app import APP_NAME, build

        serve.run(build({"config": str(tmp / "clawray.yaml")}), name=APP_NAME, route_prefix="/", blocking=False)
        table = ray._private.state.actors(actor_state_name="ALIVE").values()
        result["named_actor_counts"] = {n: sum(1 for a in table if a["Name"] == n) for n in NAMES}
        result["ok_all"] = (
            result["samples_before_evolution"] > 0 and result["generation"][1] > result["generation"][0]
            and result["run"].get("steps", 0) >= 1 and not result["run"].get("error")
            and active != before and r.status_code == 200
            and all(v == 1 for v in result["named_actor_counts"].values()))
    finally:
        try:
            if serve_proc is not None:
                subprocess.run([str(bindir / "serve"), "shutdown", "-y", f"--address={address}"], env=env,
                               capture_output=True, timeout=120)
                os.killpg(serve_proc.pid, signal.SIGTERM)
                serve_proc.wait(timeout=60)
        finally:
            import ray as _ray

            _ray.shutdown()
            os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` tears its cluster down on SIGTERM
            head.wait(timeout=120)
            from cluster.head import forget_current_cluster

            forget_current_cluster(gcs)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawray-serve-run-") as tmp:
        try:
            result = run(Path(tmp))
        except Exception:  # noqa: BLE001 - the test reads the traceback from the JSON
            result = {"ok_all": False, "error": traceback.format_exc()}
            for log in ("serve.log", "head.log"):
                p = Path(tmp) / log
                if p.is_file():
                    result[log] = p.read_text()[-3000:]
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("ok_all") else 1


if __name__ == "__main__":
    sys.exit(main())
