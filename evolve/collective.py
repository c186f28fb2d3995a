"""Collective evolution as pure functions: sessions of many users -> per-skill groups -> decisions.

SkillClaw's loop, deterministic and offline (an LLM decider may replace `decide`, evolve/collective_llm.py):
1. `summarise` turns each session's evidence rows into a `SessionSummary`: skills used (injected or
   touched through tools), turns, failures, mean reward, the rule-like lessons of its feedback, and a
   one-paragraph trajectory summary.
2. `group_by_skill` puts each session into the group of every skill it used, and sessions that used none
   into the `NO_SKILL` group.
3. `decide` picks, per group, one of
   - `refine`: failures of sessions that used the skill carry a lesson the skill does not state yet:
     the candidate keeps the whole body (successful sessions are evidence that it works) and appends the
     new rules under "Refinements";
   - `create`: sessions that used no skill share a lesson (in at least `min_sessions` sessions, or one
     session with `min_sessions` failures of it) that no global skill states: a new global skill for that
     need (users' private lessons, evolve/scopes.py, are what it shares);
   - `optimize_description`: the skill helped where its topic matched and was injected into sessions
     about something else that failed without any lesson for it: the description is narrowed to the
     topics of the sessions where it worked, so retrieval serves it for the right tasks;
   - `skip`, with the reason.
   Every decision carries a written edit summary (kept / changed / why) and its evidence (sessions,
   counts, mean reward).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from core.contracts import Skill
from evolve.evidence import Evidence
from evolve.evolvers import excerpt, extract_lessons, lesson_slug, task_question
from evolve.scopes import GLOBAL, scope_of
from evolve.text import STOPWORDS, detect_task_type, jaccard, topic_tokens, words

NO_SKILL = ""  # the group of sessions that used no skill
Action = Literal["refine", "create", "optimize_description", "skip", "promote"]
REFINEMENTS = "## Refinements"
# Topic-token Jaccard at which a lesson is the same lesson (clustered) or already stated by a skill. Higher
# than the fast loop's MERGE_JACCARD: "prefer option C for backups" and "prefer option D for dates" share 3
# of 5 topic words and are different lessons; a refinement must not be dropped as "already said".
SAME_LESSON = 0.7
RELEVANT_JACCARD = 0.08  # topic overlap of a task and a skill below which the skill was off-topic


@dataclass
class SessionSummary:
    session_id: str
    tenant: str
    used: list[str]
    turns: int
    failures: int
    mean_reward: float
    lessons: list[str]
    instructions: list[str]
    summary: str
    rows: list[Evidence] = field(default_factory=list, repr=False)

    @property
    def succeeded(self) -> bool:
        return self.failures == 0 and self.turns > 0


@dataclass
class Decision:
    group: str  # the skill name, or NO_SKILL
    action: Action
    summary: str  # the edit summary: what was kept, what changed, why
    candidate: Skill | None = None
    base_version: int = 0  # the version the candidate was made from (0: a new skill)
    evidence: dict[str, Any] = field(default_factory=dict)


def summarise(session_id: str, rows: Sequence[Evidence]) -> SessionSummary:
    """One session's trajectory, deterministically (same rows, same summary)."""
    rows = sorted(rows, key=lambda e: (e.turn_index, e.created_at))
    used = list(dict.fromkeys(s for e in rows for s in e.used))
    failures = sum(e.failed for e in rows)
    lessons = list(dict.fromkeys(lesson for e in rows if e.failed for lesson in extract_lessons(e.feedback)))
    mean = sum(e.reward for e in rows) / len(rows) if rows else 0.0
    first = excerpt(rows[0].instruction, 120) if rows else ""
    text = (f"{len(rows)} turn(s), {failures} failed, mean reward {mean:.2f}; "
            f"skills used: {', '.join(used) or 'none'}; started with \"{first}\"")
    if lessons:
        text += "; feedback taught: " + "; ".join(excerpt(x, 100) for x in lessons[:3])
    return SessionSummary(session_id, rows[0].tenant if rows else "default", used, len(rows), failures, mean,
                          lessons, [e.instruction for e in rows], text, list(rows))


def summarise_all(rows: Iterable[Evidence]) -> list[SessionSummary]:
    by: dict[str, list[Evidence]] = {}
    for e in rows:
        by.setdefault(e.session_id, []).append(e)
    return [summarise(s, r) for s, r in sorted(by.items())]


