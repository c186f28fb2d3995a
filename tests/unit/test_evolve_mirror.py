"""Skills in the bucket (issue 13): evolve/mirror.py's snapshots, publish/pull, merges, readers, retention,
each on a real S3 HTTP server (moto_server: a create-only PUT on an existing key answers 412) and on a
local blob folder. Interleavings are driven by hooks and barriers, never sleeps."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path

import pytest

from core.config import EvolverConfig, SkillsConfig
from core.contracts import Skill
from evolve.bank import SkillBank
from evolve.evolvers import make_evolver
from evolve.loop import EvolutionLoop
from evolve.mirror import (
    MARKER,
    SKILLS,
    SkillMirror,
    SnapshotError,
    digest_tree,
    merge_units,
    new_history_lines,
    record_key,
    records_to_remove,
)
from evolve.snapshot_reader import SnapshotReader

CFG = SkillsConfig(retrieval="template")


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"clawray-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    return s3_endpoint


@pytest.fixture(params=["local", "s3"])
def blob_root(request, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket")
    return f"s3://{make_bucket(request.getfixturevalue('s3_env'))}/team/prod"


def sk(name: str, body: str = "") -> Skill:
    return Skill(name=name, description=f"use when the task is about {name.replace('-', ' ')}",
                 category="general", body=body or f"Steps for {name}.")


def writer(blob_root: str, folder: Path, **kw) -> tuple[SkillMirror, SkillBank]:
    """An Evolver's start: pull before the bank loads."""
    mirror = SkillMirror(blob_root, folder, **kw)
    mirror.pull()
    return mirror, SkillBank(folder, CFG)


def library(folder: Path) -> dict[str, str]:
    return {rel: sha for rel, sha in digest_tree(folder).items()}


# ------------------------------------------------------------------------------------------ pure rules
@pytest.mark.parametrize("base, ours, theirs, pick, conflicts", [
    ({"a": "1"}, {"a": "1"}, {"a": "2"}, {"a": "theirs"}, []),  # changed on their side only
    ({"a": "1"}, {"a": "2"}, {"a": "1"}, {"a": "ours"}, []),  # on ours only
    ({}, {"a": "1"}, {"b": "1"}, {"a": "ours", "b": "theirs"}, []),  # added on each side
    ({"a": "1", "b": "1"}, {"b": "1"}, {"a": "1"}, {}, []),  # each side deleted one
    ({"a": "1"}, {"a": "2"}, {"a": "3"}, {"a": "theirs"}, ["a"]),  # both edited: the one published first
    ({"a": "1"}, {}, {"a": "3"}, {"a": "theirs"}, ["a"]),  # deleted here, edited there: the edit stays
    ({"a": "1"}, {"a": "2"}, {}, {"a": "ours"}, ["a"]),
    ({}, {"a": "2"}, {"a": "2"}, {"a": "ours"}, []),  # the same change on both sides
])
def test_merge_takes_each_sides_changes_and_never_lets_a_deletion_beat_an_edit(base, ours, theirs, pick,
                                                                                conflicts):
    assert merge_units(base, ours, theirs) == (pick, conflicts)


def test_merged_history_only_grows_and_keeps_each_line_once():
    ours, theirs = b"a\nb\nmine\n", b"a\nb\nc\nd\n"
    assert ours + new_history_lines(ours, theirs) == b"a\nb\nmine\nc\nd\n"
    assert new_history_lines(b"a\n", b"a\npartial") == b""  # a line being written is not a line yet


def test_retention_removes_all_but_the_newest():
    assert records_to_remove([3, 1, 4, 2, 5], 3) == [1, 2]
    assert records_to_remove([1, 2], 3) == []


# ------------------------------------------------------------------------------------------ writer
def test_a_published_library_pulled_into_an_empty_folder_is_the_same_library(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "a")
    assert mirror.publish() is None  # an empty library: nothing to publish
    bank.add(sk("git-commit"))
    bank.add(sk("run-tests"))
    assert mirror.changed()
    out = mirror.publish()
    assert out is not None and not out.merged
    assert (out.record["version"], out.record["generation"]) == (1, 2)
    assert sorted(out.record["files"]) == [".generation", "git-commit/SKILL.md", "history.jsonl",
                                           "run-tests/SKILL.md"]
    assert not mirror.changed() and mirror.publish() is None

    other, copy = writer(blob_root, tmp_path / "b")  # another host
    assert library(tmp_path / "b") == library(tmp_path / "a")
    assert copy.generation == 2 and copy.names() == ["git-commit", "run-tests"]
    assert len(copy.history()) == 2 and other.version == 1
    assert other.publish() is None  # nothing new: no version is spent on a copy


