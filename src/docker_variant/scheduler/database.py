"""Opening the database: URL checks, per-dialect set-up, and failures as one line.

SQLite (the default, a file) runs in WAL mode; a transaction that writes starts with
``BEGIN IMMEDIATE``, so writers queue on SQLite's lock (30 s busy timeout) instead of failing
when they upgrade from reading. Its files are made with ``auto_vacuum=INCREMENTAL``, so that
the pages deleted rows leave free can be given back (``rows.Rows.reclaim``). PostgreSQL goes through psycopg 3 (``postgresql://`` is taken
as ``postgresql+psycopg://``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url

from docker_variant.errors import InvalidInputError, UnreachableError, one_line

__all__ = [
    "DEFAULT_DB_URL",
    "RETRYABLE_SQLSTATES",
    "WRITE",
    "DatabaseUnavailableError",
    "driver_execute",
    "open_engine",
    "safe_url",
    "sqlstate",
    "unavailable",
]

DEFAULT_DB_URL = "sqlite:///./variant-scheduler.db"
#: Execution option marking a connection whose transaction writes (SQLite: BEGIN IMMEDIATE).
WRITE = "docker_variant_write"
#: PostgreSQL's "try the transaction again": serialization failure, deadlock detected.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
_SQLITE_BUSY_TIMEOUT_S = 30
_PG_CONNECT_TIMEOUT_S = 10


class DatabaseUnavailableError(UnreachableError):
    """The database could not be reached or failed a statement; the HTTP answer is 503."""


def safe_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _parse(text: str) -> URL:
    try:
        url = make_url(text)
    except (exc.ArgumentError, ValueError) as error:
        raise InvalidInputError(
            f"invalid database URL {text!r}: {one_line(str(error))} "
            "(expected sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB)"
        ) from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.drivername not in ("sqlite", "sqlite+pysqlite"):
            raise InvalidInputError(f"database URL {safe_url(url)}: use sqlite:///PATH")
        database = url.database or ""
        if database in ("", ":memory:") or url.query.get("mode") == "memory":
            raise InvalidInputError(
                f"database URL {safe_url(url)}: an in-memory SQLite database is private to one "
                "connection; give a file, e.g. sqlite:///./variant-scheduler.db"
            )
        if not database.startswith("file:") and not Path(database).parent.is_dir():
            raise InvalidInputError(
                f"database URL {safe_url(url)}: directory {str(Path(database).parent)!r} "
                "does not exist"
            )
        return url
    if backend == "postgresql":
        if url.drivername not in ("postgresql", "postgresql+psycopg"):
            raise InvalidInputError(
                f"database URL {safe_url(url)}: the PostgreSQL driver here is psycopg 3; "
                "use postgresql+psycopg://..."
            )
        return url.set(drivername="postgresql+psycopg")
    raise InvalidInputError(
        f"database URL {safe_url(url)}: {backend!r} is not supported; "
        "use sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
    )


def driver_execute(conn: Connection, sql: str, params: Any = (), *, many: bool = False) -> Any:
    """Run ``sql`` on a DBAPI cursor of ``conn``, in its transaction, without SQLAlchemy's
    work per statement (for statements run on every request, ``rows.Prepared``); a DBAPI
    error is raised as SQLAlchemy raises it (``IntegrityError``, ``OperationalError``...).
    Returns the cursor; the caller closes it."""
    dialect = conn.dialect
    failure = dialect.loaded_dbapi.Error
    cursor = conn.connection.cursor()
    try:
        if many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
    except failure as error:
        cursor.close()
        raise exc.DBAPIError.instance(sql, params, error, failure, dialect=dialect) from error
    return cursor


def _sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (below)
        cursor = dbapi_connection.cursor()
        # before WAL, which writes the header of a new file: set later, it stays NONE; on a
        # file made without it, it takes effect at the next VACUUM (``Rows.open``)
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE, False)
        driver_execute(connection, "BEGIN IMMEDIATE" if write else "BEGIN").close()


def open_engine(text: str) -> Engine:
    """An engine for ``text``; InvalidInputError for a URL we cannot use (nothing connects)."""
    url = _parse(text)
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
            # the connection used last first: its page cache is current, where SQLite
            # re-reads the pages of one whose cache other connections' commits made stale
            pool_use_lifo=True,
            pool_size=8,
            max_overflow=24,
        )
        _sqlite_events(engine)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=8,
        max_overflow=24,
        connect_args={"connect_timeout": _PG_CONNECT_TIMEOUT_S},
    )


def sqlstate(error: exc.DBAPIError) -> str | None:
    """The SQLSTATE of a PostgreSQL error (``40P01`` deadlock, ...); None elsewhere."""
    state = getattr(error.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


@contextlib.contextmanager
def unavailable(what: str, url: str) -> Iterator[None]:
    """Turn a database outage inside the block into ``DatabaseUnavailableError``."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError) as error:
        if isinstance(error, exc.DBAPIError) and sqlstate(error) in RETRYABLE_SQLSTATES:
            raise  # a lost race (deadlock, serialization failure), not an outage
        reason = error.orig if isinstance(error, exc.DBAPIError) and error.orig else error
        raise DatabaseUnavailableError(
            f"{what}: database {url} is unavailable: {one_line(str(reason), 200)}"
        ) from None
