"""A synthetic corpus that teaches the tiny CPU model to follow rules stated in its prompt (issue 18 item 1).

The bare tiny model has random weights: an injected skill cannot help it, so nothing the loops do shows.
This corpus makes a model that reads rules. Each example is a chat exactly as clawray serves it: a persona
system prompt, possibly the skills block the Proxy appends to it (`serve.injection.add_to_system` of
`evolve.retrieval.render_skills_block` of skills the real feedback evolver distilled from feedback
sentences), a user message that may start with `[Previous Feedback] ...` and possibly the previous exchange
(harness/driver.py keeps one round), and the reply the rule asks for.

What the model is NOT told is which rule a user wants: every task family has several rules in a closed
vocabulary (`FAMILIES`, each rule with the few phrasings feedback uses for it; the workload's feedback
fixes those of the rules it teaches, and the others avoid their key words, e.g. "offset", so that a few
words tell the rules apart), and an example without its
family's rule in the prompt is answered by a rule drawn uniformly, so the bare model can only guess: the
hidden preference that feedback reveals, skills carry, and RL can internalise. Families (the task types of
workloads/clawray-mini): timestamp formats, file names, backing up before editing (multiple choice) and
the casing of status updates and of ticket titles (free text; the two families' rules use the same
words but for their own kind of text, so the model must read the rule of the task's kind).

A multiple-choice reply marks every option first (`A+ B- C+` : matches the rule or not), then boxes the
marked letters (`\\bbox{A,C}`): one decision per option, each a lookup of one option line against the told
rule, is what a 3-layer model learns in minutes; choosing the whole set at once it did not (docs/bench.md).

Two phases (`example(rng, phase=...)`): `short` chats (the skills block and the question only) to learn the
rules fast, then `served` chats in the full served format. Pure and seeded: `examples(n, seed)` returns the
same chats for the same arguments.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

ANSWER_FORMATS = ("Answer using \\bbox{X} or \\bbox{X,Y} format.", "Answer using \\bbox{X} format.")
PERSONAS = (
    "You are a helpful assistant.",
    "You are Rio, the assistant of a small data team in Lisbon. The user is Ana, who leads the team.",
    "You are Pax, an operations assistant for a bakery chain. The user is Tom, the operations manager.",
    "You are Juno, the assistant of a research lab. The user is Dr. Okafor, who runs the lab.",
    "You are Bex, a helpful assistant for a freight forwarder in Rotterdam (UTC+01:00). The user is Lena.",
    "You are Sol, the coordinator bot of a support desk in Perth (UTC+08:00).\n\n\nThe user is Priya, the desk "
    "lead. She wants things done her way.\n",
    "You are Ode, the planning assistant of a shipping office in Manila (UTC+08:00).\n\n\nThe user is Raf, the "
    "office manager. He is strict about formats and expects you to remember what he asked for.\n",
    "You are Taz, the assistant of a warehouse team in Denver (UTC-07:00).\n\n\nThe user is Kim, the shift lead. "
    "She is precise and expects you to remember her preferences.\n",
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
    texts: tuple[str, ...]  # the rule in the closed vocabulary: the phrasings feedback states it in
    example: str = ""  # an illustration some feedback adds ("..., e.g. <example>")


@dataclass
class Example:
    messages: list[dict[str, Any]]  # the chat as the Proxy forwards it (skills block included)
    reply: str  # what the rule asks for
    family: str
    rule: str  # key of the rule that decided the reply
    told: bool  # the rule was in the prompt (a skill of its family)
    spec: dict[str, Any] = field(default_factory=dict)  # the checker spec that scores the reply
    # every earlier assistant reply is as right as `reply` (its family's rule told, or a guess): a trainer
    # may take the loss on them too (more supervised decisions for little more compute)
    history_right: bool = False


FAMILIES: dict[str, tuple[Rule, ...]] = {
    "timestamp": (
        Rule("timestamp", "iso_offset", ("timestamps must be ISO 8601 with a T separator and the +08:00 offset",
                                         "timestamps must use the +08:00 offset, not Z",
                                         "timestamps must include the +08:00 offset",
                                         "timestamps must be ISO 8601 (YYYY-MM-DDTHH:MM:SS+08:00)"),
             "2026-05-05T09:00:00+08:00"),
        Rule("timestamp", "utc_z", ("timestamps must be ISO 8601 in UTC with a Z suffix",
                                    "timestamps must be in UTC and end with the Z suffix",
                                    "timestamps must be ISO 8601 (YYYY-MM-DDTHH:MM:SSZ)"), "2026-05-05T01:00:00Z"),
        Rule("timestamp", "plain", ("timestamps must be written as YYYY-MM-DD HH:MM with a space",
                                    "timestamps must use a space between date and time, no T"),
             "2026-05-05 09:00"),
    ),
    "filename": (
        Rule("filename", "date_snake", ("file names must be YYYYMMDD_snake_case.ext",
                                        "file names must be YYYYMMDD_snake_case.ext, no spaces or capitals",
                                        "file names must start with the date as YYYYMMDD followed by snake_case",
                                        "file names must be YYYYMMDD_snake_case.ext (lowercase snake case)"),
             "20260505_eta_export.csv"),
        Rule("filename", "kebab_date_last", ("file names must be kebab-case with the date YYYY-MM-DD at the end",
                                             "file names must end with the date as YYYY-MM-DD after kebab-case words"),
             "eta-export-2026-05-05.csv"),
        Rule("filename", "title", ("file names must be TitleCase words with no date",
                                   "file names must use TitleCase and never a date"), "EtaExport.csv"),
    ),
    "backup": (
        Rule("backup", "bak_first", ("you must create a .bak backup before modifying a file",
                                     "always create a .bak backup before modifying a file")),
        Rule("backup", "in_place", ("edit files in place and never leave extra copies",
                                    "files must be edited in place directly")),
    ),
    "status": (
        Rule("status", "lower", ("status updates must be written in lowercase only, no capital letters",
                                 "status updates must be all lowercase, never capitals")),
        Rule("status", "upper", ("status updates must be written in uppercase only",
                                 "status updates must be all uppercase, never lowercase")),
    ),
    # The same two cases for another kind of text: which case a reply takes depends on the rule OF ITS KIND
    # (a status rule and a ticket rule are often shown together, in opposite cases).
    "ticket": (
        Rule("ticket", "ticket_upper", ("ticket titles must be written in uppercase only",
                                        "ticket titles must be all uppercase, never lowercase")),
        Rule("ticket", "ticket_lower", ("ticket titles must be written in lowercase only, no capital letters",
                                        "ticket titles must be all lowercase, never capitals")),
    ),
}
RULES = {r.key: r for rules in FAMILIES.values() for r in rules}
CASED = {"status", "ticket"}  # free-text families: the rule decides the case of every letter of the reply
# The cased families carry most of the workload's rounds and are what a 3-layer model learns to read in a
# few hundred steps; multiple choice keeps enough examples for its reply format.
FAMILY_WEIGHTS = {"timestamp": 1, "filename": 1, "backup": 1, "status": 3, "ticket": 3}


# ------------------------------------------------------------------------------------ options
def _moment(rng: random.Random) -> datetime:
    return datetime(2026, 1, 1, 8) + timedelta(days=rng.randrange(365), minutes=15 * rng.randrange(40))


def _clock(d: datetime, rng: random.Random) -> str:
    h = f"{d.hour % 12 or 12}"
    return (h if d.minute == 0 and rng.random() < 0.5 else f"{h}:{d.minute:02d}") + ("am" if d.hour < 12 else "pm")


def timestamp_options(rng: random.Random) -> list[tuple[str, set[str]]]:
    """(text, the rules it satisfies) for one moment in several formats."""
    d = _moment(rng)
    iso = d.strftime("%Y-%m-%dT%H:%M:%S")
    return [(iso + "+08:00", {"iso_offset"}), (iso + ".000+08:00", {"iso_offset"}), (iso + "Z", {"utc_z"}),
            (iso + ".000Z", {"utc_z"}), (d.strftime("%Y-%m-%d %H:%M"), {"plain"}), (iso, set()),
            (d.strftime("%d/%m/%Y ") + _clock(d, rng), set()), (f"{d.day} {d.strftime('%B')} {_clock(d, rng)}", set()),
            (iso + "+01:00", set()), (d.strftime("%Y-%m-%d"), set())]


def filename_options(rng: random.Random) -> list[tuple[str, set[str]]]:
    d = _moment(rng)
    ymd, dash = d.strftime("%Y%m%d"), d.strftime("%Y-%m-%d")
    opts: list[tuple[str, set[str]]] = []
    for _ in range(3):
        w, ext = rng.choice(TOPICS).split(), rng.choice(EXTS)
        cap = [x.capitalize() for x in w]
        opts += [(f"{ymd}_{'_'.join(w)}.{ext}", {"date_snake"}), (f"{'-'.join(w)}-{dash}.{ext}", {"kebab_date_last"}),
                 (f"{''.join(cap)}.{ext}", {"title"}), (f"{' '.join(cap)}.{ext}", set()),
                 (f"{ymd}_{''.join(cap)}.{ext}", set()), (f"{'_'.join(w)}.{ext}", set()),
                 (f"{' '.join(w).upper()} {w[-1]}.{ext}", set()), (f"{dash}-{'-'.join(w)}.{ext}", set())]
    seen: dict[str, set[str]] = {}
    for text, rules in opts:
        seen.setdefault(text, rules)
    return list(seen.items())


def backup_options(rng: random.Random) -> tuple[str, list[tuple[str, set[str]]]]:
    """A file and (action, the rules it satisfies)."""
    f = rng.choice(FILES)
    name = f.rsplit("/", 1)[-1]
    return f, [("Edit it in place right away", {"in_place"}), (f"Copy it to {f}.bak first", {"bak_first"}),
               (f"Create {f}.bak", {"bak_first"}), ("Keep the .bak copy unchanged after editing", {"bak_first"}),
               ("Delete it and write a new one", set()), (f"Rename {name} before editing", set()),
               (f"Open and edit {name}", {"in_place"}), (f"Move {name} to another folder", set())]


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
                "We need to update {f}. How should you go about it? Select all that apply.",
                "I want to change the settings in {f}. What is the right first step?")
ST_QUESTIONS = ("Write a one-line status update for the team channel about the {t}.",
                "Post a short end-of-day note for the team channel.",
                "Give me a one-line status update on the {t}.",
                "Write a short end-of-day note for the team channel.",
                "Send a quick status line about the {t}.")
ST_REPLIES = ("the {t} are done and checked for today.", "all {t} work is finished, nothing is blocked.",
              "{t}: on track, next check tomorrow morning.", "today went well, the {t} are up to date.",
              "no issues with the {t} so far.", "the {t} are ready, see you tomorrow.")
TICKET_TOPICS = ("late shipment from busan", "broken label printer", "missing pallet labels", "rejected customs form",
                 "truck that missed its slot", "duplicate carrier invoices", "scanner dropping barcodes",
                 "cold-chain sensor alarm", "forklift battery fault", "wrong delivery address", "damaged crate at the depot",
                 "expired dock permit")
TK_QUESTIONS = ("Write a ticket title for the {t}.", "Give me a short ticket title about the {t}.",
                "File a ticket for the {t}: what is its title?", "Write a one-line ticket title for the {t}.")
TK_REPLIES = ("{t}", "fix the {t}", "{t} needs a fix", "{t} blocks the team", "urgent: {t}", "{t} reported today")


def choice_reply(marks: list[tuple[str, bool]]) -> str:
    """`A+ B- C+` then the box of the `+` letters: each option marked, then the answer."""
    chosen = [x for x, good in marks if good]
    return " ".join(f"{x}{'+' if good else '-'}" for x, good in marks) + "\n\\bbox{" + ",".join(chosen) + "}"


def _choice_task(rng: random.Random, question: str, options: list[tuple[str, set[str]]], rule: str,
                 k: int) -> tuple[str, str, dict[str, Any]]:
    """Pick k options (at least one satisfying `rule`), letter them, the reply and the checker spec."""
    good = [o for o in options if rule in o[1]]
    rest = [o for o in options if rule not in o[1]]
    single = "Select all" not in question or rng.random() < 0.15
    chosen = rng.sample(good, 1 if single else min(len(good), rng.choice((1, 1, 2))))
    chosen += rng.sample(rest, min(len(rest), k - len(chosen)))
    rng.shuffle(chosen)
    letters = string.ascii_uppercase[:len(chosen)]
    text = "\n".join(f"{x}. {o[0]}" for x, o in zip(letters, chosen, strict=True))
    marks = [(x, rule in o[1]) for x, o in zip(letters, chosen, strict=True)]
    fmt = ANSWER_FORMATS[1] if single and rng.random() < 0.7 else ANSWER_FORMATS[0]
    spec = {"type": "multi_choice", "options": {x: o[0] for x, o in zip(letters, chosen, strict=True)},
            "answer": [x for x, good in marks if good]}
    return f"{question}\n\n{text}\n\n{fmt}", choice_reply(marks), spec


def task(rng: random.Random, family: str, rule: str) -> tuple[str, str, dict[str, Any]]:
    """(question, the reply `rule` asks for, checker spec) for one task of `family`."""
    k = rng.choice((3, 4, 4))
    if family == "timestamp":
        return _choice_task(rng, rng.choice(TS_QUESTIONS), timestamp_options(rng), rule, k)
    if family == "filename":
        return _choice_task(rng, rng.choice(FN_QUESTIONS), filename_options(rng), rule, k)
    if family == "backup":
        f, opts = backup_options(rng)
        return _choice_task(rng, rng.choice(BK_QUESTIONS).format(f=f), opts, rule, k)
    if family == "ticket":
        t = rng.choice(TICKET_TOPICS)
        question, reply = rng.choice(TK_QUESTIONS).format(t=t), rng.choice(TK_REPLIES).format(t=t)
    else:
        t = rng.choice(TOPICS)
        question, reply = rng.choice(ST_QUESTIONS).format(t=t), rng.choice(ST_REPLIES).format(t=t)
    lower = rule in ("lower", "ticket_lower")
    spec = {"type": "lowercase" if lower else "uppercase", "threshold": 0.95}
    return question, reply.lower() if lower else reply.upper(), spec


# ------------------------------------------------------------------------------------ feedback and skills
def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def feedback_for(rule: Rule, rng: random.Random, text: str | None = None) -> str:
    """A feedback sentence stating `rule` (one of its phrasings, or `text`) the way the workloads write it."""
    t = text or rng.choice(rule.texts)
    form = rng.randrange(5)
    if form == 0:
        return f"{rng.choice('BCD')} is wrong: {t}."
    if form == 1:
        return f"Correct: {t}."
    if form == 2 and rule.example:
        return f"{_cap(t)}, e.g. {rule.example}."
    if form == 3:
        return f"{rng.choice('ABC')} wrong: {t}."
    return f"{_cap(t)}."


NEUTRAL_FEEDBACK = ("Correct.", "Incorrect.", "Thanks, that is what I wanted.", "Correct!", "Good.")


def skills_for(rules: list[Rule], rng: random.Random) -> list:
    """The skills the feedback evolver distils from feedback stating `rules` (one failure each; a rule listed
    twice comes back in two phrasings where it has them, as a day of feedback leaves it)."""
    from evolve.evolvers import Failure, FeedbackEvolver

    out: list = []
    used: dict[str, list[str]] = {}
    for i, r in enumerate(rules):
        fresh = [t for t in r.texts if t not in used.setdefault(r.key, [])] or list(r.texts)
        text = rng.choice(fresh)
        used[r.key].append(text)
        fail = Failure(instruction=task(rng, r.family, r.key)[0], response="", feedback=feedback_for(r, rng, text),
                       reward=-1.0, session_id=f"c{i}", sample_id=f"c{i}")
        new = FeedbackEvolver().distil([fail], out)
        out += [s for s in new if s.name not in {x.name for x in out}]
    return out


HISTORY_ROUNDS = (1, 1, 2, 3)  # earlier rounds in a served training chat (when it has any)
P_TOLD = {"short": 0.85, "served": 0.7}  # short chats are for learning to read the rules: most state one


def _draw(rng: random.Random, phase: str) -> tuple[str, Rule, bool]:
    family = rng.choices(list(FAMILIES), weights=[FAMILY_WEIGHTS[f] for f in FAMILIES])[0]
    return family, rng.choice(FAMILIES[family]), rng.random() < P_TOLD[phase]


def example(rng: random.Random, phase: str = "served", told: bool | None = None) -> Example:
    """One chat: a family, the rule that decides the reply (the told skill's, else a uniform guess).

    `short`: a plain persona, the skills block and the question. `served`: the full served format (any
    persona, up to four other families' skills, the previous round's feedback and exchange)."""
    from evolve.retrieval import render_skills_block
    from serve.injection import add_to_system

    family, rule, drawn = _draw(rng, phase)
    told = drawn if told is None else told
    others = [f for f in FAMILIES if f != family]
    n_other = rng.choice((0, 1)) if phase == "short" else rng.choice((0, 1, 2, 3, 3, 4))
    picked = rng.sample(others, n_other)
    twin = next((f for f in CASED if f != family), None) if family in CASED else None
    if twin is not None and twin not in picked and rng.random() < 0.5:  # the other kind's case rule beside it
        picked.append(twin)
    shown = [rng.choice(FAMILIES[f]) for f in picked]
    if told:
        shown += [rule] * (2 if phase == "served" and len(rule.texts) > 1 and rng.random() < 0.25 else 1)
    rng.shuffle(shown)
    question, reply, spec = task(rng, family, rule.key)
    persona = PERSONAS[0] if phase == "short" else rng.choice(PERSONAS)
    body: dict[str, Any] = {"messages": [{"role": "system", "content": persona}]}
    prefix, history = "", False
    # Earlier rounds: other families' tasks, their replies, feedback. The driver sends one (history_rounds);
    # a training chat may hold up to HISTORY_ROUNDS: each reply in it follows its family's told rule (or a
    # guess, as an untold reply does), so each is a target too: several rule decisions per prompt read.
    rounds = rng.choice(HISTORY_ROUNDS) if phase == "served" and rng.random() < 0.75 else 0
    for _ in range(rounds):
        prev = rng.choices(others, weights=[FAMILY_WEIGHTS[f] for f in others])[0]
        prev_rule = next((r for r in shown if r.family == prev), None) or rng.choice(FAMILIES[prev])
        q0, a0, _ = task(rng, prev, prev_rule.key)
        body["messages"] += [{"role": "user", "content": prefix + q0}, {"role": "assistant", "content": a0}]
        # the user is consistent: feedback on a told family's round states that rule (the reply followed it)
        fb_rule = prev_rule if prev_rule in shown else rng.choice(FAMILIES[prev])
        fb = feedback_for(fb_rule, rng) if rng.random() < 0.6 else rng.choice(NEUTRAL_FEEDBACK)
        prefix, history = f"[Previous Feedback] {fb}\n\n", True
    body["messages"].append({"role": "user", "content": prefix + question})
    if shown:
        add_to_system(body, render_skills_block(skills_for(shown, rng)), anthropic=False)
    return Example(body["messages"], reply, family, rule.key, told, spec, history_right=history)


def examples(n: int, seed: int, phase: str = "served") -> Iterator[Example]:
    rng = random.Random(seed)
    for _ in range(n):
        yield example(rng, phase)