def test_two_writers_racing_for_one_version_exactly_one_wins_and_the_other_merges(blob_root: str,
                                                                                  tmp_path: Path):
    seed, bank = writer(blob_root, tmp_path / "seed")
    bank.add(sk("base-skill"))
    seed.publish()
    racers = [writer(blob_root, tmp_path / f"w{i}") for i in range(2)]
    for i, (_, b) in enumerate(racers):
        b.add(sk(f"skill-of-writer-{i}"))  # generation 2 on both sides
    barrier = threading.Barrier(2)
    for mirror, _ in racers:  # both have uploaded their files before either creates the record
        create = mirror.blobs.write_new

        def gated(key, data, create=create, first=[True]):  # noqa: B006 - per-writer "first call" flag
            if first[0]:
                first[0] = False
                barrier.wait(timeout=30)
            return create(key, data)

        mirror.blobs.write_new = gated
    results = [None, None]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, racers[i][0].publish()))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.merged for r in results) == [False, True]
    won, lost = (results[0], results[1]) if not results[0].merged else (results[1], results[0])
    assert won.record["version"] == 2 and won.record["generation"] == 2
    assert lost.record["version"] == 3 and lost.record["generation"] == 3  # past both sides' generation 2
    names = sorted(n.split("/")[0] for n in lost.record["files"] if n.endswith("SKILL.md"))
    assert names == ["base-skill", "skill-of-writer-0", "skill-of-writer-1"]
    assert seed.versions() == [1, 2, 3]
    trees = [n for n in seed.blobs.list(SKILLS) if not n.endswith(".json")]
    assert len(trees) == 3  # the loser's upload for v2 was deleted
    reader, _ = writer(blob_root, tmp_path / "reader")
    history = SkillBank(reader.folder, CFG).history()
    assert [r["action"] for r in history][-1] == "merge" and history[-1]["generation"] == 3
    assert sum(r["action"] == "add" for r in history) == 3


def test_an_edit_that_lost_the_race_is_not_written_over_the_published_one_and_is_reported(blob_root: str,
                                                                                         tmp_path: Path):
    """Two hosts edit the same skill from the same base; the one that publishes first wins. The second's
    publish keeps the published text (never overwrites it), names the skill in `lost` for its caller to
    decide again, and keeps its own text in the history without making it a version."""
    seed, bank = writer(blob_root, tmp_path / "seed")
    bank.add(sk("shared-skill", "Version one."))
    seed.publish()
    (ma, a), (mb, b) = writer(blob_root, tmp_path / "a"), writer(blob_root, tmp_path / "b")
    a.add(sk("shared-skill", "A's edit."), allow_updates=True)
    b.add(sk("shared-skill", "B's edit."), allow_updates=True)
    b.add(sk("b-only", "B's new skill."))
    won = ma.publish()
    assert not won.merged and won.lost == []
    lost = mb.publish()
    assert lost.merged and lost.lost == ["shared-skill"]
    b.reload()
    assert b.get("shared-skill").body == "A's edit." and b.get("b-only") is not None  # B's other change stays
    assert b.version_of("shared-skill") == 2 and b.text_at("shared-skill", 2) == a.text_at("shared-skill", 2)
    texts = [r.get("text", "") for r in b.history() if r["name"] == "shared-skill"]
    assert any("B's edit." in t for t in texts)  # the audit keeps the losing text
    assert [r["action"] for r in b.history()][-1] == "lost"
    reader, _ = writer(blob_root, tmp_path / "reader")  # every host sees the winner
    assert SkillBank(reader.folder, CFG).get("shared-skill").body == "A's edit."


