"""Evolvers: failed turns (the support set) -> new or refined skills. Two behind one interface.

- `feedback` (offline, the embedded default): distils the rule-like sentences of the environment's
  own feedback ("must create .bak before modifying") into skills, deterministically. The same lesson
  seen again (in the batch or already in the library) is merged into its one skill, never duplicated.
- `llm`: a failure-analysis prompt to any OpenAI-compatible endpoint through `core.llm.LLMClient`;
  the reply must be a JSON list of skills (validated with pydantic), retried when invalid and rejected
  as a whole (`EvolveError`) rather than half-applied.

Interface: `async evolve(failures, existing) -> list[Skill]`. It is async because `LLMClient.chat` is.
`existing` is the current library: a returned skill whose name is in it is meant as an update of that
skill (the bank decides; same content = a metadata-only merge).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from core.config import EvolverConfig
from core.contracts import Skill
from evolve.text import (
    RULE_WORDS,
    STOPWORDS,
    detect_task_type,
    rule_subject,
    same_lesson,
    topic_tokens,
    words,
)


class EvolveError(RuntimeError):
    """An evolution that produced nothing usable (LLM unreachable, invalid output after retries)."""


@dataclass(frozen=True)
class Failure:
    """One failed main turn with what followed it (the evolver's input)."""

    instruction: str  # the last user message the turn answered
    response: str  # the assistant's reply (text, tool calls rendered)
    feedback: str  # next state: user feedback / tool results / environment feedback
    reward: float  # <= 0
    session_id: str
    sample_id: str
    tenant: str = "default/default"  # "<user>/<workspace>" of the session (the lesson's scope, evolve/scopes.py)


class Evolver(Protocol):
    name: str

    def teaches(self, failure: Failure) -> bool:
        """Whether `failure` carries anything this evolver can learn from. The loop claims only such
        failures as support (a fence blocks training seals while it is open), so a failure that cannot
        teach stays a query sample and opens no fence."""
        ...

    async def evolve(self, failures: list[Failure], existing: Sequence[Skill]) -> list[Skill]:
        ...


# ------------------------------------------------------------------------------------ feedback
_MARKER_RE = re.compile(r"\[[^\]\n]{0,40}feedback[^\]\n]{0,40}\]|^\s*feedback\s*:", re.I | re.M)
# A sentence ends at . ! ? but not at "e.g." / "i.e.": "<rule>, e.g. <example>." is one lesson with its example
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)\s+|\n+|;\s+", re.I)
_RULE_RE = re.compile(
    r"\b(must|should|always|never|required|requires?|needs? to|do not|don'?t|make sure|ensure|"
    r"expected|instead|remember to|avoid)\b", re.I)
_BULLET_RE = re.compile(r"^\s*(?:[-*•>]+|\d+[.)])\s*")
_LEAD_RE = re.compile(r"^(?:(?:you|please|note|hint|error|rule)\b[:,]?\s*)+", re.I)
# The verdict a multi-choice feedback opens with ("B is wrong: <rule>", "Correct: <rule>"): not part of the rule.
_VERDICT_RE = re.compile(
    r"^(?:(?:option\s+)?[A-Z]\s+(?:is\s+)?)?(?:not\s+)?(?:wrong|incorrect|correct|right)\s*[:\-\u2013\u2014,]\s*", re.I)
MERGE_JACCARD = 0.5  # topic-token Jaccard at which two lessons are the same lesson
MAX_LESSON_CHARS = 300
SEEN_CHARS = 120  # the excerpt of the task a feedback skill was learned from
# A multiple-choice option line ("A. text", "B) text"): the question ends where the options begin
_OPTION_LINE_RE = re.compile(r"^\s*[A-Z][.)]\s+\S", re.M)


def extract_lessons(feedback: str) -> list[str]:
    """Rule-like sentences of `feedback`, in order, deduplicated, markers and bullets stripped."""
    text = _MARKER_RE.sub("\n", feedback or "")
    out: list[str] = []
    for raw in _SENTENCE_SPLIT_RE.split(text):
        s = _LEAD_RE.sub("", _VERDICT_RE.sub("", _BULLET_RE.sub("", raw).strip())).rstrip(".!;:, ").strip()
        if 8 <= len(s) <= MAX_LESSON_CHARS and _RULE_RE.search(s) and topic_tokens(s) and s not in out:
            out.append(s)
    return out


def excerpt(text: str, n: int = 240) -> str:
    one = " ".join((text or "").split())
    return one if len(one) <= n else one[: n - 1] + "…"


def task_question(instruction: str) -> str:
    """The question of a task as a skill may quote it: without the `[Previous Feedback] ...` paragraph a
    driver puts in front of it (the previous round's feedback, often another task's rule) and without its
    option lines and what follows them (the options of one task are wrong in every other one)."""
    text = (instruction or "").lstrip()
    if _MARKER_RE.match(text):
        text = text.split("\n\n", 1)[1] if "\n\n" in text else ""
    first = _OPTION_LINE_RE.search(text)
    return (text[:first.start()] if first else text).strip()


