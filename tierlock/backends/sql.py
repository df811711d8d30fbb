"""The SQLAlchemy backend: SQLite, MariaDB/MySQL (pymysql) and PostgreSQL (psycopg 3).

Error handling. Every operation runs on a connection taken from the pool for that
operation only, in autocommit mode, so no connection is held between polls or while a
thread waits (semantic 7). A failed statement is sorted into one of three kinds:

* contention (MariaDB deadlock 1213 or lock wait timeout 1205, PostgreSQL
  serialization failure or deadlock, SQLite busy): nothing was written; an acquire
  reports the key as taken and backs off, other operations retry;
* connection trouble (a dropped or refused connection): the statement may or may not
  have taken effect, so the retry first checks by owner id what really happened
  (semantic 9), and after ``ATTEMPTS`` tries a ``BackendError`` is raised;
* anything else (a missing table, bad SQL): ``BackendError`` at once.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import MetaData, create_engine, event, inspect
from sqlalchemy.engine import URL, Dialect, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.expression import ClauseElement

from ..errors import BackendError, LockError
from ..records import LockInfo, Owner
from ..stats import Counters
from . import Doorbell, LockBackend
from .bells import Bells
from .gate import Gate
from .notify import Listener, channel_name
from .sqltable import (
    MYSQL_FAMILY,
    REAP_BATCH,
    Statements,
    check_table_name,
    fencing_token,
    lock_table,
)
from .sweeper import Sweep, Sweeper
from .watchdog import Watchdog

__all__ = ["SQLBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Tries of one operation when the connection fails, and the pauses between them:
# enough to ride over a pool of connections that a server restart made stale.
ATTEMPTS = 4
RETRY_PAUSE = 0.05
# The longest pause between two tries of an operation that meets contention (SQLite's
# one writer), which is retried until ``database_timeout`` runs out.
LONGEST_RETRY_PAUSE = 0.5

# How long one SQLite statement waits for the file's write lock before it reports
# contention (to be tried again): short, so that an acquire keeps within its timeout
# and a fork waits for at most this long (see ``_pause_for_fork``).
SQLITE_BUSY_SLICE = 0.1
# The least an acquire's try waits for that lock however close its deadline, as a try
# on a server takes a round trip: without it a non-blocking acquire would fail whenever
# any other process happened to be writing, even to another key.
SQLITE_LEAST_BUSY_WAIT = 0.01

_MYSQL_CONTENTION = {1205, 1213}  # lock wait timeout, deadlock
_POSTGRESQL_CONTENTION = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock n/a
_SQLITE_CONTENTION = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}

_CONTENTION, _CONNECTION, _FATAL = "contention", "connection", "fatal"

# The default bound, in seconds, on one operation that cannot reach the database.
DEFAULT_TIMEOUT = 20.0
# Seconds to wait for a connection; pymysql also applies its read timeout to the
# handshake, and libpq counts connect_timeout in whole seconds of at least 2.
CONNECT_TIMEOUT = 5


def _driver_timeouts(backend: str, timeout: float) -> dict[str, Any]:
    """Driver options that keep one try within half of ``timeout``.

    Every statement tierlock sends touches one row (or one reaper batch) in autocommit
    mode, so a reply slower than that means the server or the network is in trouble.
    """
    per_try = timeout / 2
    if backend == "postgresql":
        # tcp_user_timeout (ms) drops a connection whose sent data stays unacknowledged.
        return {
            "connect_timeout": max(2, min(CONNECT_TIMEOUT, math.ceil(per_try))),
            "tcp_user_timeout": max(1, round(per_try * 1000)),
        }
    return {
        "connect_timeout": min(CONNECT_TIMEOUT, per_try),
        "read_timeout": per_try,
        "write_timeout": per_try,
    }


def _engine_for_url(url: str, timeout: float) -> Engine:
    """An engine in autocommit mode, so that each statement is one round trip.

    With no transaction ever open, the rollbacks SQLAlchemy would send when a
    connection is closed or returned to the pool (a round trip each on pymysql) have
    nothing to undo, so they are turned off.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # Not quoted: the text may hold a password.
        raise ValueError(
            "not a database URL; expected dialect+driver://user:password@host:port/database"
        ) from None
    options: dict[str, Any] = {
        "isolation_level": "AUTOCOMMIT",
        "skip_autocommit_rollback": True,
        "pool_reset_on_return": None,
    }
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        _refuse_memory_database(parsed)
    elif backend not in (*MYSQL_FAMILY, "postgresql"):
        raise ValueError(
            f"unsupported database {backend!r} in {parsed!r}: "
            "use sqlite, mysql, mariadb or postgresql"
        )
    else:
        # Without these a server that stops answering blocks a caller for good,
        # whatever its timeout; options given in the URL's query take precedence.
        defaults = _driver_timeouts(backend, timeout)
        options["connect_args"] = {
            name: value for name, value in defaults.items() if name not in parsed.query
        }
    try:
        engine = create_engine(parsed, **options)
    except (ArgumentError, ImportError) as exc:
        raise ValueError(f"cannot use {parsed!r}: {exc}") from exc
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def _refuse_memory_database(url: URL) -> None:
    if url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    ):
        raise ValueError(
            "an in-memory SQLite database is private to one connection and cannot "
            "hold locks; give a file, for example sqlite:///tierlock.db"
        )


