"""Copy an embedded state (the SQLite files under a storage root) into PostgreSQL, and take stock of a
state database: the logic of `clawray state migrate` / `clawray state check` (cluster/state_cli.py).

What is copied, each store into the schema the store itself opens on PostgreSQL (`<namespace>_<store>`,
core/state.py), with the tables created by the store's own DDL:
  sessions   sessions/sessions.db   sessions and turns (pending turns, the outbox, session dead letters)
  replay     replay/replay.sqlite   samples, leases, fences, dead letters, meta (the current generation)
  runlock    control/run_lock.db    the run lock's row (a stale holding is taken over as usual)
  control    control/control.db     OMLS and Controller state (versioned key/value rows, core/kv.py)
  memory     memory/memory.db       units (with their vectors and supersession history), scopes, the
                                    ingestion inbox, forgets; the full-text index is rebuilt, not copied
What is not (`not_copied`): skills, adapters and checkpoints are files, not records (they stay under the
storage root); memory's change counter and tombstones (`EmbeddedStore.skip` says why); control JSON files
of an older release are adopted by OMLS and the Controller themselves (core/kv.py).

Idempotent: a table is copied with `INSERT ... ON CONFLICT DO NOTHING` (through a temporary table filled
by COPY), so a second run copies nothing new and never duplicates a row; each store is copied in one
transaction, so a failure leaves it as it was and a re-run copies what is missing. Then every table is
checked: the primary key of every source row must be present in PostgreSQL. A source row that conflicts
with a different target row on another unique column (the namespace already held other data under the
same sample id) is not present under its key: a mismatch. Identity columns (Replay's `seq`) are copied
with their values; the sequence is then moved past the largest value the source handed out, so the next
row PostgreSQL numbers never collides with a copied one.

NOTE: copy a quiescent state (`clawray stop` first). A row changed in SQLite after it was copied is not
copied again (its key is present), and a re-run does not overwrite rows a running PostgreSQL-backed
system has changed since.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.db import Database, DatabaseError, redact_dsn
from core.state import open_database
from core.storage import StorageLayout

COPY_BATCH = 5000  # source rows fetched per round trip


class MigrationError(RuntimeError):
    """The state cannot be copied as it is (a table PostgreSQL lacks, a table without a primary key)."""


Derived = tuple[tuple[str, ...], Callable[[dict[str, Any]], tuple]]  # (PostgreSQL columns, f(source row))


@dataclass(frozen=True)
class EmbeddedStore:
    """One store's SQLite file, how the store opens its database (creating its tables), and what differs
    between its two layouts (only the memory store's full-text index does)."""

    name: str  # open_database's store name: its PostgreSQL schema is <namespace>_<name>
    path: Path
    open: Callable[[StateConfig], Database]
    skip: dict[str, str] = field(default_factory=dict)  # source table -> why it is not copied
    derive: dict[str, Derived] = field(default_factory=dict)  # table -> columns computed from each row
    finish: Callable[[sqlite3.Connection, Any], None] | None = None  # (source, target) after the copy


@dataclass(frozen=True)
class TableResult:
    store: str
    table: str
    source_rows: int
    copied: int  # rows this run inserted (0 on a re-run)
    present: int  # source rows whose primary key PostgreSQL holds afterwards
    target_rows: int  # every row of the PostgreSQL table

    @property
    def ok(self) -> bool:
        return self.present == self.source_rows


def embedded_stores(root: Path) -> list[EmbeddedStore]:
    """Every store that keeps records under storage root `root` (whether its file exists or not)."""
    from core.kv import CONTROL_FILE
    from core.kv import SCHEMA as CONTROL_DDL
    from core.kv import STORE as CONTROL
    from serve.sessions import ADDED_COLUMNS
    from serve.sessions import DB_FILE as SESSIONS_FILE
    from serve.sessions import SCHEMA as SESSIONS_DDL
    from train.replay import DB_FILE as REPLAY_FILE
    from train.replay_schema import STORE as REPLAY
    from train.replay_schema import open_replay_db
    from train.run_lock import RUN_LOCK_FILE
    from train.run_lock import SCHEMA as RUN_LOCK_DDL
    from train.run_lock import STORE as RUN_LOCK

    layout = StorageLayout(root)
    return [
        EmbeddedStore("sessions", layout.sessions / SESSIONS_FILE,
                      _opener(root, "sessions", SESSIONS_DDL, {"turns": ADDED_COLUMNS})),
        EmbeddedStore(REPLAY, layout.replay / REPLAY_FILE, lambda cfg: open_replay_db(root / REPLAY, cfg)),
        EmbeddedStore(RUN_LOCK, layout.control / RUN_LOCK_FILE, _opener(root, RUN_LOCK, RUN_LOCK_DDL)),
        EmbeddedStore(CONTROL, layout.control / CONTROL_FILE, _opener(root, CONTROL, CONTROL_DDL)),
        _memory_store(layout),
    ]


def _opener(root: Path, name: str, ddl: str, added: dict | None = None) -> Callable[[StateConfig], Database]:
    def open_(cfg: StateConfig) -> Database:
        db = open_database(cfg, root / name, name)  # the path is unused with a dsn
        db.schema(ddl, added)
        return db
    return open_


def _memory_store(layout: StorageLayout) -> EmbeddedStore:
    """The memory store: the same tables on both engines, except the full-text index. SQLite keeps it in
    FTS5 tables (not copied: virtual); PostgreSQL in `units.terms` (the same terms, memory.text.index_text)
    with statistics in `vocab` and `fts_totals`, which the copy derives and then recounts."""
    from memory.pg_store import SCHEMA, STORE
    from memory.sqlite_store import DB_FILE
    from memory.text import index_text

    def terms(row: dict[str, Any]) -> tuple:
        return (index_text(row["scope_key"], row["content"]).split(),)

    return EmbeddedStore(
        STORE, layout.memory / DB_FILE, _opener(layout.root, STORE, SCHEMA),
        skip={"meta": "its one entry, the change counter, moves into the sequence change_seq",
              "tombstones": "readers' catch-up hints for deleted units (readers start afresh after the move)"},
        derive={"units": (("terms",), terms)}, finish=_memory_finish)


def _memory_finish(src: sqlite3.Connection, dst) -> None:
    """Full-text statistics recounted over the active units (whatever the target held), and the change
    sequence moved past every change number the source handed out."""
    dst.execute("DELETE FROM vocab")
    dst.execute("INSERT INTO vocab(term, docs) SELECT t, count(*) FROM units, "
                "LATERAL (SELECT DISTINCT unnest(terms) AS t) x WHERE superseded_by IS NULL GROUP BY t")
    dst.execute("UPDATE fts_totals SET docs = s.d, tokens = s.t FROM (SELECT count(*) AS d, "
                "COALESCE(sum(cardinality(terms)), 0) AS t FROM units WHERE superseded_by IS NULL) s WHERE id = 1")
    tops = [int(r[0]) for r in src.execute("SELECT v FROM meta WHERE k = 'seq'")]
    tops += [r[0] for r in src.execute("SELECT max(seq) FROM units UNION ALL SELECT max(seq) FROM scopes")]
    top = max((v for v in tops if v is not None), default=None)
    if top is not None:
        dst.execute("SELECT setval('change_seq', GREATEST(%s, COALESCE(pg_sequence_last_value('change_seq'), %s)))",
                    (top, top))


def not_copied(root: Path) -> list[str]:
    """What the storage root holds that a migration leaves where it is, and why (for the report)."""
    layout = StorageLayout(root)
    out = [f"{s.name}.{table}: {why}" for s in embedded_stores(root) if s.path.is_file()
           for table, why in s.skip.items()]
    legacy = sorted(p.name for p in layout.control.glob("*.json"))
    if legacy:
        out.append(f"{', '.join(legacy)} under {layout.control}: control state of an older release; OMLS and the "
                   "Controller adopt it into the control store when they first start with this storage root")
    what = {layout.skills: "skill texts, their metadata in the front matter", layout.adapters: "adapter versions",
            layout.checkpoints: "training checkpoints"}
    files = [f"{p.name}/ ({desc})" for p, desc in what.items() if p.is_dir()]
    if files:
        out.append(f"{', '.join(files)} under {root}: files, not records; they stay under the storage root "
                   "(`--skills-to s3://...` publishes the skill library into the cluster's bucket; docs/cluster.md, "
                   "\"Moving an embedded state onto the cluster\")")
    return out


# ------------------------------------------------------------------------------------------------- copy
def migrate(root: Path, cfg: StateConfig, progress: Callable[[str], None] = lambda _: None) -> list[TableResult]:
    """Copy every present store of `root` into the PostgreSQL `cfg` names, then check every table."""
    present = [s for s in embedded_stores(root) if s.path.is_file()]
    copied: dict[tuple[str, str], int] = {}
    for store in present:
        schema = f"{cfg.namespace}_{store.name}"
        progress(f"creating the {store.name} tables in schema {schema}")
        store.open(cfg).close()  # the store's own DDL, exactly as the store opens it
        progress(f"copying {store.path}")
        with _source(store.path) as src, _target(cfg, schema) as dst, dst.transaction():
            for table in _tables(src, store):
                copied[store.name, table] = _copy_table(src, dst, schema, table, store.derive.get(table))
            if store.finish is not None:
                store.finish(src, dst)
    results = []
    for store in present:
        progress(f"checking {store.name}")
        with _source(store.path) as src, _target(cfg, f"{cfg.namespace}_{store.name}") as dst:
            results += [verify_table(src, dst, store.name, table, copied.get((store.name, table), 0))
                        for table in _tables(src, store)]
    return results


@contextmanager
def _source(path: Path) -> Iterator[sqlite3.Connection]:
    """The SQLite file read-only, inside one read transaction (a consistent snapshot of its tables)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)) as db:
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("ROLLBACK")


@contextmanager
def _target(cfg: StateConfig, schema: str) -> Iterator[Any]:
    """A plain psycopg connection with `schema` first on the search path (COPY needs the raw driver)."""
    import psycopg
    from psycopg import sql

    try:
        conn = psycopg.connect(cfg.connection_string(), connect_timeout=10)
    except psycopg.OperationalError as e:
        # Named by the configured DSN, which has no password (the connection string may hold one).
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DatabaseError(f"cannot connect to {redact_dsn(cfg.dsn or '')}: {first}") from None
    with conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        yield conn


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tables(src: sqlite3.Connection, store: EmbeddedStore) -> list[str]:
    """The store's tables to copy: not SQLite's own, not virtual tables (FTS5) nor their shadow tables
    (`<virtual table>_data`, ...), not the ones the store skips."""
    rows = src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND "
                       "name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name").fetchall()
    virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL")]
    return [name for name, _ in rows if name not in store.skip
            and not any(name == v or name.startswith(v + "_") for v in virtual)]


def _columns(src: sqlite3.Connection, table: str) -> tuple[list[str], list[str]]:
    """(every column, the primary key's columns in key order) of a source table."""
    info = src.execute(f"PRAGMA table_info({_q(table)})").fetchall()
    key = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return [r[1] for r in info], key


def _target_columns(dst, schema: str, table: str) -> dict[str, bool]:
    """Column name -> is an identity column, of a PostgreSQL table (empty: no such table)."""
    rows = dst.execute("SELECT column_name, is_identity FROM information_schema.columns "
                       "WHERE table_schema = %s AND table_name = %s", (schema, table)).fetchall()
    return {name: ident == "YES" for name, ident in rows}


def _copy_table(src: sqlite3.Connection, dst, schema: str, table: str, derive: Derived | None = None) -> int:
    """Insert the rows of `table` PostgreSQL lacks, by key (inside the caller's transaction), with the
    `derive`d columns computed from each source row; then move its identity sequences on. Returns the
    rows inserted."""
    from psycopg import sql

    cols, key = _columns(src, table)
    extra, compute = derive or ((), None)
    have = _target_columns(dst, schema, table)
    missing = [c for c in cols if c not in have]
    if not have or missing:
        what = f"columns {', '.join(missing)}" if have else "the table"
        raise MigrationError(f"{schema}.{table}: PostgreSQL lacks {what} (created by the store's DDL); "
                             "is this clawray older than the state it copies?")
    if not key:
        raise MigrationError(f"{table} has no primary key: it cannot be copied idempotently")
    names = sql.SQL(", ").join(map(sql.Identifier, [*cols, *extra]))
    dst.execute(sql.SQL("CREATE TEMP TABLE migrate_rows (LIKE {} INCLUDING DEFAULTS) ON COMMIT DROP")
                .format(sql.Identifier(table)))
    with dst.cursor().copy(sql.SQL("COPY migrate_rows ({}) FROM STDIN").format(names)) as copy:
        cur = src.execute(f"SELECT {', '.join(map(_q, cols))} FROM {_q(table)}")
        while rows := cur.fetchmany(COPY_BATCH):
            for row in rows:
                copy.write_row(row if compute is None else (*row, *compute(dict(zip(cols, row, strict=True)))))
    copied = dst.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM migrate_rows ON CONFLICT DO NOTHING")
                         .format(sql.Identifier(table), names, names)).rowcount
    dst.execute("DROP TABLE migrate_rows")
    for col in (c for c in cols if have[c]):
        _advance_sequence(src, dst, schema, table, col)
    return copied


def _advance_sequence(src: sqlite3.Connection, dst, schema: str, table: str, col: str) -> None:
    """Move the identity sequence of `table.col` past every value the source handed out: its largest
    row, and SQLite's AUTOINCREMENT high-water mark (values of rows deleted at the end stay unused)."""
    tops = [src.execute(f"SELECT max({_q(col)}) FROM {_q(table)}").fetchone()[0]]
    if src.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
        tops += [r[0] for r in src.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))]
    top = max((v for v in tops if v is not None), default=None)
    if top is None:
        return  # nothing handed out: the sequence starts where it starts
    # GREATEST with the sequence's own position: never move it back (PostgreSQL may have numbered rows).
    dst.execute("SELECT setval(s, GREATEST(%s, COALESCE(pg_sequence_last_value(s), %s))) "
                "FROM (SELECT pg_get_serial_sequence(%s, %s)::regclass AS s) x",
                (top, top, f"{schema}.{table}", col))