def test_a_change_not_published_before_a_crash_is_merged_with_what_others_published(blob_root: str,
                                                                                     tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("first"))
    mirror.publish()
    bank.add(sk("committed-not-published"))  # then the process dies
    cli, cli_bank = writer(blob_root, tmp_path / "cli")
    cli_bank.add(sk("added-by-hand"))
    assert cli.publish().record["version"] == 2

    restarted, bank = writer(blob_root, tmp_path / "evolver")  # the same host: the folder is still there
    assert bank.names() == ["added-by-hand", "committed-not-published", "first"]
    assert bank.generation == 3  # max(2, 2) + 1: a library neither side has served
    out = restarted.publish()
    assert (out.record["version"], out.record["generation"]) == (3, 3)


def test_an_evolver_restarted_on_an_empty_folder_continues_with_the_same_generation(blob_root: str,
                                                                                    tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "host-a")
    bank.add(sk("git-commit"))
    bank.add(sk("run-tests"))
    mirror.publish()
    replay_generation = bank.generation  # what Replay saw: 2

    mirror_b, bank_b = writer(blob_root, tmp_path / "host-b")  # the Evolver restarted on another host
    loop = EvolutionLoop(bank_b, EvolverConfig(), make_evolver(EvolverConfig()))
    assert loop.reconcile(replay_generation) == 2  # continued: no new generation retires samples
    assert bank_b.names() == ["git-commit", "run-tests"] and mirror_b.publish() is None
    bank_b.add(sk("third"))
    out = mirror_b.publish()
    assert not out.merged and (out.record["version"], out.record["generation"]) == (2, 3)

    # Without the bucket (the old behaviour) the same restart went back and had to skip a generation.
    bare = SkillBank(tmp_path / "host-c", CFG)
    assert EvolutionLoop(bare, EvolverConfig(), make_evolver(EvolverConfig())).reconcile(replay_generation) == 3


