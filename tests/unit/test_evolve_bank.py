"""SkillBank: generation per batch, history, refusals, malformed folders, cross-process safety."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import pytest

from core.config import SkillsConfig
from core.contracts import Skill
from evolve.bank import BankError, SkillBank
from evolve.skill_md import parse_skill_md, render_skill_md


def sk(name: str, desc: str | None = None, body: str = "", category: str = "general") -> Skill:
    return Skill(name=name, description=desc or f"about {name}", category=category, body=body)


class BagOfWordsEmbedder:
    """A deterministic stand-in behind the Embedder protocol: hashed bag of words, L2-normalised."""

    dim = 64

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(".", " ").split():
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture
def bank(tmp_path: Path) -> SkillBank:
    return SkillBank(tmp_path / "skills", SkillsConfig())


def test_generation_bumps_once_per_batch_and_history_records_origins(bank: SkillBank):
    r = bank.add_batch([sk("aa"), sk("bb"), sk("cc")], origin_sessions=["s1", "s2"], evolver="feedback")
    assert r.accepted == ["aa", "bb", "cc"] and r.rejected == [] and r.generation == 1
    assert bank.generation == 1 and (bank.root / ".generation").read_text().strip() == "1"
    r2 = bank.add_batch([sk("dd")], ["s3"], "llm")
    assert r2.generation == 2
    hist = [json.loads(line) for line in (bank.root / "history.jsonl").read_text().splitlines()]
    assert [(h["name"], h["generation"], h["evolver"]) for h in hist] == [
        ("aa", 1, "feedback"), ("bb", 1, "feedback"), ("cc", 1, "feedback"), ("dd", 2, "llm")]
    assert hist[0]["origin_sessions"] == ["s1", "s2"] and hist[0]["action"] == "add"
    meta = bank.get("aa").metadata
    assert meta["origin_sessions"] == ["s1", "s2"] and meta["version"] == 1 and meta["generation"] == 1


def test_rejected_only_batch_does_not_bump(bank: SkillBank):
    bank.add(sk("aa"))
    r = bank.add_batch([sk("aa", "other text")])
    assert r.accepted == [] and r.generation == 1 and "already exists" in r.rejected[0].reason


def test_update_and_metadata_only_merge(bank: SkillBank):
    bank.add(sk("aa", body="v1"), ["s1"])
    merged = bank.add(sk("aa", body="v1"), ["s2"], allow_updates=True)
    assert merged.merged == ["aa"] and merged.accepted == [] and merged.generation == 1
    assert bank.get("aa").metadata["origin_sessions"] == ["s1", "s2"]
    updated = bank.add(sk("aa", body="v2"), ["s3"], allow_updates=True)
    assert updated.accepted == ["aa"] and updated.generation == 2
    meta = bank.get("aa").metadata
    assert meta["version"] == 2 and meta["origin_sessions"] == ["s1", "s2", "s3"]
    assert [h["action"] for h in bank.history()] == ["add", "merge", "update"]


def test_duplicates_within_a_batch_are_refused(bank: SkillBank):
    r = bank.add_batch([sk("aa"), sk("aa", "again")])
    assert r.accepted == ["aa"] and r.rejected[0].reason == "duplicate name within the batch"


def test_oversized_content_is_refused_and_nothing_written(tmp_path: Path):
    bank = SkillBank(tmp_path, SkillsConfig(max_skill_bytes=1024))
    r = bank.add(sk("big", body="x" * 2000))
    assert r.accepted == [] and "max_skill_bytes" in r.rejected[0].reason
    assert not (tmp_path / "big").exists() and bank.generation == 0


def test_case_clash_and_malformed_folders(bank: SkillBank):
    (bank.root / "Backup-Skill").mkdir()
    (bank.root / "Backup-Skill" / "SKILL.md").write_text("---\nname: Backup-Skill\ndescription: d\n---\n")
    (bank.root / "broken").mkdir()
    (bank.root / "broken" / "SKILL.md").write_text("no front matter here")
    (bank.root / "evil").mkdir()
    (bank.root / "evil" / "SKILL.md").write_text("---\nname: ../../evil\ndescription: d\n---\n")
    (bank.root / "good-one").mkdir()
    (bank.root / "good-one" / "SKILL.md").write_text(render_skill_md(sk("good-one")))
    assert bank.reload() is True
    assert bank.names() == ["good-one"]
    assert set(bank.problems) == {"Backup-Skill", "broken", "evil"}
    assert "front matter" in bank.problems["broken"]
    r = bank.add_batch([sk("backup-skill"), sk("broken")])
    reasons = {x.name: x.reason for x in r.rejected}
    assert "clashes by case" in reasons["backup-skill"] and "malformed" in reasons["broken"]


def test_oversized_file_on_disk_is_skipped(tmp_path: Path):
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "SKILL.md").write_text(render_skill_md(sk("huge", body="y" * 5000)))
    bank = SkillBank(tmp_path, SkillsConfig(max_skill_bytes=1024))
    assert len(bank) == 0 and "max_skill_bytes" in bank.problems["huge"]


@pytest.mark.parametrize("bad", ["../etc", "a/b", "..", "", "A-b", "x" * 65])
def test_remove_refuses_traversal_and_invalid_names(bank: SkillBank, bad: str):
    outside = bank.root.parent / "etc"
    outside.mkdir(exist_ok=True)
    with pytest.raises(BankError, match="invalid skill name"):
        bank.remove(bad)
    assert outside.exists()


def test_remove_bumps_generation_and_other_instances_follow(bank: SkillBank):
    other = SkillBank(bank.root, SkillsConfig())
    bank.add_batch([sk("aa"), sk("bb")])
    assert other.reload() and other.names() == ["aa", "bb"] and other.generation == 1
    assert bank.remove("aa") == 2
    assert not (bank.root / "aa").exists()
    assert other.reload() and other.names() == ["bb"] and other.generation == 2
    with pytest.raises(BankError, match="no skill named"):
        bank.remove("aa")


def test_reload_is_cheap_when_nothing_changed(bank: SkillBank):
    bank.add_batch([sk(f"skill-{i:03d}") for i in range(100)])
    reader = SkillBank(bank.root, SkillsConfig())
    version = reader.version
    t0 = time.perf_counter()
    for _ in range(200):
        assert reader.reload() is False
    per_call = (time.perf_counter() - t0) / 200
    assert reader.version == version
    assert per_call < 2e-3, f"reload took {per_call * 1e3:.2f} ms with nothing new"


def test_hand_added_folder_is_found_by_reload(bank: SkillBank):
    bank.add(sk("aa"))
    (bank.root / "manual").mkdir()
    (bank.root / "manual" / "SKILL.md").write_text(render_skill_md(sk("manual")))
    assert bank.reload() and "manual" in bank


def test_damaged_generation_file_is_recovered_from_history(bank: SkillBank):
    bank.add(sk("aa"))
    bank.add(sk("bb"))
    (bank.root / ".generation").write_text("garbage")
    again = SkillBank(bank.root, SkillsConfig())
    assert again.generation == 2 and ".generation" in again.problems
    assert again.add(sk("cc")).generation == 3


def test_near_duplicates_refused_by_embedding(tmp_path: Path):
    bank = SkillBank(tmp_path, SkillsConfig(dedup_threshold=0.9), BagOfWordsEmbedder())
    bank.add(sk("backup-first", "create a bak copy before modifying a file"))
    r = bank.add_batch([
        sk("backup-again", "create a bak copy before modifying a file"),  # same text, new name
        sk("iso-times", "timestamps must be iso 8601 with the +08:00 offset"),
        sk("iso-times-2", "timestamps must be iso 8601 with the +08:00 offset"),  # dup within batch
    ])
    assert r.accepted == ["iso-times"]
    reasons = {x.name: x.reason for x in r.rejected}
    assert "near-duplicate of 'backup-first'" in reasons["backup-again"]
    assert "near-duplicate of 'iso-times'" in reasons["iso-times-2"]
    # An update is not a duplicate of itself.
    assert bank.add(sk("iso-times", "timestamps must be iso 8601 with the +08:00 offset",
                       body="more"), allow_updates=True).accepted == ["iso-times"]


def _writer(root: str, worker: int, batches: int, start) -> None:
    bank = SkillBank(Path(root), SkillsConfig())
    start.wait(60)  # all writers begin together, so their batches interleave
    for b in range(batches):
        r = bank.add_batch([sk(f"w{worker}-b{b}-{j}", body=f"body {worker} {b} {j}\n" * 20)
                            for j in range(2)], [f"sess-{worker}"], "test")
        assert not r.rejected, r.rejected


def _run_writers(target, root: Path, workers: int, n: int) -> None:
    """`workers` processes running target(root, w, n, barrier), started together; each must exit 0."""
    ctx = mp.get_context("spawn")  # a clean interpreter per writer, like separate processes
    start = ctx.Barrier(workers)
    procs = [ctx.Process(target=target, args=(str(root), w, n, start)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0


def test_concurrent_adds_from_several_processes_lose_nothing(tmp_path: Path):
    workers, batches = 4, 8
    _run_writers(_writer, tmp_path, workers, batches)
    bank = SkillBank(tmp_path, SkillsConfig())
    expected = {f"w{w}-b{b}-{j}" for w in range(workers) for b in range(batches) for j in range(2)}
    assert set(bank.names()) == expected and not bank.problems
    assert bank.generation == workers * batches  # once per batch, none lost or doubled
    for name in expected:  # every file complete and parseable
        parse_skill_md((tmp_path / name / "SKILL.md").read_text(), folder_name=name)
    hist = bank.history()
    assert len(hist) == len(expected)
    assert sorted(h["generation"] for h in hist) == sorted(g for g in range(1, workers * batches + 1)
                                                          for _ in range(2))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp", ".trash"))]
    for h in hist:  # each record keeps exactly the text its writer wrote
        text = (tmp_path / h["name"] / "SKILL.md").read_text()
        assert h["text"] == text and h["sha256"] == hashlib.sha256(text.encode()).hexdigest()


def _cas_writer(root: str, worker: int, edits: int, start) -> None:
    """Read-modify-write of ONE shared skill with compare-and-swap, retrying on conflicts."""
    bank = SkillBank(Path(root), SkillsConfig())
    start.wait(60)
    for e in range(edits):
        while True:
            bank.reload()
            cur = bank.get("shared")
            r = bank.add(sk("shared", body=f"{cur.body}\n- w{worker} e{e}"), evolver=f"w{worker}",
                         expected_version=cur.metadata["version"])
            assert not r.rejected, r.rejected
            if r.accepted:
                break
            assert r.conflicts, r  # not written: another writer moved the base


def test_compare_and_swap_across_processes_loses_no_update(tmp_path: Path):
    workers, edits = 3, 4
    SkillBank(tmp_path, SkillsConfig()).add(sk("shared", body="- base"))
    _run_writers(_cas_writer, tmp_path, workers, edits)
    bank = SkillBank(tmp_path, SkillsConfig())
    lines = bank.get("shared").body.splitlines()
    assert sorted(lines[1:]) == sorted(f"- w{w} e{e}" for w in range(workers) for e in range(edits))
    assert bank.version_of("shared") == 1 + workers * edits == bank.generation
    assert [h["version"] for h in bank.history()] == list(range(1, 2 + workers * edits))


def test_vector_set_tracks_adds_changes_and_removals():
    from evolve.embedding import EmbeddingCache, VectorSet
    from evolve.skill_md import content_key

    calls: list[int] = []
    base = BagOfWordsEmbedder()

    class Counting:
        dim = base.dim

        def encode(self, texts):
            calls.append(len(texts))
            return base.encode(texts)

    vs = VectorSet(EmbeddingCache(Counting()))
    lib = {f"s{i:02d}": sk(f"s{i:02d}", f"topic{i} alpha{i} beta{i}") for i in range(20)}
    vs.sync(lib, {n: content_key(s) for n, s in lib.items()})
    probe = base.encode(["s03. topic3 alpha3 beta3"])[0]
    assert vs.nearest(probe)[0] == "s03" and vs.nearest(probe, exclude="s03")[0] != "s03"
    lib["s03"] = sk("s03", "entirely different words here")  # changed content
    for i in range(4, 12):  # removals beyond a quarter of the rows force a compaction
        del lib[f"s{i:02d}"]
    vs.sync(lib, {n: content_key(s) for n, s in lib.items()})
    assert calls == [20, 1]  # only the changed skill was encoded again
    name, cos = vs.nearest(base.encode(["s03. entirely different words here"])[0])
    assert name == "s03" and cos > 0.99
    assert all(vs.nearest(base.encode([f"s{i:02d}. topic{i} alpha{i} beta{i}"])[0])[0] != f"s{i:02d}"
               for i in range(4, 12))
