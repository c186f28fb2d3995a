"""One GPU for the engine and the trainer, checked end to end on a CUDA machine (docs/cluster.md).

Starts the whole system as `clawray start` does (configs/local.yaml, moved onto the GPU: the engine asks
Ray for 0.5 GPU with vLLM's sleep mode, a training worker for the other 0.5) and checks, with the GPU's
memory read by nvidia-smi:

  1. the engine serves, started with sleep mode;
  2. `sleep` frees most of the engine's GPU memory, a request sent meanwhile waits, `wake_up` serves it;
  3. a manual GRPO step (`Controller.train_step`) trains on the same GPU while the engine sleeps (the
     Controller puts it to sleep, the step publishes an adapter, the Controller wakes the engine);
  4. after the wake the engine serves the new adapter, and the Controller's history has the sequence.

Run it with `scripts/gpu_check.sh` (under 10 minutes); prints a PASS/FAIL table, exits 0 only when every
check passed, 2 when the machine lacks what it needs (a GPU, vLLM's CUDA build).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS: list[tuple[str, bool, str]] = []
SIDE = {"X-Turn-Type": "side"}  # served, never recorded as a turn (no scoring traffic on the engine)


def check(name: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append((name, bool(ok), detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    return bool(ok)


def gpu_used_mib() -> int:
    """Memory in use on GPU 0, every process's (the engine's EngineCore and the training worker are not
    this process)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.strip().splitlines()[0])


def preflight() -> str | None:
    """What the machine lacks, or None."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi: not an NVIDIA GPU machine"
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        return f"vLLM is not installed ({e}): pip install -e .[gpu]"
    if not current_platform.is_sleep_mode_available():
        return f"this vLLM build has no sleep mode on its platform ({current_platform.device_name})"
    return None


def overrides(root: Path, model: str, port: int) -> dict[str, str]:
    """configs/local.yaml moved onto one GPU shared by the engine and the trainer (env overrides)."""
    return {
        "CLAWRAY__STORAGE_ROOT": str(root), "CLAWRAY__MODEL__PATH": model, "CLAWRAY__MODEL__DTYPE": "bfloat16",
        "CLAWRAY__MODEL__MAX_MODEL_LEN": "1024", "CLAWRAY__ENGINE__DEVICE": "gpu",
        "CLAWRAY__ENGINE__NUM_GPUS": "0.5", "CLAWRAY__ENGINE__GPU_MEMORY_UTILIZATION": "0.3",
        "CLAWRAY__ENGINE__SHARE_GPU_WITH_TRAINING": "sleep", "CLAWRAY__TRAIN__USE_GPU": "true",
        "CLAWRAY__TRAIN__GPUS_PER_WORKER": "0.5", "CLAWRAY__TRAIN__BF16": "true",
        "CLAWRAY__TRAIN__BATCH_SIZE": "4", "CLAWRAY__PROXY__PORT": str(port),
        # No windows of its own (the manual step is the run), no memory embedder to load.
        "CLAWRAY__SCHEDULER__MODE": "skills_only", "CLAWRAY__MEMORY__ENABLED": "false",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(base_url: str, model: str, timeout: float = 120.0) -> tuple[int, dict]:
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=SIDE, timeout=timeout)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else {})


def make_samples(cfg, generation: int, n: int) -> list:
    """`n` scored turns of the model's own chat template, rewards +1/-1 alternating (so the step has a
    non-zero advantage); logprobs stand in for the engine's (the check is about the GPU, not learning)."""
    from transformers import AutoTokenizer

    from core.contracts import Sample

    tok = AutoTokenizer.from_pretrained(cfg.model_path())
    out = []
    for i in range(n):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"task {i}: rename the file"}],
                                         add_generation_prompt=True, tokenize=False)
        resp = tok.encode("done, renamed." if i % 2 else "DONE.", add_special_tokens=False)
        resp.append(tok.convert_tokens_to_ids("<|im_end|>"))  # the turn's end in Qwen's (and the tiny) template
        out.append(Sample(session_id=f"gpu-check-{i}", turn_index=0, prompt_ids=tok.encode(
            prompt, add_special_tokens=False), response_ids=resp, response_logprobs=[-1.0] * len(resp),
            reward=1.0 if i % 2 else -1.0, loss_mask=[1] * len(resp), skill_generation=generation,
            reward_source="gpu_check"))
    return out


