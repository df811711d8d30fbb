"""Engines made from a URL, engines given by the caller, and the settings each needs."""

from __future__ import annotations

import math
import os
import sqlite3
import weakref
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError

from ...errors import UNREACHABLE
from ...urls import missing_driver, sql_url
from ..basics import connect_timeout
from ..gate import Gate

__all__ = [
    "DEFAULT_TIMEOUT",
    "SQLITE_BUSY_SLICE",
    "SQLITE_LEAST_BUSY_WAIT",
    "engine_for_url",
    "engines",
    "has_connected",
    "is_contention",
    "refuse_memory_database",
    "set_busy_timeout",
    "unreachable",
    "usable_engine",
]

# How long one SQLite statement waits for the file's write lock before it reports
# contention (to be tried again): short, so that an acquire keeps within its timeout
# and a fork waits for at most this long (see ``_pause_for_fork``).
SQLITE_BUSY_SLICE = 0.1
# The least an acquire's try waits for that lock however close its deadline, as a try
# on a server takes a round trip: without it a non-blocking acquire would fail whenever
# any other process happened to be writing, even to another key.
SQLITE_LEAST_BUSY_WAIT = 0.01
# The same for a try of a read hold or a permit, which is a transaction of a few
# statements (or several inserts): others' are longer, and a busy machine stretches them.
SQLITE_LEAST_SHARED_WAIT = 0.25

# The default bound, in seconds, on one operation that cannot reach the database.
DEFAULT_TIMEOUT = 20.0
# libpq counts its connect_timeout in whole seconds, and takes at least this many.
LEAST_LIBPQ_CONNECT_TIMEOUT = 2


def _driver_timeouts(backend: str, timeout: float) -> dict[str, Any]:
    """Driver options that keep one try within half of ``timeout``.

    Every statement tierlock sends touches one row (or one reaper batch) in autocommit
    mode, so a reply slower than that means the server or the network is in trouble.
    """
    per_try = timeout / 2
    if backend == "postgresql":
        # psycopg gives each address the host resolves to connect_timeout for the whole
        # connect, login included. tcp_user_timeout (ms) drops a connection whose sent
        # data stays unacknowledged; it also ends a connect whose SYN goes unanswered,
        # which libpq then misreports as the server closing the connection, so it is
        # no shorter than connect_timeout.
        seconds = max(LEAST_LIBPQ_CONNECT_TIMEOUT, math.ceil(connect_timeout(timeout)))
        return {
            "connect_timeout": seconds,
            "tcp_user_timeout": round(max(seconds, per_try) * 1000),
        }
    return {
        "connect_timeout": connect_timeout(timeout),
        "read_timeout": per_try,
        "write_timeout": per_try,
    }


def _pymysql_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
    """A PyMySQL connection whose handshake keeps to ``connect_timeout``, as its TCP
    connect does.

    PyMySQL reads the server's greeting and the answer to the login with its read
    timeout, so a server that takes the connection and never speaks would hold the
    caller for the read timeout instead. The connection is opened with read and write
    timeouts of ``connect_timeout``, and gets those asked for once it is open.
    """
    limit = cparams["connect_timeout"]
    connection = dialect.loaded_dbapi.connect(
        *cargs, **{**cparams, "read_timeout": limit, "write_timeout": limit}
    )
    # (PyMySQL has no public setter; it applies these at the next read and write.)
    connection._read_timeout = cparams.get("read_timeout")
    connection._write_timeout = cparams.get("write_timeout")
    return connection


def engine_for_url(url: str, timeout: float) -> Engine:
    """An engine in autocommit mode, so that each statement is one round trip.

    With no transaction ever open, the rollbacks SQLAlchemy would send when a
    connection is closed or returned to the pool (a round trip each on pymysql) have
    nothing to undo, so they are turned off.

    :raises ValueError: not a URL of a database tierlock supports, or of an in-memory one.
    :raises MissingDriverError: the URL's driver is not installed.
    """
    parsed = sql_url(url)
    options: dict[str, Any] = {
        "isolation_level": "AUTOCOMMIT",
        "skip_autocommit_rollback": True,
        "pool_reset_on_return": None,
    }
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        refuse_memory_database(parsed)
    else:
        # Without these a server that stops answering blocks a caller for good,
        # whatever its timeout; options given in the URL's query take precedence.
        defaults = _driver_timeouts(backend, timeout)
        options["connect_args"] = {
            name: value for name, value in defaults.items() if name not in parsed.query
        }
    try:
        engine = create_engine(parsed, **options)
    except ImportError as exc:
        raise missing_driver(url, parsed.get_driver_name(), exc) from exc
    except ArgumentError as exc:
        raise ValueError(f"cannot use {parsed!r}: {exc}") from exc
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    elif engine.dialect.driver == "pymysql":
        event.listen(engine, "do_connect", _pymysql_connect)
    return engine


def refuse_memory_database(url: URL) -> None:
    """Refuse an in-memory SQLite database: each connection has a private one, so a
    lock table there is seen by no other connection, thread or process."""
    if url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    ):
        raise ValueError(
            "an in-memory SQLite database is private to the connection that opens it, so "
            "a lock table there coordinates nothing, not even two threads; give a file, "
            "for example sqlite:///tierlock.db"
        )