def test_a_wiped_folder_merges_the_library_back_instead_of_publishing_deletions(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "skills")
    bank.add(sk("keep-me"))
    mirror.publish()
    for p in sorted((tmp_path / "skills").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    assert not (tmp_path / "skills" / MARKER).exists()
    again, bank = writer(blob_root, tmp_path / "skills")
    assert bank.names() == ["keep-me"] and again.publish() is None


def test_retention_keeps_the_newest_snapshots_and_removes_records_before_files(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "skills", keep=2)
    deleted: list[str] = []
    delete = mirror.blobs.delete
    mirror.blobs.delete = lambda key: (deleted.append(key), delete(key))[1]
    records = []
    for i in range(4):
        bank.add(sk(f"skill-{i}"))
        records.append(mirror.publish().record)
    assert mirror.versions() == [3, 4]
    for old in records[:2]:
        assert deleted.index(record_key(old["version"])) < deleted.index(old["key"])  # record first
        assert mirror.blobs.find(old["key"]) == {}
    # An upload no record names: a writer that died between its upload and its record.
    orphan = f"{SKILLS}/v00000009-{uuid.uuid4().hex[:12]}"
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("x")
    mirror.blobs.put_tree(tmp_path / "o", orphan)
    assert orphan not in mirror.prune()  # younger than the grace: maybe an upload in progress
    mirror.grace_s = -1.0
    assert orphan in mirror.prune() and mirror.blobs.find(orphan) == {}
    assert mirror.versions() == [3, 4]


# ------------------------------------------------------------------------------------------ readers
def test_a_reader_never_sees_a_partial_snapshot(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("git-commit"))
    mirror.publish()
    reader = SnapshotReader(blob_root, tmp_path / "proxy-cache", CFG)
    assert (reader.version, reader.generation) == (1, 1)
    assert [s.name for s in reader.search.retrieve("git commit")] == ["git-commit"]

    bank.add(sk("deploy-service"))
    seen = []
    create = mirror.blobs.write_new

    def between_upload_and_record(key, data):
        record = json.loads(data)
        assert sorted(mirror.blobs.find(record["key"])) == sorted(record["files"])  # all files are up
        seen.append((reader.poll(), reader.version, reader.generation,
                     [s.name for s in reader.search.retrieve("deploy service")]))
        return create(key, data)

    mirror.blobs.write_new = between_upload_and_record
    mirror.publish()
    assert seen == [(False, 1, 1, ["git-commit"])]  # the old library, whole
    assert reader.poll() and (reader.version, reader.generation) == (2, 2)
    assert "deploy-service" in [s.name for s in reader.search.retrieve("deploy service")]
    assert not reader.poll()  # nothing new: one LIST


def test_a_damaged_snapshot_is_refused_and_the_served_library_stays(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("git-commit"))
    mirror.publish()
    reader = SnapshotReader(blob_root, tmp_path / "cache", CFG)
    bank.add(sk("deploy-service"))
    record = mirror.publish().record
    damaged = tmp_path / "damaged.md"
    damaged.write_text("---\nname: deploy-service\ndescription: tampered\n---\n")
    mirror.blobs.put_file(damaged, f"{record['key']}/deploy-service/SKILL.md")
    with pytest.raises(SnapshotError, match="1 file"):
        reader.poll()
    mirror.blobs.delete(f"{record['key']}/deploy-service/SKILL.md")  # e.g. pruned mid-download
    with pytest.raises((SnapshotError, FileNotFoundError)):
        reader.poll()
    assert (reader.version, reader.generation) == (1, 1)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["empty", Path(mirror.record(1)["key"]).name]


def test_a_reader_never_takes_a_lower_generation(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("a-skill"))
    bank.add(sk("b-skill"))
    mirror.publish()
    reader = SnapshotReader(blob_root, tmp_path / "cache", CFG)
    assert reader.generation == 2
    bad = {**mirror.record(1), "version": 2, "generation": 1}
    assert mirror.blobs.write_new(record_key(2), json.dumps(bad).encode())
    assert not reader.poll() and (reader.version, reader.generation) == (1, 2)


def test_readers_drop_downloaded_snapshots_the_bucket_no_longer_holds(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver", keep=1)
    reader = SnapshotReader(blob_root, tmp_path / "cache", CFG)
    for i in range(3):
        bank.add(sk(f"skill-{i}"))
        key = mirror.publish().record["key"]
        assert reader.poll()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["empty", Path(key).name]


# ------------------------------------------------------------------------------------------ the Proxy
def test_a_proxy_replica_on_another_host_injects_the_library_from_the_bucket(blob_root: str, tmp_path: Path):
    from serve.injection import SkillInjector

    mirror, bank = writer(blob_root, tmp_path / "evolver-host" / "skills")
    bank.add(sk("git-commit", "Write imperative commit messages."))
    mirror.publish()
    injector = SkillInjector.build(CFG, tmp_path / "proxy-host" / "skills", blob_root)
    body = {"messages": [{"role": "user", "content": "please git commit my change"}]}

    names, generation = asyncio.run(injector.inject(body, anthropic=False))
    assert (names, generation) == (["git-commit"], 1)
    assert "imperative commit messages" in body["messages"][0]["content"]
    assert not (tmp_path / "proxy-host" / "skills").exists() or not any((tmp_path / "proxy-host" / "skills").iterdir())


async def _until_generation(injector, generation: int) -> None:
    """Until the injector's follower has taken `generation` (it polls every refresh_s): bounded, not timed."""
    for _ in range(400):
        if injector.search.generation == generation:
            return
        await asyncio.sleep(0.05)


def test_the_proxy_takes_its_skills_from_the_bucket_not_from_this_hosts_evolver_folder(blob_root: str,
                                                                                       tmp_path: Path):
    from serve.proxy import ProxyImpl

    scratch = tmp_path / "scratch"  # one host's local storage root, shared with an Evolver there
    mirror, bank = writer(blob_root, scratch / "skills")
    bank.add(sk("git-commit"))
    mirror.publish()
    bank.add(sk("not-published-yet"))
    proxy = ProxyImpl(None, {}, CFG.model_dump(), str(scratch), blob_root=blob_root)
    try:
        assert proxy.injector.reader is not None and proxy.injector.search.generation == 1
        assert [s.name for s in proxy.injector.search.bank.skills()] == ["git-commit"]
        assert (scratch / "skills-snapshots").is_dir()
    finally:
        proxy.store.close()

async def test_a_running_replica_follows_new_snapshots_without_a_restart(blob_root: str, tmp_path: Path):

    from serve.injection import SkillInjector

    mirror, bank = writer(blob_root, tmp_path / "evolver")
    injector = SkillInjector.build(SkillsConfig(retrieval="template", refresh_s=0.05),
                                   tmp_path / "proxy" / "skills", blob_root)
    follower = injector.start()
    body = {"messages": [{"role": "user", "content": "deploy the service"}]}
    assert await injector.inject(dict(body), anthropic=False) == ([], 0)
    bank.add(sk("deploy-service"))
    await asyncio.to_thread(mirror.publish)
    await _until_generation(injector, 1)
    assert await injector.inject(dict(body), anthropic=False) == (["deploy-service"], 1)
    follower.cancel()


# ------------------------------------------------------------------------------------------ the CLI
def test_clawray_skills_reads_and_writes_the_library_in_the_bucket(s3_env: str, tmp_path: Path):
    from typer.testing import CliRunner

    from evolve.cli import skills_app

    root = f"s3://{make_bucket(s3_env)}/prod"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage_root: {root}\ncache_dir: {tmp_path / 'cache'}\n"
                   "state: {dsn: 'postgresql://clawray@db.invalid:5432/clawray'}\n")
    src = tmp_path / "incoming" / "git-commit"
    src.mkdir(parents=True)
    (src / "SKILL.md").write_text("---\nname: git-commit\ndescription: commit messages\n---\nImperative mood.\n")
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(skills_app, ["--config", str(cfg), *args])

    r = run("add", str(src))
    assert r.exit_code == 0, r.output
    assert "git-commit: added; generation 1; published as version 1" in r.output
    mirror, bank = writer(root, tmp_path / "evolver")  # what an Evolver on any host pulls
    assert bank.names() == ["git-commit"] and bank.generation == 1
    r = run("list")
    assert r.exit_code == 0 and "git-commit" in r.output and "generation 1" in r.output
    r = run("show", "git-commit")
    assert r.exit_code == 0 and "Imperative mood." in r.output
    bank.add(sk("from-the-evolver"))  # the Evolver changes the library meanwhile...
    mirror.publish()
    r = run("remove", "git-commit")  # ...and the CLI starts from the newest version
    assert r.exit_code == 0 and "git-commit: removed; generation 3" in r.output, r.output
    _, after = writer(root, tmp_path / "check")
    assert after.names() == ["from-the-evolver"] and after.generation == 3
    assert not (tmp_path / "cache" / "storage").exists() or not any((tmp_path / "cache").rglob("SKILL.md"))


def test_a_record_naming_a_path_outside_its_snapshot_is_refused(blob_root: str, tmp_path: Path):
    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("git-commit"))
    record = mirror.publish().record
    reader = SnapshotReader(blob_root, tmp_path / "cache", CFG)
    evil = {**record, "version": 2, "key": f"{SKILLS}/v00000002-0123456789ab",
            "files": {"../../escaped": record["files"]["git-commit/SKILL.md"]}}
    assert mirror.blobs.write_new(record_key(2), json.dumps(evil).encode())
    with pytest.raises(SnapshotError, match="leaves the snapshot"):
        reader.poll()
    assert not (tmp_path / "escaped").exists() and reader.version == 1


