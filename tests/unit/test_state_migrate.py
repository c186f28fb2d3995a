"""`clawray state migrate` / `check` against a real PostgreSQL server: an embedded state written by the
real stores is copied row for row, the stores read it back the same on PostgreSQL, a re-run copies
nothing, a row the target holds under another key is a count mismatch (exit 1), and no password is ever
printed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.state_cli import state_app
from cluster.state_migrate import embedded_stores, migrate
from core.config import StateConfig
from core.contracts import Sample, Turn
from core.kv import control_store
from core.state import open_database
from core.storage import StorageLayout
from memory.open import open_memory_store
from memory.store import Plan, UnitFilter
from memory.units import Kind, Level, MemoryUnit, Scope
from serve.history import read_history
from serve.sessions import DB_FILE as SESSIONS_FILE
from serve.sessions import SessionStore
from tests.memory_fakes import WordEmbedder, entry
from tests.servers import free_port, unique_namespace
from train.replay import DB_FILE as REPLAY_FILE
from train.replay_store import ReplayStore
from train.run_lock import run_lock_for

N_SAMPLES = 40


def _sample(i: int, **kw) -> Sample:
    return Sample(session_id=f"s{i % 5}", turn_index=i, prompt_ids=[1, 2, i], response_ids=[4, 5],
                  response_logprobs=[-0.5, -1.25], reward=1.0 if i % 2 else -1.0, loss_mask=[1, 1],
                  skill_generation=0, **kw)


def _turn(sid: str, text: str) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                response_text=text)


def build_embedded_state(root: Path) -> dict:
    """A storage root written through the stores' own APIs: every table holds rows."""
    layout = StorageLayout(root)
    sessions = SessionStore(layout.sessions / SESSIONS_FILE)
    for sid in ("a", "b", "c"):
        first = [{"role": "user", "content": f"hi {sid}"}]
        sessions.record([_turn(sid, f"answer {sid}")], read_history(first))
        sessions.record([_turn(sid, "more")], read_history(
            [*first, {"role": "assistant", "content": f"answer {sid}"}, {"role": "user", "content": "thanks"}]))
    claimed = sessions.claim(10, 60)
    sessions.mark_dispatched([claimed[0].turn_id])
    sessions.fail([claimed[1].turn_id], "judge refused", retry_in_s=0, max_failures=1)  # a dead letter
    replay = ReplayStore(layout.replay / REPLAY_FILE, default_lease_s=60)
    samples = [_sample(i) for i in range(N_SAMPLES)]
    samples += [_sample(100 + k, group_id="g", group_size=2) for k in range(2)]
    replay.append(samples)
    replay.lease(8, owner="grpo")  # a lease row, leased samples
    replay.begin_evolution([samples[20].sample_id], ttl_s=600)  # a fence, a support sample
    replay.dead_letter([samples[21].sample_id], "bad payload")
    last = samples[-1].sample_id
    replay.dead_letter([last], "dropped later")
    replay.drop([last])  # SQLite's AUTOINCREMENT mark is now above max(seq)
    control = control_store(root)
    control.put("omls", {"state": "idle_wait"}, 0)
    run_lock_for(layout).acquire("a run killed mid-way", heartbeat=False)  # its row stays
    memory = build_memory(layout.memory)
    expected = {"sessions": sessions.stats(), "session_dead": sessions.dead_letters(),
                "replay": replay.stats(), "replay_dead": replay.dead_letters(), "omls": control.get("omls"),
                "memory": memory_view(memory)}
    for store in (sessions, replay, control, memory):
        store.close()
    return expected


EMB = WordEmbedder()
MEMORY_SCOPES = [Scope(Level.user, "alice"), Scope(Level.workspace, "alice", "w")]


def _unit(content: str, user: str, workspace: str | None = None, **kw) -> MemoryUnit:
    return MemoryUnit(kind=kw.pop("kind", Kind.semantic), content=content, user=user, workspace=workspace,
                      level=Level.workspace if workspace else Level.user, **kw)


