"""An idle window on a local multi-node cluster whose training node the autoscaler adds and removes.

Run as a subprocess by tests/integration/test_cluster_autoscaling.py (it needs a Ray cluster of its own):
    python -m tests.integration.autoscaling_driver --temp-dir DIR --out result.json

1. `cluster.local_cluster.up`: Ray's fake multi-node provider with cluster/cluster-local.yaml (a head, the
   always-on serving node; training nodes 0..2), its autoscaler polling every second, a 12 s idle timeout.
2. `clawray start` (the CLI, as an operator runs it) joins that cluster with the placement of
   configs/gpu.yaml: the engine asks for `clawray_serve` (serving node), each training worker for
   `clawray_train` (only a training node, which does not exist yet).
3. Trainable samples into Replay, then a window by hand (`OMLS.trigger_now`); one GRPO step per window.
4. Observed, with timings: the Controller's `request_resources` makes the autoscaler add a training node;
   the run's Ray Train workers run there; the step's adapter is published and activated by the engine,
   and a request through the policy alias is served by it; the run ends, the window closes, and the
   training node is removed after its idle timeout.
The observations go to `--out` as JSON (the test asserts on them); the cluster is stopped either way.
"""

from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: every process of the cluster must agree

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402

from cluster import local_cluster  # noqa: E402
from core.config import REPO_ROOT, load_config  # noqa: E402
from tests.servers import free_port  # noqa: E402

IDLE_TIMEOUT_MIN = 0.2  # the training node goes 12 s after its last task (the shipped file says 1 min)
TRAIN, SERVE = "clawray_train", "clawray_serve"


def base_env() -> dict[str, str]:
    """This process's env for the head and the CLI, minus any Ray cluster the caller is joined to."""
    from cluster.runtime import runtime_env_vars

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CLAWRAY_CONFIG")}
    return {**env, "PYTHONPATH": str(REPO_ROOT), **runtime_env_vars(load_config(env={}))}


def overrides(root: Path, address: str) -> dict[str, str]:
    """configs/local.yaml on the cluster, placed as configs/gpu.yaml places it; one step per window."""
    return {
        "CLAWRAY__STORAGE_ROOT": str(root), "CLAWRAY__RAY__ADDRESS": address,
        "CLAWRAY__PROXY__PORT": str(free_port()),
        "CLAWRAY__PROXY__INGRESS": "head_only",  # every "node" shares this machine's ports
        "CLAWRAY__ENGINE__RESOURCES": f"{{{SERVE}: 1}}", "CLAWRAY__TRAIN__WORKER_RESOURCES": f"{{{TRAIN}: 1}}",
        "CLAWRAY__TRAIN__MAX_STEPS_PER_WINDOW": "1", "CLAWRAY__MEMORY__ENABLED": "false",
        "CLAWRAY__SCHEDULER__SLEEP_START": "", "CLAWRAY__SCHEDULER__SLEEP_END": "",
        "CLAWRAY__SCHEDULER__IDLE_MINUTES": "", "CLAWRAY__SCHEDULER__POLL_S": "1",
    }