def _usable_engine(engine: object) -> Engine:
    """``engine`` if tierlock can use it; else a clear error now, rather than an
    AttributeError, or every thread failing later on a table it cannot see."""
    if not isinstance(engine, Engine):
        if isinstance(getattr(engine, "sync_engine", None), Engine):
            raise TypeError(
                f"engine is an asyncio {type(engine).__name__}; tierlock's asyncio API is "
                "to come, until then pass engine.sync_engine"
            )
        raise TypeError(f"engine must be a SQLAlchemy Engine, not {type(engine).__name__}")
    _refuse_memory_database(engine.url)
    return engine


def _unreachable(exc: DBAPIError) -> str:
    """The message for a database out of reach: the same words on every database, so
    that people and log searches find them, then the driver's reason."""
    return f"cannot reach the database: {exc.orig}"


def _sqlite_on_connect(dbapi_connection: sqlite3.Connection, record: Any) -> None:
    # WAL lets readers run beside the one writer; the busy timeout makes a writer
    # wait a little for the file lock before it reports contention.
    _set_busy_timeout(dbapi_connection, record.info, SQLITE_BUSY_SLICE)
    dbapi_connection.execute("PRAGMA journal_mode = WAL")


def _set_busy_timeout(connection: sqlite3.Connection, info: dict[str, Any], wait: float) -> None:
    """Make SQLite statements on ``connection`` wait up to ``wait`` seconds for the write
    lock; ``info`` (the pool's record of the connection) remembers the setting."""
    milliseconds = round(wait * 1000)
    if info.get("busy_ms") != milliseconds:
        connection.execute(f"PRAGMA busy_timeout = {milliseconds:d}")
        info["busy_ms"] = milliseconds


def _utc(value: datetime | str) -> datetime:
    # PostgreSQL returns aware datetimes in the session's zone, MySQL naive ones and
    # SQLite text; the naive ones hold UTC because only UTC is ever stored.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _info(row: dict[str, Any]) -> LockInfo:
    return LockInfo(
        key=row["lock_key"],
        token=fencing_token(row["token"], row["handoffs"]),
        owner=row["owner_id"],
        host=row["host"],
        pid=row["pid"],
        thread_id=row["thread_id"],
        thread_name=row["thread_name"],
        acquired_at=_utc(row["acquired_at"]),
        expires_at=_utc(row["expires_at"]),
        expired=bool(row["expired"]),
    )


