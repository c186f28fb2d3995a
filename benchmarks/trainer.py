"""Training-side speed of one GRPO step: clawray's loss/step vs trl's `GRPOTrainer`, generation excluded.

    python -m benchmarks.trainer [--steps 10] [--repeats 2] [--quick]

Fairness (what is held equal):
- the same tiny chat model (scripts/make_tiny_model.py, fp32, CPU), the same LoRA (r=8, alpha=16,
  q/k/v/o), AdamW at the same lr, gradient clipping at 1.0, the same torch thread count;
- the same batch: B samples with the same prompt/response token ids, engine ("old") logprobs and
  advantages; both compute the PPO-clipped token-level loss (trl `loss_type="bnpo"`, the token mean
  over the batch, i.e. our `ppo` loss), beta = 0 (no reference model), one optimizer step per batch;
- generation is excluded for both: trl's `training_step` runs on prepared inputs with
  `_prepare_inputs` replaced by the identity (that method is where trl generates and scores), so trl
  is timed on its own forward/loss/backward path plus clip + optimizer step; clawray is timed on
  `train.step.train_step` (advantages from rewards, collate, forward, loss, backward, clip, step).
- each (implementation, shape) runs in its own fresh process: peak RSS (`ru_maxrss`) is then that
  implementation's own peak (imports, model, optimizer state and the step), not a shared one.

Throughput counts real (unpadded) prompt + response tokens per second of the fastest of `--steps`
timed steps (after `--warmup`); the median is shown too. Torch runs 1 thread in both by default
(`--threads`): on a shared 2-core machine two spinning OpenMP threads make both sides erratic.
Output: a rich table and benchmarks/out/trainer.json.

Why clawray's step is faster here: the LM head runs only on the response columns (`logits_to_keep`
over a left-padded prompt / right-padded response layout) and logprobs come from a gather minus a
per-row logsumexp (`train.step.gathered_logprobs`, the math of trl's `selective_log_softmax` on CPU), while trl's fused LM head on a non-Triton device scores every position of
the sequence (prompt included) and computes per-token entropies for its metrics.
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
OUT = REPO / "benchmarks" / "out" / "trainer.json"
SHAPES = {  # name: (batch, prompt_len, response_len)
    "8x(32+32)": (8, 32, 32),
    "16x(128+128)": (16, 128, 128),
}
LR, RANK, ALPHA, TARGETS = 1e-4, 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]


def model_dir() -> Path:
    sys.path.insert(0, str(REPO))
    from scripts.make_tiny_model import make

    return make()  # builds .cache/tiny-chat once (~6 s); a no-op when it is already there


def make_samples(batch: int, p: int, r: int, seed: int = 0):
    """B samples, lengths varying in [p/2, p] and [r/2, r] so padding is realistic; rewards +-1."""
    import torch

    from core.contracts import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(batch):
        lp = int(torch.randint(p // 2, p + 1, (1,), generator=g))
        lr = int(torch.randint(r // 2, r + 1, (1,), generator=g))
        out.append(Sample(
            session_id=f"b{i}", turn_index=0,
            prompt_ids=torch.randint(10, 4000, (lp,), generator=g).tolist(),
            response_ids=torch.randint(10, 4000, (lr,), generator=g).tolist(),
            response_logprobs=(-8.3 + 0.05 * torch.randn(lr, generator=g)).tolist(),
            reward=float(i % 2) * 2 - 1, loss_mask=[1] * lr, skill_generation=0,
        ))
    return out


def _timed(step_fn, steps: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        step_fn()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step_fn()
        times.append(time.perf_counter() - t0)
    return {"step_s_median": statistics.median(times), "step_s_min": min(times), "rss_peak_before_steps_kb": rss_before}


def run_ours(shape: tuple[int, int, int], steps: int, warmup: int) -> dict[str, Any]:
    import torch

    from core.config import LoRAConfig, TrainConfig
    from train.model import DDPBackend, build_peft_model
    from train.step import train_step

    samples = make_samples(*shape)
    cfg = TrainConfig(loss="ppo", lr=LR, batch_size=shape[0], lora=LoRAConfig(rank=RANK, alpha=ALPHA, target_modules=TARGETS))
    model = build_peft_model(str(model_dir()), cfg, torch.device("cpu"))
    model.train()
    backend = DDPBackend(model, cfg, torch.device("cpu"), world=1)
    res = _timed(lambda: train_step(backend, samples, cfg), steps, warmup)
    return {**res, "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)}


def _trl_inputs(samples, pad_id: int) -> dict[str, Any]:
    """trl's prepared-batch layout: left-padded prompts, right-padded completions."""
    import torch
    from trl.trainer.utils import pad

    from train.algos import compute_advantages

    def col(key, dtype, side, value=0):
        return pad([torch.tensor(getattr(s, key), dtype=dtype) for s in samples], padding_value=value, padding_side=side)

    prompt_ids = col("prompt_ids", torch.long, "left", pad_id)
    completion_ids = col("response_ids", torch.long, "right", pad_id)
    rewards = torch.tensor([s.reward for s in samples])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": pad([torch.ones(len(s.prompt_ids), dtype=torch.long) for s in samples], 0, "left"),
        "completion_ids": completion_ids,
        "completion_mask": pad([torch.ones(len(s.response_ids), dtype=torch.long) for s in samples], 0, "right"),
        "old_per_token_logps": col("response_logprobs", torch.float32, "right"),
        "advantages": compute_advantages(rewards, [None] * len(samples)),
        "num_items_in_batch": torch.tensor(float(sum(len(s.response_ids) for s in samples))),
    }


