"""Build the instruction-following tiny model (issue 18 item 1): nothing downloaded, nothing committed.

A small Qwen2 with the tiny chat model's tokenizer (scripts/make_tiny_model.py, built first), trained from
scratch on CPU on `harness.corpus` (chats exactly as clawray serves them, skills block included) so that
it follows a rule a skill states and, without one, can only guess which rule the user wants. Two phases:
short chats (skills block and question) to learn the rules, then the full served format. Seeded and
cached: the folder's `clawray-build.json` records a fingerprint of the settings, this script, the corpus
and the code that writes the skills; a second run with the same inputs does nothing. About 9 minutes once
on 2 cores of an Intel Xeon with AMX, ~20 in fp32 on an AVX2-only AMD EPYC (18 of training at 1.09 s a step,
2.3 of evaluation; rich progress bar).

Where the compute goes: the loss is on the replies only (~20 tokens of ~500), so the LM head runs on the
reply positions alone, matmuls run in bf16 autocast (fp32 weights) where the CPU has native bf16 (AMX or
AVX512-BF16; fp32 elsewhere, where emulated bf16 is ~17x slower), batches are filled to a token budget
(short chats come many to a batch), and a chat's previous reply is a supervised target too where it is as
right as the last one (`Example.history_right`).

At the end it measures (scripts/instruct_eval.py) by greedy decoding how often the reply is exactly right
on held-out corpus chats, per family, with the rule in the prompt (told) and without it, and plays
workloads/clawray-mini offline as the driver does, with and without the skills its feedback distils. The
numbers go into `clawray-build.json` (`eval`); docs/bench.md says what the model can and cannot do.

Usage: python scripts/make_instruct_model.py [--out .cache/tiny-instruct] [--steps N] [--force]
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
SOURCES = ("scripts/make_instruct_model.py", "scripts/instruct_eval.py", "harness/corpus.py",
           "evolve/evolvers.py", "evolve/retrieval.py", "evolve/text.py")
# Of a file that is mostly serving code, only the functions the build calls: editing the rest of the Proxy's
# injection (which query it retrieves for, say) cannot change the model, so it must not retrain it.
SOURCE_PARTS = {"serve/injection.py": ("add_to_system", "last_user_text")}
SHAPE = {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2}
MAX_TOKENS = 1152  # longer chats are left out of training (served chats with 5 skills reach ~1,100)


def fingerprint(args: argparse.Namespace) -> str:
    keys = ("steps", "short_frac", "batch_tokens", "lr", "prompt_weight", "seed", "shape", "eval_n", "precision")
    h = hashlib.sha256(json.dumps({k: getattr(args, k) for k in keys}, sort_keys=True).encode())
    for s in SOURCES:
        h.update(code_digest((REPO / s).read_text()).encode())
    for s, names in SOURCE_PARTS.items():
        h.update(code_digest((REPO / s).read_text(), only=names).encode())
    h.update((BASE / "clawray-build.json").read_bytes())
    return h.hexdigest()[:16]


def code_digest(source: str, only: tuple[str, ...] | None = None) -> str:
    """What in a source file can change the build: its syntax tree without docstrings (comments are not in
    the tree), so that editing the prose of this script or of the code it reads does not retrain (~20 min
    on an AVX2-only CPU) a model that would come out bitwise the same. `only`: just these top-level
    functions and classes (each must exist: a renamed one is an error here, not a silently smaller digest)."""
    import ast

    tree = ast.parse(source)
    if only is not None:
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        if missing := [n for n in only if n not in defs]:
            raise ValueError(f"the build's sources lack {missing}")
        tree = ast.Module(body=[defs[n] for n in only], type_ignores=[])
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def resolve_precision(asked: str) -> str:
    """bf16 autocast only on a CPU with native bf16 matmuls (AMX or AVX512-BF16): elsewhere (an AVX2-only
    AMD EPYC, say) PyTorch emulates it: ~20 s a step against ~1.1 in fp32 (5.5 hours in all)."""
    if asked != "auto":
        return asked
    import torch

    return "bf16" if torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported() else "fp32"


def is_built(out: Path, fp: str) -> bool:
    try:
        return json.loads((out / "clawray-build.json").read_text())["fingerprint"] == fp
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return False


def _ids(x) -> list[int]:
    return list(x["input_ids"] if hasattr(x, "keys") else x)


DECISION_WEIGHT = 4  # the first token of a reply decides its case (or its first mark): counted this many times


def encode(tok, ex, history: bool = True) -> tuple[list[int], list[int]]:
    """(token ids of the served prompt followed by the reply and <|im_end|>, target positions): the reply's
    tokens, and those of every earlier reply when `history` and the example says they are right too. The
    prompt ids are exactly what the engine renders (the chat template), so are the earlier replies' spans in
    them. A reply's first token is listed DECISION_WEIGHT times: the loss is a mean over the listed positions,
    and that token is the rule's decision (the rest of a cased reply follows from it), while the words after
    it are most of the tokens and none of the decision."""
    prompt = _ids(tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True))
    reply = _ids(tok(ex.reply + "<|im_end|>", add_special_tokens=False))

    def span(start: int, n: int) -> list[int]:
        return [start] * (DECISION_WEIGHT - 1) + list(range(start, start + n))

    targets = span(len(prompt), len(reply))
    if history and ex.history_right:
        earlier = []
        for i, m in enumerate(ex.messages):
            if m["role"] != "assistant":
                continue
            head = _ids(tok.apply_chat_template(ex.messages[:i], add_generation_prompt=True, tokenize=True))
            prev = _ids(tok(m["content"] + "<|im_end|>", add_special_tokens=False))
            if prompt[:len(head) + len(prev)] == head + prev:  # the span as rendered (always, for ChatML)
                earlier += span(len(head), len(prev))
        targets = earlier + targets
    return prompt + reply, targets


PAD_TO = 64  # sequence lengths and target counts are padded to a multiple of this


def _padded(n: int) -> int:
    return -(-n // PAD_TO) * PAD_TO


def batches(data: list[tuple[list[int], list[int]]], budget: int, rng: random.Random) -> list[list[int]]:
    """Index batches of chats of one padded length L, budget // L of them (a few shapes only: oneDNN compiles
    a kernel per shape, and a new shape every step cost time and gigabytes)."""
    by_len: dict[int, list[int]] = {}
    idx = list(range(len(data)))
    rng.shuffle(idx)
    for j in idx:
        by_len.setdefault(_padded(len(data[j][0])), []).append(j)
    out: list[list[int]] = []
    for n, js in by_len.items():
        size = max(1, budget // n)
        out += [js[k:k + size] for k in range(0, len(js), size)]
    rng.shuffle(out)
    return out


def collate(rows: list[tuple[list[int], list[int]]], pad: int, budget: int | None = None):
    """ids (B, L), attention mask (B, L), and the (row, position) of every target token, padded to a multiple
    of PAD_TO with position 0 (its loss is masked by `reply_loss`'s target -100). With `budget`, B is the
    batch size that padded length always gets (short batches are filled with padding rows)."""
    import torch

    n = _padded(max(len(s) for s, _ in rows))
    b = max(len(rows), budget // n) if budget else len(rows)
    ids = torch.full((b, n), pad, dtype=torch.long)
    mask = torch.zeros((b, n), dtype=torch.long)
    mask[:, 0] = 1  # a padding row attends to one token (all-masked rows give NaN in SDPA)
    rows_ix, pos_ix = [], []
    for i, (seq, targets) in enumerate(rows):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        rows_ix += [i] * len(targets)
        pos_ix += targets
    extra = _padded(len(pos_ix)) - len(pos_ix) if budget else 0
    return ids, mask, torch.tensor(rows_ix + [0] * extra), torch.tensor(pos_ix + [0] * extra)


def reply_loss(model, ids, mask, rows, pos, prompt_weight: float = 0.0):
    """(loss, the replies' part): the mean cross-entropy of the target tokens (the replies), plus `prompt_weight` times the mean over every
    other real token: next-token prediction on the prompts is a signal for free (the forward pass runs over
    them anyway) that teaches the structure the replies need (copying, which option line is which).
    Without it the LM head runs on the targets' predecessors only."""
    import torch

    # No attention mask: padding is only ever on the right (`collate`), so under causal attention no real token
    # sees it, and without a mask SDPA runs its causal kernel: the same loss, less time (AVX2-only EPYC: one
    # served batch on one thread 2.6 s against 3.4; the whole build on 2 threads 1.09 s a step against 1.14).
    # `mask` still says which tokens are real for the prompt loss below.
    hidden = model.model(input_ids=ids).last_hidden_state  # (B, L, H)
    real = pos > 0  # position 0 is padding (never a target)
    if not prompt_weight:
        logits = model.lm_head(hidden[rows, pos - 1])  # (N, V): position t-1 predicts token t
        target = torch.where(real, ids[rows, pos], -100)
        loss = torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=-100)
        return loss, loss.detach()
    logits = model.lm_head(hidden[:, :-1])  # (B, L-1, V)
    ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(),
                                           reduction="none").view(ids.shape[0], -1)
    reply = torch.zeros_like(mask, dtype=torch.bool)
    reply[rows[real], pos[real]] = True
    other = mask.bool() & ~reply
    other[:, 0] = False
    on_reply = ce[reply[:, 1:]].mean()
    return on_reply + prompt_weight * ce[other[:, 1:]].mean(), on_reply.detach()


