"""Skills in the bucket: snapshots of the skill library on object storage (issue 13).

With a remote storage root (`s3://bucket/prefix`, `gs://...`) Proxy replicas on any host and an Evolver
restarted on another host must see one library, but the SkillBank is a local folder (evolve/bank.py).
This module mirrors that folder into the bucket. A local storage root has no mirror: nothing changes.

Under the bucket's `skills/` nothing is renamed or overwritten (the adapters' protocol, core/adapter_store.py):
    skills/v<NNNNNNNN>-<hex>/   one snapshot: every skill folder, `.generation` and `history.jsonl`,
                                uploaded under a key no one else writes
    skills/v<NNNNNNNN>.json     its record {version, generation, key, files: {path: sha256}, writer},
                                created create-only AFTER the upload: the record IS the publish
The newest KEEP snapshots stay; older ones go, record first (a reader never finds a record without its
files); uploads no record names (a writer that died, or lost its version) go after TMP_GRACE_S.

Writer (`SkillMirror`: the Evolver, and `clawray skills add/remove` from a temporary folder). After a
committed bank change it stages a copy of the folder (under the bank's lock), uploads it as the version
after the one the folder is based on and creates the record. Losing the create, or finding a version
newer than its base, means another writer published (a `clawray skills` command, or a second Evolver):
it logs loudly, merges that snapshot into the folder and publishes the result as the next version. The
merge is three-way per skill folder against the base: a skill changed on one side only takes that
change; one changed on both keeps the published one (this writer lost the race for the version: its
change is returned as `Published.lost`, recorded in the history as lost, and decided again by the caller,
as a compare-and-swap conflict is; a deletion never beats an edit); the other side's history lines are appended (the local
history only grows, so the bank's reader follows it as it follows any other writer), and the generation
becomes max(both) + 1: the merged library is new to every reader. `pull()` runs the same merge at Evolver
start, before the bank loads: an empty folder (a new host) simply becomes the newest snapshot with its
generation, so a restarted Evolver continues the library and generations never go back. The base is
the record the folder last matched, kept in the folder as `.mirror.json`; a wiped folder loses it too,
so a wipe merges everything back instead of publishing the deletions.

Readers (evolve/snapshot_reader.py `SnapshotReader`: each Proxy replica; serve/injection.py polls it every
`skills.refresh_s`, off the request path). `poll()` does one LIST of `skills/`; when a newer record appears it downloads that
snapshot into a temp folder, checks every file against the record's sha256, renames it into
`<cache>/v<NNNNNNNN>-<hex>/` (complete, never changed afterwards, shared by the replicas of a host) and
swaps in a new `SkillSearch` over it in one assignment: a request is served from one whole library or
the next, never a half-written one. A record whose generation is below the one served is not taken.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.blobs import BlobStore
from core.storage import (
    TMP_GRACE_S,
    TMP_PREFIX,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
    remove_tree,
    rename_durably,
)
from evolve import store
from evolve.store import FileLock

log = logging.getLogger(__name__)

SKILLS = "skills"
MARKER = ".mirror.json"  # the record this folder is based on (never uploaded: dot-named)
KEEP = 5  # snapshots kept in the bucket
MAX_TRIES = 20
RECORD_RE = re.compile(r"^v(\d{8,})\.json$")
TREE_RE = re.compile(r"^v(\d{8,})-[0-9a-f]+$")
SPECIAL = (store.GENERATION_FILE, store.HISTORY_FILE)  # merged by rule, not by content


class SnapshotError(RuntimeError):
    """A downloaded snapshot does not match its record (deleted or damaged meanwhile)."""


def record_key(version: int) -> str:
    return f"{SKILLS}/v{version:08d}.json"


# ------------------------------------------------------------------------------------------ pure rules
def units(files: dict[str, str]) -> dict[str, str]:
    """{unit: digest} of a snapshot's {path: sha256}: a unit is a skill folder (all its files together) or
    another top-level file; the generation file and the history are not units (pure)."""
    groups: dict[str, list[str]] = {}
    for rel, sha in files.items():
        if rel not in SPECIAL:
            groups.setdefault(rel.split("/", 1)[0], []).append(f"{rel}\0{sha}")
    return {u: hashlib.sha256("\n".join(sorted(v)).encode()).hexdigest() for u, v in groups.items()}


def merge_units(base: dict[str, str], ours: dict[str, str],
                theirs: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Three-way merge of {unit: digest} maps (pure). Returns ({unit: "ours" | "theirs"} for every unit
    the merged library holds, the units both sides changed differently). A change on one side wins. On
    both sides, the change already published wins (theirs): this writer lost the race for the version, as a
    compare-and-swap loses, and its change is decided again on the new base (`Published.lost`), never
    written over the other's. The one exception: a deletion never beats an edit, whichever side edited."""
    pick: dict[str, str] = {}
    conflicts: list[str] = []
    for unit in sorted(set(base) | set(ours) | set(theirs)):
        b, o, t = base.get(unit), ours.get(unit), theirs.get(unit)
        if o == t or t == b:
            side, value = "ours", o
        elif o == b:
            side, value = "theirs", t
        else:
            conflicts.append(unit)
            side, value = ("theirs", t) if t is not None else ("ours", o)
        if value is not None:
            pick[unit] = side
    return pick, conflicts