def wait_for(pred, timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(every)
    return None


def sleep_and_wake(engine, base_url: str, alias: str, baseline: int) -> None:
    awake = gpu_used_mib()
    check("engine up with sleep mode (0.5 GPU)", awake > baseline, f"{awake - baseline} MiB on the GPU")
    status, _ = chat(base_url, alias)
    check("engine serves before sleeping", status == 200, f"HTTP {status}")
    engine.sleep.remote().result(timeout_s=300)
    asleep = gpu_used_mib()
    check("sleep frees the engine's GPU memory", awake - asleep >= 0.5 * (awake - baseline),
          f"{awake} -> {asleep} MiB (engine held {awake - baseline})")
    answer: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: answer.update(status=chat(base_url, alias)[0]))
    waiter.start()
    time.sleep(2.0)
    waited = waiter.is_alive()  # held at the engine's gate, not failed inside vLLM
    engine.wake_up.remote().result(timeout_s=300)
    waiter.join(60)
    check("a request sent while asleep waits and is served after wake_up", waited and answer.get("status") == 200,
          f"waited: {waited}, HTTP {answer.get('status')}, {gpu_used_mib()} MiB after the wake")


def train_while_asleep(cfg, handles: dict, engine) -> str | None:
    import ray

    replay, controller = handles["Replay"], handles["Controller"]
    generation = ray.get(replay.stats.remote())["generation"]
    ray.get(replay.append.remote(make_samples(cfg, generation, 2 * cfg.train.batch_size)))
    step = controller.train_step.remote(1)
    seen_asleep, peak = False, 0
    while not ray.wait([step], timeout=0.5)[0]:
        seen_asleep = seen_asleep or engine.is_sleeping.remote().result(timeout_s=30)
        peak = max(peak, gpu_used_mib())
    done = ray.get(step)
    adapters = done.get("adapters") or []
    check("a GRPO step trains on the same GPU while the engine sleeps",
          seen_asleep and done.get("steps") == 1 and not done.get("error") and adapters,
          f"asleep seen: {seen_asleep}, steps {done.get('steps')}, error {done.get('error')}, "
          f"adapters {adapters}, peak {peak} MiB")
    return adapters[-1] if adapters else None


def served_after_wake(cfg, handles: dict, engine, base_url: str, adapter: str | None) -> None:
    import ray

    awake = wait_for(lambda: not engine.is_sleeping.remote().result(timeout_s=30), 120)
    active = engine.models.remote().result(timeout_s=30)["active"]
    check("the Controller wakes the engine after the run", bool(awake), f"active adapter {active}")
    status, body = chat(base_url, cfg.model.policy_alias)
    check("the engine serves the new adapter", status == 200 and adapter is not None and body.get("model") == adapter,
          f"HTTP {status}, model {body.get('model')}, published {adapter}")
    keep = ("engine_slept", "run_started", "run_finished", "engine_woken")
    seq = [h["event"] for h in ray.get(handles["Controller"].history_events.remote()) if h["event"] in keep]
    check("Controller sequence: sleep, run, wake", seq[-4:] == list(keep), " -> ".join(seq[-4:]))


def run_checks(cfg) -> None:
    from ray import serve

    from cluster.system import start_system, stop_system
    from core import names

    baseline = gpu_used_mib()
    t0 = time.monotonic()
    system = start_system(cfg)
    try:
        check("system started", True, f"{time.monotonic() - t0:.0f} s, {system.base_url}")
        engine = serve.get_deployment_handle(names.ENGINE, app_name=names.APP)
        sleep_and_wake(engine, system.base_url, cfg.model.policy_alias, baseline)
        adapter = train_while_asleep(cfg, system.handles, engine)
        served_after_wake(cfg, system.handles, engine, system.base_url, adapter)
    finally:
        stop_system(cfg)


def table() -> str:
    width = max(len(n) for n, _, _ in RESULTS)
    lines = [f"{'check':<{width}}  result  detail"]
    lines += [f"{n:<{width}}  {'PASS' if ok else 'FAIL':<6}  {d}" for n, ok, d in RESULTS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="model folder (default: the tiny model, `make model`); "
                   "e.g. a local Qwen2-0.5B-Instruct")
    p.add_argument("--keep", action="store_true", help="keep the storage root (logs, adapters) afterwards")
    args = p.parse_args(argv)
    if missing := preflight():
        print(f"gpu_check: cannot run here: {missing}", file=sys.stderr)
        return 2
    from core.config import load_config

    root = Path(tempfile.mkdtemp(prefix="clawray-gpu-check-"))
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env=overrides(root, args.model, free_port()))
    t0 = time.monotonic()
    try:
        run_checks(cfg)
    except Exception as e:  # noqa: BLE001 - any failure is a FAIL row of the table, with its reason
        check("the check ran to its end", False, f"{type(e).__name__}: {e}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{table()}\n\n{time.monotonic() - t0:.0f} s; storage root {root}{'' if args.keep else ' (removed)'}")
    return 0 if RESULTS and all(ok for _, ok, _ in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