# ------------------------------------------------------------------------------------------------ check
def verify_table(src: sqlite3.Connection, dst, store: str, table: str, copied: int = 0) -> TableResult:
    """How many of the source table's keys PostgreSQL holds, counted in a transaction of its own after
    the copy committed (`copied`: what the copy reported, carried into the result)."""
    from psycopg import sql

    _, key = _columns(src, table)
    keys = sql.SQL(", ").join(map(sql.Identifier, key))
    with dst.transaction():
        dst.execute(sql.SQL("CREATE TEMP TABLE migrate_keys AS SELECT {} FROM {} WITH NO DATA")
                    .format(keys, sql.Identifier(table)))
        with dst.cursor().copy(sql.SQL("COPY migrate_keys ({}) FROM STDIN").format(keys)) as copy:
            cur = src.execute(f"SELECT {', '.join(map(_q, key))} FROM {_q(table)}")
            while rows := cur.fetchmany(COPY_BATCH):
                for row in rows:
                    copy.write_row(row)
        source_rows = dst.execute("SELECT count(*) FROM migrate_keys").fetchone()[0]
        present = dst.execute(sql.SQL("SELECT count(*) FROM migrate_keys JOIN {} USING ({})")
                              .format(sql.Identifier(table), keys)).fetchone()[0]
        target_rows = dst.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]
        dst.execute("DROP TABLE migrate_keys")
    return TableResult(store, table, source_rows, copied, present, target_rows)


