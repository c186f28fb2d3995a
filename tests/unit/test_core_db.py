"""core/db.py and core/state.py: the two backends behave alike, PostgreSQL specifics hold, unsafe
embedded setups are refused, and no password reaches a message."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from core.config import ConfigError, StateConfig, config_from_dict
from core.db import STORE_LOCK, DatabaseError, PostgresDatabase, pg_ddl, pg_sql, redact_dsn
from core.state import check_embedded, is_network_fs, mount_fs_type, open_database

DDL = """
CREATE TABLE IF NOT EXISTS items (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, at REAL NOT NULL, n INTEGER NOT NULL DEFAULT 0);
"""


@pytest.fixture
def db(state_cfg, tmp_path):
    d = open_database(state_cfg, tmp_path / "items.db", "items", storage_root=tmp_path)
    d.schema(DDL, {"items": [("note", "TEXT")]})
    yield d
    d.close()


def test_same_sql_on_both_backends(db):
    with db.tx() as c:
        c.executemany("INSERT INTO items(name, at) VALUES(?, ?) ON CONFLICT DO NOTHING",
                      [("a", 1.5), ("b", 1700000000.123456), ("a", 3.0)])
    with db.tx() as c:
        rows = c.execute("SELECT seq, name, at, note FROM items ORDER BY seq").fetchall()
        assert [(r[1], r[2], r[3]) for r in rows] == [("a", 1.5, None), ("b", 1700000000.123456, None)]
        assert rows[0][0] < rows[1][0]  # arrival order
        assert c.executemany("UPDATE items SET n=n+1 WHERE name=?", [("a",), ("b",), ("zz",)]).rowcount == 2
        assert c.execute("SELECT COUNT(*) FROM items WHERE name LIKE 'a%'").fetchone()[0] == 1
        assert c.executemany("UPDATE items SET n=0 WHERE name=?", []).rowcount == 0


def test_a_failed_transaction_changes_nothing(db):
    with pytest.raises(RuntimeError), db.tx() as c:
        c.execute("INSERT INTO items(name, at) VALUES(?, ?)", ("x", 1.0))
        raise RuntimeError("boom")
    with db.tx() as c:
        assert c.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0


def test_schema_is_idempotent_and_adds_columns(state_cfg, tmp_path):
    for _ in range(2):
        d = open_database(state_cfg, tmp_path / "items.db", "items", storage_root=tmp_path)
        d.schema(DDL, {"items": [("note", "TEXT"), ("extra", "INTEGER NOT NULL DEFAULT 7")]})
        with d.tx() as c:
            c.execute("INSERT INTO items(name, at) VALUES(?, ?) ON CONFLICT DO NOTHING", ("k", 1.0))
            assert c.execute("SELECT extra FROM items WHERE name='k'").fetchone()[0] == 7
        d.close()


def test_store_lock_serialises_postgres_writers(pg_dsn):
    """Two transactions naming the same lock never interleave (the advisory lock is held until commit);
    a second process would see the same (advisory locks are server-side)."""
    from tests.servers import unique_namespace

    ns = unique_namespace()
    a, b = (PostgresDatabase(pg_dsn, f"{ns}_items") for _ in range(2))
    a.schema(DDL)
    inside, release, order = threading.Event(), threading.Event(), []

    def first():
        with a.tx(STORE_LOCK) as c:
            c.execute("INSERT INTO items(name, at) VALUES('first', 1)")
            inside.set()
            release.wait(10)
            order.append("first-commit")

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    done = threading.Event()

    def second():
        with b.tx(STORE_LOCK) as c:
            order.append("second-in")
            assert c.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 1  # saw the first's commit
        done.set()

    t2 = threading.Thread(target=second)
    t2.start()
    assert not done.wait(0.5)  # blocked behind the lock (an injected hold, not a race: `first` waits)
    release.set()
    t.join(10)
    t2.join(10)
    assert order == ["first-commit", "second-in"]
    a.close()
    b.close()


def test_skip_locked_claims_are_disjoint(pg_dsn):
    from tests.servers import unique_namespace

    ns = unique_namespace()
    a, b = (PostgresDatabase(pg_dsn, f"{ns}_items") for _ in range(2))
    a.schema(DDL)
    with a.tx() as c:
        c.executemany("INSERT INTO items(name, at) VALUES(?, ?)", [(f"n{i}", i) for i in range(6)])
    q = "SELECT name FROM items ORDER BY seq LIMIT 4" + a.skip_locked
    with a.tx() as ca:
        got_a = [r[0] for r in ca.execute(q).fetchall()]
        with b.tx() as cb:  # while a's rows are locked, b takes the others without waiting
            got_b = [r[0] for r in cb.execute(q).fetchall()]
    assert got_a == ["n0", "n1", "n2", "n3"] and got_b == ["n4", "n5"]
    a.close()
    b.close()


def test_unreachable_postgres_is_a_clear_error_without_the_password(tmp_path, monkeypatch):
    monkeypatch.setenv("PGPW_TEST", "s3cret-pw")
    cfg = StateConfig(dsn="postgresql://u@127.0.0.1:1/db", password_env="PGPW_TEST")
    with pytest.raises(DatabaseError) as e:
        open_database(cfg, tmp_path / "x.db", "sessions")
    assert "s3cret-pw" not in str(e.value) and "127.0.0.1" in str(e.value)


def test_config_refuses_a_password_in_the_dsn_and_a_missing_env():
    with pytest.raises(ConfigError, match="password"):
        config_from_dict({"state": {"dsn": "postgresql://u:pw@h/db"}})
    with pytest.raises(ConfigError, match="postgresql"):
        config_from_dict({"state": {"dsn": "mysql://h/db"}})
    with pytest.raises(ConfigError, match="NOPE_UNSET"):
        StateConfig(dsn="postgresql://u@h/db", password_env="NOPE_UNSET").connection_string()


def test_redact_dsn():
    assert redact_dsn("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert "pw" not in redact_dsn("host=h password=pw dbname=x")


def test_dialect_translation():
    assert "DOUBLE PRECISION" in pg_ddl("at REAL NOT NULL")
    assert "GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY" in pg_ddl("seq INTEGER PRIMARY KEY AUTOINCREMENT")
    assert pg_sql("SELECT 1 WHERE a LIKE 'x%' AND b=?") == "SELECT 1 WHERE a LIKE 'x%%' AND b=%s"


MOUNTS = """/dev/sda1 / ext4 rw 0 0
fs1:/export /mnt/shared nfs4 rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
"""


def test_network_file_systems_are_refused(tmp_path):
    assert mount_fs_type(Path("/mnt/shared/state"), MOUNTS) == "nfs4"
    assert mount_fs_type(Path("/home/x"), MOUNTS) == "ext4"
    assert is_network_fs("nfs4") and is_network_fs("fuse.s3fs") and not is_network_fs("ext4")
    nfs_mounts = f"/dev/sda1 / ext4 rw 0 0\nfs1:/x {tmp_path} nfs rw 0 0\n"
    with pytest.raises(ConfigError, match="network file system.*state.dsn"):
        check_embedded(tmp_path / "root", mounts=nfs_mounts)


def test_a_root_opened_by_another_host_is_refused(tmp_path):
    check_embedded(tmp_path, host="host-a")
    check_embedded(tmp_path, host="host-a")  # the same host again: fine
    with pytest.raises(ConfigError, match="host-a.*several hosts.*state.dsn"):
        check_embedded(tmp_path, host="host-b")