def group_by_skill(sessions: Iterable[SessionSummary], known: Iterable[str] | None = None) -> dict[str, list[SessionSummary]]:
    """skill name -> sessions that used it; NO_SKILL -> sessions that used none (of `known`, when given:
    a skill removed since is no group)."""
    names = None if known is None else set(known)
    groups: dict[str, list[SessionSummary]] = {}
    for s in sessions:
        used = [u for u in s.used if names is None or u in names]
        for name in used or [NO_SKILL]:
            groups.setdefault(name, []).append(s)
    return dict(sorted(groups.items()))


def stated_lessons(skill: Skill) -> list[str]:
    """What a skill already says: its learned lesson, its description and its body's lines."""
    lines = [skill.description, *skill.body.splitlines()]
    lesson = skill.metadata.get("lesson")
    if isinstance(lesson, str):
        lines.append(lesson)
    return [x for x in lines if topic_tokens(x)]


def _covered(lesson: str, stated: Sequence[str]) -> bool:
    toks = topic_tokens(lesson)
    return any(jaccard(toks, topic_tokens(x)) >= SAME_LESSON for x in stated)


def _clusters(sessions: Sequence[SessionSummary]) -> list[tuple[str, list[SessionSummary], int]]:
    """Lessons of failed turns clustered by topic: (lesson, sessions that taught it, failures teaching it)."""
    clusters: list[tuple[str, frozenset[str], list[SessionSummary], list[int]]] = []
    for s in sessions:
        for e in s.rows:
            if not e.failed:
                continue
            for lesson in extract_lessons(e.feedback):
                toks = topic_tokens(lesson)
                for _, ctoks, members, count in clusters:
                    if jaccard(toks, ctoks) >= SAME_LESSON:
                        if s not in members:
                            members.append(s)
                        count[0] += 1
                        break
                else:
                    clusters.append((lesson, toks, [s], [1]))
    return [(lesson, members, count[0]) for lesson, _, members, count in clusters]


def _evidence(sessions: Sequence[SessionSummary]) -> dict[str, Any]:
    n = sum(s.turns for s in sessions)
    return {"sessions": [s.session_id for s in sessions], "tenants": sorted({s.tenant for s in sessions}),
            "turns": n, "failures": sum(s.failures for s in sessions),
            "succeeded_sessions": sum(s.succeeded for s in sessions),
            "mean_reward": round(sum(s.mean_reward * s.turns for s in sessions) / n, 4) if n else 0.0}


def decide(group: str, sessions: Sequence[SessionSummary], library: Sequence[Skill], *,
           min_sessions: int = 2) -> Decision:
    """The decision for one group (module docstring). `library` is the current library."""
    ev = _evidence(sessions)
    by_name = {s.name: s for s in library}
    if group == NO_SKILL:
        return _create(sessions, library, ev, min_sessions)
    skill = by_name.get(group)
    if skill is None:
        return Decision(group, "skip", f"skip: skill {group!r} is no longer in the library", evidence=ev)
    version = int(skill.metadata.get("version") or 1)
    stated = stated_lessons(skill)
    new = [(lesson, members, n) for lesson, members, n in _clusters(sessions) if not _covered(lesson, stated)]
    if new:
        return _refine(skill, version, new, sessions, ev)
    return _optimise(skill, version, sessions, ev)


