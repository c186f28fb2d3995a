"""One GRPO step against its floor: a bare forward + backward of the same model on the same tokens.

    python -m benchmarks.trainer_floor [--quick] [--steps 2] [--warmup 1] [--threads 2]

The model is a random-weight Qwen2 with Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads,
MLP 4,864, vocabulary 151,936, tied embeddings; ~494M parameters, fp32 on CPU; `--quick`: 4 layers), built
in memory and saved once to a temporary folder so clawray's trainer loads it as it loads any model. Both
sides train the same LoRA (r=8 on q/k/v/o) with AdamW and clip at 1.0, on the same B samples whose
prompt + response lengths vary over 1-2k tokens (prompts 768-1,536, responses 256-512):

- clawray: `train.step.train_step` (advantages, collate into the padded left-prompt / right-response
  layout, forward, logprobs on the response columns, the PPO-clipped loss, backward, clip, step);
- floor: per sample, unpadded, `model(input_ids)` with the LM head on the response positions only, the
  summed log-likelihood of the response tokens as the loss, backward; then the same clip and step. No
  advantages, no ratio, no padding: what any trainer of these tokens must at least compute.

Each side runs in a fresh process (peak RSS is its own) and reports its fastest and median step of
`--steps` after `--warmup`. Goal (issue 19): clawray's step <= 1.15x the floor's time. Output: a table and
benchmarks/out/trainer_floor.json.

clawray's side uses `train.micro_batch_tokens` of the config (default 2048: sequences this long go one
by one, unpadded); `--micro-tokens none` batches all 4 (padded, masked) for comparison.

GPU profile (when a GPU machine is lent; nothing else changes):
    python -m benchmarks.trainer_floor --device cuda --bf16 --steps 5 --warmup 2 --micro-tokens 8192
reports peak GPU memory (torch.cuda.max_memory_allocated) beside the step times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out" / "trainer_floor.json"
BATCH, PROMPT, RESPONSE = 4, (768, 1536), (256, 512)
LR, RANK, ALPHA, TARGETS = 1e-4, 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]
GOAL = 1.15


def qwen05_config(layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
                       tie_word_embeddings=True, rope_theta=1_000_000.0, use_cache=False)


def model_folder(layers: int) -> Path:
    """A random-weight model of that shape, saved once per run under the temp folder."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(tempfile.gettempdir()) / f"clawray-bench-qwen05-{layers}l"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(qwen05_config(layers)).save_pretrained(path)
    return path


def samples(seed: int = 0):
    import torch

    from core.contracts import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(BATCH):
        lp = int(torch.randint(PROMPT[0], PROMPT[1] + 1, (1,), generator=g))
        lr = int(torch.randint(RESPONSE[0], RESPONSE[1] + 1, (1,), generator=g))
        out.append(Sample(session_id=f"b{i}", turn_index=0,
                          prompt_ids=torch.randint(10, 150000, (lp,), generator=g).tolist(),
                          response_ids=torch.randint(10, 150000, (lr,), generator=g).tolist(),
                          response_logprobs=(-11.9 + 0.05 * torch.randn(lr, generator=g)).tolist(),
                          reward=float(i % 2) * 2 - 1, loss_mask=[1] * lr, skill_generation=0))
    return out


def _cfg(**kw):
    from core.config import LoRAConfig, TrainConfig

    return TrainConfig(loss="ppo", lr=LR, batch_size=BATCH, lora=LoRAConfig(rank=RANK, alpha=ALPHA, target_modules=TARGETS),
                       **kw)


MICRO: dict[str, Any] = {}  # TrainConfig overrides of the clawray side (--micro-tokens, --bf16)
DEVICE = "cpu"


def run_clawray(path: Path, batch) -> Any:
    import torch

    from train.model import DDPBackend, build_peft_model
    from train.step import train_step

    cfg = _cfg(**MICRO)
    model = build_peft_model(str(path), cfg, torch.device(DEVICE))
    model.train()
    backend = DDPBackend(model, cfg, torch.device(DEVICE), world=1)
    return lambda: train_step(backend, batch, cfg, device=DEVICE)