def phase_data(tok, phase: str, tokens: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Encoded chats of `phase` until they hold about `tokens` tokens (plus a margin for padding)."""
    from harness.corpus import examples

    out, total = [], 0
    for ex in examples(10 ** 9, seed, phase):
        d = encode(tok, ex)
        if len(d[0]) > MAX_TOKENS:
            continue
        out.append(d)
        total += len(d[0])
        if total >= tokens:
            return out
    return out


def new_model(tok_dir: Path, shape: dict[str, int]):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base = json.loads((tok_dir / "config.json").read_text())
    cfg = Qwen2Config(vocab_size=base["vocab_size"], max_position_embeddings=base["max_position_embeddings"],
                      tie_word_embeddings=True, eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
                      bos_token_id=None, torch_dtype="float32", **shape)
    return Qwen2ForCausalLM(cfg)


def train(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from transformers import AutoTokenizer, GenerationConfig

    from scripts.instruct_eval import evaluate

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(BASE)
    model = new_model(BASE, args.shape)
    rng = random.Random(args.seed)
    n_short = round(args.steps * args.short_frac)
    plan: list[tuple[list, list[int]]] = []  # (the phase's data, one batch of indices into it)
    for phase, n, seed in (("short", n_short, args.seed), ("served", args.steps - n_short, args.seed + 7)):
        if n == 0:
            continue
        data = phase_data(tok, phase, n * args.batch_tokens, seed)
        cut = batches(data, args.batch_tokens, rng)
        while len(cut) < n:
            cut += batches(data, args.batch_tokens, rng)
        plan += [(data, b) for b in cut[:n]]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, args.steps // 25)

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses: list[float] = []
    t0 = time.time()
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*cols) as progress:
        bar = progress.add_task("training the instruction-following tiny model", total=args.steps)
        for step, (data, b) in enumerate(plan):
            ids, mask, rows, pos = collate([data[j] for j in b], model.config.pad_token_id, args.batch_tokens)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                loss, on_reply = reply_loss(model, ids, mask, rows, pos, args.prompt_weight)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(on_reply.item())
            recent = sum(losses[-20:]) / len(losses[-20:])
            phase = "short" if step < n_short else "served"
            progress.update(bar, advance=1, description=f"training the instruction-following tiny model "
                                                        f"({phase} chats, reply loss {recent:.3f})")
    train_s = time.time() - t0
    model.eval()
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id,
                     do_sample=True).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    t1 = time.time()
    ev = evaluate(model, tok, args.seed + 1, n=args.eval_n, short=args.short_frac > 0)
    return {"train_s": round(train_s, 1), "s_per_step": round(train_s / args.steps, 3), "eval_s": round(time.time() - t1, 1),
            "chats": sum(len(b) for _, b in plan), "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
            "eval": ev}


def make(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out
    fp = fingerprint(args)
    if is_built(out, fp) and not args.force:
        return json.loads((out / "clawray-build.json").read_text())
    from scripts.make_tiny_model import build_into

    info: dict[str, Any] = {"fingerprint": fp, "seed": args.seed, "steps": args.steps,
                            "short_frac": args.short_frac, "batch_tokens": args.batch_tokens, "lr": args.lr,
                            "prompt_weight": args.prompt_weight,
                            "shape": args.shape, "precision": args.precision}

    def build(tmp: Path) -> None:
        info.update(train(args, tmp))
        (tmp / "clawray-build.json").write_text(json.dumps(info, indent=2))

    build_into(out, build)
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--short-frac", type=float, default=0.4, help="share of the steps on short chats (first)")
    ap.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per batch")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--prompt-weight", type=float, default=0.0, help="weight of the prompt tokens' loss")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--shape", type=json.loads, default=SHAPE, help="Qwen2 shape (JSON), default %(default)s")
    ap.add_argument("--eval-n", type=int, default=480, help="held-out chats the build is measured on")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="matmuls in bf16 autocast or fp32; auto: bf16 where the CPU has it natively")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    args.precision = resolve_precision(args.precision)
    info = make(args)
    print(json.dumps({k: info[k] for k in ("train_s", "final_loss", "eval") if k in info}, indent=2))
    print(f"instruction-following tiny model: {args.out}")


if __name__ == "__main__":
    main()