def build_memory(folder: Path):
    """Units with vectors in two scopes, a superseded slot (history), pending and consumed inbox turns,
    and a forgotten user (its units deleted: tombstones, a forget row)."""
    store = open_memory_store(folder)
    old = _unit("The user's editor is vim.", "alice", key="editor")
    new = _unit("The user's editor is emacs.", "alice", key="editor", supersedes=old.unit_id)
    units = [old, _unit("The deploy target is eu-west-1.", "alice", "w"), _unit("Bob likes tea.", "bob"),
             _unit("The user works on the billing migration.", "alice", "w", kind=Kind.episodic)]
    assert store.apply(Plan(inserts=[(u, EMB.encode([u.content])[0]) for u in units]), [])
    assert store.apply(Plan(inserts=[(new, EMB.encode([new.content])[0])], supersessions=[(old.unit_id, new.unit_id)]),
                       [])
    assert store.inbox_add(entry("remember my editor", turn="t1")) and store.inbox_add(entry("and more", turn="t2"))
    assert store.apply(Plan(), ["t1"])  # consumed: kept a while so a re-delivery is ignored
    store.forget("bob")
    return store


def memory_view(store) -> dict:
    """What the memory plane reads: every unit (history too), scope versions, full text, inbox, forgets."""
    keys = [s.key for s in MEMORY_SCOPES]
    return {"units": sorted(u.model_dump_json() for u in store.list_units(UnitFilter(include_superseded=True), 100)),
            "versions": store.scope_versions(keys), "owners": store.inbox_owners(),
            "full_text": {q: store.full_text(keys, q, 10, 100) for q in ("editor", "deploy target", "vim")},
            "stats": store.stats(), "forgot_bob": store.forgotten("bob", "w", "s1", 0.0)}


