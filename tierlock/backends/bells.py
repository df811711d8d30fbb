"""Wake-ups on MariaDB/MySQL: a ``GET_LOCK`` beside each contended row (a doorbell).

The first poller of a key in any process takes the key's named lock (``GET_LOCK``) on
a connection of its own and keeps it while it polls and, once it wins the row, while
its process holds the row; the pollers of other processes block on the named lock in
the server instead of sleeping. When the row is released, so is the named lock, and the
server wakes the next poller at once. The named lock only saves time: every poller
still waits at most its pause before it tries the row again, and a dropped connection
(which frees the named lock) costs nothing but that pause.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..stats import Counters
from . import Doorbell

__all__ = ["Bells"]

logger = logging.getLogger(__name__)

# Idle doorbell connections kept for the next contended key.
SPARE_CONNECTIONS = 4
# The longest pause of the poller that holds a key's named lock while another process
# holds the row without it: it is the only poller of that key that polls at all, and
# it must not miss the gap a releasing process leaves (see COURTESY_PAUSE).
NEXT_IN_LINE_PAUSE = 0.004


class Bells:
    """The doorbells of one manager's table, and their dedicated connections."""

    def __init__(self, connect: Callable[[], Any], table: str, counters: Counters) -> None:
        self._connect = connect  # a new autocommit pymysql connection, outside the pool
        self._table = table
        self._counters = counters
        self.forget()

    def forget(self) -> None:
        """Drop the connections without closing them: used in a forked child."""
        self._mutex = threading.Lock()
        self._spare: list[Any] = []

    def doorbell(self, key: str) -> Doorbell:
        return _Bell(self, _name(self._table, key))

    def waiting(self, key: str) -> bool:
        """Whether a poller holds the key's named lock: someone is next in line."""
        try:
            connection = self._borrow()
        except Exception as exc:
            logger.debug("doorbell check failed: %s", exc)
            return False
        try:
            used = self._query(connection, "SELECT IS_USED_LOCK(%s)", _name(self._table, key))
        except Exception as exc:
            logger.debug("doorbell check failed: %s", exc)
            _close(connection)
            return False
        self._give_back(connection)
        return used is not None

    def close(self) -> None:
        with self._mutex:
            spare, self._spare = self._spare, []
        for connection in spare:
            _close(connection)

    def _borrow(self) -> Any:
        with self._mutex:
            if self._spare:
                return self._spare.pop()
        return self._connect()

    def _give_back(self, connection: Any) -> None:
        with self._mutex:
            if len(self._spare) < SPARE_CONNECTIONS:
                self._spare.append(connection)
                return
        _close(connection)

    def _query(self, connection: Any, sql: str, *args: object) -> Any:
        self._counters.add("doorbell_queries")
        with connection.cursor() as cursor:
            cursor.execute(sql, args)
            row = cursor.fetchone()
        return None if row is None else row[0]


class _Bell(Doorbell):
    """One poller's doorbell: ``wait`` blocks on the named lock until it is free."""

    def __init__(self, bells: Bells, name: str) -> None:
        self._bells = bells
        self._name = name
        self._connection: Any = None
        self._holding = False  # this poller holds the named lock: it is next in line

    def wait(self, seconds: float) -> bool:
        if self._holding:
            time.sleep(min(seconds, NEXT_IN_LINE_PAUSE))
            return False
        bells = self._bells
        began = time.monotonic()
        try:
            if self._connection is None:
                self._connection = bells._borrow()
            got = bells._query(self._connection, "SELECT GET_LOCK(%s, %s)", self._name, seconds)
        except Exception as exc:  # the database's trouble shows on the row soon enough
            logger.debug("doorbell %s failed: %s", self._name, exc)
            self._drop()
            time.sleep(max(0.0, seconds - (time.monotonic() - began)))
            return False
        self._holding = got == 1
        return self._holding

    def keep(self) -> Callable[[], None] | None:
        if not self._holding:
            return None
        connection, name, bells = self._connection, self._name, self._bells
        self._connection, self._holding = None, False

        def ring() -> None:
            try:
                bells._query(connection, "SELECT RELEASE_LOCK(%s)", name)
            except Exception as exc:  # a closed connection has freed the lock already
                logger.debug("doorbell %s failed to ring: %s", name, exc)
                _close(connection)
                return
            bells._give_back(connection)

        return ring

    def close(self) -> None:
        ring = self.keep()
        if ring is not None:
            ring()
        elif self._connection is not None:
            self._bells._give_back(self._connection)
            self._connection = None

    def _drop(self) -> None:
        if self._connection is not None:
            _close(self._connection)
        self._connection, self._holding = None, False


def _name(table: str, key: str) -> str:
    # Named locks are server-wide and at most 64 characters long.
    digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"tierlock:{table[:30]}:{digest}"


def _close(connection: Any) -> None:
    with contextlib.suppress(Exception):  # already broken
        connection.close()
