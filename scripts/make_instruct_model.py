"""Build the instruction-following tiny model (issue 18 item 1): nothing downloaded, nothing committed.

A 3-layer, hidden-192 Qwen2 (~2.5M parameters) with the tiny chat model's tokenizer (scripts/
make_tiny_model.py, built first), trained from scratch on CPU on `harness.corpus` (chats exactly as
clawray serves them, skills block included; the loss on the reply only) so that it follows a rule a
skill states and, without one, can only guess which rule the user wants. Seeded and cached: the folder's
`clawray-build.json` records a fingerprint of this script, the corpus and the evolver that writes the
skills; a second run with the same inputs does nothing. ~10 minutes once on 2 cores (rich progress).

At the end it measures, by greedy decoding, on held-out corpus chats and on the rounds of
workloads/clawray-mini it can do (multiple choice and status updates; file-writing tool calls are not
taught): how often the reply is right with the rule in the prompt (as a skill) and without it. Those
numbers go into `clawray-build.json` (`eval`), and docs/bench.md says what the model can and cannot do.

Usage: python scripts/make_instruct_model.py [--out .cache/tiny-instruct] [--steps 700] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BASE = REPO / ".cache" / "tiny-chat"
DEFAULT_OUT = REPO / ".cache" / "tiny-instruct"
SEED = 1234
SOURCES = ("scripts/make_instruct_model.py", "harness/corpus.py", "evolve/evolvers.py", "evolve/retrieval.py")
SHAPE = {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2}
MAX_TOKENS = 768  # longer chats are left out of training (the corpus' p99 is ~700)


def fingerprint(args: argparse.Namespace) -> str:
    h = hashlib.sha256(json.dumps({"steps": args.steps, "batch": args.batch, "lr": args.lr,
                                   "seed": args.seed}).encode())
    for s in SOURCES:
        h.update((REPO / s).read_bytes())
    h.update((BASE / "clawray-build.json").read_bytes())
    return h.hexdigest()[:16]


def is_built(out: Path, fp: str) -> bool:
    try:
        return json.loads((out / "clawray-build.json").read_text())["fingerprint"] == fp
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return False


def encode(tok, ex) -> tuple[list[int], list[int]]:
    """(prompt ids as the engine sees them, reply ids ending with <|im_end|>)."""
    prompt = tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else list(prompt)
    return prompt, tok(ex.reply + "<|im_end|>", add_special_tokens=False)["input_ids"]


def batches(data: list[tuple[list[int], list[int]]], batch: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length (little padding): shuffle, sort within chunks of 16 batches."""
    idx = list(range(len(data)))
    rng.shuffle(idx)
    out = []
    for i in range(0, len(idx), batch * 16):
        chunk = sorted(idx[i:i + batch * 16], key=lambda j: len(data[j][0]) + len(data[j][1]))
        out += [chunk[k:k + batch] for k in range(0, len(chunk), batch)]
    rng.shuffle(out)
    return out


def collate(rows: list[tuple[list[int], list[int]]], pad: int):
    import torch

    n = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        seq = p + r
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(r)
        mask[i, :len(seq)] = 1
    return ids, labels, mask


def train(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from harness.corpus import examples

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(BASE)
    base_cfg = json.loads((BASE / "config.json").read_text())
    cfg = Qwen2Config(vocab_size=base_cfg["vocab_size"], max_position_embeddings=base_cfg["max_position_embeddings"],
                      tie_word_embeddings=True, eos_token_id=base_cfg["eos_token_id"],
                      pad_token_id=base_cfg["pad_token_id"], bos_token_id=None, torch_dtype="float32", **SHAPE)
    model = Qwen2ForCausalLM(cfg)
    rng = random.Random(args.seed)
    data = [d for d in (encode(tok, e) for e in examples(args.steps * args.batch, args.seed))
            if len(d[0]) + len(d[1]) <= MAX_TOKENS]
    plan = batches(data, args.batch, rng)
    while len(plan) < args.steps:
        plan += batches(data, args.batch, rng)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses: list[float] = []
    t0 = time.time()
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*cols) as progress:
        task = progress.add_task("training the instruction-following tiny model", total=args.steps)
        for step in range(args.steps):
            ids, labels, mask = collate([data[j] for j in plan[step]], cfg.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            recent = sum(losses[-20:]) / len(losses[-20:])
            progress.update(task, advance=1, description=f"training the instruction-following tiny model "
                                                         f"(loss {recent:.3f})")
    model.eval()
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, do_sample=True).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return {"train_s": round(time.time() - t0, 1), "examples": len(data), "final_loss": round(sum(losses[-50:]) / 50, 4),
            "eval": evaluate(model, tok, args.seed + 1)}


