"""A Proxy replica's skill library read from the bucket's snapshots (the writer and the layout: evolve/mirror.py).

`poll()` does one LIST of `skills/`; when a newer record appears it downloads that snapshot, checks every
file against the record, and swaps in a new `SkillSearch` over it in one assignment."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from core.blobs import BlobStore
from core.config import SkillsConfig
from core.storage import remove_stale_temps, remove_tree
from evolve.mirror import RECORD_RE, SKILLS, TREE_RE, download, record_key

log = logging.getLogger("evolve.mirror")  # one logger for the mirror's writer and readers, as before


class SnapshotReader:
    """A Proxy replica's library: a `SkillSearch` over the newest snapshot, swapped whole by `poll()`.

    `cache`: this host's folder of downloaded snapshots (not the Evolver's skills folder)."""

    def __init__(self, blob_root: str, cache: Path, cfg: SkillsConfig):
        from evolve.embedding import shared_cache

        self.blobs = BlobStore(blob_root)
        self.cache, self.cfg = Path(cache), cfg
        # One encoder and cache for every snapshot: a skill is encoded once, however many versions it is in.
        self._embedder = shared_cache(cfg.embedding_model, cfg.embedding_encoder) \
            if cfg.retrieval == "embedding" else None
        self.version = 0
        self._refused = 0
        self.search = self._open(self.cache / "empty")  # until the bucket has a snapshot
        try:
            self.poll()
        except Exception as e:  # noqa: BLE001 - s3fs/gcsfs raise OSError subclasses and their own errors
            # A replica that cannot read the bucket yet still serves (without skills, generation 0: such
            # turns are never trained once the library's generation is known) rather than failing its
            # start; the injector's follower polls again every `skills.refresh_s`.
            log.warning("cannot read the skill library from the bucket at start (%s: %s); serving "
                        "without skills until it can", type(e).__name__, e)

    @property
    def generation(self) -> int:
        return self.search.generation

    def poll(self) -> bool:
        """One LIST; when a newer snapshot is published, download it and swap it in. True when swapped."""
        versions = sorted(int(m.group(1)) for n in self.blobs.list(SKILLS) if (m := RECORD_RE.fullmatch(n)))
        if not versions or versions[-1] in (self.version, self._refused):
            return False
        raw = self.blobs.read(record_key(versions[-1]))
        if raw is None:
            return False  # pruned between the LIST and the read: the next poll lists again
        record = json.loads(raw)
        if record["generation"] < self.generation:
            self._refused = versions[-1]
            log.error("skills v%d has generation %d, below %d served now: not taken (generations never go "
                      "back)", record["version"], record["generation"], self.generation)
            return False
        folder = download(self.blobs, record, self.cache / record["key"].rsplit("/", 1)[-1])
        self.search, self.version = self._open(folder), int(record["version"])  # one assignment: the swap
        self._prune(set(versions))
        log.info("skills v%d (generation %d) loaded from %s", self.version, self.generation,
                 self.blobs.uri(record["key"]))
        return True

    def _open(self, folder: Path):
        from evolve.bank import SkillBank
        from evolve.retrieval import SkillSearch

        return SkillSearch(SkillBank(folder, self.cfg, self._embedder), self.cfg, embedder=self._embedder)

    def _prune(self, listed: set[int]) -> None:
        """Drop downloaded snapshots the bucket no longer holds (the one served is held in memory)."""
        remove_stale_temps(self.cache)
        for p in self.cache.iterdir():
            m = TREE_RE.fullmatch(p.name)
            if m and int(m.group(1)) not in listed and int(m.group(1)) != self.version:
                remove_tree(p)