def new_history_lines(ours: bytes, theirs: bytes) -> bytes:
    """The complete lines of `theirs` that `ours` lacks, in their order (pure): appended to `ours`, they
    make the merged history, which only grows."""
    have = set(ours.splitlines(keepends=True))
    return b"".join(line for line in theirs.splitlines(keepends=True)
                    if line.endswith(b"\n") and line not in have)


def parse_generation(raw: bytes | None) -> int:
    try:
        return max(int(raw or b"0"), 0)
    except ValueError:
        return 0


def records_to_remove(versions: list[int], keep: int) -> list[int]:
    """The versions retention removes: all but the `keep` highest (pure)."""
    return sorted(versions)[:-keep] if keep > 0 else sorted(versions)


# ------------------------------------------------------------------------------------------ local files
def snapshot_paths(folder: Path) -> list[str]:
    """The files a snapshot holds, relative to `folder`: everything but dot-named entries (the lock, the
    marker, temp and trash folders), except `.generation`."""
    out = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        hidden = any(part.startswith(".") for part in rel.split("/")) and rel != store.GENERATION_FILE
        if not hidden and p.is_file():
            out.append(rel)
    return sorted(out)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest_tree(folder: Path) -> dict[str, str]:
    return {rel: sha256_file(folder / rel) for rel in snapshot_paths(folder)}


def download(blobs: BlobStore, record: dict[str, Any], dest: Path) -> Path:
    """The snapshot of `record` as the local folder `dest`: downloaded into a temp folder, every file
    checked against the record, then renamed into place whole. An existing `dest` was put there the same
    way (by this process or another replica of this host) and is kept."""
    dest = Path(dest)
    files: dict[str, str] = record["files"]
    if any(part in ("", ".", "..") for rel in files for part in rel.split("/")):
        raise SnapshotError(f"skills v{record['version']}: a file path leaves the snapshot folder")
    if dest.is_dir():
        return dest
    tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        tmp.mkdir(parents=True)
        for rel in files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        if files:
            blobs.fs.get([blobs.path(f"{record['key']}/{rel}") for rel in files], [str(tmp / rel) for rel in files])
        bad = [rel for rel, sha in files.items() if not (tmp / rel).is_file() or sha256_file(tmp / rel) != sha]
        if bad:
            raise SnapshotError(f"skills v{record['version']} at {blobs.uri(record['key'])}: "
                                f"{len(bad)} file(s) missing or changed, e.g. {bad[0]}")
        try:
            rename_durably(tmp, dest)
        except OSError:
            if not dest.is_dir():  # not "another replica filled it first"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ------------------------------------------------------------------------------------------ the writer
@dataclass
class Staged:
    dir: Path  # a copy of the snapshot files, taken under the bank's lock
    files: dict[str, str]
    generation: int
    fingerprint: tuple[int, str | None]


