"""Statements counted where tierlock sends them: at the driver's cursor of a pooled
connection (tierlock sends to the DBAPI cursor, not through SQLAlchemy's events). The
``driver_statements`` fixture (in ``conftest``) counts them for a test."""

from __future__ import annotations

import threading

__all__ = ["HEARTBEAT", "CountingCursor", "DriverStatements"]

HEARTBEAT = "tierlock-heartbeat"  # the heartbeat thread's name


class DriverStatements:
    """Every statement sent to a driver cursor of a pooled connection in this process,
    with the name of the thread that sent it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self._mutex = threading.Lock()

    def add(self, statement: str) -> None:
        with self._mutex:
            self.sent.append((threading.current_thread().name, statement))

    def count(self, *, thread: str | None = None, but: str | None = None) -> int:
        with self._mutex:
            return sum(
                1
                for name, _ in self.sent
                if (thread is None or name == thread) and (but is None or name != but)
            )

    def by_this_thread(self, since: int) -> list[str]:
        """The statements the calling thread sent from index ``since`` of ``sent`` on."""
        me = threading.current_thread().name
        with self._mutex:
            return [statement for name, statement in self.sent[since:] if name == me]


class CountingCursor:
    def __init__(self, cursor: object, statements: DriverStatements) -> None:
        self._cursor = cursor
        self._statements = statements

    def execute(self, statement: str, *parameters: object) -> object:
        self._statements.add(statement)
        return self._cursor.execute(statement, *parameters)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._cursor, name)