def run_floor(path: Path, batch) -> Any:
    import contextlib

    import torch

    from train.model import build_peft_model

    cfg = _cfg(bf16=MICRO.get("bf16", False))
    model = build_peft_model(str(path), cfg, torch.device(DEVICE))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR)
    rows = [(torch.tensor([s.prompt_ids + s.response_ids], device=DEVICE), torch.tensor(s.response_ids, device=DEVICE))
            for s in batch]
    autocast = (lambda: torch.autocast(DEVICE, dtype=torch.bfloat16)) if cfg.bf16 else contextlib.nullcontext

    def step() -> None:
        for ids, resp in rows:
            # The positions that predict the response: the last prompt token up to the one before the end.
            with autocast():
                out = model(input_ids=ids[:, :-1], logits_to_keep=len(resp))
            loss = -torch.log_softmax(out.logits[0].float(), dim=-1).gather(1, resp[:, None]).sum()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def worker(impl: str, layers: int, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    path, batch = model_folder(layers), samples()
    fn = {"clawray": run_clawray, "floor": run_floor}[impl](path, batch)
    for _ in range(warmup):
        fn()
    times = []
    cuda = DEVICE.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch)
    padded = BATCH * (max(len(s.prompt_ids) for s in batch) + max(len(s.response_ids) for s in batch))
    return {"impl": impl, "layers": layers, "threads": torch.get_num_threads(), "tokens": tokens,
            "padded_tokens": padded, "step_s_min": min(times), "step_s_median": statistics.median(times),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "device": DEVICE, "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}


def _spawn(impl: str, layers: int, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "benchmarks.trainer_floor", "--worker", impl, "--layers", str(layers),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads),
           "--micro-tokens", str(MICRO.get("micro_batch_tokens", "default")).lower(), "--device", DEVICE,
           *(["--bf16"] if MICRO.get("bf16") else [])]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 layers instead of 24")
    ap.add_argument("--worker", choices=["clawray", "floor"], help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=24, help=argparse.SUPPRESS)
    ap.add_argument("--micro-tokens", default="default",
                    help="clawray's train.micro_batch_tokens: a number, 'none', or 'default' (the config's)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU profile (module docstring)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (GPU profile)")
    a = ap.parse_args(argv)
    global DEVICE
    DEVICE = a.device
    if a.bf16:
        MICRO["bf16"] = True
    if a.micro_tokens != "default":
        MICRO["micro_batch_tokens"] = None if a.micro_tokens == "none" else int(a.micro_tokens)
    if a.worker:
        print(json.dumps(worker(a.worker, a.layers, a.steps, a.warmup, a.threads)))
        return 0
    layers = 4 if a.quick else a.layers
    rows = [_spawn(impl, layers, a.steps, a.warmup, a.threads) for impl in ("floor", "clawray")]
    floor = rows[0]
    for r in rows:
        r["x_floor"] = r["step_s_min"] / floor["step_s_min"]
        r["peak_rss_vs_floor"] = r["peak_rss_mb"] / floor["peak_rss_mb"]
    _report(rows)
    return 0


def _report(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    r0 = rows[0]
    t = Table(title=f"GRPO step vs a bare forward+backward: Qwen2-0.5B shape ({r0['layers']} layers), {BATCH} "
                    f"sequences, {r0['tokens']} tokens ({r0['padded_tokens']} padded), CPU fp32, "
                    f"{r0['threads']} threads; goal <= {GOAL}x")
    for c in ("impl", "step s (min)", "step s (median)", "x floor", "peak RSS MB", "RSS x floor"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["impl"], f"{r['step_s_min']:.2f}", f"{r['step_s_median']:.2f}", f"{r['x_floor']:.2f}",
                  f"{r['peak_rss_mb']:.0f}", f"{r['peak_rss_vs_floor']:.2f}")
    Console(width=140).print(t)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows, "goal": GOAL, "time": time.time()}, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
