"""Versions of skills, read from the bank's history.jsonl: pure functions, and `VersionedBank`, the half
of `SkillBank` (evolve/bank.py) that reads versions back and rolls back.

Every content change is a history record that keeps the full SKILL.md written: actions "add", "update"
and "rollback" carry `text` and its `sha256`; "remove" records the version removed. So the history alone
says what each skill's text was at any version, generation or time, and since evolve/mirror.py merges
history files by appending lines, that holds on every host that pulls the library. Records written
before texts were kept (no `text`) still count as versions; they can be listed but not shown or restored.

The version counter. A skill's version is the bank's counter, not the number in its front matter:
`version_of(name)` = max(the highest version any history record of that name carries, the front
matter's `metadata.version`, 1) for a skill that exists, 0 for one that does not. Adds and updates write version + 1 into the front matter, so normally both
agree. A rollback writes the stored text byte for byte, so the file keeps the OLD number in its front
matter while its history record takes the next number; the bank then reports the counter (in memory a
loaded skill's `metadata.version` is raised to it), so compare-and-swap bases (`expected_versions`)
only ever go up, and a skill removed and added again continues its numbers instead of reusing them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.contracts import SKILL_NAME_RE
from evolve.skill_md import SkillFormatError, parse_skill_md
from evolve.store import BankError, BatchResult, HistoryLog, Rejection, sha256_text, utc_now_ms

CONTENT = ("add", "update", "rollback")  # records that carry the text written
VERSIONED = (*CONTENT, "remove")  # records that change a skill's state (a merge changes metadata only)


def as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_ts(value: Any) -> datetime | None:
    """A history `ts` (or a user's `--at`) as an aware UTC datetime: second or millisecond precision,
    `Z` or an offset, or a date; without a zone it is UTC. None when it is not ISO 8601."""
    try:
        dt = datetime.fromisoformat(str(value).strip().replace("z", "Z"))
    except ValueError:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def note_heads(heads: dict[str, int], records: Iterable[dict[str, Any]]) -> None:
    """Raise `heads` ({name: highest version in the history}) by `records`."""
    for r in records:
        name = r.get("name")
        if isinstance(name, str) and name:
            v = as_int(r.get("version"))
            if v > heads.get(name, 0):
                heads[name] = v


def lost_texts(records: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """(name, sha256) of the texts that lost a race between two hosts (evolve/mirror.py writes a "lost"
    record when a change published first wins over this host's): such a text is in the history (the audit
    keeps it) but is no version of the skill, so the number both hosts wrote is the published text's."""
    return {(r["name"], r["lost_sha256"]) for r in records
            if r.get("action") == "lost" and isinstance(r.get("name"), str) and isinstance(r.get("lost_sha256"), str)}


def _live(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    lost = lost_texts(records)
    if not lost:
        return records
    return [r for r in records if not (r.get("action") in CONTENT and (r.get("name"), r.get("sha256")) in lost)]


def versions_of(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The records of skill `name` that changed its state (add, update, rollback, remove), oldest first;
    a text that lost a race between hosts is none of them (`lost_texts`)."""
    return [r for r in _live(records) if r.get("name") == name and r.get("action") in VERSIONED]


def _checked_text(r: dict[str, Any]) -> str | None:
    text = r.get("text")
    if not isinstance(text, str):
        return None
    sha = r.get("sha256")
    if sha is not None and sha != sha256_text(text):
        raise BankError(f"the stored text of version {r.get('version')} of skill {r.get('name')!r} is "
                        "damaged (sha256 mismatch)")
    return text


def text_of(records: list[dict[str, Any]], name: str, version: int) -> str:
    """The SKILL.md text of `name` at `version`; BankError saying why when there is none."""
    recs = [r for r in versions_of(records, name) if r.get("action") in CONTENT]
    if not recs:
        raise BankError(f"no stored versions of skill {name!r} (not in history.jsonl)")
    same = [r for r in recs if as_int(r.get("version")) == version]
    if not same:
        known = sorted({as_int(r.get("version")) for r in recs})
        raise BankError(f"skill {name!r} has no version {version} (stored versions: "
                        f"{', '.join(map(str, known))})")
    for r in same:  # two hosts may have written the same number (a mirror merge): the first recorded
        text = _checked_text(r)
        if text is not None:
            return text
    raise BankError(f"version {version} of skill {name!r} was recorded before the bank kept texts in "
                    "history.jsonl: it cannot be shown or restored")


def resolve(records: list[dict[str, Any]], generation: int | None = None,
            at: datetime | None = None) -> tuple[dict[str, dict[str, Any] | None], dict[str, str], set[str]]:
    """Each skill's state at a point of the history: after every record with `generation` <= the given
    one, or with `ts` <= `at` (neither: now). Returns
      known:   {name: the content record holding its text then, or None (it did not exist / was removed)}
      unknown: {name: why its text then is not stored} (a folder added by hand before the bank first
               recorded it, or a version recorded before texts were kept)
      changed: the names with an add/update/rollback/remove record after that point.
    Only valid skill names are considered (a damaged history line can never name a path outside)."""
    per_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in enumerate(_live(records)):
        name = r.get("name")
        if r.get("action") in VERSIONED and isinstance(name, str) and SKILL_NAME_RE.fullmatch(name):
            per_name.setdefault(name, []).append((i, r))

    def key(item: tuple[int, dict[str, Any]]) -> tuple[Any, int]:
        i, r = item
        if at is not None:
            return parse_ts(r.get("ts")) or datetime.max.replace(tzinfo=UTC), i
        return as_int(r.get("generation")), i

    def before(r: dict[str, Any]) -> bool:
        if at is not None:
            ts = parse_ts(r.get("ts"))
            return ts is not None and ts <= at
        return generation is None or as_int(r.get("generation")) <= generation

    known: dict[str, dict[str, Any] | None] = {}
    unknown: dict[str, str] = {}
    changed: set[str] = set()
    for name, recs in per_name.items():
        prior = [x for x in recs if before(x[1])]
        if len(prior) < len(recs):
            changed.add(name)
        last = max(prior, key=key)[1] if prior else None
        if last is None:
            first = recs[0][1]
            if first.get("action") == "add":
                known[name] = None
            else:
                unknown[name] = (f"it existed before the bank first recorded it ({first.get('action')} of "
                                 f"version {first.get('version')}), so its text then is not stored")
        elif last.get("action") == "remove":
            known[name] = None
        else:
            try:
                ok = _checked_text(last) is not None
            except BankError as e:
                unknown[name] = str(e)
                continue
            if ok:
                known[name] = last
            else:
                unknown[name] = (f"version {last.get('version')} was recorded before the bank kept texts "
                                 "in history.jsonl")
    return known, unknown, changed


class VersionedBank:
    """The versions half of `SkillBank` (evolve/bank.py): stored versions read back, and rollbacks. It
    works through the bank's own primitives: its locks, `reload` (catch up), `_write_skill`, `_delete`
    and `_commit` (history, then generation), so a rollback is committed like any other batch."""

    root: Path
    cfg: Any
    _gen: int
    _folders: dict[str, str]
    _history: HistoryLog

    def versions(self, name: str) -> list[dict[str, Any]]:
        """The history records of skill `name` that changed it (add, update, rollback: with `text` where
        stored; remove), oldest first. Metadata-only merges are left out."""
        return versions_of(self._history.read_all(), self._valid(name))

    def text_at(self, name: str, version: int) -> str:
        """The exact SKILL.md text of `name` at `version`; BankError when that version has no stored text
        (unknown, or recorded before texts were kept)."""
        return text_of(self._history.read_all(), self._valid(name), int(version))

    def state_at(self, generation: int | None = None, at: str | None = None) -> dict[str, str | None]:
        """{skill name: its SKILL.md text as of `generation` (or ISO time `at`; neither: now), None when it
        did not exist or was removed then} for every skill in the history whose state then is known (a
        folder added by hand before the bank first recorded it, or a version recorded before texts were
        kept, is left out)."""
        when = self._point(generation, at)
        known, _, _ = resolve(self._history.read_all(), generation, when)
        return {n: (r["text"] if r is not None else None) for n, r in sorted(known.items())}

    def rollback(self, name: str, to_version: int, evolver: str = "manual") -> BatchResult:
        """Restore the exact stored text of `name` at `to_version` as its next version (history action
        "rollback" with `restored_version`; +1 generation), re-creating it if it was removed since. When
        the file already holds that text, nothing is written and `unchanged` says so. BankError when that
        version has no stored text."""
        self._valid(name)
        with self._lock, self._file_lock.hold():
            self.reload()
            text = text_of(self._history.read_all(), name, int(to_version))
            if self._holds(name, text):
                return BatchResult([], [], self._gen, unchanged=[name])
            return self._restore({name: (text, int(to_version))}, evolver, f"rollback to version {to_version}")

    def rollback_library(self, generation: int | None = None, at: str | None = None,
                         evolver: str = "manual") -> BatchResult:
        """Bring every skill the history knows back to its state at `generation` (or ISO time `at`), in
        ONE generation bump: restore the texts of those that existed then (re-creating removed ones) and
        remove those that did not. Folders with no history record (added by hand) are never touched;
        skills whose text then is not stored are left as they are and listed in `rejected`."""
        if (generation is None) == (at is None):
            raise BankError("give exactly one of a generation or a time (at) to roll the library back to")
        when = self._point(generation, at)
        with self._lock, self._file_lock.hold():
            self.reload()
            if generation is not None and generation > self._gen:
                raise BankError(f"generation {generation} is ahead of the library's ({self._gen})")
            known, unknown, changed = resolve(self._history.read_all(), generation, when)
            rejected = [Rejection(n, f"left as it is: {unknown[n]}") for n in sorted(changed & set(unknown))]
            targets: dict[str, tuple[str | None, int | None]] = {}
            for name in sorted(changed - set(unknown)):
                rec = known[name]
                text = rec["text"] if rec is not None else None
                if not self._holds(name, text):
                    targets[name] = (text, as_int(rec["version"]) if rec is not None else None)
            point = f"generation {generation}" if generation is not None else f"{at}"
            result = self._restore(targets, evolver, f"library rollback to {point}")
            result.rejected[:0] = rejected
            return result

    def _point(self, generation: int | None, at: str | None) -> datetime | None:
        if generation is not None and generation < 0:
            raise BankError(f"generation must be >= 0, not {generation}")
        if at is None:
            return None
        when = parse_ts(at)
        if when is None:
            raise BankError(f"not an ISO 8601 time: {at!r} (e.g. 2025-01-31T12:00:00Z)")
        return when

    def _holds(self, name: str, text: str | None) -> bool:
        """Whether folder `name` holds exactly `text` (None: no folder at all)."""
        folder = self.root / name
        if text is None:
            return not folder.exists()
        try:
            return (folder / "SKILL.md").read_bytes() == text.encode("utf-8")
        except OSError:
            return False

    def _restore(self, targets: dict[str, tuple[str | None, int | None]], evolver: str,
                 summary: str) -> BatchResult:
        """Write each stored text as it was (None: remove the folder) as ONE new generation. Lock held."""
        gen = self._gen + 1
        records: list[dict[str, Any]] = []
        accepted, removed, rejected = [], [], []
        for name, (text, restored) in sorted(targets.items()):
            if text is None:
                records.append(self._delete(name, gen, evolver, summary))
                removed.append(name)
                continue
            clash = self._folders.get(name.casefold())
            try:
                if clash is not None and clash != name:
                    raise SkillFormatError(f"name clashes by case with existing folder {clash!r}")
                if len(text.encode("utf-8")) > self.cfg.max_skill_bytes:
                    raise SkillFormatError(self._too_big(text))
                skill = parse_skill_md(text, folder_name=name)
                version = self._next_version(name)
                skill = skill.model_copy(update={"metadata": {**skill.metadata, "version": version}})
                self._write_skill(skill, text, new=not (self.root / name).is_dir())
            except (SkillFormatError, OSError) as e:
                rejected.append(Rejection(name, f"could not restore: {e}"))
                continue
            records.append({"ts": utc_now_ms(), "action": "rollback", "name": name, "generation": gen,
                            "version": version, "restored_version": restored, "evolver": evolver,
                            "origin_sessions": [], "category": skill.category, "text": text,
                            "sha256": sha256_text(text), "summary": summary})
            accepted.append(name)
        if records:
            self._commit(records, gen)
        return BatchResult(accepted, rejected, self._gen, removed=removed)