@pytest.fixture
def embedded(tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "state"
    return root, build_embedded_state(root)


@pytest.fixture
def target(pg_dsn: str) -> StateConfig:
    return StateConfig(dsn=pg_dsn, namespace=unique_namespace("mig"))


def _rows(db, table: str, cols: list[str]) -> list[tuple]:
    """Every row in the source's columns, by primary key (the first column of every store table; sorted
    here, as PostgreSQL's text collation may order differently from SQLite's)."""
    with db.tx() as c:
        rows = c.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall()
    return sorted((tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows), key=lambda r: r[0])


def test_migration_copies_every_row_of_every_store(embedded, target):
    root, _ = embedded
    results = migrate(root, target)
    assert {(r.store, r.table) for r in results} == {
        ("sessions", "sessions"), ("sessions", "turns"), ("sessions", "payloads"), ("sessions", "blocks"),
        ("runlock", "run_lock"), ("control", "kv"),
        *(("replay", t) for t in ("samples", "leases", "fences", "dead_letters", "meta")),
        *(("memory", t) for t in ("units", "scopes", "inbox", "forgets"))}  # FTS5, meta, tombstones: not
    assert all(r.ok and r.copied == r.source_rows == r.present == r.target_rows for r in results), results
    assert sum(r.source_rows for r in results if r.table == "samples") == N_SAMPLES + 1
    for store in embedded_stores(root):  # row for row, every source column
        src = open_database(None, store.path, store.name)
        dst = store.open(target)
        for r in (r for r in results if r.store == store.name):
            with sqlite3.connect(store.path) as raw:
                cols = [c[1] for c in raw.execute(f"PRAGMA table_info({r.table})")]
            assert _rows(src, r.table, cols) == _rows(dst, r.table, cols), f"{store.name}.{r.table}"
        src.close()
        dst.close()


def test_the_stores_on_postgresql_read_the_migrated_state_as_sqlite_did(embedded, target):
    root, expected = embedded
    layout = StorageLayout(root)
    migrate(root, target)
    sessions = SessionStore(layout.sessions / SESSIONS_FILE, target)
    assert sessions.stats() == expected["sessions"] and sessions.dead_letters() == expected["session_dead"]
    replay = ReplayStore(layout.replay / REPLAY_FILE, state=target)
    got = replay.stats()
    assert {k: v for k, v in got.items() if k != "oldest_fresh_age_s"} == \
        {k: v for k, v in expected["replay"].items() if k != "oldest_fresh_age_s"}
    assert replay.dead_letters() == expected["replay_dead"]
    control, lock = control_store(root, target), run_lock_for(layout, target)
    assert control.get("omls") == expected["omls"]
    holder = lock.current()
    assert holder is not None and holder.holder == "a run killed mid-way"
    control.close()
    lock.close()
    memory = open_memory_store(layout.memory, target)
    assert memory_view(memory) == expected["memory"]  # full text ranks alike: the index was rebuilt
    before = memory.scope_versions([MEMORY_SCOPES[0].key])[MEMORY_SCOPES[0].key]
    assert memory.apply(Plan(inserts=[(_unit("The user's shell is zsh.", "alice"), None)]), [])
    assert memory.scope_versions([MEMORY_SCOPES[0].key])[MEMORY_SCOPES[0].key] > before  # the change sequence moved on
    memory.close()
    # The identity sequence continues past every seq SQLite handed out (the dropped last one included).
    with sqlite3.connect(layout.replay / REPLAY_FILE) as src:
        mark = src.execute("SELECT seq FROM sqlite_sequence WHERE name = 'samples'").fetchone()[0]
        assert mark > src.execute("SELECT max(seq) FROM samples").fetchone()[0]
    new = _sample(500)
    assert replay.append([new]) == 1
    db = embedded_stores(root)[1].open(target)
    with db.tx() as c:
        assert c.execute("SELECT seq FROM samples WHERE sample_id = ?", (new.sample_id,)).fetchone()[0] == mark + 1
    for store in (sessions, replay, db):
        store.close()


def test_migrating_again_copies_nothing_and_duplicates_nothing(embedded, target):
    root, _ = embedded
    first = migrate(root, target)
    again = migrate(root, target)
    assert [r.copied for r in again] == [0] * len(again)
    assert [(r.store, r.table, r.present, r.target_rows) for r in again] == \
        [(r.store, r.table, r.present, r.target_rows) for r in first]
    assert all(r.ok for r in again)


def _conflicting_target(root: Path, target: StateConfig) -> str:
    """The target's replay already holds a sample id of the source under another seq (another system's
    data in this namespace): the source row is skipped by ON CONFLICT and absent under its key."""
    with sqlite3.connect(StorageLayout(root).replay / REPLAY_FILE) as src:
        row = src.execute("SELECT * FROM samples ORDER BY seq LIMIT 1").fetchone()
    db = embedded_stores(root)[1].open(target)
    with db.tx() as c:
        c.execute(f"INSERT INTO samples VALUES({','.join('?' * len(row))})", (10**6, *row[1:]))
    db.close()
    return row[1]


def test_a_row_the_target_holds_under_another_key_is_a_count_mismatch(embedded, target):
    root, _ = embedded
    _conflicting_target(root, target)
    bad = [r for r in migrate(root, target) if not r.ok]
    assert [(r.store, r.table, r.source_rows - r.present) for r in bad] == [("replay", "samples", 1)]


# ---------------------------------------------------------------------------------------------- the CLI
def _cli(tmp_path: Path, root: Path, *args: str, env: dict | None = None, state: str = ""):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage_root: {root}\n{state}")
    return CliRunner().invoke(state_app, [args[0], "--config", str(cfg), *args[1:]], env=env)


def test_cli_migrates_prints_the_table_and_what_it_leaves(embedded, target, tmp_path):
    root, _ = embedded
    (StorageLayout(root).skills / "a-skill").mkdir(parents=True)
    res = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace)
    assert res.exit_code == 0, res.output
    assert "samples" in res.output and "turns" in res.output and "migrated" in res.output
    assert "not copied" in res.output and "skills" in res.output
    again = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace)
    assert again.exit_code == 0, again.output


def test_cli_mismatch_exits_nonzero_and_names_the_table(embedded, target, tmp_path):
    root, _ = embedded
    _conflicting_target(root, target)
    res = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace)
    assert res.exit_code == 1
    assert "count mismatch" in res.output and "replay.samples: 1 of" in res.output


@pytest.mark.parametrize("password", ["hunter2-secret", "hunter2 secret's"])  # libpq quotes the second
def test_cli_unreachable_server_exits_nonzero_without_the_password(embedded, tmp_path, password):
    root, _ = embedded
    dsn = f"postgresql://clawray@127.0.0.1:{free_port()}/clawray"
    res = _cli(tmp_path, root, "migrate", "--to", dsn, "--password-env", "MIG_PW", env={"MIG_PW": password})
    assert res.exit_code == 1 and "cannot connect" in res.output
    assert "hunter2" not in res.output and "secret" not in res.output


def test_cli_refuses_a_password_in_the_dsn_without_echoing_it(embedded, tmp_path):
    root, _ = embedded
    res = _cli(tmp_path, root, "migrate", "--to", "postgresql://u:hunter2-secret@db.example:5432/x")
    assert res.exit_code == 1 and "must not contain a password" in res.output
    assert "hunter2" not in res.output


