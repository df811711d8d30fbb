"""``Link``: one operation's connection, which runs compiled statements straight on the
driver (see ``running`` for how operations are tried and retried).

A statement's result is read in one of four ways, each reading no more than its caller
needs: ``execute`` (columns and all rows), ``count`` (the row count), ``first`` (the
first row) and ``inserted`` (the new row's id). Every one leaves nothing of the result
on the server or in the driver: psycopg's and PyMySQL's cursors read a whole result as
the statement runs, and on SQLite, which steps a query's rows only as they are fetched
(holding its read snapshot until then), every row is read.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from sqlalchemy.pool import PoolProxiedConnection

from .engine import SQLITE_BUSY_SLICE, set_busy_timeout
from .queries import Query

if TYPE_CHECKING:
    from .running import Runner

__all__ = ["Link", "Result", "Undo"]

T = TypeVar("T")

_COMMIT = Query("COMMIT", {}, None)
_ROLLBACK = Query("ROLLBACK", {}, None)

# Where a pooled connection's ``info`` keeps its driver connection and cursor.
_KEPT_CURSOR = "tierlock.cursor"


class Undo(Exception):
    """Raised inside ``Link.transaction`` to roll the transaction back on purpose."""


class Link:
    """One pooled driver connection, lent to one try of one operation at a time; the
    runner keeps a few between operations (see ``Runner.put_back``)."""

    __slots__ = (
        "_broken",
        "_busy_limited",
        "_commit",
        "_connection",
        "_cursor",
        "_failed",
        "_runner",
        "_session",
        "_whole",
    )

    def __init__(self, runner: Runner, connection: PoolProxiedConnection) -> None:
        self._runner = runner
        self._connection = connection
        # An engine of the caller's may not be in autocommit mode: commit each statement.
        self._commit = runner.commit
        self._broken = False  # a statement on it was cut short: its state is unknown
        self._failed = False  # a statement on it failed: the pool must reset it
        self._session: object = None
        # SQLite: whether the busy wait may differ from SQLITE_BUSY_SLICE (a connection
        # from the pool may come with the wait of an earlier try).
        self._busy_limited = runner.dialect_name == "sqlite"
        # The cursor the connection keeps for tierlock (None: a new one per statement).
        self._cursor = self._kept_cursor() if runner.reuses_cursors else None
        # SQLite: every row must be read (see the module docstring).
        self._whole = runner.dialect_name == "sqlite"

    def execute(self, query: Query, params: dict[str, Any] | None = None) -> Result:
        """Run ``query`` and read its whole result: columns and rows."""
        return self._send(query, params, _result)

    def count(self, query: Query, params: dict[str, Any] | None = None) -> int:
        """Run ``query``; the rows it changed (or those a SELECT returned, on a server)."""
        return self._send(query, params, _count_read if self._whole else _count)

    def first(self, query: Query, params: dict[str, Any] | None = None) -> Any:
        """Run ``query``, which returns rows; its first row, or ``None``."""
        return self._send(query, params, _first)

    def inserted(self, query: Query, params: dict[str, Any] | None = None) -> int | None:
        """Run ``query``, an insert of at most one row; the row's id (the driver's
        ``lastrowid``) if it inserted one, else ``None``."""
        return self._send(query, params, _inserted)

    def _send(self, query: Query, params: dict[str, Any] | None, read: Callable[[Any], T]) -> T:
        """Run ``query`` and ``read`` its cursor, so no cursor outlives the call."""
        runner = self._runner
        runner.counters.add("statements")
        cursor = self._cursor
        if params is None:
            params = {}
        try:
            if cursor is None:
                cursor = self._connection.cursor()
                cursor.execute(query.sql, query.arguments(params))
                result = read(cursor)
                cursor.close()
            else:
                cursor.execute(query.sql, query.arguments(params))
                result = read(cursor)
            if self._commit:
                self._connection.commit()
        except runner.dbapi_error as exc:
            self.remember_session()
            self._failed = True
            raise runner.failure(exc, query, self._connection) from exc
        except BaseException:
            # Interrupted, or the driver failed its own way: what the server got of the
            # statement, and what of its reply is still unread, is unknown.
            self.remember_session()
            self._broken = True
            raise
        return result

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the statements sent inside as one transaction, committed at the end; on
        a failure the pool rolls it back when the connection returns to it. ``Undo``
        raised inside rolls it back at once, and goes no further."""
        commit, self._commit = self._commit, False
        try:
            if not commit:  # (an autocommit connection of tierlock's own)
                self.count(self._runner.begin)
            yield
            if commit:
                self._connection.commit()
            else:
                self.count(_COMMIT)
        except Undo:
            if commit:
                self._connection.rollback()
            else:
                self.count(_ROLLBACK)
        except BaseException:
            self._failed = True
            self._roll_back()
            raise
        finally:
            self._commit = commit

    def _roll_back(self) -> None:
        """End a failed transaction here: the pool does not roll back a connection in
        autocommit mode, and a transaction left open would swallow later statements."""
        try:
            # Each driver's rollback() ends a transaction begun with BEGIN in autocommit
            # mode, and does nothing without one.
            self._connection.rollback()
        except Exception:
            self._broken = True  # (closed, never pooled again)

    def _kept_cursor(self) -> Any:
        """The cursor the connection keeps for tierlock's statements (a new cursor costs
        psycopg about 35 µs), made if it has none yet."""
        connection = self._connection
        kept = connection.info.get(_KEPT_CURSOR)
        if kept is None or kept[0] is not connection.dbapi_connection:
            # (None, or the cursor of a driver connection that the pool since replaced)
            kept = connection.info[_KEPT_CURSOR] = (
                connection.dbapi_connection,
                connection.cursor(),
            )
        return kept[1]

    def remember_session(self) -> None:
        """Note the server's id for this connection, whose statement was cut short,
        while it can still be read."""
        if self._session is None:
            self._session = self._runner.session_of(self._connection)

    @property
    def session(self) -> object:
        """The server session whose statement was cut short on this connection, and may
        still be running: ``None`` if none was (or on SQLite)."""
        return self._session

    def fileno(self) -> int:
        driver_connection = self._connection.dbapi_connection
        assert driver_connection is not None
        fileno: int = driver_connection.fileno()
        return fileno

    def limit_busy_wait(self, seconds: float) -> None:
        """SQLite: let the next statement wait at most ``seconds`` for the write lock."""
        self._set_busy_wait(seconds)
        self._busy_limited = True

    def restore_busy_wait(self) -> None:
        """SQLite: let statements wait ``SQLITE_BUSY_SLICE`` again, if they may not."""
        if self._busy_limited:
            self._set_busy_wait(SQLITE_BUSY_SLICE)
            self._busy_limited = False

    def _set_busy_wait(self, seconds: float) -> None:
        driver_connection = self._connection.dbapi_connection
        assert isinstance(driver_connection, sqlite3.Connection)
        set_busy_timeout(driver_connection, self._connection.info, seconds)

    def close(self) -> None:
        """End the try: keep the connection if its statements went well, else let the
        pool reset or discard it."""
        if self._broken:
            self.invalidate()
        elif self._failed:
            self._connection.info.pop(_KEPT_CURSOR, None)
            self._connection.close()
        else:
            self._runner.put_back(self)

    def give_back(self) -> None:
        """Return the connection, whose statements went well, to the pool."""
        self._connection.close()

    def invalidate(self) -> None:
        """Close the connection for good: it is broken, or its server may be gone."""
        self._connection.info.pop(_KEPT_CURSOR, None)
        self._connection.invalidate()


def _result(cursor: Any) -> Result:
    columns = cursor.description
    return Result(
        cursor.rowcount,
        getattr(cursor, "lastrowid", None),  # (psycopg has none: it uses RETURNING)
        [] if columns is None else [column[0] for column in columns],
        [] if columns is None else list(cursor.fetchall()),
    )


def _count(cursor: Any) -> int:
    count: int = cursor.rowcount
    return count


def _count_read(cursor: Any) -> int:
    count: int = cursor.rowcount
    cursor.fetchall()
    return count


def _first(cursor: Any) -> Any:
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _inserted(cursor: Any) -> int | None:
    # (An insert that did nothing leaves lastrowid at an earlier insert's id, or, as a
    # duplicate that MariaDB counts as found, at 0.)
    return (cursor.lastrowid or None) if cursor.rowcount == 1 else None


class Result(NamedTuple):
    rowcount: int
    lastrowid: int | None
    columns: list[str]
    rows: list[Any]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]