def run_trl(shape: tuple[int, int, int], steps: int, warmup: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    batch, _, r = shape
    path = str(model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    samples = make_samples(*shape)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=batch, num_generations=batch,
            max_completion_length=r, loss_type="bnpo", beta=0.0, learning_rate=LR, max_grad_norm=1.0,
            report_to="none", logging_steps=10**6, save_strategy="no", seed=0,
        )
        torch.manual_seed(0)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args, train_dataset=Dataset.from_dict({"prompt": ["hi"] * batch}), processing_class=tok,
            peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"),
        )
        trainer.create_optimizer()
        trainer._prepare_inputs = lambda x: x  # generation/scoring happen here in trl: excluded
        trainer.current_gradient_accumulation_steps = 1  # normally set by Trainer.train()'s loop
        model, inputs = trainer.model, _trl_inputs(samples, tok.pad_token_id)
        params = [p for p in model.parameters() if p.requires_grad]

        def step() -> None:
            trainer.training_step(model, dict(inputs), inputs["num_items_in_batch"])
            trainer.accelerator.clip_grad_norm_(params, 1.0)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        res = _timed(step, steps, warmup)
    return {**res, "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)}


def worker(impl: str, shape_name: str, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    fn = {"clawray": run_ours, "trl": run_trl}[impl]
    res = fn(SHAPES[shape_name], steps, warmup)
    res.update(
        impl=impl, shape=shape_name, threads=torch.get_num_threads(),
        # Best-of-N step time (timeit's rule): on a shared machine the minimum is the least disturbed run.
        tokens_per_s=res["tokens"] / res["step_s_min"],
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        step_rss_growth_mb=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - res.pop("rss_peak_before_steps_kb")) / 1024,
    )
    return res


def _spawn(impl: str, shape: str, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "benchmarks.trainer", "--worker", impl, "--shape", shape,
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} {shape} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per (impl, shape); best kept")
    ap.add_argument("--quick", action="store_true", help="small shape only")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for both (1 = stable numbers on a shared 2-core machine)")
    ap.add_argument("--worker", choices=["clawray", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="8x(32+32)", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.shape, a.steps, a.warmup, a.threads)))
        return 0
    shapes = ["8x(32+32)"] if a.quick else list(SHAPES)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        runs: dict[str, list[dict[str, Any]]] = {"clawray": [], "trl": []}
        for _ in range(a.repeats):  # alternate so background load hits both alike
            for impl in ("trl", "clawray"):
                runs[impl].append(_spawn(impl, shape, a.steps, a.warmup, a.threads))
        best = {impl: max(rs, key=lambda x: x["tokens_per_s"]) for impl, rs in runs.items()}
        for impl in ("trl", "clawray"):
            rows.append({**best[impl], "speedup_vs_trl": best[impl]["tokens_per_s"] / best["trl"]["tokens_per_s"],
                         "peak_rss_vs_trl": best[impl]["peak_rss_mb"] / best["trl"]["peak_rss_mb"]})
    _report(rows)
    return 0


def _report(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GRPO training step (CPU, tiny model, generation excluded)")
    for c in ("shape", "impl", "step ms (min)", "step ms (median)", "tokens/s", "x trl", "peak RSS MB",
              "RSS growth MB"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["shape"], r["impl"], f"{r['step_s_min'] * 1e3:.1f}", f"{r['step_s_median'] * 1e3:.1f}",
                  f"{r['tokens_per_s']:,.0f}",
                  f"{r['speedup_vs_trl']:.2f}", f"{r['peak_rss_mb']:.0f}", f"{r['step_rss_growth_mb']:.1f}")
    Console(width=120).print(t)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows, "time": time.time()}, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