def lesson_slug(lesson: str) -> str:
    kept = [w for w in words(lesson) if w not in STOPWORDS and w not in RULE_WORDS][:6]
    name = "-".join(kept)[:64].strip("-")
    while len(name) > 64 or (name and not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,63}", name)):
        name = name[:-1].strip("-")
    return name if len(name) >= 2 else "lesson"


def lesson_category(lesson: str, instruction: str) -> str:
    """The category a lesson is filed under (template retrieval injects it into requests of that category;
    "general" ones into every request): by the task keywords of the lesson and of the task it was learned
    in. A lesson that names what it is about but has no task keyword ("status updates must be written in
    lowercase only") is general: the incidental words of the one task it came from ("... on the config
    change") would file it under file_operations, where the status updates it is about never find it."""
    if detect_task_type(lesson) is None and rule_subject(lesson):
        return "general"
    return detect_task_type(f"{lesson} {instruction}") or "general"


class FeedbackEvolver:
    """Deterministic lesson distiller (no model). Skills carry `metadata.lesson` and `occurrences`."""

    name = "feedback"

    def teaches(self, failure: Failure) -> bool:
        """Only feedback with a rule-like sentence teaches (a single-turn session has no next state)."""
        return bool(extract_lessons(failure.feedback))

    async def evolve(self, failures: list[Failure], existing: Sequence[Skill]) -> list[Skill]:
        return self.distil(failures, existing)

    def distil(self, failures: list[Failure], existing: Sequence[Skill]) -> list[Skill]:
        """Synchronous core of `evolve` (pure: same input, same output)."""
        clusters: list[tuple[str, list[Failure]]] = []
        for f in failures:
            for lesson in extract_lessons(f.feedback):
                for first, members in clusters:
                    if same_lesson(lesson, first, MERGE_JACCARD):
                        if f not in members:
                            members.append(f)
                        break
                else:
                    clusters.append((lesson, [f]))
        learned = [s for s in existing if isinstance(s.metadata.get("lesson"), str)]
        taken = {s.name for s in existing}
        out: list[Skill] = []
        for lesson, members in clusters:
            match = next((s for s in learned if same_lesson(lesson, s.metadata["lesson"], MERGE_JACCARD)), None)
            skill = self._merge(match, members) if match else self._new(lesson, members, taken)
            taken.add(skill.name)
            out.append(skill)
        return out

    @staticmethod
    def _merge(skill: Skill, members: list[Failure]) -> Skill:
        """The same skill (content unchanged) with the new occurrences counted."""
        meta = dict(skill.metadata)
        meta["occurrences"] = int(meta.get("occurrences") or 1) + len(members)
        meta["origin_sessions"] = sorted({f.session_id for f in members})
        return skill.model_copy(update={"metadata": meta})

    @staticmethod
    def _new(lesson: str, members: list[Failure], taken: set[str]) -> Skill:
        first = members[0]
        name = lesson_slug(lesson)
        if name in taken:  # a different lesson already owns the name: make it unique, stably
            name = f"{name[:57].rstrip('-')}-{hashlib.sha1(lesson.encode()).hexdigest()[:6]}"
        rule = lesson[0].upper() + lesson[1:]
        category = lesson_category(lesson, first.instruction)
        # Injected into every matching turn, so brief: the rule once (the description is what retrieval
        # and the block's heading show) and the task it was learned from; the feedback stays in metadata.
        seen = excerpt(task_question(first.instruction), SEEN_CHARS)
        body = f"- **Rule:** {rule}." + (f"\n- **Seen in the task:** \"{seen}\"" if seen else "")
        return Skill(
            name=name,
            description=f"{rule}."[:1024],
            category=category,
            body=body,
            metadata={"lesson": lesson, "occurrences": len(members), "feedback": first.feedback[:1000],
                      "origin_sessions": sorted({f.session_id for f in members})},
        )


# ------------------------------------------------------------------------------------ llm
SkillName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{1,63}$")]


class SkillDraft(BaseModel):
    """One skill as the LLM must write it."""

    model_config = ConfigDict(extra="forbid")
    name: SkillName
    description: str = Field(min_length=10, max_length=1024)
    category: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,39}$")] = "general"
    body: str = Field(min_length=1, max_length=8000)


_DRAFTS = TypeAdapter(list[SkillDraft])
_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)

