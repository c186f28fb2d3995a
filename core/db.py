"""One relational-database layer under every durable store: SQLite (embedded default) or PostgreSQL.

Stores (sessions + outbox, Replay, run lock, control state, ...) write their SQL once, in the common
dialect of both engines (`?` placeholders, `INSERT ... ON CONFLICT`, partial indexes), and open a
`Database` from `core.state.open_database`; the few places where the engines differ are explicit here:

- Transactions. `with db.tx(*locks) as c:` is one transaction. SQLite: `BEGIN IMMEDIATE` under a
  process lock (one writer per file, WAL readers alongside). PostgreSQL: a pooled connection, `BEGIN`
  (READ COMMITTED) and, for each named lock, a transaction-scoped advisory lock
  (`pg_advisory_xact_lock`): the store names what must be serialised (a session id, or `STORE_LOCK` for
  multi-row invariants that were proven under SQLite's single writer), and nothing else waits.
- Leases. `db.skip_locked` is appended to a lease's SELECT: `FOR UPDATE SKIP LOCKED` on PostgreSQL, so
  claimers on several hosts take disjoint rows without blocking; empty on SQLite (BEGIN IMMEDIATE already
  serialises claimers).
- Schema. Each store lives in its own PostgreSQL schema (`<namespace>_<store>`, the namespace from
  `state.namespace`), so table names never collide and tests isolate by namespace; DDL written for SQLite
  is translated (`REAL` -> `DOUBLE PRECISION`, `INTEGER` -> `BIGINT`, AUTOINCREMENT -> identity).

Why a thin hand-written layer and not an ORM/SQLAlchemy: the stores' SQL is hot-path, lease- and
lock-specific and already written; what differs between the engines is the handful of points above, and a
layer of ~200 lines keeps every statement visible and the SQLite path exactly as fast as before.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

STORE_LOCK = "*"  # tx(STORE_LOCK): serialise against every other STORE_LOCK transaction of this store


class DatabaseError(RuntimeError):
    """The state database cannot be used (unreachable, refused credentials, incompatible schema)."""


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Conn(Protocol):
    """What a store sees inside a transaction (sqlite3 and psycopg cursors both fit)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> Cursor: ...


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by `***` (for logs and errors; secrets never reach them)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        # A key=value conninfo (make_conninfo) quotes a value with spaces: 'a b\'c' is one value.
        return re.sub(r"(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# ------------------------------------------------------------------------------------------------ sqlite
# WAL pages past which a commit checkpoints even while checkpoints are deferred (~40 MB of 4 KB pages).
DEFERRED_CHECKPOINT_BACKSTOP = 10_000


class SqliteDatabase:
    """One SQLite file in WAL mode; one connection behind a lock (thread-safe), and `try_tx`'s second one
    under the same lock."""

    dialect = "sqlite"
    skip_locked = ""

    def __init__(self, path: Path, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so every call is one explicit transaction.
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                   timeout=busy_timeout_s)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")  # FULL: fsync every commit (ack == durable)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._db.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        self._synchronous = synchronous
        self._nowait: sqlite3.Connection | None = None  # try_tx's own connection (busy_timeout 0), on first use
        self._lock = threading.Lock()
        self._autocheckpoint: int | None = None  # None: SQLite's default (1000 pages); see `defer_checkpoints`
        self._ckpt: sqlite3.Connection | None = None  # `checkpoint`'s own connection, on first use
        self._ckpt_lock = threading.Lock()

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def schema(self, ddl: str, added_columns: dict[str, Sequence[tuple[str, str]]] | None = None) -> None:
        """Create what `ddl` describes (IF NOT EXISTS) and add `added_columns` that older files lack."""
        with self._lock:
            self._db.executescript(ddl)
            for table, cols in (added_columns or {}).items():
                have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                for name, definition in cols:
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")

    @contextmanager
    def tx(self, *locks: str) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error); `locks` are implied by the single writer."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def try_tx(self) -> Iterator[sqlite3.Connection | None]:
        """`tx`, if it can begin without waiting: yields None at once when this connection is busy (another
        thread's transaction) or another process holds the file's write lock. For a caller on an event loop,
        which runs a short transaction in place when it can and otherwise hands `tx` to a thread."""
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            # A second connection whose busy timeout is 0 (SQLITE_BUSY at once instead of waiting up to 30 s),
            # used only under the same lock as `_db`: switching one connection's timeout around each attempt
            # cost two PRAGMA statements (~26 us) per in-place commit.
            db = self._nowait
            if db is None:
                db = self._nowait = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                                    timeout=0)
                db.execute(f"PRAGMA synchronous={self._synchronous}")
                if self._autocheckpoint is not None:
                    db.execute(f"PRAGMA wal_autocheckpoint={self._autocheckpoint}")
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # "database is locked": another process is writing
                yield None
                return
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")  # WAL: the commit itself never waits on readers or writers
        finally:
            self._lock.release()

    def defer_checkpoints(self, backstop_pages: int = DEFERRED_CHECKPOINT_BACKSTOP) -> None:
        """Leave WAL checkpoints to `checkpoint`, which the owner runs off its request path: by default the
        commit that takes the WAL past 1,000 pages copies them into the database file itself, a 2-8 ms stall
        of that request (~1 commit in 80 of a proxy's turns, its p99). Commits still checkpoint past
        `backstop_pages` (an owner that stopped calling `checkpoint` cannot grow the WAL without bound)."""
        with self._lock:
            self._autocheckpoint = backstop_pages
            for db in (self._db, self._nowait):
                if db is not None:
                    db.execute(f"PRAGMA wal_autocheckpoint={backstop_pages}")

    def checkpoint(self) -> tuple[int, int, int]:
        """Copy committed WAL frames into the database file (PASSIVE: never waits for, nor blocks, readers or
        writers; its own connection, so no transaction of this object waits on it either). Returns SQLite's
        (busy, frames in the WAL, frames checkpointed)."""
        with self._ckpt_lock:
            if self._ckpt is None:
                self._ckpt = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                             timeout=0)
            return tuple(self._ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._nowait is not None:
                self._nowait.close()
        with self._ckpt_lock:
            if self._ckpt is not None:
                self._ckpt.close()
                self._ckpt = None


# -------------------------------------------------------------------------------------------- postgresql
_TYPE_RULES = (
    (re.compile(r"\bINTEGER\s+PRIMARY\s+KEY\s+AUTOINCREMENT\b", re.I), "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bREAL\b", re.I), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
)


def pg_ddl(ddl: str) -> str:
    """SQLite DDL as PostgreSQL DDL (the type names that differ; everything else is common)."""
    for rule, repl in _TYPE_RULES:
        ddl = rule.sub(repl, ddl)
    return ddl


_SQL_CACHE: dict[str, str] = {}


def pg_sql(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (a literal `%` doubled). The stores' SQL never has `?` in a string
    literal; statements are cached (the same few dozen are run over and over)."""
    out = _SQL_CACHE.get(sql)
    if out is None:
        out = _SQL_CACHE[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out


class _PgConn:
    """A psycopg connection inside one transaction, speaking the stores' `?` dialect."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()):
        return self._conn.execute(pg_sql(sql), tuple(params))

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]):
        rows = [tuple(p) for p in seq]
        if not rows:  # psycopg would report rowcount -1; sqlite3 reports 0
            return _NoRows()
        cur = self._conn.cursor()
        cur.executemany(pg_sql(sql), rows)  # psycopg: rowcount is the sum over the parameter sets
        return cur


