"""A synthetic corpus that teaches the tiny CPU model to follow rules stated in its prompt (issue 18 item 1).

The bare tiny model has random weights: an injected skill cannot help it, so nothing the loops do shows.
This corpus makes a model that reads rules. Each example is a chat exactly as clawray serves it: a persona
system prompt, possibly the skills block the Proxy appends to it (`serve.injection.add_to_system` of
`evolve.retrieval.render_skills_block` of skills the real feedback evolver distilled from a feedback
sentence), a user message that may start with `[Previous Feedback] ...` (harness/driver.py), possibly
the previous exchange, and the reply the rule asks for.

What the model is NOT told is which rule a user wants: every task family has several rules in a closed
vocabulary (`FAMILIES`), and an example without its family's rule in the prompt is answered by a rule
drawn uniformly, so the bare model can only guess: the hidden preference that feedback reveals, skills
carry, and RL can internalise. Families (the task types of workloads/clawray-mini): timestamp formats,
file names, backing up before editing (multiple choice, `\\bbox{...}` answers) and the casing of status
updates (free text). File-writing tool calls are not taught: the model cannot do those tasks.

Pure and seeded: `examples(n, seed)` returns the same chats for the same arguments.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

ANSWER_FORMAT = "Answer using \\bbox{X} or \\bbox{X,Y} format."
PERSONAS = (
    "You are Rio, the assistant of a small data team in Lisbon. The user is Ana, who leads the team.",
    "You are Pax, an operations assistant for a bakery chain. The user is Tom, the operations manager.",
    "You are Juno, the assistant of a research lab. The user is Dr. Okafor, who runs the lab.",
    "You are Bex, a helpful assistant for a freight forwarder in Rotterdam. The user is Lena.",
    "You are Sol, the coordinator bot of a support desk. The user is Priya, the desk lead.",
    "You are a helpful assistant.",
)
TOPICS = ("shipments", "daily report", "eta export", "meeting notes", "config change", "invoice batch",
          "stock count", "build summary", "release plan", "support tickets", "weekly metrics", "route plan")
EXTS = ("md", "csv", "json", "txt")
FILES = ("day01/shipments.json", "day02/config.json", "data/routes.yaml", "notes/plan.md", "ops/settings.ini",
         "day03/report.json", "etc/app.toml")


@dataclass(frozen=True)
class Rule:
    family: str
    key: str
    text: str  # the rule in the closed vocabulary (as feedback states it and a skill carries it)
    example: str = ""  # an illustration some feedback adds ("..., e.g. <example>")


@dataclass
class Example:
    messages: list[dict[str, Any]]  # the chat as the Proxy forwards it (skills block included)
    reply: str  # what the rule asks for
    family: str
    rule: str  # key of the rule that decided the reply
    told: bool  # the rule was in the prompt (a skill of its family)
    spec: dict[str, Any] = field(default_factory=dict)  # the checker spec that scores the reply


FAMILIES: dict[str, tuple[Rule, ...]] = {
    "timestamp": (
        Rule("timestamp", "iso_offset", "timestamps must be ISO 8601 with a T separator and the +08:00 offset",
             "2026-05-05T09:00:00+08:00"),
        Rule("timestamp", "utc_z", "timestamps must be ISO 8601 in UTC with a Z suffix", "2026-05-05T01:00:00Z"),
        Rule("timestamp", "plain", "timestamps must be written as YYYY-MM-DD HH:MM with a space", "2026-05-05 09:00"),
    ),
    "filename": (
        Rule("filename", "date_snake", "file names must be YYYYMMDD_snake_case.ext", "20260505_eta_export.csv"),
        Rule("filename", "kebab_date_last", "file names must be kebab-case with the date YYYY-MM-DD at the end",
             "eta-export-2026-05-05.csv"),
        Rule("filename", "title", "file names must be TitleCase words with no date", "EtaExport.csv"),
    ),
    "backup": (
        Rule("backup", "bak_first", "you must create a .bak backup before modifying a file"),
        Rule("backup", "in_place", "edit files in place and never leave backup copies"),
    ),
    "status": (
        Rule("status", "lower", "status updates must be written in lowercase only, no capital letters"),
        Rule("status", "upper", "status updates must be written in uppercase only"),
    ),
}
RULES = {r.key: r for rules in FAMILIES.values() for r in rules}
# Multiple choice is learned far more slowly than the casing of a status line: it gets more examples.
FAMILY_WEIGHTS = {"timestamp": 3, "filename": 3, "backup": 2, "status": 1}


# ------------------------------------------------------------------------------------ options
def _moment(rng: random.Random) -> datetime:
    return datetime(2026, 1, 1, 8) + timedelta(days=rng.randrange(365), minutes=15 * rng.randrange(40))


def timestamp_options(rng: random.Random) -> list[tuple[str, str | None]]:
    """(text, the rule it satisfies or None) for one moment in several formats."""
    d = _moment(rng)
    iso = d.strftime("%Y-%m-%dT%H:%M:%S")
    pm = f"{d.hour % 12 or 12}:{d.minute:02d}{'am' if d.hour < 12 else 'pm'}"
    pool = [(iso + "+08:00", "iso_offset"), (d.strftime("%Y-%m-%dT%H:%M:%S.000") + "+08:00", "iso_offset"),
            (iso + "Z", "utc_z"), (d.strftime("%Y-%m-%d %H:%M"), "plain"), (iso, None),
            (d.strftime("%d/%m/%Y ") + pm, None), (f"{d.day} {d.strftime('%B')} {pm}", None)]
    return pool


def _words(rng: random.Random) -> list[str]:
    return rng.choice(TOPICS).split()


def filename_options(rng: random.Random) -> list[tuple[str, str | None]]:
    d = _moment(rng)
    ymd, dash = d.strftime("%Y%m%d"), d.strftime("%Y-%m-%d")
    opts: list[tuple[str, str | None]] = []
    for _ in range(3):
        w, ext = _words(rng), rng.choice(EXTS)
        opts += [(f"{ymd}_{'_'.join(w)}.{ext}", "date_snake"), (f"{'-'.join(w)}-{dash}.{ext}", "kebab_date_last"),
                 (f"{''.join(x.capitalize() for x in w)}.{ext}", "title"),
                 (f"{' '.join(x.capitalize() for x in w)}.{ext}", None),
                 (f"{ymd}_{''.join(x.capitalize() for x in w)}.{ext}", None), (f"{'_'.join(w)}.{ext}", None)]
    return list(dict.fromkeys(opts))


def backup_options(rng: random.Random) -> tuple[str, list[tuple[str, set[str]]]]:
    """A file and (action, the rules it satisfies)."""
    f = rng.choice(FILES)
    name = f.rsplit("/", 1)[-1]
    return f, [("Edit it in place right away", {"in_place"}), (f"Copy it to {f}.bak first", {"bak_first"}),
               ("Delete it and write a new one", set()), ("Keep the .bak copy unchanged after editing", {"bak_first"}),
               (f"Rename {name} before editing", set()), (f"Open and edit {name}", {"in_place"})]


# ------------------------------------------------------------------------------------ tasks
TS_QUESTIONS = ("Which timestamps follow our team standard? Select all that apply.",
                "Which of these meeting times may go into the calendar export? Select all that apply.",
                "Which of these times can go into the delivery log? Select all that apply.",
                "I am filling in the schedule. Which timestamps are written the way I want? Select all that apply.")
FN_QUESTIONS = ("I need to save today's report. Which file names follow our naming rule? Select all that apply.",
                "Name the export of this week's data. Which names are acceptable? Select all that apply.",
                "Which of these file names may I use for the new file? Select all that apply.",
                "Which file names conform to our output file naming convention? Select all that apply.")
BK_QUESTIONS = ("Before I change {f} again, what should you do first? Select all that apply.",
                "I want to change a value in {f}. What is the right first step? Select all that apply.",
                "We need to update {f}. How should you go about it? Select all that apply.")
ST_QUESTIONS = ("Write a one-line status update for the team channel about the {t}.",
                "Post a short end-of-day note for the team channel.",
                "Give me a one-line status update on the {t}.",
                "Write a short end-of-day note for the team channel.",
                "Send a quick status line about the {t}.")
ST_REPLIES = ("the {t} are done and checked for today.", "all {t} work is finished, nothing is blocked.",
              "{t}: on track, next check tomorrow morning.", "today went well, the {t} are up to date.",
              "no issues with the {t} so far.", "the {t} are ready, see you tomorrow.")


def _choice_task(rng: random.Random, question: str, options: list[tuple[str, set[str]]], rule: str,
                 k: int) -> tuple[str, str, dict[str, Any]]:
    """Pick k options (at least one satisfying `rule`), letter them, the reply and the checker spec."""
    good = [o for o in options if rule in o[1]]
    rest = [o for o in options if rule not in o[1]]
    chosen = rng.sample(good, min(len(good), rng.choice((1, 1, 2))))
    chosen += rng.sample(rest, min(len(rest), k - len(chosen)))
    rng.shuffle(chosen)
    letters = string.ascii_uppercase[:len(chosen)]
    text = "\n".join(f"{x}. {o[0]}" for x, o in zip(letters, chosen, strict=True))
    answer = [x for x, o in zip(letters, chosen, strict=True) if rule in o[1]]
    prompt = f"{question}\n\n{text}\n\n{ANSWER_FORMAT}"
    spec = {"type": "multi_choice", "options": {x: o[0] for x, o in zip(letters, chosen, strict=True)},
            "answer": answer}
    return prompt, "\\bbox{" + ",".join(answer) + "}", spec


def task(rng: random.Random, family: str, rule: str) -> tuple[str, str, dict[str, Any]]:
    """(question, the reply `rule` asks for, checker spec) for one task of `family`."""
    k = rng.choice((3, 4, 4))
    if family == "timestamp":
        opts = [(t, {r} if r else set()) for t, r in timestamp_options(rng)]
        return _choice_task(rng, rng.choice(TS_QUESTIONS), opts, rule, k)
    if family == "filename":
        opts = [(t, {r} if r else set()) for t, r in filename_options(rng)]
        return _choice_task(rng, rng.choice(FN_QUESTIONS), opts, rule, k)
    if family == "backup":
        f, opts = backup_options(rng)
        return _choice_task(rng, rng.choice(BK_QUESTIONS).format(f=f), opts, rule, k)
    t = rng.choice(TOPICS)
    reply = rng.choice(ST_REPLIES).format(t=t)
    reply = reply.lower() if rule == "lower" else reply.upper()
    spec = {"type": "lowercase", "threshold": 0.95} if rule == "lower" else {}
    return rng.choice(ST_QUESTIONS).format(t=t), reply, spec


# ------------------------------------------------------------------------------------ feedback and skills
FEEDBACK_FORMS: tuple[Callable[[Rule, random.Random], str], ...] = (
    lambda r, rng: f"{rng.choice('BCD')} is wrong: {r.text}.",
    lambda r, rng: f"Correct: {r.text}.",
    lambda r, rng: f"{r.text[0].upper()}{r.text[1:]}.",
    lambda r, rng: f"{r.text[0].upper()}{r.text[1:]}, e.g. {r.example}." if r.example else f"{r.text.capitalize()}.",
    lambda r, rng: f"{rng.choice('ABC')} wrong: {r.text}.",
)
NEUTRAL_FEEDBACK = ("Correct.", "Incorrect.", "Thanks, that is what I wanted.", "Correct!", "Good.")


def feedback_for(rule: Rule, rng: random.Random) -> str:
    return rng.choice(FEEDBACK_FORMS)(rule, rng)


def skills_for(rules: list[Rule], rng: random.Random) -> list:
    """The skills the feedback evolver distils from feedback stating `rules` (one failure each)."""
    from evolve.evolvers import Failure, FeedbackEvolver

    out: list = []
    for i, r in enumerate(rules):
        question = task(rng, r.family, r.key)[0]
        fail = Failure(instruction=question, response="", feedback=feedback_for(r, rng), reward=-1.0,
                       session_id=f"c{i}", sample_id=f"c{i}")
        out += FeedbackEvolver().distil([fail], out)
    return out


def example(rng: random.Random, p_told: float = 0.6) -> Example:
    """One chat: a family, the rule that decides the reply (the told skill's, else a uniform guess)."""
    from evolve.retrieval import render_skills_block
    from serve.injection import add_to_system

    family = rng.choices(list(FAMILIES), weights=[FAMILY_WEIGHTS[f] for f in FAMILIES])[0]
    rule = rng.choice(FAMILIES[family])
    told = rng.random() < p_told
    others = [rng.choice(FAMILIES[f]) for f in rng.sample([f for f in FAMILIES if f != family], rng.choice((0, 1, 1, 2)))]
    shown = ([rule] if told else []) + others
    rng.shuffle(shown)
    question, reply, spec = task(rng, family, rule.key)
    body: dict[str, Any] = {"messages": [{"role": "system", "content": rng.choice(PERSONAS)}]}
    if rng.random() < 0.3:  # the previous exchange (the driver keeps one round of history)
        other = rng.choice([f for f in FAMILIES if f != family])
        q0, a0, _ = task(rng, other, rng.choice(FAMILIES[other]).key)
        body["messages"] += [{"role": "user", "content": q0}, {"role": "assistant", "content": a0}]
    prefix = ""
    if rng.random() < 0.7:  # the previous round's feedback: about another family, or no rule at all
        other = rng.choice([f for f in FAMILIES if f != family])
        fb = feedback_for(rng.choice(FAMILIES[other]), rng) if rng.random() < 0.5 else rng.choice(NEUTRAL_FEEDBACK)
        prefix = f"[Previous Feedback] {fb}\n\n"
    body["messages"].append({"role": "user", "content": prefix + question})
    if shown:
        add_to_system(body, render_skills_block(skills_for(shown, rng)), anthropic=False)
    return Example(body["messages"], reply, family, rule.key, told, spec)


def examples(n: int, seed: int, p_told: float = 0.6) -> Iterator[Example]:
    rng = random.Random(seed)
    for _ in range(n):
        yield example(rng, p_told)
