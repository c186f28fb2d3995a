"""What the instruction-following tiny model can do (scripts/make_instruct_model.py runs this after training).

- `corpus_eval`: held-out served-format corpus chats (a seed the build never trains on), half with the
  family's rule told by a skill, half without; a reply is right when greedy decoding gives exactly the
  corpus reply (checked token by token in one batched forward pass: the greedy reply equals the target iff
  every target token is the argmax after its prefix). Per family, told and untold (untold: a guess among
  the family's rules, so about 1/#rules is all a model can do).
- `workload_eval`: workloads/clawray-mini played offline through harness/driver.py's own `play_day` (its
  prompts, history, `[Previous Feedback]`, tools and scoring) with a client that serves the model in-process
  the way the Proxy does: the skills retrieved for the last user message (template retrieval, the default
  config's top-k) appended to the system prompt, the chat template with the tools, the reply's Hermes tool
  calls parsed. Without skills and with the skills the feedback evolver distils from the rounds' feedback
  (what the user's preferences are); greedy, and sampled at the driver's temperature 1.0.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "workloads" / "clawray-mini"
_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


# ------------------------------------------------------------------------------------ corpus
def corpus_eval(model, tok, seed: int, n: int = 480, batch: int = 16, phase: str = "served") -> dict[str, Any]:
    """Right greedy replies on `n` held-out chats of `phase`, per family, told / untold: multiple choice
    exactly the corpus reply (and finer signs of progress: `_tokens` the share of its tokens that are the
    argmax, `_marks` the share of its option marks); status updates generated and right when every letter is in the rule's case."""
    import random

    import torch

    from harness.corpus import CASED, example
    from scripts.make_instruct_model import collate, encode

    rng = random.Random(seed)
    exs = [example(rng, phase, told=i % 2 == 0) for i in range(n)]
    data = [encode(tok, e, history=False) for e in exs]
    marks = torch.tensor([tok.convert_tokens_to_ids(m) for m in ("+", "-")])
    exact: list[bool] = []
    share: list[float] = []
    marked: list[float] = []  # the share of the option marks (`+` / `-`) that are right
    with torch.no_grad():
        for i in range(0, n, batch):
            ids, mask, rows, pos = collate(data[i:i + batch], model.config.pad_token_id)
            logits = model(input_ids=ids, attention_mask=mask).logits
            ok = logits[rows, pos - 1].argmax(-1) == ids[rows, pos]
            is_mark = torch.isin(ids[rows, pos], marks)
            for r in range(ids.shape[0]):
                exact.append(bool(ok[rows == r].all()))
                share.append(float(ok[rows == r].float().mean()))
                m = (rows == r) & is_mark
                marked.append(float(ok[m].float().mean()) if m.any() else 0.0)
        for i, e in enumerate(exs):
            if e.family in CASED:
                exact[i] = cased(e.rule, greedy(model, tok, e.messages, 32))
    out: dict[str, Any] = {"n": n}
    for fam in sorted({e.family for e in exs}):
        for told in (True, False):
            key = f"{fam}_{'told' if told else 'untold'}"
            sel = [i for i, e in enumerate(exs) if e.family == fam and e.told == told]
            out[key] = round(sum(exact[i] for i in sel) / max(1, len(sel)), 3)
            if fam not in CASED:
                out[key + "_tokens"] = round(sum(share[i] for i in sel) / max(1, len(sel)), 3)
                out[key + "_marks"] = round(sum(marked[i] for i in sel) / max(1, len(sel)), 3)
    return out


