"""The offline extractor: deterministic rules over what the user said (CPU runs, tests, no LLM configured).

Per sentence of each user message (code blocks and questions skipped), the first rule that matches
proposes one unit; first-person wording is rewritten to the third person ("my editor" -> "the user's
editor") because the unit is read later, by the assistant, about the user:

- "remember (that) X"                          -> semantic (workspace), or X's own rule when it has one
- "<thing> is done|blocked|deployed|..."       -> project_state, slot "status of <thing>"
- "next step / todo / deadline / status: X"    -> project_state, slot of that name
- "we finished|shipped|merged ... X"           -> project_state
- "my <attr> is <value>" (and "I am a/an X", "I work at X", "I live in X", "call me X")
                                               -> semantic, slot <attr>; personal attributes are user
                                                  scope, others workspace; "my preferred/favourite X is Y"
                                                  is a preference
- "I prefer|like|love|hate|want ... X"         -> preference (user)
- "always|never|from now on|avoid ..."         -> preference (user): a standing instruction
- "I use|we use X"                             -> semantic (workspace)

Per batch, one episodic unit ("On <date> the user asked: ..."); per session, a rolling working summary
(slot "summary", so each new one supersedes the last: history kept).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from memory.store import InboxEntry
from memory.text import first_sentence
from memory.units import Candidate, Kind, Level

MAX_SENTENCE_CHARS = 300
MAX_VALUE_CHARS = 200
SUMMARY_TOPICS = 6  # user requests a working summary lists (the most recent ones)
PERSONAL = frozenset({"name", "first name", "last name", "email", "email address", "timezone", "time zone",
                      "location", "city", "country", "role", "job", "job title", "title", "pronouns",
                      "birthday", "native language", "language", "phone", "phone number", "company",
                      "employer", "team", "manager", "handle", "username", "editor", "ide", "shell", "os",
                      "operating system", "keyboard layout"})
STATES = ("done|finished|complete|completed|blocked|in progress|on hold|deployed|merged|shipped|released|"
          "broken|failing|passing|fixed|ready|pending|paused|cancelled|canceled|live|in review")
_FIRST_PERSON = [(re.compile(p, f), r) for p, r, f in (
    (r"\bI am\b", "the user is", 0), (r"\bI'm\b", "the user is", 0), (r"\bI've\b", "the user has", 0),
    (r"\bI'd\b", "the user would", 0), (r"\bI'll\b", "the user will", 0), (r"\bI\b", "the user", 0),
    (r"\bmy\b", "the user's", re.I), (r"\bmine\b", "the user's", re.I), (r"\bmyself\b", "the user", re.I),
    (r"\bme\b", "the user", re.I), (r"\byou\b", "the assistant", re.I), (r"\byour\b", "the assistant's", re.I),
)]
_VERB3 = {"prefer": "prefers", "like": "likes", "love": "loves", "enjoy": "enjoys", "hate": "hates",
          "dislike": "dislikes", "want": "wants", "need": "needs", "don't like": "does not like",
          "do not like": "does not like", "can't stand": "cannot stand"}


def third_person(text: str) -> str:
    for pat, repl in _FIRST_PERSON:
        text = pat.sub(repl, text)
    return text


def _clean(value: str) -> str:
    value = value.strip().rstrip(".!;,: ").strip()
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1].rstrip() + "…"


def _sentence(text: str) -> str:
    text = _clean(text)
    return text[:1].upper() + text[1:] + "." if text else ""


def _cand(kind: Kind, content: str, level: Level, confidence: float, key: str | None = None) -> Candidate:
    return Candidate(kind=kind, content=content, level=level, confidence=confidence, key=key)


# ---- rules: (sentence) -> Candidate | None; the first that matches wins --------------------------------
def _remember(s: str) -> Candidate | None:
    m = re.match(r"(?:please\s+)?(?:remember|note|keep in mind)\s*(?:that\s+|:\s*)?(?P<x>.+)", s, re.I)
    if not m:
        return None
    inner = _first_match(m.group("x"), RULES[1:])
    if inner is not None:
        return inner.model_copy(update={"confidence": max(inner.confidence, 0.9)})
    return _cand(Kind.semantic, _sentence(third_person(m.group("x"))), Level.workspace, 0.9)


def _state(s: str) -> Candidate | None:
    m = re.match(rf"(?:the\s+|our\s+|my\s+)?(?P<s>\w[\w .\-/#]{{0,60}}?)\s+(?:is|are|was|has been|have been)\s+"
                 rf"(?:now\s+|finally\s+|still\s+)?(?P<st>(?:{STATES})\b.*)", s, re.I)
    if not m:
        return None
    subject = _clean(m.group("s"))
    return _cand(Kind.project_state, _sentence(f"{third_person(subject)} is {third_person(m.group('st'))}"),
                 Level.workspace, 0.75, key=f"status of {subject}")


def _labelled(s: str) -> Candidate | None:
    m = re.match(r"(?:the\s+|our\s+|my\s+)?(?P<k>next steps?|todo|to-do|status|deadline|blocker|current task|"
                 r"goal)\s*(?:is|are|:)\s*(?P<x>.+)", s, re.I)
    if not m:
        return None
    label = m.group("k").lower().replace("next steps", "next step").replace("to-do", "todo")
    return _cand(Kind.project_state, _sentence(f"{label}: {third_person(m.group('x'))}"), Level.workspace,
                 0.75, key=label)


def _did(s: str) -> Candidate | None:
    m = re.match(r"(?:we|i)\s+(?:just\s+|have\s+|'ve\s+|finally\s+)?(?P<v>finished|completed|shipped|deployed|"
                 r"merged|released|started|fixed|migrated)\s+(?P<x>.+)", s, re.I)
    if not m:
        return None
    return _cand(Kind.project_state, _sentence(f"the user {m.group('v').lower()} {third_person(m.group('x'))}"),
                 Level.workspace, 0.7)


def _slot(s: str) -> Candidate | None:
    m = re.match(r"(?:and\s+|also\s+|btw,?\s+)?my\s+(?P<k>[a-z][\w \-]{0,40}?)\s+(?:is|are|=)\s+(?P<v>.+)", s, re.I)
    if m and not re.match(r"not\b", m.group("v"), re.I):
        attr, value = " ".join(m.group("k").lower().split()), _clean(m.group("v"))
        if re.match(r"(preferred|favou?rite)\b", attr):
            return _cand(Kind.preference, _sentence(f"the user's {attr} is {value}"), Level.user, 0.8, attr)
        level = Level.user if attr in PERSONAL else Level.workspace
        return _cand(Kind.semantic, _sentence(f"the user's {attr} is {value}"), level, 0.8, attr)
    for pattern, attr, verb in ((r"(?:i am|i'm)\s+(?P<v>(?:a|an)\s+.+)", "role", "is"),
                                (r"(?:i|we)\s+work\s+(?:at|for)\s+(?P<v>.+)", "employer", "works at"),
                                (r"(?:i|we)\s+live\s+in\s+(?P<v>.+)", "location", "lives in"),
                                (r"call me\s+(?P<v>.+)", "name", "is called")):
        m = re.match(pattern, s, re.I)
        if m:
            return _cand(Kind.semantic, _sentence(f"the user {verb} {_clean(m.group('v'))}"), Level.user, 0.8, attr)
    return None


def _likes(s: str) -> Candidate | None:
    m = re.match(r"(?:i|we)\s+(?:really\s+|strongly\s+|generally\s+|usually\s+|always\s+)?(?P<v>prefer|like|"
                 r"love|enjoy|hate|dislike|want|need|don't like|do not like|can't stand)\s+(?P<x>.+)", s, re.I)
    if not m:
        return None
    verb = _VERB3[m.group("v").lower()]
    return _cand(Kind.preference, _sentence(f"the user {verb} {third_person(m.group('x'))}"), Level.user, 0.8)


def _instruction(s: str) -> Candidate | None:
    if not re.match(r"(?:please\s+)?(?:always|never|from now on|don't ever|do not ever|avoid)\b", s, re.I):
        return None
    return _cand(Kind.preference, f"Standing instruction from the user: {_clean(third_person(s))}.",
                 Level.user, 0.8)


def _uses(s: str) -> Candidate | None:
    m = re.match(r"(?:i|we)\s+(?:mostly\s+|mainly\s+)?use\s+(?P<x>.+)", s, re.I)
    if not m:
        return None
    return _cand(Kind.semantic, _sentence(f"the user uses {third_person(m.group('x'))}"), Level.workspace, 0.7)


RULES: list[Callable[[str], Candidate | None]] = [_remember, _state, _labelled, _did, _slot, _likes,
                                                  _instruction, _uses]


def _first_match(sentence: str, rules: Sequence[Callable[[str], Candidate | None]]) -> Candidate | None:
    for rule in rules:
        cand = rule(sentence)
        if cand is not None:
            return cand
    return None


def sentences(text: str) -> list[str]:
    """Sentences of a user message worth reading: code blocks, questions and very long ones dropped."""
    text = re.sub(r"```.*?(```|$)", " ", text, flags=re.S)
    out = []
    for part in re.split(r"(?<=[.!?])\s+|\n+", text):
        s = part.strip().lstrip("-*• ").strip()
        if 6 <= len(s) <= MAX_SENTENCE_CHARS and not s.endswith("?"):
            out.append(s)
    return out


def extract_facts(entries: Sequence[InboxEntry]) -> list[Candidate]:
    """Rule-based candidates from the user messages of `entries` (in order; duplicates kept: the
    consolidation step merges them)."""
    out = []
    for e in entries:
        for text in e.user_texts:
            for s in sentences(text):
                cand = _first_match(s, RULES)
                if cand is not None:
                    out.append(cand.model_copy(update={"source_turns": [e.turn_id]}))
    return out


def _asks(entries: Sequence[InboxEntry]) -> list[str]:
    return [first_sentence(t, 80) for e in entries for t in e.user_texts if t.strip()]


def episode(entries: Sequence[InboxEntry]) -> Candidate | None:
    """One episodic unit for a batch: when, and what the user asked (first three requests)."""
    asks = _asks(entries)
    if not asks:
        return None
    day = time.strftime("%Y-%m-%d", time.gmtime(entries[0].created_at))
    more = f" (and {len(asks) - 3} more)" if len(asks) > 3 else ""
    return Candidate(kind=Kind.episodic, level=Level.workspace, confidence=0.5,
                     content=f"On {day} the user asked: " + "; ".join(asks[:3]) + more,
                     source_turns=[e.turn_id for e in entries])


def working_summary(entries: Sequence[InboxEntry], previous: str | None, turns_so_far: int) -> Candidate | None:
    """The session's rolling summary: its previous topics plus this batch's, the latest SUMMARY_TOPICS."""
    asks = _asks(entries)
    if not asks:
        return None
    old = previous.split(" Topics: ", 1)[1].split(" | ") if previous and " Topics: " in previous else []
    topics = [t for t in [*old, *asks] if t][-SUMMARY_TOPICS:]
    return Candidate(kind=Kind.working_summary, level=Level.session, confidence=0.6, key="summary",
                     content=f"Session so far ({turns_so_far} turns). Topics: " + " | ".join(topics),
                     source_turns=[e.turn_id for e in entries])


class OfflineExtractor:
    """The deterministic extractor (see the module docstring). `async` like the LLM extractor."""

    name = "offline"

    async def extract(self, entries: Sequence[InboxEntry]) -> list[Candidate]:
        out = extract_facts(entries)
        ep = episode(entries)
        return [*out, ep] if ep is not None else out