class Query(NamedTuple):
    """A statement compiled once for the driver, so that running it costs no
    SQLAlchemy work: its SQL, the values of parameters fixed in the statement (such
    as a LIMIT), and the order of parameters for drivers that take them by position
    (``None``: by name)."""

    sql: str
    fixed: dict[str, Any]
    order: tuple[str, ...] | None

    @classmethod
    def compile(cls, statement: ClauseElement, dialect: Dialect) -> Query:
        compiled = statement.compile(dialect=dialect)
        fixed = {name: value for name, value in compiled.params.items() if value is not None}
        order = getattr(compiled, "positiontup", None)
        return cls(compiled.string, fixed, None if order is None else tuple(order))

    def arguments(self, params: dict[str, Any]) -> Any:
        if self.fixed:
            params = {**self.fixed, **params}
        return params if self.order is None else tuple(params[name] for name in self.order)


class Queries:
    """Every statement of :class:`Statements`, compiled for one dialect."""

    def __init__(self, statements: Statements, dialect: Dialect) -> None:
        for name, statement in vars(statements).items():
            if isinstance(statement, ClauseElement):
                setattr(self, name, Query.compile(statement, dialect))

    insert_if_absent: Query
    delete_expired_key: Query
    delete_owned: Query
    extend_owned: Query
    handoff_owned: Query
    select_owned_token: Query
    select_live: Query
    select_info: Query
    select_all: Query
    delete_key: Query
    delete_expired_batch: Query
    session_alive: Query


class _Link:
    """One pooled driver connection, lent to one try of one operation."""

    __slots__ = ("_backend", "_broken", "_commit", "_connection", "_session")

    def __init__(self, backend: SQLBackend, connection: PoolProxiedConnection) -> None:
        self._backend = backend
        self._connection = connection
        # An engine of the caller's may not be in autocommit mode: commit each statement.
        self._commit = not backend._owns_engine
        self._broken = False  # a statement on it was cut short: its state is unknown
        self._session: object = None

    def execute(self, query: Query, params: dict[str, Any] | None = None) -> Result:
        """Run ``query`` and read its whole result, so no cursor outlives the call."""
        backend = self._backend
        backend.counters.add("statements")
        cursor = self._connection.cursor()
        try:
            cursor.execute(query.sql, query.arguments(params or {}))
            columns = cursor.description
            result = Result(
                cursor.rowcount,
                getattr(cursor, "lastrowid", None),  # (psycopg has none: it uses RETURNING)
                [] if columns is None else [column[0] for column in columns],
                [] if columns is None else list(cursor.fetchall()),
            )
            cursor.close()
            if self._commit:
                self._connection.commit()
        except backend._dbapi_error as exc:
            self.remember_session()
            raise backend._failure(exc, query, self._connection) from exc
        except BaseException:
            # Interrupted, or the driver failed its own way: what the server got of the
            # statement, and what of its reply is still unread, is unknown.
            self.remember_session()
            self._broken = True
            raise
        return result

    def remember_session(self) -> None:
        """Note the server's id for this connection while it can still be read."""
        if self._session is None:
            self._session = self._backend._session_of(self._connection)

    @property
    def session(self) -> object:
        """The server session id of the connection (``None`` on SQLite)."""
        self.remember_session()
        return self._session

    def fileno(self) -> int:
        driver_connection = self._connection.dbapi_connection
        assert driver_connection is not None
        fileno: int = driver_connection.fileno()
        return fileno

    def limit_busy_wait(self, seconds: float) -> None:
        """SQLite: let the next statement wait at most ``seconds`` for the write lock."""
        driver_connection = self._connection.dbapi_connection
        assert isinstance(driver_connection, sqlite3.Connection)
        _set_busy_timeout(driver_connection, self._connection.info, seconds)

    def close(self) -> None:
        if self._broken:
            self._connection.invalidate()
        else:
            self._connection.close()


