"""Pure text helpers shared by retrieval (template mode) and the feedback evolver.

No I/O, no Ray, no model: tokenising, a crude stemmer, keyword task-type detection (MetaClaw's
`template` retrieval) and token-set similarity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_WORD_RE = re.compile(r"[a-z0-9]+")

STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from into onto as is are was were be
    been being it its this that these those there here you your we our they their i me my he she his her
    them us do does did done so not no nor can could would will shall may might than too very just also
    about after all any each both few more most other some such only own same what which who whom when
    where why how out over under up down again further once please""".split()
)

# Words that mark a sentence as a rule ("must", "never", ...). They carry no topic, so they are
# dropped from lesson keys and names (see evolvers.FeedbackEvolver).
RULE_WORDS = frozenset(
    """must should always never required require requires need needs ensure make sure don t dont
    expected instead forgot forgotten missing remember avoid""".split()
)

# Task types for `template` retrieval. Category names follow MetaClaw's SKILL.md categories, plus
# `file_operations` for agent workspaces (edit/back up/rename files). Single words are matched as stems,
# phrases as substrings of the lowercased text.
TASK_KEYWORDS: dict[str, tuple[str, ...]] = {
    "file_operations": (
        "file", "files", "config", "json", "yaml", "yml", "toml", "ini", "modify", "edit", "rename",
        "backup", "bak", "folder", "directory", "overwrite", "copy", "move", "delete", "save",
    ),
    "coding": (
        "code", "debug", "implement", "function", "class", "bug", "error", "python", "java",
        "javascript", "typescript", "rust", "sql", "api", "library", "framework", "algorithm",
        "refactor", "test", "unittest", "lint", "compile", "build", "deploy", "dockerfile", "git",
        "commit", "pull request",
    ),
    "data_analysis": (
        "data", "dataset", "csv", "dataframe", "pandas", "analytics", "metric", "dashboard",
        "visualize", "chart", "plot", "statistics", "aggregate", "etl", "schema", "database", "table",
        "column", "query", "timestamp", "date", "time",
    ),
    "research": (
        "research", "paper", "arxiv", "study", "literature", "source", "cite", "citation", "academic",
        "journal", "publication", "evidence", "survey", "look up",
    ),
    "productivity": (
        "task", "plan", "schedule", "project", "deadline", "priority", "todo", "agenda", "meeting",
        "goal", "milestone", "calendar", "reminder",
    ),
    "security": (
        "security", "vulnerability", "exploit", "auth", "authentication", "authorization",
        "password", "token", "secret", "encrypt", "decrypt", "ssl", "tls", "injection", "xss", "csrf",
        "permission", "api key", "access control",
    ),
    "communication": (
        "email", "message", "slack", "notify", "announcement", "draft", "reply", "newsletter",
        "outreach", "communicate", "write to", "summarize for", "report to",
    ),
    "automation": (
        "automate", "script", "cron", "scheduled", "pipeline", "batch", "ci/cd", "workflow",
        "trigger", "webhook", "bot", "scrape", "selenium", "playwright", "headless",
    ),
    "agentic": (
        "agent", "multi-agent", "sub-agent", "orchestrate", "spawn", "delegate", "autonomous",
        "tool use", "mcp", "memory", "context window", "session",
    ),
}
GENERAL_CATEGORIES = ("general", "common_mistakes")


@lru_cache(maxsize=1 << 16)  # a request's query is tokenized on the hot path; its words repeat across requests
def stem(word: str) -> str:
    """A crude suffix stripper: enough to match "modifying"/"modifies"/"modify", "creates"/"created"."""
    w = word
    if len(w) <= 3:
        return w
    if w.endswith(("ies", "ied")):
        w = w[:-3] + "y"
    elif w.endswith("ying"):
        w = w[:-4] + "y"
    elif w.endswith("ing") and len(w) >= 6:
        w = w[:-3]
    elif w.endswith("ed") and len(w) >= 5:
        w = w[:-2]
    elif w.endswith(("sses", "xes", "zes", "ches", "shes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    # "create"/"created"/"creating" all end as "creat".
    if len(w) > 4 and w.endswith("e"):
        w = w[:-1]
    return w


def words(text: str) -> list[str]:
    """Lowercase alphanumeric words of `text`, in order, stopwords kept (for names and titles)."""
    return _WORD_RE.findall(text.lower())


def tokenize(text: str) -> list[str]:
    """Stemmed content tokens of `text`, in order, without stopwords and 1-character tokens."""
    return [stem(w) for w in words(text) if len(w) > 1 and w not in STOPWORDS]


def topic_tokens(text: str) -> frozenset[str]:
    """Tokens that say what a rule is about (rule words like "must" removed)."""
    return frozenset(t for t in tokenize(text) if t not in RULE_WORDS)


_MODAL_RE = re.compile(r"\b(must|should|shall|need to|needs to|have to|has to)\b", re.I)


def same_lesson(a: str, b: str, threshold: float) -> bool:
    """Whether lessons `a` and `b` say the same thing: their topic tokens overlap by `threshold` (Jaccard)
    AND, where both name what they are about before a modal verb ("status updates must ..."), the subjects
    overlap too. "Ticket titles must be written in lowercase only" and "Status updates must be written in
    lowercase only" share most words but are rules about different things."""
    if jaccard(topic_tokens(a), topic_tokens(b)) < threshold:
        return False
    ta, tb = rule_subject(a), rule_subject(b)
    if ta and tb and jaccard(ta, tb) < 0.5:
        return False
    return True


def rule_subject(lesson: str) -> frozenset[str]:
    """The topic tokens of what a rule is about: the words before its modal verb ("ticket titles" of
    "ticket titles must be written in uppercase only"); empty when it names none ("you must ...", or no
    modal verb at all)."""
    head = _MODAL_RE.split(lesson, maxsplit=1)
    return topic_tokens(head[0]) if len(head) > 1 else frozenset()


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    """|a ∩ b| / |a ∪ b|, 0.0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _compile_keywords() -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    out = {}
    for cat, kws in TASK_KEYWORDS.items():
        singles = frozenset(stem(k) for k in kws if _WORD_RE.fullmatch(k))
        phrases = tuple(k for k in kws if not _WORD_RE.fullmatch(k))
        out[cat] = (singles, phrases)
    return out


_KEYWORDS = _compile_keywords()


def task_type_scores(text: str, tokens: Iterable[str] | None = None) -> dict[str, int]:
    """Keyword hits per task type for `text` (types with no hit are omitted). `tokens`: `tokenize(text)`,
    when the caller has it already."""
    lowered = text.lower()
    toks = set(tokenize(text) if tokens is None else tokens)
    scores = {}
    for cat, (singles, phrases) in _KEYWORDS.items():
        hits = len(toks & singles) + sum(1 for p in phrases if p in lowered)
        if hits:
            scores[cat] = hits
    return scores


def detect_task_type(text: str, available: Iterable[str] | None = None,
                     tokens: Iterable[str] | None = None) -> str | None:
    """The task type with most keyword hits among `available` (all types if None); None if no hit.

    Ties go to the type listed first in TASK_KEYWORDS, so the result is deterministic. `tokens`:
    `tokenize(text)`, when the caller has it already.
    """
    allowed = None if available is None else set(available)
    scores = task_type_scores(text, tokens)
    best, best_hits = None, 0
    for cat in TASK_KEYWORDS:
        hits = scores.get(cat, 0)
        if hits > best_hits and (allowed is None or cat in allowed):
            best, best_hits = cat, hits
    return best