# ------------------------------------------------------------------------------------ evaluation
def reply(model, tok, messages: list[dict[str, Any]], max_new_tokens: int = 24) -> str:
    import torch

    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else list(ids)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def right(family: str, rule: str, spec: dict[str, Any], text: str) -> bool:
    from rewards.checkers import evaluate as check

    if family == "status":
        letters = [c for c in text if c.isalpha()]
        return bool(letters) and all(c.islower() if rule == "lower" else c.isupper() for c in letters)
    return check(spec, text, None).passed


def evaluate(model, tok, seed: int, n: int = 160) -> dict[str, Any]:
    """Greedy replies on held-out corpus chats (told / not told) and on the workload's rounds."""
    from harness.corpus import examples

    told = {"right": 0, "n": 0}
    untold = {"right": 0, "n": 0}
    for ex in examples(n, seed):
        bucket = told if ex.told else untold
        bucket["n"] += 1
        bucket["right"] += right(ex.family, ex.rule, ex.spec, reply(model, tok, ex.messages))
    return {"corpus_told": told["right"] / max(1, told["n"]), "corpus_untold": untold["right"] / max(1, untold["n"]),
            "corpus_n": n, "workload": workload_eval(model, tok)}


def workload_eval(model, tok) -> dict[str, Any]:
    """workloads/clawray-mini's multiple-choice and status rounds, as the driver asks them (persona, no
    feedback prefix), without skills and with the skills the feedback evolver distils from the rounds'
    own feedback (what the user's preferences are)."""
    from evolve.evolvers import Failure, FeedbackEvolver
    from evolve.retrieval import render_skills_block
    from harness.workload import load_workload
    from rewards.checkers import evaluate as check
    from serve.injection import add_to_system

    w = load_workload(REPO / "workloads" / "clawray-mini")
    rounds = [r for d in w.days for r in d.rounds if r.type in ("multi_choice", "lowercase")]
    skills: list = []
    for i, r in enumerate(rounds):
        fb = r.feedback.get("incorrect") or next(iter((r.feedback.get("options") or {}).values()), "")
        wrong = [t for k, t in sorted((r.feedback.get("options") or {}).items()) if k not in r.eval.get("answer", [])]
        fb = wrong[0] if wrong else fb
        for s in FeedbackEvolver().distil([Failure(r.question, "", fb, -1.0, f"w{i}", f"w{i}")], skills):
            skills = [x for x in skills if x.name != s.name] + [s]  # a lesson seen again: the same skill
    out: dict[str, Any] = {"rounds": len(rounds), "skills": [s.name for s in skills]}
    for label, with_skills in (("without_skills", False), ("with_skills", True)):
        scores, passed = [], 0
        for r in rounds:
            body = {"messages": [{"role": "system", "content": w.persona()}, {"role": "user", "content": r.question}]}
            if with_skills:
                add_to_system(body, render_skills_block(skills), anthropic=False)
            res = check(r.eval_spec(), reply(model, tok, body["messages"]), None)
            scores.append(res.score)
            passed += res.passed
        out[label] = {"accuracy": sum(scores) / len(scores), "completion": passed / len(scores)}
    return out


def make(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out
    fp = fingerprint(args)
    if is_built(out, fp) and not args.force:
        return json.loads((out / "clawray-build.json").read_text())
    from scripts.make_tiny_model import build_into

    info: dict[str, Any] = {"fingerprint": fp, "seed": args.seed, "steps": args.steps, "batch": args.batch,
                            "lr": args.lr, "shape": SHAPE}

    def build(tmp: Path) -> None:
        info.update(train(args, tmp))
        (tmp / "clawray-build.json").write_text(json.dumps(info, indent=2))

    build_into(out, build)
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    info = make(args)
    print(json.dumps({k: info[k] for k in ("train_s", "final_loss", "eval") if k in info}, indent=2))
    print(f"instruction-following tiny model: {args.out}")


if __name__ == "__main__":
    main()
