"""SkillBank: the skill library `S` on disk (one folder per skill) with a durable generation counter.

Under `root`: `<name>/SKILL.md` (one skill), `.generation` (+1 per accepted batch that changed what
readers see, per removal and per rollback), `history.jsonl` (one JSON line per change: ts, action, name,
generation, version, evolver, origin sessions; content changes also keep the full SKILL.md written and
its sha256, plus the caller's summary/evidence/validation/base_version) and `.lock` (flock target
serialising writers across processes).

A versioned store (evolve/versions.py): writes can be compare-and-swap (`expected_versions`: a skill
changed meanwhile is reported as a conflict, never overwritten), every stored version can be read back
(`versions`, `text_at`, `state_at`) and restored byte for byte (`rollback`, `rollback_library`).

Writers take the lock, catch up with other writers, decide, write each SKILL.md atomically, append the
history and only then write the generation, so a reader that sees a generation also sees its files.
Readers (`reload`) follow history.jsonl by byte offset and re-read only the folders it names; with
nothing new a call costs three stat/reads (cheap once a second). Folders added or deleted by hand are
found through the root folder's mtime; hand edits inside a folder need `reload(force=True)`.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.config import SkillsConfig
from core.contracts import SKILL_NAME_RE, Skill
from core.storage import atomic_write_text, rename_durably
from evolve import store, versions
from evolve.embedding import Embedder, EmbeddingCache, VectorSet
from evolve.skill_md import SkillFormatError, content_key, parse_skill_md, render_skill_md
from evolve.store import BankError, BatchResult, FileLock, GenerationFile, HistoryLog, Rejection
from evolve.versions import VersionedBank

log = logging.getLogger(__name__)

MAX_ORIGIN_SESSIONS = 50  # origin ids kept per skill (most recent); bounds file growth under merges


class SkillBank(VersionedBank):
    """Folder-per-skill library under `root`. Thread-safe; safe across processes on one host."""

    def __init__(self, root: Path, cfg: SkillsConfig, embedder: Embedder | EmbeddingCache | None = None):
        self.root = Path(root)
        self.cfg = cfg
        # None: near-duplicates are judged by name only. A shared cache encodes each skill once.
        self.cache = embedder if embedder is None or isinstance(embedder, EmbeddingCache) \
            else EmbeddingCache(embedder)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._file_lock = FileLock(self.root / store.LOCK_FILE)
        self._gen_file = GenerationFile(self.root / store.GENERATION_FILE)
        self._history = HistoryLog(self.root / store.HISTORY_FILE)
        self._skills: dict[str, Skill] = {}
        self._keys: dict[str, str] = {}  # name -> content_key
        self._folders: dict[str, str] = {}  # casefolded folder name -> folder name (incl. malformed)
        self._problems: dict[str, str] = {}  # folder (or file) -> why it was skipped
        self._heads: dict[str, int] = {}  # name -> highest version in the history (evolve/versions.py)
        self._gen = 0  # the highest generation seen: readers never report a lower one
        self._disk_gen = 0  # what the folder says now (lower than _gen after a wipe or replacement)
        self._gen_raw: str | None = None
        self._hist_off = 0
        self._root_mtime = 0
        self._version = 0  # +1 whenever the in-memory library changes (readers rebuild on it)
        self._sorted: tuple[Skill, ...] | None = None
        self._vectors: VectorSet | None = None  # embeddings of the library, for near-duplicate checks
        self._full_scan()

    # ---------------------------------------------------------------- read side
    @property
    def generation(self) -> int:
        """Monotonic: a skills folder that went back (wiped, replaced) does not lower it."""
        return self._gen

    @property
    def disk_generation(self) -> int:
        """The generation the folder holds now; below `generation` when it went back."""
        return self._disk_gen

    @property
    def version(self) -> int:
        """Changes whenever the in-memory library changes; compare it to know when to rebuild."""
        return self._version

    @property
    def problems(self) -> dict[str, str]:
        """Folders (or files) skipped because they are malformed, with the reason."""
        return dict(self._problems)

    def skills(self) -> tuple[Skill, ...]:
        """All loaded skills, sorted by name. Treat them as read-only."""
        with self._lock:
            if self._sorted is None:
                self._sorted = tuple(self._skills[n] for n in sorted(self._skills))
            return self._sorted

    def snapshot(self) -> tuple[int, int, tuple[Skill, ...]]:
        """(version, generation, skills) read together."""
        with self._lock:
            return self._version, self._gen, self.skills()

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def names(self) -> list[str]:
        return sorted(self._skills)

    def __len__(self) -> int:
        return len(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """History records, oldest first (the last `limit` when given)."""
        recs = self._history.read_all()
        return recs[-limit:] if limit else recs

    def version_of(self, name: str) -> int:
        """Skill `name`'s current version (= `get(name).metadata["version"]`), 0 when it does not exist:
        the base for `expected_versions`. Monotonic per name (evolve/versions.py, "The version counter")."""
        skill = self._skills.get(name)
        return versions.as_int(skill.metadata.get("version")) if skill is not None else 0

    def reload(self, force: bool = False) -> bool:
        """Catch up with changes made by other processes; True when the library changed."""
        with self._lock:
            if force:
                return self._full_scan()
            size = self._history.size()
            if size < self._hist_off:  # history truncated or replaced: start over
                return self._full_scan()
            changed = self._apply_history() if size > self._hist_off else False
            if self._root_mtime_ns() != self._root_mtime:  # folders appeared or vanished
                changed = self._diff_scan() or changed
            raw = self._gen_file.read_raw()
            if raw != self._gen_raw:
                self._set_generation(raw)
                self._version += 1
                changed = True
            return changed

    # ---------------------------------------------------------------- write side
    def add(self, skill: Skill, origin_sessions: Iterable[str] = (), evolver: str = "manual",
            allow_updates: bool = False, expected_version: int | None = None,
            note: dict[str, Any] | None = None) -> BatchResult:
        return self.add_batch([skill], origin_sessions, evolver, allow_updates,
                              None if expected_version is None else {skill.name: expected_version},
                              None if note is None else {skill.name: note})

    def add_batch(self, skills: Sequence[Skill], origin_sessions: Iterable[str] = (),
                  evolver: str = "manual", allow_updates: bool = False,
                  expected_versions: dict[str, int] | None = None,
                  notes: dict[str, dict[str, Any]] | None = None) -> BatchResult:
        """Add (or, with `allow_updates`, update) skills as one batch: +1 generation if any content changed.

        A skill whose name exists is refused unless `allow_updates`; then it replaces that skill (same
        content: a metadata-only merge that does not bump the generation). New skills are refused when a
        folder clashes by case, when the rendered SKILL.md exceeds `cfg.max_skill_bytes`, or (with an
        embedder) when cosine similarity to another skill is >= `cfg.dedup_threshold`.

        Compare-and-swap: `expected_versions[name]` is the version the caller based its change on (0: the
        skill must not exist yet). When the skill's current version (`version_of`, checked under the lock
        after catching up) differs, it is not written but listed in `conflicts`; the rest of the batch
        goes on. A matching base >= 1 allows that update even without `allow_updates`.
        `notes[name]` (summary, evidence, validation, base_version) goes into that skill's history record.
        """
        origins = [str(s) for s in origin_sessions]
        expected, notes = dict(expected_versions or {}), notes or {}
        with self._lock, self._file_lock.hold():
            self.reload()
            conflicts = [Rejection(s.name, f"based on version {expected[s.name]} but the current version "
                                   f"is {self.version_of(s.name)}: changed meanwhile, not written")
                         for s in skills if s.name in expected and expected[s.name] != self.version_of(s.name)]
            late = {c.name for c in conflicts}
            writes, rejected = self._plan([s for s in skills if s.name not in late], allow_updates,
                                          {n for n, v in expected.items() if v >= 1})
            if not writes:
                return BatchResult([], rejected, self._gen, conflicts=conflicts)
            bump = any(action != "merge" for _, action in writes)
            gen = self._gen + 1 if bump else self._gen
            records, accepted, merged = [], [], []
            for skill, action in writes:
                old = self._skills.get(skill.name)
                version = self.version_of(skill.name) if action == "merge" else self._next_version(skill.name)
                final = skill.model_copy(update={"metadata": store.stamp_metadata(
                    skill, old, action, origins, evolver, gen, MAX_ORIGIN_SESSIONS, version)})
                text = render_skill_md(final)
                if len(text.encode("utf-8")) > self.cfg.max_skill_bytes:
                    rejected.append(Rejection(skill.name, self._too_big(text)))
                    continue
                try:
                    self._write_skill(final, text, new=action == "add")
                except OSError as e:  # e.g. a folder of that name made by hand a moment ago
                    rejected.append(Rejection(skill.name, f"could not write: {e}"))
                    continue
                (merged if action == "merge" else accepted).append(final.name)
                note = dict(notes.get(skill.name) or {})
                if skill.name in expected:
                    note.setdefault("base_version", expected[skill.name])
                records.append(store.history_record(final, action, evolver, origins,
                                                    None if action == "merge" else text, note))
            if records and not accepted:  # only merges were written: no new generation
                for r in records:
                    r["generation"] = self._gen
            self._commit(records, gen if accepted else None)
            return BatchResult(accepted, rejected, self._gen, merged, conflicts)

    def remove(self, name: str, evolver: str = "manual") -> int:
        """Delete skill `name` (or a malformed folder of that name); returns the new generation."""
        self._valid(name)
        with self._lock, self._file_lock.hold():
            self.reload()
            if name not in self._skills and not (self.root / name).is_dir():
                raise BankError(f"no skill named {name!r}")
            record = self._delete(name, self._gen + 1, evolver, None)
            self._commit([record], self._gen + 1)
            return self._gen

    def ensure_generation(self, floor: int = 0, evolver: str = "reconcile") -> int:
        """Reconcile a folder that went back: when its generation is below the highest one seen (or
        below `floor`, e.g. the replay buffer's), write a NEW generation above both (S changed, so
        samples served before must be retired). Returns the generation."""
        with self._lock, self._file_lock.hold():
            self.reload()
            if self._disk_gen >= max(self._gen, floor):
                return self._gen
            new = max(self._gen, floor) + 1
            log.warning("skills folder %s holds generation %d, below %d (wiped or replaced): writing "
                        "generation %d", self.root, self._disk_gen, max(self._gen, floor), new)
            self._commit([{"ts": store.utc_now_ms(), "action": "reconcile", "name": "", "generation": new,
                           "version": 0, "evolver": evolver, "origin_sessions": []}], new)
            return self._gen

    # ---------------------------------------------------------------- versions
    def _valid(self, name: str) -> str:
        if not SKILL_NAME_RE.fullmatch(name or ""):
            raise BankError(f"invalid skill name {name!r}: must match {SKILL_NAME_RE.pattern}")
        return name

    def _next_version(self, name: str) -> int:
        return max(self._heads.get(name, 0), self.version_of(name)) + 1

    def _with_head(self, skill: Skill) -> Skill:
        """`skill` as loaded, its `metadata.version` the bank's counter: raised to the history's highest
        (after a rollback the file holds the restored version's number); 1 when the file has none."""
        raw = skill.metadata.get("version")
        version = max(self._heads.get(skill.name, 0), versions.as_int(raw), 1)
        if type(raw) is int and raw == version:
            return skill
        return skill.model_copy(update={"metadata": {**skill.metadata, "version": version}})

    def _delete(self, name: str, generation: int, evolver: str, summary: str | None) -> dict[str, Any]:
        """Delete folder `name` (lock held); returns its history record (committed by the caller)."""
        version = self.version_of(name)
        # Rename first so readers never see a half-deleted folder, then delete.
        trash = self.root / f".trash-{name}-{uuid.uuid4().hex[:8]}"
        rename_durably(self.root / name, trash)
        shutil.rmtree(trash, ignore_errors=True)
        self._load_folder(name)  # forgets it
        rec = {"ts": store.utc_now_ms(), "action": "remove", "name": name, "generation": generation,
               "version": version, "evolver": evolver, "origin_sessions": []}
        return {**rec, "summary": summary} if summary else rec

    # ---------------------------------------------------------------- decisions
    def _plan(self, skills: Sequence[Skill], allow_updates: bool,
              updatable: set[str] = frozenset()) -> tuple[list, list[Rejection]]:
        writes: list[tuple[Skill, str]] = []
        rejected: list[Rejection] = []
        batch_names: set[str] = set()
        batch_vecs: list[tuple[str, np.ndarray]] = []
        for skill in skills:
            reason, action = self._check_name(skill, allow_updates or skill.name in updatable, batch_names)
            vec = None
            if reason is None and action != "merge" and self.cache is not None:
                vec = self.cache.skill_matrix([skill])[0]
                reason = self._check_similar(skill.name, vec, batch_vecs)
            if reason is not None:
                rejected.append(Rejection(skill.name, reason))
                continue
            batch_names.add(skill.name)
            if vec is not None:
                batch_vecs.append((skill.name, vec))
            writes.append((skill, action))
        return writes, rejected

    def _check_name(self, skill: Skill, allow_updates: bool, batch: set[str]) -> tuple[str | None, str]:
        name = skill.name
        if name in batch:
            return "duplicate name within the batch", "add"
        if name in self._skills:
            if not allow_updates:
                return f"a skill named {name!r} already exists", "add"
            same = content_key(skill) == self._keys[name]
            return None, "merge" if same else "update"
        folder = self._folders.get(name.casefold())
        if folder is not None and folder != name:
            return f"name clashes by case with existing folder {folder!r}", "add"
        if folder is not None:
            return f"folder {name!r} exists but is malformed ({self._problems.get(name, '?')})", "add"
        return None, "add"

    def _check_similar(self, name: str, vec: np.ndarray, batch: list[tuple[str, np.ndarray]]) -> str | None:
        assert self.cache is not None
        if self._vectors is None:
            self._vectors = VectorSet(self.cache)
        self._vectors.sync(self._skills, self._keys)
        best, cos = self._vectors.nearest(vec, exclude=name)  # an update is not a duplicate of itself
        for other, v in batch:
            c = float(v @ vec)
            if c > cos:
                best, cos = other, c
        if best is not None and cos >= self.cfg.dedup_threshold:
            return (f"near-duplicate of {best!r} (cosine {cos:.3f} >= dedup_threshold "
                    f"{self.cfg.dedup_threshold})")
        return None

    def _commit(self, records: list[dict[str, Any]], generation: int | None) -> None:
        """Append `records` to the history, then (if given) write the new generation. Lock held."""
        if records:
            self._hist_off = self._history.append(records)
            versions.note_heads(self._heads, records)
        if generation is not None:
            self._gen_file.write(generation)
            self._set_generation(self._gen_file.read_raw())
        self._root_mtime = self._root_mtime_ns()
        self._changed()

    def _too_big(self, text: str) -> str:
        return (f"SKILL.md would be {len(text.encode('utf-8'))} bytes > max_skill_bytes "
                f"{self.cfg.max_skill_bytes}")

    # ---------------------------------------------------------------- disk <-> memory
    def _write_skill(self, skill: Skill, text: str, new: bool) -> None:
        target = self.root / skill.name
        if new:
            # Build the folder aside and rename it in, so no reader ever sees a folder without SKILL.md.
            tmp = self.root / f".tmp-{skill.name}-{uuid.uuid4().hex[:8]}"
            atomic_write_text(tmp / "SKILL.md", text)
            try:
                rename_durably(tmp, target)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        else:
            atomic_write_text(target / "SKILL.md", text)
        self._skills[skill.name] = skill
        self._keys[skill.name] = content_key(skill)
        self._folders[skill.name.casefold()] = skill.name
        self._problems.pop(skill.name, None)

    def _load_folder(self, name: str) -> None:
        """(Re)read folder `name` into memory, or forget it if it is gone; problems are recorded."""
        self._skills.pop(name, None)
        self._keys.pop(name, None)
        self._problems.pop(name, None)
        folder = self.root / name
        if not folder.is_dir():
            self._folders.pop(name.casefold(), None)
            return
        self._folders[name.casefold()] = name
        try:
            skill = self._read_skill(folder)
        except (SkillFormatError, OSError, UnicodeDecodeError) as e:
            self._problems[name] = str(e)
            log.warning("skill folder %s skipped: %s", folder, e)
            return
        self._skills[name] = self._with_head(skill)
        self._keys[name] = content_key(skill)

    def _read_skill(self, folder: Path) -> Skill:
        path = folder / "SKILL.md"
        if not path.is_file():
            raise SkillFormatError("no SKILL.md in the folder")
        size = path.stat().st_size
        if size > self.cfg.max_skill_bytes:
            raise SkillFormatError(f"SKILL.md is {size} bytes > max_skill_bytes {self.cfg.max_skill_bytes}")
        if not SKILL_NAME_RE.fullmatch(folder.name):
            raise SkillFormatError(f"folder name {folder.name!r} is not a valid skill name "
                                   f"({SKILL_NAME_RE.pattern})")
        return parse_skill_md(path.read_text(encoding="utf-8"), folder_name=folder.name)

    def _folder_names(self) -> set[str]:
        return {e.name for e in os.scandir(self.root) if not e.name.startswith(".") and e.is_dir()}

    def _full_scan(self) -> bool:
        with self._lock:
            before = dict(self._keys)
            self._skills, self._keys, self._folders, self._problems = {}, {}, {}, {}
            # Offsets/mtimes are read before scanning, so changes made during the scan are re-read later.
            records, self._hist_off = self._history.read_from(0)
            self._heads = {}
            versions.note_heads(self._heads, records)
            self._root_mtime = self._root_mtime_ns()
            for name in sorted(self._folder_names()):
                self._load_folder(name)
            self._set_generation(self._gen_file.read_raw())
            self._changed()
            return before != self._keys

    def _diff_scan(self) -> bool:
        """Load folders that appeared and forget those that vanished (one directory listing)."""
        self._root_mtime = self._root_mtime_ns()
        present = self._folder_names()
        known = set(self._folders.values())
        for name in sorted((present - known) | (known - present)):
            self._load_folder(name)
        if present != known:
            self._changed()
        return present != known

    def _apply_history(self) -> bool:
        records, self._hist_off = self._history.read_from(self._hist_off)
        versions.note_heads(self._heads, records)
        names = {str(r.get("name", "")) for r in records}
        for name in sorted(n for n in names if SKILL_NAME_RE.fullmatch(n)):
            self._load_folder(name)
        if records:
            self._changed()
        return bool(records)

    def _set_generation(self, raw: str | None) -> None:
        gen = self._gen_file.parse(raw)
        self._problems.pop(store.GENERATION_FILE, None)
        if raw is None and self._history.size() > 0:
            # Not written yet (a writer appends history first) or deleted: never go back in generations.
            gen = self._history.max_generation()
        elif gen is None:  # damaged file: the history says how far generations went
            gen = self._history.max_generation()
            self._problems[store.GENERATION_FILE] = f"malformed ({raw!r}); using {gen} from the history"
            log.error("%s is malformed (%r); using generation %d from the history",
                      self.root / store.GENERATION_FILE, raw, gen)
        if gen < self._gen:
            log.warning("skills folder %s went back from generation %d to %d (wiped or replaced?): "
                        "readers keep %d until the Evolver writes a new generation above it",
                        self.root, self._gen, gen, self._gen)
        self._disk_gen, self._gen, self._gen_raw = gen, max(gen, self._gen), raw

    def _root_mtime_ns(self) -> int:
        return os.stat(self.root).st_mtime_ns

    def _changed(self) -> None:
        self._version += 1
        self._sorted = None
        if self.cache is not None and len(self.cache) > 1.25 * len(self._keys) + 64:
            self.cache.prune(set(self._keys.values()))  # only now and then: it walks the whole cache