class Result(NamedTuple):
    rowcount: int
    lastrowid: int | None
    columns: list[str]
    rows: list[Any]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


class SQLBackend(LockBackend):
    """Holds as rows of one table; see the module docstring for error handling."""

    def __init__(
        self,
        *,
        url: str | None,
        engine: Engine | None,
        table: str,
        create_table: bool,
        counters: Counters,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.table = lock_table(check_table_name(table), MetaData())
        self.counters = counters
        self.timeout = timeout
        if engine is None:
            if url is None:
                raise ValueError("give a database URL or an engine")
            self._base_engine = _engine_for_url(url, timeout)
            self._owns_engine = True
            self._engine = self._base_engine
        else:
            if url is not None:
                raise ValueError("give a database URL or an engine, not both")
            self._base_engine = _usable_engine(engine)
            self._owns_engine = False
            self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect_name = self._engine.dialect.name
        self._dialect = self._engine.dialect
        self._dbapi_error: type[Exception] = self._dialect.loaded_dbapi.Error
        self._listener: Listener | None = None
        self._watchdog: Watchdog | None = None
        self._bells: Bells | None = None
        self._gate = Gate()
        # Owner ids whose insert or hand-off may have reached the server unconfirmed,
        # with the server sessions that carried it (see ``discard``).
        self._doubts: dict[str, list[object]] = {}
        self._sweeper = Sweeper(self._sweep)
        self._closing = threading.Event()  # cuts SQLite pollers' pauses short at close
        channel = None
        if self.dialect_name == "postgresql":
            channel = channel_name(self.table.name)
            self._listener = Listener(self._dedicated_connection, channel)
            self._watchdog = Watchdog(timeout / 2)
        elif self.dialect_name in MYSQL_FAMILY:
            self._bells = Bells(self._dedicated_connection, self.table.name, counters)
        self.sql = Statements(self.table, self.dialect_name, channel)
        self.queries = Queries(self.sql, self._dialect)
        if self.dialect_name == "sqlite":
            _sqlite_backends.add(self)
        self._gate.enter()
        try:
            if create_table:
                self._create_table()
            if self.dialect_name in MYSQL_FAMILY:
                self._check_autoinc_lock_mode()
        finally:
            self._gate.leave()

    def _create_table(self) -> None:
        try:
            connection = self._engine.connect()
        except DBAPIError as exc:
            raise BackendError(_unreachable(exc)) from exc
        with connection:
            try:
                self.table.create(connection, checkfirst=True)
            except DBAPIError as exc:
                # Another process may have created it between the check and CREATE.
                if not self._has_table():
                    message = f"cannot create table {self.table.name!r}: {exc.orig}"
                    raise BackendError(message) from exc
        self._add_handoffs_column()

    def _check_autoinc_lock_mode(self) -> None:
        """Fencing tokens rise in the order holds are won only while InnoDB holds its
        AUTO-INC lock through an INSERT ... SELECT (see ``Statements``)."""
        try:
            with self._engine.connect() as connection:
                mode = connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar()
        except DBAPIError as exc:
            raise BackendError(_unreachable(exc)) from exc
        if mode == 2:
            logger.warning(
                "innodb_autoinc_lock_mode is 2 (interleaved): fencing tokens of lock table "
                "%r may come out of order when two inserts of one key race; set it to 1",
                self.table.name,
            )

    def _has_table(self) -> bool:
        try:
            return inspect(self._engine).has_table(self.table.name)
        except SQLAlchemyError:
            return False

    def _add_handoffs_column(self) -> None:
        """Bring a table made by tierlock 0.1, which had no ``handoffs``, up to date."""
        columns = {column["name"] for column in inspect(self._engine).get_columns(self.table.name)}
        if "handoffs" in columns:
            return
        # Quoted as CREATE TABLE quoted it: PostgreSQL folds a bare MixedCase to lower case.
        name = self._dialect.identifier_preparer.format_table(self.table)
        ddl = f"ALTER TABLE {name} ADD COLUMN handoffs INTEGER NOT NULL DEFAULT 0"
        try:
            with self._engine.connect() as connection:
                connection.exec_driver_sql(ddl)
        except DBAPIError as exc:
            columns = {c["name"] for c in inspect(self._engine).get_columns(self.table.name)}
            if "handoffs" not in columns:  # (else another process added it first)
                raise BackendError(f"cannot upgrade table {self.table.name!r}: {exc.orig}") from exc
        logger.warning("added column handoffs to lock table %r", self.table.name)

    # -- running statements -------------------------------------------------------

    def _failure(
        self, exc: Exception, query: Query | None, connection: PoolProxiedConnection | None
    ) -> DBAPIError:
        """``exc`` from the driver as SQLAlchemy's exception, with the connection (and,
        as SQLAlchemy does, every connection opened before it) invalidated if it broke."""
        disconnect = connection is not None and self._dialect.is_disconnect(
            exc,  # type: ignore[arg-type]  # the driver's Error, as caught
            connection,
            None,
        )
        if disconnect:
            assert connection is not None
            self._engine.pool._invalidate(connection, exc)
        wrapped = DBAPIError.instance(
            None if query is None else query.sql,
            None,
            exc,
            self._dbapi_error,
            connection_invalidated=disconnect,
            dialect=self._dialect,
        )
        assert isinstance(wrapped, DBAPIError)
        return wrapped

    def _kind(self, exc: DBAPIError) -> str:
        if exc.connection_invalidated:
            return _CONNECTION
        orig = exc.orig
        mysql_code = orig.args[0] if orig is not None and orig.args else None
        if (
            mysql_code in _MYSQL_CONTENTION
            or getattr(orig, "sqlstate", None) in _POSTGRESQL_CONTENTION
            or getattr(orig, "sqlite_errorcode", None) in _SQLITE_CONTENTION
        ):
            return _CONTENTION
        # SQLite has no connection to lose: "no such table" is an OperationalError too.
        if isinstance(exc, OperationalError) and self.dialect_name != "sqlite":
            return _CONNECTION
        return _FATAL

    def _message(self, what: str, exc: DBAPIError, tries: int = 1) -> str:
        """What a ``BackendError`` says of ``exc``, which ended ``tries`` of ``what``. A
        database out of reach (a server's connection error, or SQLite unable to open
        its file) reads the same on every database: see ``_unreachable``."""
        orig = exc.orig
        if (
            self._kind(exc) == _CONNECTION
            or getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_CANTOPEN
        ):
            return _unreachable(exc)
        after = f" after {tries} tries" if tries > 1 else ""
        return f"{what} failed{after}: {orig}"

    def _run(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[_Link, bool], T],
        on_contention: Callable[[], T] | None = None,
        *,
        owner: str | None = None,
    ) -> T:
        """Run ``attempt(link, uncertain)`` with retries, on a pooled connection each try.

        ``uncertain`` is True once an earlier try failed in a way that may have taken
        effect; ``on_contention`` gives the result for contention (else it is retried).
        ``owner``: the owner id whose row the operation may create or take; a try cut
        short after sending leaves it in doubt (see ``discard``), and an operation for
        an owner id in doubt starts uncertain. Raises only tierlock errors, apart from
        what interrupts it (``KeyboardInterrupt`` and the like).
        """
        self._gate.enter()
        try:
            return self._tries(what, key, attempt, on_contention, owner)
        finally:
            self._gate.leave()

    def _tries(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[_Link, bool], T],
        on_contention: Callable[[], T] | None,
        owner: str | None,
    ) -> T:
        uncertain = owner is not None and owner in self._doubts
        last: DBAPIError | None = None
        give_up = time.monotonic() + self.timeout
        tries = 0
        while True:
            tries += 1
            link: _Link | None = None
            try:
                link = self._link()
                return self._watched(link, attempt, uncertain)
            except DBAPIError as exc:
                kind = self._kind(exc)
                if kind == _FATAL:
                    raise BackendError(self._message(what, exc), key) from exc
                if kind == _CONTENTION and on_contention is not None and not uncertain:
                    # (Once uncertain, retry instead: the next try checks by owner id.)
                    return on_contention()
                logger.debug("%s of %r hit %s, retrying: %s", what, key, kind, exc.orig)
                if kind == _CONNECTION:
                    self._doubt(owner, link)
                    uncertain = True
                last = exc
            except LockError:
                raise
            except Exception as exc:  # e.g. the pool timed out, or a driver's own failure
                self._doubt(owner, link)
                raise BackendError(f"{what} failed: {exc}", key) from exc
            except BaseException:
                self._doubt(owner, link)
                raise
            finally:
                if link is not None:
                    link.close()
            now = time.monotonic()
            if now >= give_up or (kind == _CONNECTION and tries >= ATTEMPTS):
                raise BackendError(self._message(what, last, tries), key) from last
            time.sleep(min(RETRY_PAUSE * tries, LONGEST_RETRY_PAUSE, give_up - now))

    def _watched(self, link: _Link, attempt: Callable[[_Link, bool], T], uncertain: bool) -> T:
        """``attempt`` on ``link``, cut off by the watchdog if the server does not answer."""
        if self._watchdog is None:
            return attempt(link, uncertain)
        with self._watchdog.watch(link.fileno()):
            return attempt(link, uncertain)

    def _link(self) -> _Link:
        """A pooled connection for one try; the caller closes it."""
        try:
            connection = self._engine.raw_connection()
        except self._dbapi_error as exc:
            raise self._failure(exc, None, None) from exc
        if self.dialect_name == "sqlite":
            driver_connection = connection.dbapi_connection
            assert isinstance(driver_connection, sqlite3.Connection)
            _set_busy_timeout(driver_connection, connection.info, SQLITE_BUSY_SLICE)
        return _Link(self, connection)

    def _doubt(self, owner: str | None, link: _Link | None) -> None:
        """Record that a statement for ``owner`` may have reached the server on
        ``link`` without an answer."""
        if owner is not None and link is not None:
            self._doubts.setdefault(owner, []).append(link.session)

    def _session_of(self, connection: PoolProxiedConnection) -> object:
        driver_connection = connection.dbapi_connection
        try:
            if self.dialect_name in MYSQL_FAMILY:
                return driver_connection.thread_id()  # type: ignore[union-attr]
            if self.dialect_name == "postgresql":
                return driver_connection.info.backend_pid  # type: ignore[union-attr]
        except Exception:  # already closed: the server saw its end
            pass
        return None

    # -- holds -------------------------------------------------------------------

    def _insert(self, link: _Link, params: dict[str, Any]) -> int | None:
        result = link.execute(self.queries.insert_if_absent, params)
        if self.sql.returns_token:
            token: int | None = result.rows[0][0] if result.rows else None
        else:
            token = result.lastrowid if result.rowcount == 1 else None
        self.counters.add("insert_conflicts" if token is None else "inserts")
        return None if token is None else fencing_token(token, 0)

    def _owned_token(self, link: _Link, key: str, owner_id: str) -> int | None:
        """Our fencing token if ``owner_id`` holds ``key``: what an ambiguous try did."""
        rows = link.execute(self.queries.select_owned_token, {"key": key, "owner": owner_id}).rows
        return fencing_token(*rows[0]) if rows else None

    def try_acquire(
        self, key: str, owner: Owner, ttl: float, limit: float | None = None
    ) -> int | None:
        params = {
            "key": key,
            "owner": owner.owner_id,
            "host_name": owner.host,
            "proc": owner.pid,
            "thread": owner.thread_id,
            "thread_label": owner.thread_name,
            "ttl": ttl,
        }
        queries = self.queries
        busy_wait = None
        if self.dialect_name == "sqlite" and limit is not None and limit < SQLITE_BUSY_SLICE:
            busy_wait = max(limit, SQLITE_LEAST_BUSY_WAIT)

        def attempt(link: _Link, uncertain: bool) -> int | None:
            if uncertain:
                # A dropped connection hid whether our insert committed: ask.
                token = self._owned_token(link, key, owner.owner_id)
                if token is not None:
                    return token
            if busy_wait is not None:
                link.limit_busy_wait(busy_wait)
            token = self._insert(link, params)
            if token is None and link.execute(queries.delete_expired_key, params).rowcount:
                logger.warning("lock %r: took over a hold whose lease had ended", key)
                self.counters.add("takeovers")
                token = self._insert(link, params)
            if token is not None and self._gate.shut:
                # Won just as the manager closed: nobody will hold it.
                link.execute(queries.delete_owned, params)
                return None
            return token

        token = self._run("acquire", key, attempt, on_contention=lambda: None, owner=owner.owner_id)
        if token is not None and self._doubts:
            self._doubts.pop(owner.owner_id, None)
        return token

    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        params = {"key": key, "owner": owner_id}

        def attempt(link: _Link, uncertain: bool) -> bool:
            if link.execute(self.queries.delete_owned, params).rowcount == 1:
                return True
            # The row is gone. After a dropped connection that may be our own earlier
            # try's doing, but only while the lease surely ran could nobody else (the
            # reaper, a waiter taking over) have removed it; after that, it is lost.
            return uncertain and time.monotonic() < live_until

        return self._run("release", key, attempt)

    def handoff(
        self, key: str, owner_id: str, token: int, successor: Owner, ttl: float
    ) -> int | None:
        params = {
            "key": key,
            "owner": owner_id,
            "new_owner": successor.owner_id,
            "thread": successor.thread_id,
            "thread_label": successor.thread_name,
            "ttl": ttl,
        }

        def attempt(link: _Link, uncertain: bool) -> int | None:
            if uncertain:
                handed = self._owned_token(link, key, successor.owner_id)
                if handed is not None:
                    return handed
            if link.execute(self.queries.handoff_owned, params).rowcount != 1:
                return None
            # The row was exactly as our hold left it, so its token is ours plus one.
            return token + 1

        # A hand-off whose outcome stays unknown leaves the successor's owner id in
        # doubt: the successor's own first try then looks for the row under it.
        handed = self._run("handoff", key, attempt, owner=successor.owner_id)
        if self._doubts:
            self._doubts.pop(successor.owner_id, None)
        return handed

    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        sessions = self._doubts.pop(owner_id, None) if self._doubts else None
        if sessions is None and not certain:
            return
        alive = tuple(session for session in sessions or () if session is not None)
        give_up = time.monotonic() + self.timeout * 1.5
        self._sweeper.add(Sweep(key, owner_id, alive, give_up))

    def _sweep(self, item: Sweep) -> bool:
        """Delete ``item``'s row once its sessions are over; ``False``: not yet."""
        queries = self.queries
        params = {"key": item.key, "owner": item.owner_id}

        def attempt(link: _Link, uncertain: bool) -> bool:
            if item.sessions and time.monotonic() < item.give_up:
                for session in item.sessions:
                    if link.execute(queries.session_alive, {"session": session}).rows:
                        return False
            if link.execute(queries.delete_owned, params).rowcount:
                logger.warning("lock %r: deleted a row its interrupted owner left", item.key)
            return True

        return self._run("sweep", item.key, attempt)

    def extend(self, key: str, owner_id: str, ttl: float) -> bool:
        params = {"key": key, "owner": owner_id, "ttl": ttl}
        return self._run(
            "extend",
            key,
            lambda link, _: link.execute(self.queries.extend_owned, params).rowcount == 1,
        )

    def is_locked(self, key: str) -> bool:
        return self._run(
            "locked",
            key,
            lambda link, _: bool(link.execute(self.queries.select_live, {"key": key}).rows),
        )

    def info(self, key: str) -> LockInfo | None:
        def attempt(link: _Link, uncertain: bool) -> LockInfo | None:
            rows = link.execute(self.queries.select_info, {"key": key}).records()
            return _info(rows[0]) if rows else None

        return self._run("info", key, attempt)

    def holders(self) -> list[LockInfo]:
        return self._run(
            "holders",
            None,
            lambda link, _: [_info(row) for row in link.execute(self.queries.select_all).records()],
        )

    def force_release(self, key: str) -> bool:
        return self._run(
            "force_release",
            key,
            lambda link, _: link.execute(self.queries.delete_key, {"key": key}).rowcount > 0,
        )

    def reap(self) -> int:
        total = 0
        while True:
            deleted: int = self._run(
                "reap",
                None,
                lambda link, _: link.execute(self.queries.delete_expired_batch).rowcount,
            )
            total += deleted
            if deleted < REAP_BATCH:
                self.counters.add("reaped", total)
                return total

    def doorbell(self, key: str) -> Doorbell:
        if self._listener is not None:
            return self._listener.doorbell(key)
        if self._bells is not None:
            return self._bells.doorbell(key)
        return Doorbell(self._closing)

    def others_waiting(self, key: str) -> bool:
        return self._bells is not None and self._bells.waiting(key)

    def _dedicated_connection(self) -> Any:
        """A driver connection in autocommit mode, outside the pool: for LISTEN, or
        for a doorbell's named lock."""
        connection = self._engine.raw_connection()
        connection.detach()
        driver_connection = connection.dbapi_connection
        assert driver_connection is not None
        if self.dialect_name == "postgresql":
            driver_connection.autocommit = True
        else:
            driver_connection.autocommit(True)
        return driver_connection

    def after_fork(self) -> None:
        # SQLAlchemy's advice for a child process: new pool, parent's sockets untouched.
        self._base_engine.dispose(close=False)
        # Another thread may have held the gate's own mutex at the fork.
        self._gate = Gate(shut=self._gate.shut)
        self._doubts = {}
        self._sweeper.forget()  # the parent sweeps its own rows
        if self._listener is not None:
            self._listener.forget()
        if self._watchdog is not None:
            self._watchdog.forget()
        if self._bells is not None:
            self._bells.forget()

    def close(self) -> None:
        if self._gate.shut:
            return
        self._closing.set()
        if self._listener is not None:
            self._listener.close()  # (which wakes its pollers first)
        self._gate.close(self.timeout * 1.5)
        self._sweeper.finish(self.timeout)
        self._gate.seal()
        if self._bells is not None:
            self._bells.close()
        if self._watchdog is not None:
            self._watchdog.close()
        if self._owns_engine:
            self._base_engine.dispose()
        _sqlite_backends.discard(self)


# SQLite runs in the process, and its global mutexes are copied into a forked child
# locked if a thread of the parent was inside SQLite at that moment: the child then
# hangs on its first statement. So a fork waits until no tierlock statement on SQLite
# is under way, and holds new ones back until it is done.
_sqlite_backends: weakref.WeakSet[SQLBackend] = weakref.WeakSet()
# The longest a fork waits for statements under way (each waits at most
# SQLITE_BUSY_SLICE for the write lock).
FORK_WAIT = 5.0


def _pause_for_fork() -> None:
    for backend in list(_sqlite_backends):
        backend._gate.pause(FORK_WAIT)


def _resume_after_fork() -> None:
    for backend in list(_sqlite_backends):
        backend._gate.resume()


os.register_at_fork(before=_pause_for_fork, after_in_parent=_resume_after_fork)