def wait(pred, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def nodes() -> dict[str, dict]:
    """Every node Ray has known (removed ones too): alive, and its custom clawray resources."""
    import ray

    return {n["NodeID"]: {"alive": n["Alive"], "custom": sorted(k for k in n["Resources"] if k.startswith("clawray_"))}
            for n in ray.nodes()}


def alive_with(resource: str) -> list[str]:
    return [i for i, n in nodes().items() if n["alive"] and resource in n["custom"]]


def actor_nodes(class_prefix: str) -> list[str]:
    """The nodes of every actor whose class name starts with `class_prefix` (dead ones too)."""
    from ray._private.state import actors

    return [a["Address"]["NodeID"] for a in actors().values()
            if a["ActorClassName"].startswith(class_prefix) and a["Address"].get("NodeID")]


def custom_of(node_ids: list[str]) -> list[list[str]]:
    known = nodes()
    return [known[i]["custom"] if i in known else ["?"] for i in node_ids]


def window(cfg, base: str, out: dict) -> None:
    """Samples in, a window by hand, and what the cluster does about it."""
    import ray

    from tests.integration.test_controller_windows import make_samples

    replay, omls = ray.get_actor("Replay", namespace="clawray"), ray.get_actor("OMLS", namespace="clawray")
    controller = ray.get_actor("Controller", namespace="clawray")
    generation = ray.get(replay.stats.remote())["generation"]
    ray.get(replay.append.remote(make_samples(cfg, "as", generation, cfg.train.batch_size)))
    out["train_nodes_before"] = len(alive_with(TRAIN))
    since = len(ray.get(controller.history_events.remote()))
    t0 = time.monotonic()
    ray.get(omls.trigger_now.remote())
    wait(lambda: alive_with(TRAIN), 120, "the autoscaler to add a training node", every=0.2)
    out["train_node_joined_s"] = round(time.monotonic() - t0, 1)

    def finished():
        return [e for e in ray.get(controller.history_events.remote())[since:] if e["event"] == "run_finished"]

    (run,) = wait(finished, 600, "the window's training run", every=1)
    out["run_finished_s"] = round(time.monotonic() - t0, 1)
    out["run"] = {k: run.get(k) for k in ("reason", "steps", "stop_reason", "error", "adapters")}
    out["train_worker_nodes"] = custom_of(actor_nodes("RayTrainWorker"))
    out["active_adapter"] = httpx.get(base + "/healthz", timeout=10).json().get("active_adapter")
    out["served_by"] = served_adapter(cfg, base)
    wait(lambda: ray.get(omls.state.remote())["state"] == "idle_wait", 60, "OMLS back to idle_wait")
    t1 = time.monotonic()
    wait(lambda: not alive_with(TRAIN), 180, "the idle training node to be removed", every=1)
    out["train_node_removed_after_run_s"] = round(time.monotonic() - t1, 1)
    out["alive_nodes_after"] = [n["custom"] for n in nodes().values() if n["alive"]]


def served_adapter(cfg, base: str) -> str | None:
    """One request through the policy alias; the adapter version its turn was served under."""
    from tests.integration.helpers import session_turns, wait_for

    sid = f"as-{uuid.uuid4().hex[:8]}"
    r = httpx.post(base + "/v1/chat/completions", timeout=120, headers={"X-Session-Id": sid},
                   json={"model": cfg.model.policy_alias, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "rename the q3 report"}]})
    r.raise_for_status()
    turns = wait_for(lambda: session_turns(cfg.storage_path(), sid), 30)
    return turns[0].adapter_version if turns else None


def run(temp_dir: Path, out: dict) -> None:
    import ray

    env = base_env()
    t0 = time.monotonic()
    info = local_cluster.up(temp_dir, port=free_port(), env=env, idle_timeout_minutes=IDLE_TIMEOUT_MIN,
                            update_interval_s=1)
    out["address"] = info["address"]
    cli_env = {**env, **overrides(temp_dir / "state", info["address"])}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "start"], cwd=REPO_ROOT, env=cli_env,
                       capture_output=True, text=True, timeout=600)
    out["clawray_start"] = {"rc": r.returncode, "tail": (r.stdout + r.stderr)[-3000:]}
    if r.returncode != 0:
        raise RuntimeError(f"clawray start exited {r.returncode}")
    out["system_up_s"] = round(time.monotonic() - t0, 1)
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env=cli_env)
    ray.init(address=info["address"], namespace="clawray", log_to_driver=False)
    out["nodes_at_start"] = [n["custom"] for n in nodes().values() if n["alive"]]
    out["engine_nodes"] = custom_of(actor_nodes("ServeReplica:clawray:PolicyEngine"))
    window(cfg, f"http://127.0.0.1:{cfg.proxy.port}", out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--temp-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out: dict = {}
    t0 = time.monotonic()
    try:
        run(args.temp_dir, out)
    except Exception:  # noqa: BLE001 - any failure is reported in the JSON the test reads
        out["error"] = traceback.format_exc()
    finally:
        import ray

        out["wall_s"] = round(time.monotonic() - t0, 1)
        ray.shutdown()  # before the cluster goes: a connected driver would log the dead GCS for a minute
        local_cluster.down(args.temp_dir)
        args.out.write_text(json.dumps(out, indent=1, default=str))
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
