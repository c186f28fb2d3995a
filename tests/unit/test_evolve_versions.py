"""The SkillBank as a versioned store: texts kept in the history, compare-and-swap writes, versions read
back, rollback of one skill and of the whole library, the version counter (evolve/versions.py)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.config import SkillsConfig
from core.contracts import Skill
from evolve.bank import BankError, SkillBank
from evolve.mirror import SkillMirror
from evolve.skill_md import render_skill_md
from evolve.store import utc_now_ms
from evolve.versions import parse_ts


def sk(name: str, body: str, desc: str | None = None) -> Skill:
    return Skill(name=name, description=desc or f"about {name}", category="general", body=body)


def disk(bank: SkillBank, name: str) -> bytes:
    return (bank.root / name / "SKILL.md").read_bytes()


@pytest.fixture
def bank(tmp_path: Path) -> SkillBank:
    return SkillBank(tmp_path / "skills", SkillsConfig())


# ------------------------------------------------------------------------------------------ texts kept
def test_every_content_change_keeps_its_text_sha_and_the_callers_notes(bank: SkillBank):
    bank.add(sk("aa", "v1"), ["s1"], "feedback")
    first = disk(bank, "aa")
    note = {"summary": "say when", "evidence": {"sessions": ["s2", "s3"], "score": 0.5},
            "validation": {"passed": True}, "text": "forged", "version": 99}
    r = bank.add(sk("aa", "v2"), ["s2"], "collective", expected_version=1, note=note)
    assert r.accepted == ["aa"]
    bank.add(sk("aa", "v2"), ["s4"], allow_updates=True)  # metadata-only merge: no text kept
    add, update, merge = bank.history()
    assert add["text"].encode() == first and add["sha256"] == hashlib.sha256(first).hexdigest()
    assert update["text"] == bank.text_at("aa", 2) and update["version"] == 2
    assert update["summary"] == "say when" and update["evidence"]["sessions"] == ["s2", "s3"]
    assert update["validation"] == {"passed": True} and update["base_version"] == 1
    assert update["evolver"] == "collective"
    assert update["text"] != "forged" and update["version"] == 2  # notes never replace the bank's fields
    assert merge["action"] == "merge" and "text" not in merge
    for rec in (add, update, merge):  # ISO 8601 with milliseconds
        assert datetime.strptime(rec["ts"], "%Y-%m-%dT%H:%M:%S.%fZ") and len(rec["ts"]) == 24
    assert [v["version"] for v in bank.versions("aa")] == [1, 2]


def test_old_second_precision_timestamps_still_parse():
    assert parse_ts("2024-05-01T10:00:00Z") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert parse_ts("2024-05-01T10:00:00.250Z") == datetime(2024, 5, 1, 10, 0, 0, 250000, tzinfo=UTC)
    assert parse_ts("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert parse_ts("2024-05-01T10:00:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)  # no zone: UTC
    assert parse_ts("yesterday") is None


# ------------------------------------------------------------------------------------------ CAS
def test_a_stale_base_is_a_conflict_and_nothing_is_overwritten(bank: SkillBank):
    bank.add_batch([sk("aa", "v1"), sk("bb", "b1")])
    bank.add(sk("aa", "v2"), allow_updates=True)
    before, gen, lines = disk(bank, "aa"), bank.generation, len(bank.history())
    r = bank.add_batch([sk("aa", "stale edit"), sk("bb", "fresh edit"), sk("cc", "new")],
                       expected_versions={"aa": 1, "bb": 1, "cc": 0},
                       notes={"bb": {"summary": "edit bb"}})
    assert [c.name for c in r.conflicts] == ["aa"] and r.accepted == ["bb", "cc"] and not r.rejected
    assert "based on version 1" in r.conflicts[0].reason and "current version is 2" in r.conflicts[0].reason
    assert disk(bank, "aa") == before  # never overwritten
    assert r.generation == gen + 1 and len(bank.history()) == lines + 2  # the rest of the batch went on
    assert bank.history()[-2]["summary"] == "edit bb" and bank.history()[-2]["base_version"] == 1
    # 0 means "must not exist yet"
    r = bank.add(sk("cc", "another new"), expected_version=0)
    assert r.conflicts and "current version is 1" in r.conflicts[0].reason and not r.accepted
    assert bank.get("cc").body == "new"


def test_two_writers_on_one_base_one_wins_and_the_retry_keeps_both_changes(tmp_path: Path):
    a = SkillBank(tmp_path, SkillsConfig())
    a.add(sk("aa", "- base rule"))
    b = SkillBank(tmp_path, SkillsConfig())
    base_a, base_b = a.get("aa"), b.get("aa")  # both read version 1
    assert base_a.metadata["version"] == base_b.metadata["version"] == 1

    ra = a.add(sk("aa", base_a.body + "\n- rule from A"), evolver="A",
               expected_version=base_a.metadata["version"])
    rb = b.add(sk("aa", base_b.body + "\n- rule from B"), evolver="B",
               expected_version=base_b.metadata["version"])
    assert ra.accepted == ["aa"] and not ra.conflicts
    assert rb.accepted == [] and [c.name for c in rb.conflicts] == ["aa"]
    assert b.get("aa").body == "- base rule\n- rule from A"  # B caught up under the lock

    retry = b.get("aa")  # B re-applies its change on the new base
    rb2 = b.add(sk("aa", retry.body + "\n- rule from B"), evolver="B",
                expected_version=retry.metadata["version"])
    assert rb2.accepted == ["aa"] and not rb2.conflicts
    assert a.reload() and a.get("aa").body == "- base rule\n- rule from A\n- rule from B"  # no lost update
    assert [(h["version"], h["evolver"]) for h in a.history()] == [(1, "manual"), (2, "A"), (3, "B")]


# ------------------------------------------------------------------------------------------ rollback
def test_rollback_restores_the_exact_text_as_a_new_version_and_bumps_the_generation(bank: SkillBank):
    bank.add(sk("aa", "v1"), ["s1"])
    v1 = disk(bank, "aa")
    bank.add(sk("aa", "v2"), ["s2"], allow_updates=True)
    reader = SkillBank(bank.root, SkillsConfig())
    gen = bank.generation
    r = bank.rollback("aa", 1, evolver="ops")
    assert r.accepted == ["aa"] and r.generation == gen + 1 == bank.generation
    assert disk(bank, "aa") == v1 == bank.text_at("aa", 1).encode()  # byte-identical
    rec = bank.history()[-1]
    assert rec["action"] == "rollback" and rec["restored_version"] == 1 and rec["version"] == 3
    assert rec["evolver"] == "ops" and rec["text"].encode() == v1 and rec["generation"] == gen + 1
    # The counter stays monotonic although the file's front matter says version 1.
    assert bank.version_of("aa") == 3 and bank.get("aa").metadata["version"] == 3
    assert reader.reload() and reader.version_of("aa") == 3 and reader.get("aa").body == "v1"
    assert SkillBank(bank.root, SkillsConfig()).version_of("aa") == 3  # a fresh scan agrees
    # Rolling back to the text already there changes nothing.
    again = bank.rollback("aa", 1)
    assert again.unchanged == ["aa"] and not again.changed and bank.generation == gen + 1
    # A CAS write on the new base continues the numbers.
    r = bank.add(sk("aa", "v4"), expected_version=3)
    assert r.accepted == ["aa"] and bank.get("aa").metadata["version"] == 4
    assert bank.history()[-1]["version"] == 4
    assert bank.add(sk("aa", "stale"), expected_version=1).conflicts


def test_rollback_recreates_a_removed_skill_and_versions_never_repeat(bank: SkillBank):
    bank.add(sk("aa", "v1"))
    bank.add(sk("aa", "v2"), allow_updates=True)
    v2 = bank.text_at("aa", 2)
    gen = bank.remove("aa")
    r = bank.rollback("aa", 2)
    assert r.accepted == ["aa"] and bank.generation == gen + 1
    assert disk(bank, "aa") == v2.encode() and bank.version_of("aa") == 3
    bank.remove("aa")
    bank.add(sk("aa", "re-added"))  # a new incarnation continues the numbers
    assert bank.version_of("aa") == 4 and bank.get("aa").metadata["version"] == 4
    assert bank.text_at("aa", 1) != bank.text_at("aa", 4)
    assert [(v["action"], v["version"]) for v in bank.versions("aa")] == [
        ("add", 1), ("update", 2), ("remove", 2), ("rollback", 3), ("remove", 3), ("add", 4)]


def test_library_rollback_restores_several_skills_in_one_bump_and_keeps_hand_added_folders(bank: SkillBank):
    bank.add_batch([sk("aa", "a1"), sk("bb", "b1")])  # generation 1
    bank.add(sk("aa", "a2"), allow_updates=True)  # 2
    a2, b1 = disk(bank, "aa"), disk(bank, "bb")
    mark = bank.history()[-1]["ts"]
    while utc_now_ms() <= mark:  # later records get a later millisecond (the clock's step, not a wait)
        pass
    bank.add(sk("aa", "a3"), allow_updates=True)  # 3
    bank.add(sk("cc", "c1"))  # 4
    bank.remove("bb")  # 5
    (bank.root / "manual").mkdir()  # dropped in by hand: no history at all
    (bank.root / "manual" / "SKILL.md").write_text(render_skill_md(sk("manual", "mine")))
    manual = disk(bank, "manual")
    reader = SkillBank(bank.root, SkillsConfig())
    expected = bank.state_at(generation=2)
    assert expected == {"aa": a2.decode(), "bb": b1.decode(), "cc": None}

    r = bank.rollback_library(generation=2, evolver="ops")
    assert r.generation == 6 == bank.generation  # ONE bump for the whole library
    assert sorted(r.accepted) == ["aa", "bb"] and r.removed == ["cc"] and not r.rejected
    assert disk(bank, "aa") == a2 and disk(bank, "bb") == b1 and not (bank.root / "cc").exists()
    assert disk(bank, "manual") == manual and "manual" in bank
    new = [h for h in bank.history() if h["generation"] == 6]
    assert sorted((h["action"], h["name"]) for h in new) == [("remove", "cc"), ("rollback", "aa"),
                                                              ("rollback", "bb")]
    assert all(h["evolver"] == "ops" and "library rollback to generation 2" in h["summary"] for h in new)
    assert reader.reload() and reader.names() == ["aa", "bb", "manual"] and reader.generation == 6
    # Nothing left to do: no bump.
    assert not bank.rollback_library(generation=2).changed and bank.generation == 6
    # By time: the same point.
    bank.add(sk("dd", "d1"))
    r = bank.rollback_library(at=mark)
    assert r.removed == ["dd"] and bank.generation == 8 and disk(bank, "aa") == a2


def test_bad_rollback_requests_are_clear_errors_that_change_nothing(bank: SkillBank):
    bank.add(sk("aa", "a1"))
    gen, lines = bank.generation, len(bank.history())
    for call, msg in [(lambda: bank.rollback("aa", 7), "has no version 7"),
                      (lambda: bank.rollback("nope", 1), "no stored versions of skill 'nope'"),
                      (lambda: bank.rollback("../x", 1), "invalid skill name"),
                      (lambda: bank.rollback_library(), "exactly one"),
                      (lambda: bank.rollback_library(generation=1, at="2024-01-01"), "exactly one"),
                      (lambda: bank.rollback_library(generation=9), "ahead of"),
                      (lambda: bank.rollback_library(at="soon"), "not an ISO 8601 time"),
                      (lambda: bank.text_at("aa", 0), "has no version 0")]:
        with pytest.raises(BankError, match=msg):
            call()
    assert bank.generation == gen and len(bank.history()) == lines


# ------------------------------------------------------------------------------------------ old records
def test_records_written_before_texts_were_kept(tmp_path: Path):
    """A library from before this change: second-precision ts, no `text` in its records."""
    root = tmp_path / "skills"
    root.mkdir()
    for name, body in (("old", "o1"), ("kept", "k1")):
        (root / name).mkdir()
        meta = {"version": 1, "generation": 1}
        (root / name / "SKILL.md").write_text(render_skill_md(sk(name, body).model_copy(update={"metadata": meta})))
    legacy = [{"ts": "2024-05-01T10:00:00Z", "action": "add", "name": n, "generation": 1, "version": 1,
               "evolver": "feedback", "origin_sessions": [], "category": "general"} for n in ("old", "kept")]
    (root / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in legacy))
    (root / ".generation").write_text("1\n")
    bank = SkillBank(root, SkillsConfig())
    with pytest.raises(BankError, match="recorded before the bank kept texts"):
        bank.text_at("old", 1)
    with pytest.raises(BankError, match="recorded before the bank kept texts"):
        bank.rollback("old", 1)
    assert bank.generation == 1
    bank.add(sk("old", "o2"), allow_updates=True)  # generation 2, keeps its text
    assert bank.version_of("old") == 2 and "o2" in bank.text_at("old", 2)
    assert bank.state_at(at="2024-05-01T10:00:00.000Z") == {}  # texts then unknown: left out
    r = bank.rollback_library(generation=1)
    assert not r.changed and [x.name for x in r.rejected] == ["old"]
    assert "recorded before the bank kept texts" in r.rejected[0].reason and bank.generation == 2


def test_a_hand_added_skill_the_bank_later_updated_is_never_removed(bank: SkillBank):
    (bank.root / "manual").mkdir()
    (bank.root / "manual" / "SKILL.md").write_text(render_skill_md(sk("manual", "mine")))
    bank.reload()
    assert bank.version_of("manual") == 1  # a file with no version counts as version 1
    bank.add(sk("manual", "bank edit"), expected_version=1)
    bank.add(sk("aa", "a1"))
    r = bank.rollback_library(generation=0)
    assert r.removed == ["aa"] and [x.name for x in r.rejected] == ["manual"]
    assert "existed before the bank first recorded it" in r.rejected[0].reason
    assert (bank.root / "manual" / "SKILL.md").is_file()


# ------------------------------------------------------------------------------------------ across hosts
def test_texts_travel_with_the_mirrored_history_so_another_host_can_roll_back(tmp_path: Path):
    blobs = str(tmp_path / "bucket")
    mirror_a = SkillMirror(blobs, tmp_path / "host-a")
    mirror_a.pull()
    a = SkillBank(mirror_a.folder, SkillsConfig())
    a.add(sk("aa", "v1"))
    v1 = disk(a, "aa")
    a.add(sk("aa", "v2"), allow_updates=True)
    mirror_a.publish()
    mirror_b = SkillMirror(blobs, tmp_path / "host-b")
    mirror_b.pull()
    b = SkillBank(mirror_b.folder, SkillsConfig())
    assert b.version_of("aa") == 2 and b.text_at("aa", 1).encode() == v1
    assert b.rollback("aa", 1).accepted == ["aa"] and disk(b, "aa") == v1
    mirror_b.publish()
    mirror_a.pull()
    assert a.reload() and disk(a, "aa") == v1 and a.version_of("aa") == 3
    assert a.history()[-1]["action"] == "rollback"