SYSTEM_PROMPT = """You improve an AI agent by writing skills: short, reusable instructions that would have \
prevented the failures you are shown. Each skill is a JSON object with keys:
  "name": lowercase slug, letters/digits/hyphens, 2-64 chars (e.g. "backup-before-editing"),
  "description": one or two sentences saying what the skill is and when it applies,
  "category": one of general, coding, file_operations, data_analysis, research, productivity, security,
              communication, automation, agentic, common_mistakes,
  "body": Markdown with the concrete steps or rules, and a short example.
Write a skill only for a lesson that generalises beyond the single task. Do not repeat an existing \
skill; to refine one, reuse its exact name and give the full improved skill.
Reply with ONLY a JSON list of such objects (an empty list [] if there is nothing to learn)."""


def parse_skill_list(text: str, max_skills: int) -> list[Skill]:
    """The skills in an LLM reply: a JSON list, optionally inside a ``` fence. Raises ValueError."""
    m = _FENCE_RE.search(text)
    raw = m.group(1) if m else text
    start, end = raw.find("["), raw.rfind("]")
    if start < 0 or end < start:
        raise ValueError("no JSON list found in the reply")
    try:
        data = json.loads(raw[start: end + 1])
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    try:
        drafts = _DRAFTS.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"invalid skill list at {where or 'top level'}: {first['msg']}") from None
    if len(drafts) > max_skills:
        raise ValueError(f"{len(drafts)} skills; at most {max_skills} allowed")
    names = [d.name for d in drafts]
    if len(set(names)) != len(names):
        raise ValueError("the same name appears twice in the list")
    return [Skill(**d.model_dump(), metadata={"source": "llm"}) for d in drafts]


def failure_prompt(failures: list[Failure], existing: Sequence[Skill], max_existing: int = 100,
                   max_chars: int = 1500) -> str:
    """The user message: the failures with their feedback, then the existing skill names."""
    parts = [f"{len(failures)} failed turn(s) of the agent follow.\n"]
    for i, f in enumerate(failures, 1):
        parts.append(f"## Failure {i} (reward {f.reward:g})\n### Instruction\n{f.instruction[:max_chars]}\n"
                     f"### Agent response\n{f.response[:max_chars]}\n"
                     f"### What followed (feedback, tool results)\n{(f.feedback or '(none)')[:max_chars]}\n")
    names = [f"- {s.name}: {s.description[:120]}" for s in existing[:max_existing]]
    more = len(existing) - len(names)
    parts.append("## Existing skills\n" + ("\n".join(names) if names else "(none)")
                 + (f"\n(and {more} more)" if more > 0 else ""))
    parts.append("\nWrite the JSON list of skills now.")
    return "\n".join(parts)


class LLMEvolver:
    """Failure analysis by an OpenAI-compatible model. All-or-nothing: a reply that is not a fully
    valid skill list is retried (`max_attempts` in all) with the validation error, then rejected."""

    name = "llm"

    def __init__(self, client: Any, max_attempts: int = 3, max_skills: int = 5,
                 temperature: float = 0.2, max_tokens: int = 2048):
        self.client = client  # core.llm.LLMClient or anything with its async `chat`
        self.max_attempts, self.max_skills = max_attempts, max_skills
        self.temperature, self.max_tokens = temperature, max_tokens

    def teaches(self, failure: Failure) -> bool:
        """The model analyses any failure: the instruction and the rejected reply are evidence enough."""
        return True

    async def evolve(self, failures: list[Failure], existing: Sequence[Skill]) -> list[Skill]:
        from evolve.llm_json import InvalidReplies, ask_valid

        if not failures:
            return []
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": failure_prompt(failures, existing)}]
        try:
            return await ask_valid(self.client, messages, lambda r: parse_skill_list(r, self.max_skills),
                                   attempts=self.max_attempts, what="llm evolver", expected="skill list",
                                   temperature=self.temperature, max_tokens=self.max_tokens)
        except InvalidReplies as e:
            raise EvolveError(f"llm evolver: {e}") from e


# ------------------------------------------------------------------------------------ registry
EVOLVERS: dict[str, Callable[[EvolverConfig, Any], Evolver]] = {
    "feedback": lambda cfg, client: FeedbackEvolver(),
    "llm": lambda cfg, client: LLMEvolver(client if client is not None else _client(cfg)),
}


def _client(cfg: EvolverConfig) -> Any:
    from core.llm import LLMClient  # imported here: the feedback evolver needs no LLM stack

    assert cfg.llm is not None  # EvolverConfig validates this for kind == "llm"
    return LLMClient(cfg.llm)


def make_evolver(cfg: EvolverConfig, client: Any = None) -> Evolver:
    """The evolver `cfg.kind` names; `client` replaces the LLMClient (tests). Unknown names list valid."""
    if cfg.kind not in EVOLVERS:
        raise ValueError(f"unknown evolver {cfg.kind!r}; valid: {', '.join(sorted(EVOLVERS))}")
    return EVOLVERS[cfg.kind](cfg, client)