async def test_a_replica_starts_while_the_bucket_is_unreachable_and_takes_the_library_once_it_is_back(
        blob_root: str, tmp_path: Path, monkeypatch):
    """A Proxy replica whose first look at the bucket fails (the bucket briefly unreachable, credentials
    still propagating) starts and serves, without skills, instead of failing its start; its follower
    takes the library as soon as the bucket answers."""

    from core.blobs import BlobStore
    from serve.injection import SkillInjector

    mirror, bank = writer(blob_root, tmp_path / "evolver")
    bank.add(sk("deploy-service"))
    mirror.publish()
    real_list, down = BlobStore.list, {"now": True}

    def flaky_list(self, prefix):
        if down["now"]:
            raise OSError("Could not connect to the endpoint URL")
        return real_list(self, prefix)

    monkeypatch.setattr(BlobStore, "list", flaky_list)
    injector = SkillInjector.build(SkillsConfig(retrieval="template", refresh_s=0.05),
                                   tmp_path / "proxy" / "skills", blob_root)
    body = {"messages": [{"role": "user", "content": "deploy the service"}]}
    assert await injector.inject(dict(body), anthropic=False) == ([], 0)
    follower = injector.start()
    down["now"] = False
    await _until_generation(injector, 1)
    assert await injector.inject(dict(body), anthropic=False) == (["deploy-service"], 1)
    follower.cancel()
