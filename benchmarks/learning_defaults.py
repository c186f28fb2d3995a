"""Which training defaults learn the toy task of the proof-of-learning test, measured offline (issue 12 item 10).

    nice -n 10 python -m benchmarks.learning_defaults [--seeds 6] [--shipped]
        [--loss importance_sampling cispo ...] [--lr 1e-3 ...] [--temperature 0.1 ...]

The toy task of tests/integration/test_train_learning.py without Ray or vLLM, so a whole grid of
(loss, lr, temperature) x seeds runs in minutes on one CPU thread:

1. N = 64 replies of at most 8 tokens to one fixed prompt, sampled from the base policy at temperature T
   (torch, seeded per run); each token's behaviour logprob is log_softmax(logits / T) of the sampled
   token, i.e. vLLM's `processed_logprobs` (the distribution the token was drawn from).
2. Reward = the `lowercase` checker's credit mapped to [-1, 1] (rewards.scoring.checker_reward); a
   reward of 0 is masked (not trained), as the PRM stores it.
3. 4 GRPO steps of `batch_size` samples in serving order, by the trainer's own code: a fresh LoRA
   (train.model.build_peft_model: rank/alpha/targets of configs/local.yaml, seeded with the run's seed),
   `train.step.train_step` (batch-normalised advantages, the learner's logprobs under each sample's
   sampling temperature, the named loss, token mean) and train.model.DDPBackend (AdamW, gradient clip).
4. N fresh replies (new sampling seed) from the trained policy: gain = mean reward after - before.

A config "learns" when every seed's gain reaches MARGIN (the integration test's threshold). Output: a
table on stdout and benchmarks/out/learning_defaults.json.

Measured (batch 16, LoRA r=8/alpha=16 on q/k/v/o; mean reward before -> gain mean / worst seed):
- importance_sampling, 6 seeds: at T 1.0, 0.3, 0.2 the base already scores +0.82..+0.84 (letter soup,
  mostly lowercase) and no lr gains (|gain| < 0.07); at T 0.05 every reply is newlines (-1.00, zero
  variance: no advantage, gain 0); at T 0.1 (-0.65) lr 1e-3 / 3e-3 / 1e-2 gain +1.42 / +1.61 / +1.59,
  worst +1.21 / +1.48 / +1.50.
- T 0.1, 6 seeds: cispo lr 1e-3 / 3e-3 / 1e-2 +1.40 / +1.53 / +1.46 (worst +1.13 / +1.35 / +1.33);
  ppo +1.22 / +0.65 / +0.55 (worst +1.10 / -0.12 / -0.37: collapses above 1e-3).
- importance_sampling at T 0.1, 20 seeds: lr 1e-3 +1.31 (worst +0.89), lr 3e-3 +1.50 (worst +1.16),
  lr 1e-2 +1.50 (worst +0.66: one collapse). Shipped: lr 3e-3, T 0.1 (configs/local.yaml says why).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from core.config import TrainConfig, load_config
from core.contracts import Sample, Sampling
from rewards.checkers.style import lowercase
from rewards.scoring import checker_reward
from train import algos
from train.model import DDPBackend, build_peft_model
from train.step import train_step

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out" / "learning_defaults.json"
PROMPT = "write one short sentence about files."  # the integration test's prompt
N, STEPS, MAX_TOKENS = 64, 4, 8
MARGIN = 0.8  # tests/integration/test_train_learning.py (Hoeffding margin for N = 64)
# The default sweep; `--loss/--lr/--temperature` pick another product, `--shipped` configs/local.yaml's.
LOSSES, LRS, TEMPERATURES = ["importance_sampling"], [1e-3, 3e-3, 1e-2], [1.0, 0.3, 0.2, 0.1, 0.05]


@torch.no_grad()
def sample(model, tok, prompt: list[int], temperature: float, seed: int) -> list[Sample]:
    """N replies of at most MAX_TOKENS, stopping at eos (kept as the reply's last token, as vLLM does),
    scored and masked as the PRM stores them (reward 0: masked)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt] * N)
    logprobs = torch.zeros(N, 0)
    alive, lengths = torch.ones(N, dtype=torch.bool), torch.zeros(N, dtype=torch.long)
    for _ in range(MAX_TOKENS):
        last = model(input_ids=ids, logits_to_keep=1, use_cache=False).logits[:, -1].float()
        step = torch.log_softmax(last / temperature, dim=-1)  # vLLM's processed_logprobs
        nxt = torch.multinomial(step.exp(), 1, generator=gen).squeeze(1)
        ids = torch.cat([ids, nxt[:, None]], 1)  # a finished row's extra tokens are cut below
        logprobs = torch.cat([logprobs, step.gather(1, nxt[:, None])], 1)
        lengths += alive
        alive &= nxt != tok.eos_token_id
        if not alive.any():
            break
    out = []
    for i in range(N):
        response = ids[i, len(prompt):len(prompt) + lengths[i]].tolist()
        reward = checker_reward(lowercase({}, tok.decode(response, skip_special_tokens=True), None))
        out.append(Sample(session_id=f"s{seed}-{i}", turn_index=0, prompt_ids=prompt, response_ids=response,
                          response_logprobs=logprobs[i, :lengths[i]].tolist(),
                          sampling=Sampling(temperature=temperature), reward=reward,
                          loss_mask=[int(reward != 0)] * len(response), skill_generation=0))
    return out


