"""``Link``: one operation's connection, which runs compiled statements straight on the
driver (see ``running`` for how operations are tried and retried)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy.pool import PoolProxiedConnection

from .engine import set_busy_timeout
from .queries import Query

if TYPE_CHECKING:
    from .running import Runner

__all__ = ["Link", "Result"]

_COMMIT = Query("COMMIT", {}, None)

# Where a pooled connection's ``info`` keeps its driver connection and cursor.
_KEPT_CURSOR = "tierlock.cursor"


class Link:
    """One pooled driver connection, lent to one try of one operation."""

    __slots__ = ("_broken", "_commit", "_connection", "_failed", "_runner", "_session")

    def __init__(self, runner: Runner, connection: PoolProxiedConnection) -> None:
        self._runner = runner
        self._connection = connection
        # An engine of the caller's may not be in autocommit mode: commit each statement.
        self._commit = runner.commit
        self._broken = False  # a statement on it was cut short: its state is unknown
        self._failed = False  # a statement on it failed: the pool must reset it
        self._session: object = None

    def execute(self, query: Query, params: dict[str, Any] | None = None) -> Result:
        """Run ``query`` and read its whole result, so no cursor outlives the call."""
        runner = self._runner
        runner.counters.add("statements")
        cursor = self._cursor()
        try:
            cursor.execute(query.sql, query.arguments(params or {}))
            columns = cursor.description
            result = Result(
                cursor.rowcount,
                getattr(cursor, "lastrowid", None),  # (psycopg has none: it uses RETURNING)
                [] if columns is None else [column[0] for column in columns],
                [] if columns is None else list(cursor.fetchall()),
            )
            if not runner.reuses_cursors:
                cursor.close()
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
        a failure the pool rolls it back when the connection returns to it."""
        commit, self._commit = self._commit, False
        try:
            if not commit:  # (an autocommit connection of tierlock's own)
                self.execute(self._runner.begin)
            yield
            if commit:
                self._connection.commit()
            else:
                self.execute(_COMMIT)
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

    def _cursor(self) -> Any:
        """A cursor on this connection: on an engine of tierlock's own, the one that the
        connection keeps for tierlock (a new cursor costs psycopg about 35 µs)."""
        connection = self._connection
        if not self._runner.reuses_cursors:
            return connection.cursor()
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
        driver_connection = self._connection.dbapi_connection
        assert isinstance(driver_connection, sqlite3.Connection)
        set_busy_timeout(driver_connection, self._connection.info, seconds)

    def close(self) -> None:
        if self._broken or self._failed:
            self._connection.info.pop(_KEPT_CURSOR, None)
        if self._broken:
            self._connection.invalidate()
        elif self._failed:
            self._connection.close()
        else:
            self._runner.put_back(self._connection)


class Result(NamedTuple):
    rowcount: int
    lastrowid: int | None
    columns: list[str]
    rows: list[Any]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]