class _NoRows:
    rowcount = 0

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []


class PostgresDatabase:
    """A pool of connections to one PostgreSQL database; the store's tables in schema `schema`."""

    dialect = "postgresql"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(self, dsn: str, schema: str, *, max_size: int = 4, connect_timeout_s: float = 10.0) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
            raise DatabaseError(f"schema name {schema!r}: lowercase letters, digits and _ only")
        self.schema_name, self._dsn = schema, dsn
        self._psycopg = psycopg

        def configure(conn) -> None:
            conn.execute(f"SET search_path TO {schema}")

        try:
            # Fail fast with one clear error if the server is unreachable or refuses us.
            psycopg.connect(dsn, connect_timeout=int(connect_timeout_s)).close()
        except psycopg.Error as e:
            raise DatabaseError(f"cannot connect to {redact_dsn(dsn)}: {_first_line(e)}") from None
        self._pool = ConnectionPool(dsn, min_size=1, max_size=max_size, open=True, configure=configure,
                                    kwargs={"autocommit": True, "connect_timeout": int(connect_timeout_s)},
                                    check=ConnectionPool.check_connection, name=f"clawray-{schema}")
        with self._pool.connection() as conn, conn.transaction():
            # CREATE SCHEMA IF NOT EXISTS races between replicas starting together: serialise it.
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('clawray-ddl', 0))")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")

    def describe(self) -> str:
        return f"{redact_dsn(self._dsn)} (schema {self.schema_name})"

    def schema(self, ddl: str, added_columns: dict[str, Sequence[tuple[str, str]]] | None = None) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('clawray-ddl', 0))")
            conn.execute(pg_ddl(ddl))  # no parameters: psycopg runs the whole script
            for table, cols in (added_columns or {}).items():
                for name, definition in cols:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {pg_ddl(definition)}")

    @contextmanager
    def tx(self, *locks: str) -> Iterator[_PgConn]:
        """One transaction on a pooled connection, holding the advisory locks named (sorted: no deadlock
        between two transactions taking the same locks)."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                for key in sorted(set(locks)):
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{self.schema_name}:{key}",))
                yield _PgConn(conn)
        except self._psycopg.OperationalError as e:
            raise DatabaseError(f"{self.describe()}: {_first_line(e)}") from e

    def close(self) -> None:
        self._pool.close()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


Database = SqliteDatabase | PostgresDatabase