@dataclass(frozen=True)
class StoreStock:
    """Where one store lives and what it holds (`clawray state check`)."""

    store: str
    location: str  # the SQLite file, or the PostgreSQL schema
    tables: dict[str, int] | None  # table -> rows; None: the store has not been created there yet


def inventory(root: Path, cfg: StateConfig) -> tuple[str, list[StoreStock]]:
    """The backend `cfg` selects (described without a password) and every store's tables and row counts
    there. Raises DatabaseError when the PostgreSQL server is unreachable or refuses us."""
    stores = embedded_stores(root)
    if not cfg.dsn:
        return "sqlite (embedded)", [_sqlite_stock(s) for s in stores]
    from psycopg import sql

    stock = []
    with _target(cfg, "public") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        for s in stores:
            schema = f"{cfg.namespace}_{s.name}"
            names = [r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' ORDER BY table_name", (schema,))]
            tables = {t: conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(schema), sql.Identifier(t))).fetchone()[0] for t in names}
            stock.append(StoreStock(s.name, f"schema {schema}", tables or None))
    return f"postgresql {version} at {redact_dsn(cfg.dsn)}", stock


def _sqlite_stock(store: EmbeddedStore) -> StoreStock:
    if not store.path.is_file():
        return StoreStock(store.name, str(store.path), None)
    with _source(store.path) as src:
        tables = {t: src.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in _tables(src, store)}
    return StoreStock(store.name, str(store.path), tables)