def cased(rule: str, text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    lower = rule in ("lower", "ticket_lower")
    return bool(letters) and all(c.islower() if lower else c.isupper() for c in letters)


def greedy(model, tok, messages: list[dict[str, Any]], max_new_tokens: int) -> str:
    import torch

    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


# ------------------------------------------------------------------------------------ workload
def workload_skills(workload) -> list:
    """The skills the feedback evolver distils when every round of the workload fails (multiple choice:
    with every option chosen, so the feedback of each wrong option comes back, as the driver sends it)."""
    from evolve.evolvers import Failure, FeedbackEvolver

    skills: list = []
    for d in workload.days:
        for r in d.rounds:
            answer = set((r.eval.get("options") or {}).keys()) if r.type == "multi_choice" else None
            fail = Failure(r.question, "", r.feedback_text(False, answer), -1.0, f"{d.id}-{r.id}", r.id)
            for s in FeedbackEvolver().distil([fail], skills):
                skills = [x for x in skills if x.name != s.name] + [s]
    return skills


class LocalClient:
    """The slice of `openai.AsyncOpenAI` that harness/driver.py's `play_day` uses, serving `model` in-process
    as the Proxy and the engine would: skills injected, the chat template rendered with the tools, greedy
    (`temperature` 0) or sampled with the request's seed, Hermes tool calls parsed out of the text."""

    def __init__(self, model, tok, skills: list, greedy: bool):
        from core.config import SkillsConfig
        from evolve.retrieval import TemplateRetriever

        self.model, self.tok, self.greedy, self.cfg = model, tok, greedy, SkillsConfig()
        self.retriever = TemplateRetriever()
        self.index = self.retriever.build(skills) if skills else None
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self.prompts: list[str] = []

    async def post(self, *args, **kwargs) -> None:  # the driver ends its session: nothing to end here
        return None

    def _inject(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from evolve.retrieval import render_skills_block
        from serve.injection import add_to_system, last_user_text

        body = {"messages": [dict(m) for m in messages]}
        if self.index is not None:
            skills = self.retriever.retrieve(last_user_text(messages), self.cfg.top_k, self.cfg.task_specific_top_k,
                                             self.index)
            if skills:
                add_to_system(body, render_skills_block(skills), anthropic=False)
        return body["messages"]

    async def create(self, *, messages, max_tokens, seed=None, tools=None, **_: Any):
        import torch

        text = self.tok.apply_chat_template(self._inject(messages), tools=tools, add_generation_prompt=True,
                                            tokenize=False)
        self.prompts.append(text)
        ids = self.tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        sampling: dict[str, Any] = {"do_sample": False}
        if not self.greedy:  # as vLLM samples at temperature 1.0: the whole distribution, the request's seed
            torch.manual_seed(seed or 0)
            sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_tokens, eos_token_id=self.model.config.eos_token_id,
                                      pad_token_id=self.model.config.pad_token_id, **sampling)
        return SimpleNamespace(choices=[SimpleNamespace(message=parse_reply(
            self.tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))])


def parse_reply(text: str) -> SimpleNamespace:
    """content and tool_calls of a reply as vLLM's `hermes` parser reads them (a call that is not valid JSON
    with a name is no call: the text stays the content)."""
    calls = []
    for raw in _CALL_RE.findall(text):
        try:
            obj = json.loads(raw.strip())
            name, args = obj["name"], obj.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        fn = SimpleNamespace(name=str(name), arguments=json.dumps(args))
        call = SimpleNamespace(id=f"call_{uuid.uuid4().hex[:8]}", type="function", function=fn)
        call.model_dump = lambda c=call: {"id": c.id, "type": "function",
                                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
        calls.append(call)
    content = text.split("<tool_call>")[0] if calls else text
    return SimpleNamespace(content=content, tool_calls=calls or None)


def play(model, tok, skills: list, greedy: bool, tag: str = "", max_tokens: int = 24) -> list:
    """Every day of the workload through the driver's `play_day` (a fresh workspace per day, as the bench)."""
    from harness.driver import play_day, prepare_workspace
    from harness.workload import load_workload

    w = load_workload(WORKLOAD)
    client = LocalClient(model, tok, skills, greedy)
    results = []
    with tempfile.TemporaryDirectory(prefix="clawray-instruct-eval-") as root:
        for day in w.days:
            prepare_workspace(w, Path(root), "mei")
            results += asyncio.run(play_day(client, w, day, "mei", Path(root), model="local", max_tokens=max_tokens,
                                            run_tag=tag))
    return results


def workload_eval(model, tok, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """Accuracy and completion on the workload's rounds, per round type, without and with skills; greedy
    and sampled (temperature 1.0, the mean over the driver's request seeds of `seeds` runs)."""
    from harness.workload import load_workload

    skills = workload_skills(load_workload(WORKLOAD))
    out: dict[str, Any] = {"skills": [s.name for s in skills]}
    for label, lib in (("without_skills", []), ("with_skills", skills)):
        greedy = play(model, tok, lib, True)
        out[f"{label}_replies"] = [f"{r.day}/{r.round}: {r.reply[:60]}" for r in greedy]
        for mode, runs in (("greedy", [greedy]), ("sampled", [play(model, tok, lib, False, tag=f"-s{s}") for s in seeds])):
            rs = [r for run in runs for r in run]
            by_type: dict[str, list[float]] = {}
            for r, rnd in zip(rs, _rounds() * len(runs), strict=True):
                by_type.setdefault(rnd.type, []).append(r.score)
            out[f"{label}_{mode}"] = {
                "accuracy": round(sum(r.score for r in rs) / len(rs), 3),
                "completion": round(sum(r.passed for r in rs) / len(rs), 3),
                **{t: round(sum(v) / len(v), 3) for t, v in sorted(by_type.items())}}
    return out


def _rounds() -> list:
    from harness.workload import load_workload

    return [r for d in load_workload(WORKLOAD).days for r in d.rounds]


def evaluate(model, tok, seed: int, n: int = 480, short: bool = False) -> dict[str, Any]:
    """`short`: also the held-out short chats (the first phase's format)."""
    model.eval()
    out = {"corpus": corpus_eval(model, tok, seed, n)}
    if short:
        out["corpus_short"] = corpus_eval(model, tok, seed, n, phase="short")
    return {**out, "workload": workload_eval(model, tok)}