@dataclass
class Published:
    record: dict[str, Any]
    merged: bool  # another writer's snapshot was merged in first: the generation went past both
    # Skills this writer changed that another writer had changed and published first: the folder now holds
    # the published text (the loser's text stays in the history); the caller decides its change again.
    lost: list[str] = field(default_factory=list)


class SkillMirror:
    """The writer side: the local skills folder `folder` and its snapshots under `blob_root`."""

    def __init__(self, blob_root: str, folder: Path, keep: int = KEEP, grace_s: float = TMP_GRACE_S):
        self.blobs = BlobStore(blob_root)
        self.folder = Path(folder)
        self.keep, self.grace_s = keep, grace_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self.folder / store.LOCK_FILE)  # the bank's lock file: flock excludes its writes
        self._clean: tuple[int, str | None] | None = None  # fingerprint when nothing was left to publish
        self.lost_since_publish: list[str] = []  # skills of the last `publish` that lost to another writer's
        self.writer = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def base(self) -> dict[str, Any] | None:
        """The record this folder is based on (last pulled or published)."""
        return read_json(self.folder / MARKER)

    @property
    def version(self) -> int:
        return int((self.base or {}).get("version", 0))

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for n in self.blobs.list(SKILLS) if (m := RECORD_RE.fullmatch(n)))

    def record(self, version: int) -> dict[str, Any] | None:
        raw = self.blobs.read(record_key(version))
        return json.loads(raw) if raw is not None else None

    def pull(self) -> dict[str, Any] | None:
        """Bring the newest snapshot into the folder, merged with changes not published yet (the Evolver
        calls this before its bank loads). Returns the record the folder is now based on."""
        versions = self.versions()
        if versions and versions[-1] != self.version:
            self._merge_newest()
        return self.base

    def changed(self) -> bool:
        """Whether the bank committed since the last publish (cheap: a stat and a small read)."""
        return self._fingerprint() != self._clean

    def publish(self) -> Published | None:
        """Publish the folder as the next version unless it equals its base; None when it does (also when
        every change of this folder lost to another writer's: `lost_since_publish` lists them)."""
        merged = False
        self.lost_since_publish: list[str] = []
        for _ in range(MAX_TRIES):
            staged = self._stage()
            if staged is None:
                return None
            try:
                record = self._upload(staged)
            finally:
                shutil.rmtree(staged.dir, ignore_errors=True)
            if record is not None:
                atomic_write_json(self.folder / MARKER, record)
                self._clean = staged.fingerprint
                try:
                    self.prune()
                except OSError as e:  # published all the same; the next publish prunes again
                    log.warning("pruning old skill snapshots failed: %s", e)
                log.info("skills v%d published (generation %d, %d files)", record["version"],
                         record["generation"], len(record["files"]))
                return Published(record, merged, list(self.lost_since_publish))
            self.lost_since_publish += self._merge_newest()
            merged = True
        raise RuntimeError(f"could not publish the skill library under {self.blobs.uri(SKILLS)}")

    def prune(self) -> list[str]:
        """Retention: snapshots beyond the newest `keep` (record first, then files), and uploads no record
        names that are older than `grace_s`. Returns the keys removed."""
        versions = self.versions()
        gone = records_to_remove(versions, self.keep)
        removed = []
        for v in gone:
            record = self.record(v)
            self.blobs.delete(record_key(v))
            if record is not None:
                self.blobs.delete(record["key"])
                removed.append(record["key"])
        kept = {r["key"].rsplit("/", 1)[-1] for v in versions if v not in gone and (r := self.record(v))}
        now = time.time()
        for entry in self.blobs.list(SKILLS):
            if TREE_RE.fullmatch(entry) and entry not in kept:
                mtimes = self.blobs.find(f"{SKILLS}/{entry}").values()
                if mtimes and now - max(mtimes) > self.grace_s:  # none yet: an upload that just started
                    self.blobs.delete(f"{SKILLS}/{entry}")
                    removed.append(f"{SKILLS}/{entry}")
        return removed

    # ---- steps ----------------------------------------------------------------------------------------
    def _fingerprint(self) -> tuple[int, str | None]:
        """Every bank commit appends to the history; every generation change rewrites `.generation`."""
        try:
            size = (self.folder / store.HISTORY_FILE).stat().st_size
        except FileNotFoundError:
            size = -1
        return size, store.GenerationFile(self.folder / store.GENERATION_FILE).read_raw()

    def _stage(self) -> Staged | None:
        """A copy of the folder's snapshot files, or None when its skills and generation equal the base."""
        with self._lock.hold():
            fingerprint = self._fingerprint()
            files = digest_tree(self.folder)
            generation = parse_generation((self.folder / store.GENERATION_FILE).read_bytes()
                                          if store.GENERATION_FILE in files else None)
            base = self.base
            if (units(files), generation) == (units((base or {}).get("files", {})),
                                              int((base or {}).get("generation", 0))):
                self._clean = fingerprint
                return None
            tmp = Path(tempfile.mkdtemp(prefix="clawray-skills-stage-"))
            for rel in files:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.folder / rel, tmp / rel)
        # Digests of the copy: the upload is exactly what the record names.
        return Staged(tmp, digest_tree(tmp), generation, fingerprint)

    def _upload(self, staged: Staged) -> dict[str, Any] | None:
        """Upload `staged` and create its record; None when another writer published first."""
        versions, base = self.versions(), self.version
        latest = versions[-1] if versions else 0
        if latest > base:
            return None
        if latest < base:
            log.warning("the bucket's newest skills version is v%d, below v%d this folder was based on "
                        "(bucket wiped or replaced?): publishing v%d", latest, base, base + 1)
        version = base + 1
        key = f"{SKILLS}/v{version:08d}-{uuid.uuid4().hex[:12]}"
        self.blobs.put_tree(staged.dir, key)
        record = {"version": version, "generation": staged.generation, "key": key, "files": staged.files,
                  "published_at": time.time(), "writer": self.writer}
        if self.blobs.write_new(record_key(version), json.dumps(record, sort_keys=True).encode()):
            return record
        self.blobs.delete(key)  # another writer took this version: ours is an orphan
        return None

    def _merge_newest(self) -> list[str]:
        """Merge the newest snapshot into the folder; the units of ours that lost to it."""
        for _ in range(MAX_TRIES):
            versions = self.versions()
            record = self.record(versions[-1]) if versions else None
            if record is not None or not versions:
                break  # else pruned between the LIST and the read: list again
        if record is None:
            return []
        with tempfile.TemporaryDirectory(prefix="clawray-skills-pull-") as tmp:
            return self._merge_in(record, download(self.blobs, record, Path(tmp) / "snapshot"))

    def _merge_in(self, record: dict[str, Any], theirs: Path) -> list[str]:
        """Make the folder hold `record`'s snapshot (downloaded at `theirs`) merged with its own changes
        since the base; the base becomes `record`. Files first, then history, then the generation: the
        order of a bank commit, so the bank's reader (of this or another process) follows it."""
        with self._lock.hold():
            ours = digest_tree(self.folder)
            base = self.base or {}
            ours_u, theirs_u = units(ours), units(record["files"])
            ours_gen = parse_generation((self.folder / store.GENERATION_FILE).read_bytes()
                                        if store.GENERATION_FILE in ours else None)
            theirs_gen = int(record["generation"])
            # Changes of our own since the base, unless `record` already holds them (our own publish whose
            # marker was never written) or would lower our generation: then a merge, as a new generation.
            local = ((ours_u, ours_gen) != (units(base.get("files", {})), int(base.get("generation", 0)))
                     and (ours_u, ours_gen) != (theirs_u, theirs_gen)) or theirs_gen < ours_gen
            if local:
                pick, conflicts = merge_units(units(base.get("files", {})), ours_u, theirs_u)
                generation = max(ours_gen, theirs_gen) + 1
                log.warning(
                    "skills v%d was published by another writer (%s) since v%d this folder is based on: a "
                    "`clawray skills` command, or a SECOND Evolver (only one should run). Merging it with this "
                    "folder's changes as generation %d%s", record["version"], record.get("writer", "?"),
                    int(base.get("version", 0)), generation,
                    f"; both changed {', '.join(conflicts)}: the published change wins, this writer's is "
                    "decided again" if conflicts else "")
            else:
                pick, conflicts, generation = dict.fromkeys(theirs_u, "theirs"), [], theirs_gen
            lost = [u for u in conflicts if pick.get(u) == "theirs"]
            lost_sha = {u: ours.get(f"{u}/SKILL.md") for u in lost}
            for unit in sorted(set(ours_u) | set(theirs_u)):
                if pick.get(unit) == "theirs" and ours_u.get(unit) != theirs_u[unit]:
                    self._take_unit(theirs, unit)
                elif unit not in pick and unit in ours_u:
                    self._drop_unit(unit)
            self._append_history(theirs, record, generation if local else None, conflicts, lost_sha)
            if generation != ours_gen or store.GENERATION_FILE not in ours:
                atomic_write_text(self.folder / store.GENERATION_FILE, f"{generation}\n")
            atomic_write_json(self.folder / MARKER, record)
            return lost

    def _take_unit(self, theirs: Path, unit: str) -> None:
        src, dst = theirs / unit, self.folder / unit
        if src.is_file():
            if dst.is_dir():
                remove_tree(dst)
            atomic_write_bytes(dst, src.read_bytes())
            return
        if not dst.is_dir():  # new skill: built aside and renamed in, never seen without its SKILL.md
            if dst.exists():
                dst.unlink()
            tmp = self.folder / f"{TMP_PREFIX}{unit}-{uuid.uuid4().hex[:8]}"
            shutil.copytree(src, tmp)
            rename_durably(tmp, dst)
            return
        wanted = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
        for rel in sorted(wanted):  # an existing skill: file by file, each replaced atomically
            if not (dst / rel).is_file() or (dst / rel).read_bytes() != (src / rel).read_bytes():
                atomic_write_bytes(dst / rel, (src / rel).read_bytes())
        for p in [p for p in dst.rglob("*") if p.is_file() and p.relative_to(dst) not in wanted]:
            p.unlink()

    def _drop_unit(self, unit: str) -> None:
        path = self.folder / unit
        if path.is_dir():
            remove_tree(path)
        else:
            path.unlink(missing_ok=True)

    def _append_history(self, theirs: Path, record: dict[str, Any], generation: int | None,
                        conflicts: list[str], lost_sha: dict[str, str | None]) -> None:
        """Their lines this history lacks, then the merge record, then one "lost" record per skill of ours
        that lost to theirs: it names the text (sha256) that is no longer any version of it (evolve/versions.py
        `lost_texts`), so the version both sides numbered alike is the published one."""
        path = self.folder / store.HISTORY_FILE
        ours = path.read_bytes() if path.is_file() else b""
        their_hist = theirs / store.HISTORY_FILE
        data = new_history_lines(ours, their_hist.read_bytes() if their_hist.is_file() else b"")
        if generation is not None:
            data += (json.dumps({"ts": store.utc_now(), "action": "merge", "name": "", "generation": generation,
                                 "version": 0, "evolver": "mirror", "origin_sessions": [],
                                 "merged_version": record["version"], "conflicts": conflicts},
                                sort_keys=True) + "\n").encode()
            for unit, sha in sorted(lost_sha.items()):
                data += (json.dumps({"ts": store.utc_now(), "action": "lost", "name": unit, "generation": generation,
                                     "version": 0, "evolver": "mirror", "origin_sessions": [], "lost_sha256": sha,
                                     "winner": record.get("writer", "?"), "merged_version": record["version"],
                                     "summary": "this writer's change lost the race to a version published "
                                                "first; it is decided again on that version"},
                                    sort_keys=True) + "\n").encode()
        if not data:
            return
        if ours and not ours.endswith(b"\n"):
            data = b"\n" + data
        with open(path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