def _create(sessions: Sequence[SessionSummary], library: Sequence[Skill], ev: dict[str, Any],
            min_sessions: int) -> Decision:
    # Only what everyone is served counts as covered: a lesson several users' private skills state (the
    # fast loop's, evolve/scopes.py) is exactly what collective evolution shares, through the gate.
    stated = [x for s in library if scope_of(s) == GLOBAL for x in stated_lessons(s)]
    for lesson, members, count in sorted(_clusters(sessions), key=lambda c: (-len(c[1]), -c[2], c[0])):
        if _covered(lesson, stated):
            continue
        if len(members) < min_sessions and count < min_sessions:
            continue
        taken = {s.name for s in library}
        name = lesson_slug(lesson)
        if name in taken:
            name = f"{name[:57].rstrip('-')}-{hashlib.sha1(lesson.encode()).hexdigest()[:6]}"
        rule = lesson[0].upper() + lesson[1:]
        instr = members[0].instructions[0] if members[0].instructions else ""
        body = "\n".join([f"# {name.replace('-', ' ').capitalize()}", "", f"- **Rule:** {rule}.",
                          f"- **Why:** {count} failed turn(s) in {len(members)} session(s) of "
                          f"{len({m.tenant for m in members})} user(s) were corrected this way.",
                          f"- **Seen in the task:** \"{excerpt(task_question(instr))}\""])
        skill = Skill(name=name, description=f"{rule}. (Learned from several users' sessions.)"[:1024],
                      category=detect_task_type(f"{lesson} {instr}") or "general", body=body,
                      metadata={"lesson": lesson, "source": "collective", "scope": GLOBAL})
        ev = {**ev, "lesson_sessions": [m.session_id for m in members], "lesson_failures": count}
        summary = (f"create {name!r}: no skill covers \"{excerpt(lesson, 120)}\", which corrected {count} "
                   f"failed turn(s) in {len(members)} session(s); nothing existing was changed")
        return Decision(NO_SKILL, "create", summary, skill, 0, ev)
    return Decision(NO_SKILL, "skip", "skip: the sessions without a skill share no recurring lesson that no "
                    f"skill states yet (min_sessions {min_sessions})", evidence=ev)


def _refine(skill: Skill, version: int, new: list[tuple[str, list[SessionSummary], int]],
            sessions: Sequence[SessionSummary], ev: dict[str, Any]) -> Decision:
    rules = [lesson[0].upper() + lesson[1:] for lesson, _, _ in new]
    body = skill.body.rstrip()
    if REFINEMENTS not in body:
        body += f"\n\n{REFINEMENTS}"
    body += "".join(f"\n- {r}." for r in rules)
    cand = skill.model_copy(update={"body": body, "metadata": {**skill.metadata, "source": "collective"}})
    ok = ev["succeeded_sessions"]
    summary = (f"refine {skill.name!r} (v{version}): kept the description and the whole body "
               f"({ok} of {len(sessions)} session(s) using it succeeded); added {len(rules)} rule(s): "
               + "; ".join(f"\"{excerpt(r, 100)}\"" for r in rules)
               + f"; why: {sum(n for _, _, n in new)} failed turn(s) using it were corrected this way")
    ev = {**ev, "added_rules": rules}
    return Decision(skill.name, "refine", summary, cand, version, ev)


def _topic(texts: Iterable[str], n: int = 6) -> list[str]:
    counts = Counter(w for t in texts for w in dict.fromkeys(words(t)) if w not in STOPWORDS and len(w) > 2)
    return [w for w, _ in counts.most_common(n)]


def _optimise(skill: Skill, version: int, sessions: Sequence[SessionSummary], ev: dict[str, Any]) -> Decision:
    toks = topic_tokens(" ".join(stated_lessons(skill)))

    def relevant(s: SessionSummary) -> bool:
        return jaccard(topic_tokens(" ".join(s.instructions)), toks) >= RELEVANT_JACCARD

    helped = [s for s in sessions if s.succeeded and relevant(s)]
    off = [s for s in sessions if not s.succeeded and not relevant(s) and not s.lessons]
    if not helped or not off:
        return Decision(skill.name, "skip", f"skip {skill.name!r}: nothing new to learn "
                        f"({ev['succeeded_sessions']} of {len(sessions)} session(s) succeeded, mean reward "
                        f"{ev['mean_reward']:.2f}, no uncovered lesson)", evidence=ev)
    topics = _topic(x for s in helped for x in s.instructions)
    base = skill.description.split(" Use for tasks about:")[0].rstrip()
    desc = f"{base} Use for tasks about: {', '.join(topics)}."[:1024]
    if desc == skill.description:
        return Decision(skill.name, "skip", f"skip {skill.name!r}: its description already names the "
                        "topics it helps with", evidence=ev)
    cand = skill.model_copy(update={"description": desc})
    summary = (f"optimize the description of {skill.name!r} (v{version}): kept the body; it helped in "
               f"{len(helped)} on-topic session(s) and was injected into {len(off)} off-topic one(s) that "
               f"failed; the description now names its topics: {', '.join(topics)}")
    return Decision(skill.name, "optimize_description", summary, cand, version,
                    {**ev, "helped_sessions": [s.session_id for s in helped],
                     "off_topic_sessions": [s.session_id for s in off]})