def test_cli_without_a_target_or_a_state_says_what_to_give(tmp_path):
    assert "--to postgresql://" in _cli(tmp_path, tmp_path / "state", "migrate").output
    empty = _cli(tmp_path, tmp_path / "empty", "migrate", "--to", "postgresql://u@h/x")
    assert empty.exit_code == 1 and "no embedded state" in empty.output


def test_cli_check_shows_backend_tables_and_counts(embedded, target, tmp_path):
    root, _ = embedded
    local = _cli(tmp_path, root, "check", "--json")
    assert local.exit_code == 0, local.output
    data = json.loads(local.output)
    assert data["backend"].startswith("sqlite")
    by_store = {s["store"]: s for s in data["stores"]}
    assert by_store["replay"]["tables"]["samples"] == N_SAMPLES + 1
    migrate(root, target)
    state = f"state: {{dsn: '{target.dsn}', namespace: {target.namespace}}}\n"
    remote = json.loads(_cli(tmp_path, root, "check", "--json", state=state).output)
    assert remote["backend"].startswith("postgresql") and remote["reachable"]
    for store in data["stores"]:  # every table copied holds its rows (memory's also has its full-text stats)
        pg = {s["store"]: s["tables"] for s in remote["stores"]}[store["store"]]
        assert store["tables"].items() <= pg.items(), store["store"]
    fresh = f"state: {{dsn: '{target.dsn}', namespace: {unique_namespace()}}}\n"
    assert all(s["tables"] is None for s in json.loads(
        _cli(tmp_path, root, "check", "--json", state=fresh).output)["stores"])


def test_cli_check_of_an_unreachable_server_exits_nonzero(tmp_path):
    state = f"state: {{dsn: 'postgresql://u@127.0.0.1:{free_port()}/x'}}\n"
    res = _cli(tmp_path, tmp_path / "state", "check", state=state)
    assert res.exit_code == 1 and "not reachable" in res.output


def test_cli_a_row_postgresql_refuses_fails_that_store_whole_and_says_so(embedded, target, tmp_path):
    root, _ = embedded
    with sqlite3.connect(StorageLayout(root).replay / REPLAY_FILE) as src:  # SQLite keeps what it is given
        src.execute("UPDATE samples SET generation = 'zero' WHERE seq = 1")
    res = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace)
    assert res.exit_code == 1 and "the copy failed" in res.output
    sessions, replay = (embedded_stores(root)[i].open(target) for i in (0, 1))
    with sessions.tx() as c:
        assert c.execute("SELECT count(*) FROM turns").fetchone()[0] == 6  # copied before the failure
    with replay.tx() as c:
        assert c.execute("SELECT count(*) FROM samples").fetchone()[0] == 0  # its transaction rolled back
    sessions.close()
    replay.close()


def test_cli_publishes_the_skill_library_into_the_clusters_bucket_once(embedded, target, tmp_path, s3_root):
    """--skills-to: the library (texts, metadata, generation, history) becomes the bucket's snapshot, which
    an Evolver or a Proxy on any host pulls; a second run publishes nothing; the source is untouched."""
    from core.config import SkillsConfig
    from core.contracts import Skill
    from evolve.bank import SkillBank
    from evolve.mirror import SkillMirror

    root, _ = embedded
    bank = SkillBank(StorageLayout(root).skills, SkillsConfig(retrieval="template"))
    bank.add(Skill(name="backup-first", description="back up a file before editing it",
                   body="Always create a .bak copy before modifying a file."))
    before = sorted(p.name for p in StorageLayout(root).skills.rglob("*"))
    res = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace,
               "--skills-to", s3_root)
    assert res.exit_code == 0, res.output
    assert "published to" in res.output and "version 1" in res.output
    assert sorted(p.name for p in StorageLayout(root).skills.rglob("*")) == before  # source untouched
    pulled = SkillMirror(s3_root, tmp_path / "other-host")
    pulled.pull()
    assert (tmp_path / "other-host" / "backup-first" / "SKILL.md").is_file()
    assert SkillBank(tmp_path / "other-host", SkillsConfig(retrieval="template")).generation == bank.generation
    again = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace,
                 "--skills-to", s3_root)
    assert again.exit_code == 0 and "nothing published" in again.output, again.output
    wrong = _cli(tmp_path, root, "migrate", "--to", target.dsn, "--namespace", target.namespace,
                 "--skills-to", str(tmp_path / "local"))
    assert wrong.exit_code != 0 and "s3://" in wrong.output