def mean_reward(samples: list[Sample]) -> float:
    return statistics.mean(s.reward for s in samples)


def run(model_path: str, tok, prompt: list[int], cfg: TrainConfig, temperature: float, seed: int) -> dict:
    """Serve N, train STEPS steps (train.step.train_step) on the trainable ones in serving order, serve N
    fresh: the gain."""
    cfg = cfg.model_copy(update={"seed": seed})
    model = build_peft_model(model_path, cfg, torch.device("cpu"))
    before = sample(model, tok, prompt, temperature, seed=1000 + seed)
    trainable = [s for s in before if s.reward != 0]
    backend = DDPBackend(model, cfg, torch.device("cpu"), world=1)
    for k in range(STEPS):
        if batch := trainable[k * cfg.batch_size:(k + 1) * cfg.batch_size]:
            train_step(backend, batch, cfg)
    after = sample(model, tok, prompt, temperature, seed=2000 + seed)
    m0, m1 = mean_reward(before), mean_reward(after)
    return {"seed": seed, "before": round(m0, 3), "after": round(m1, 3), "gain": round(m1 - m0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--shipped", action="store_true", help="only the loss, lr and temperature of local.yaml")
    ap.add_argument("--loss", nargs="+", default=LOSSES, choices=sorted(algos.POLICY_LOSSES))
    ap.add_argument("--lr", nargs="+", type=float, default=LRS)
    ap.add_argument("--temperature", nargs="+", type=float, default=TEMPERATURES)
    args = ap.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: one thread, predictable
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per run would bury the table

    shipped = load_config(REPO / "configs" / "local.yaml", env={})
    model_path = shipped.model_path()
    tok = AutoTokenizer.from_pretrained(model_path)
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    grid = ([(shipped.train.loss, shipped.train.lr, shipped.engine.default_temperature or 1.0)] if args.shipped
            else list(itertools.product(args.loss, args.lr, args.temperature)))
    rows = []
    for loss, lr, temperature in grid:
        cfg = shipped.train.model_copy(update={"loss": loss, "lr": lr})
        t0 = time.perf_counter()
        runs = [run(model_path, tok, prompt, cfg, temperature, seed) for seed in range(args.seeds)]
        gains = [r["gain"] for r in runs]
        row = {"loss": loss, "lr": lr, "temperature": temperature, "batch_size": cfg.batch_size,
               "before_mean": round(statistics.mean(r["before"] for r in runs), 3),
               "gain_mean": round(statistics.mean(gains), 3), "gain_min": min(gains),
               "learns": min(gains) >= MARGIN, "runs": runs, "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"{loss:20s} lr {lr:<6g} T {temperature:<5g} before {row['before_mean']:+.3f} "
              f"gain mean {row['gain_mean']:+.3f} min {row['gain_min']:+.3f} "
              f"{'LEARNS' if row['learns'] else '-':6s} {row['seconds']:.0f}s", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"seeds": args.seeds, "n": N, "steps": STEPS, "margin": MARGIN, "rows": rows},
                              indent=1))


if __name__ == "__main__":
    main()