def usable_engine(engine: object) -> Engine:
    """``engine`` if tierlock can use it; else a clear error now, rather than an
    AttributeError, or every thread failing later on a table it cannot see."""
    if not isinstance(engine, Engine):
        if isinstance(getattr(engine, "sync_engine", None), Engine):
            raise TypeError(
                f"engine is an asyncio {type(engine).__name__}; tierlock sends its "
                "statements from threads of its own, also for tierlock.aio: pass "
                "engine.sync_engine"
            )
        raise TypeError(f"engine must be a SQLAlchemy Engine, not {type(engine).__name__}")
    refuse_memory_database(engine.url)
    return engine


def engines(url: str | None, engine: Engine | None, timeout: float) -> tuple[Engine, Engine, bool]:
    """From a database ``url`` or the caller's ``engine`` (exactly one): the engine as
    given or made, the one statements go through (in autocommit mode), and whether
    tierlock made them (and disposes of them)."""
    if engine is None:
        if url is None:
            raise ValueError("give a database URL or an engine")
        made = engine_for_url(url, timeout)
        return made, made, True
    if url is not None:
        raise ValueError("give a database URL or an engine, not both")
    return usable_engine(engine), engine.execution_options(isolation_level="AUTOCOMMIT"), False


# lock wait timeout, deadlock, and the auto-increment read that MariaDB fails now and
# then when an INSERT ... SELECT meets a deadlocked one (nothing was written)
_MYSQL_CONTENTION = {1205, 1213, 1467}
_POSTGRESQL_CONTENTION = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock n/a
_SQLITE_CONTENTION = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def is_contention(exc: DBAPIError) -> bool:
    """Whether ``exc`` says only that others held what the statement needed (SQLite's
    one writer busy, a deadlock, a lock wait that timed out): nothing was written, and
    the statement may be tried again."""
    orig = exc.orig
    mysql_code = orig.args[0] if orig is not None and orig.args else None
    return (
        mysql_code in _MYSQL_CONTENTION
        or getattr(orig, "sqlstate", None) in _POSTGRESQL_CONTENTION
        or getattr(orig, "sqlite_errorcode", None) in _SQLITE_CONTENTION
    )


def unreachable(exc: DBAPIError, url: URL | None = None) -> str:
    """The message for a database out of reach: the same words on every database, so
    that people and log searches find them, then where it was looked for (``url``'s
    server or file, if given) and the driver's reason, on one line."""
    where = "" if url is None else f"{_address(url)}: "
    return f"{UNREACHABLE}{where}{' '.join(str(exc.orig).split())}"


def _address(url: URL) -> str:
    """Where ``url``'s database is: a server's host and port, SQLite's file, or else the
    URL (password hidden)."""
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    if url.host is None:
        return url.render_as_string(hide_password=True)
    host = f"[{url.host}]" if ":" in url.host else url.host
    return host if url.port is None else f"{host}:{url.port}"


def has_connected(engine: Engine) -> bool:
    """Whether ``engine`` has ever opened a connection (SQLAlchemy learns the server's
    version from the first): until then an address that does not answer is more likely
    wrong than restarting."""
    return engine.dialect.server_version_info is not None


def _sqlite_on_connect(dbapi_connection: sqlite3.Connection, record: Any) -> None:
    # WAL lets readers run beside the one writer; the busy timeout makes a writer
    # wait a little for the file lock before it reports contention.
    set_busy_timeout(dbapi_connection, record.info, SQLITE_BUSY_SLICE)
    dbapi_connection.execute("PRAGMA journal_mode = WAL")


def set_busy_timeout(connection: sqlite3.Connection, info: dict[str, Any], wait: float) -> None:
    """Make SQLite statements on ``connection`` wait up to ``wait`` seconds for the write
    lock; ``info`` (the pool's record of the connection) remembers the setting."""
    milliseconds = round(wait * 1000)
    if info.get("busy_ms") != milliseconds:
        connection.execute(f"PRAGMA busy_timeout = {milliseconds:d}")
        info["busy_ms"] = milliseconds


# SQLite runs in the process, and its global mutexes are copied into a forked child
# locked if a thread of the parent was inside SQLite at that moment: the child then
# hangs on its first statement. So a fork waits until no tierlock statement on SQLite
# is under way, and holds new ones back until it is done.
PAUSED_FOR_FORKS: weakref.WeakSet[Gate] = weakref.WeakSet()
# The longest a fork waits for statements under way (each waits at most
# SQLITE_BUSY_SLICE for the write lock).
FORK_WAIT = 5.0


def pause_forks_for(gate: Gate) -> None:
    """Make every fork wait for the statements that pass ``gate`` (SQLite's)."""
    PAUSED_FOR_FORKS.add(gate)


def _pause_for_fork() -> None:
    for gate in list(PAUSED_FOR_FORKS):
        gate.pause(FORK_WAIT)


def _resume_after_fork() -> None:
    for gate in list(PAUSED_FOR_FORKS):
        gate.resume()


os.register_at_fork(before=_pause_for_fork, after_in_parent=_resume_after_fork)


def dedicated_connection(engine: Engine) -> Any:
    """A driver connection in autocommit mode, outside the pool: for LISTEN, or for a
    doorbell's named lock."""
    connection = engine.raw_connection()
    connection.detach()
    driver_connection = connection.dbapi_connection
    assert driver_connection is not None
    if engine.dialect.name == "postgresql":
        driver_connection.autocommit = True
    else:
        driver_connection.autocommit(True)
    return driver_connection
