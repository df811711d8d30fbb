"""Wake-ups on MariaDB/MySQL: a ``GET_LOCK`` beside each contended row (a doorbell).

The first poller of a key in any process takes the key's named lock (``GET_LOCK``) on
a connection of its own and keeps it while it polls and, once it wins the row, while
its process holds the row; the pollers of other processes block on the named lock in
the server instead of sleeping. When the row is released, so is the named lock, and the
server wakes the next poller at once. The named lock only saves time: every poller
still waits at most its pause before it tries the row again, and a dropped connection
(which frees the named lock) costs nothing but that pause.

A query cut short (by an interrupt, or a failure) leaves its connection's protocol state
unknown, so that connection is closed, never kept for reuse; closing it frees the named
lock in the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...stats import Counters
from .. import Doorbell

__all__ = ["Bells"]

logger = logging.getLogger(__name__)

# Idle doorbell connections kept for the next contended key.
SPARE_CONNECTIONS = 4
# The longest pause of the poller that holds a key's named lock while another process
# holds the row without it: it is the only poller of that key that polls at all, and
# it must not miss the gap a releasing process leaves (see COURTESY_PAUSE).
NEXT_IN_LINE_PAUSE = 0.004
# How long ``close()`` waits for pollers to bring back their connections: a poller's
# GET_LOCK lasts at most its pause, which is at most the manager's poll interval.
CLOSE_WAIT = 2.0


class _Failed(Exception):
    """A doorbell query failed; its connection is closed already."""


class Bells:
    """The doorbells of one manager's table, and their dedicated connections."""

    def __init__(self, connect: Callable[[], Any], table: str, counters: Counters) -> None:
        self._connect = connect  # a new autocommit pymysql connection, outside the pool
        self._table = table
        self._counters = counters
        self.forget()

    def forget(self) -> None:
        """Drop the connections without closing them: used in a forked child."""
        self._changed = threading.Condition(threading.Lock())
        self._spare: list[Any] = []
        self._polling: set[Any] = set()  # lent to pollers, which bring them back
        self._ringing: set[Any] = set()  # kept by holders until their row is released
        self._closed = False

    def doorbell(self, key: str) -> Doorbell:
        return _Bell(self, _name(self._table, key))

    def waiting(self, key: str) -> bool | None:
        """Whether a poller holds the key's named lock: someone is next in line
        (``None``: the server could not be asked)."""
        try:
            connection = self._borrow()
            used = self._query(connection, "SELECT IS_USED_LOCK(%s)", _name(self._table, key))
        except _Failed:
            return None
        self._give_back(connection)
        return used is not None

    def close(self) -> None:
        """Close every doorbell connection, waiting briefly for pollers' to come back;
        those kept by holders are closed now, which frees their named locks."""
        with self._changed:
            self._closed = True
            spare, self._spare = self._spare, []
            ringing, self._ringing = self._ringing, set()
            if not self._changed.wait_for(lambda: not self._polling, CLOSE_WAIT):
                logger.warning("closing with %d doorbell poller(s) still out", len(self._polling))
        for connection in spare + list(ringing):
            _close(connection)

    def _borrow(self) -> Any:
        with self._changed:
            if self._closed:
                raise _Failed("closed")
            connection = self._spare.pop() if self._spare else None
        if connection is None:
            try:
                connection = self._connect()
            except Exception as exc:
                logger.debug("doorbell connection failed: %s", exc)
                raise _Failed(str(exc)) from exc
        with self._changed:
            self._polling.add(connection)
        return connection

    def _keep(self, connection: Any) -> None:
        """A poller that won keeps its connection (and named lock) with the row."""
        with self._changed:
            self._polling.discard(connection)
            self._changed.notify_all()
            if not self._closed:
                self._ringing.add(connection)
                return
        _close(connection)

    def _give_back(self, connection: Any, *, reuse: bool = True) -> None:
        """Take ``connection`` back from a poller or holder: kept as a spare if
        ``reuse`` and there is room, else closed."""
        with self._changed:
            self._polling.discard(connection)
            self._ringing.discard(connection)
            self._changed.notify_all()
            if reuse and not self._closed and len(self._spare) < SPARE_CONNECTIONS:
                self._spare.append(connection)
                return
        _close(connection)

    def _query(self, connection: Any, sql: str, *args: object) -> Any:
        """Run ``sql`` on ``connection``; on any failure, or an interrupt, the
        connection is dropped (``_Failed``, or the interrupt raised again)."""
        self._counters.add("doorbell_queries")
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, args)
                row = cursor.fetchone()
        except Exception as exc:
            logger.debug("doorbell query failed: %s", exc)
            self._give_back(connection, reuse=False)
            raise _Failed(str(exc)) from exc
        except BaseException:
            self._give_back(connection, reuse=False)
            raise
        return None if row is None else row[0]


class _Bell(Doorbell):
    """One poller's doorbell: ``wait`` blocks on the named lock until it is free."""

    def __init__(self, bells: Bells, name: str) -> None:
        super().__init__()
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
        except _Failed:  # the database's trouble shows on the row soon enough
            self._connection, self._holding = None, False
            time.sleep(max(0.0, seconds - (time.monotonic() - began)))
            return False
        except BaseException:
            self._connection, self._holding = None, False  # (dropped by _query)
            raise
        self._holding = got == 1
        return self._holding

    def keep(self) -> Callable[[], None] | None:
        if not self._holding:
            return None
        connection, name, bells = self._connection, self._name, self._bells
        self._connection, self._holding = None, False
        bells._keep(connection)

        def ring() -> None:
            try:
                bells._query(connection, "SELECT RELEASE_LOCK(%s)", name)
            except _Failed:  # a closed connection has freed the lock already
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


def _name(table: str, key: str) -> str:
    # Named locks are server-wide and at most 64 characters long.
    digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"tierlock:{table[:30]}:{digest}"


def _close(connection: Any) -> None:
    with contextlib.suppress(Exception):  # already broken
        connection.close()
