"""Wake-ups on MariaDB/MySQL: a ``GET_LOCK`` beside each contended row (a doorbell).

The first poller of a key in any process takes the key's named lock (``GET_LOCK``) on
a connection of its own and keeps it while it polls and, once it wins the row, while
its process holds the row; the pollers of other processes block on the named lock in
the server instead of sleeping. When the row is released, so is the named lock, and the
server wakes the next poller at once. The named lock only saves time: every poller
still waits at most its pause before it tries the row again, and a dropped connection
(which frees the named lock) costs nothing but that pause.

A try without waiting leaves no poller behind, so a process that only tries marks the
key instead (``want``): a second named lock per key, the *want lock*, held for the
mark's seconds by a thread of the manager's on a connection of its own (the trying
thread only notes the mark), and extended with no query while the tries go on. The
holder's ``waiting`` asks for both named locks in one query; the want lock shows even
while the holder keeps the doorbell's named lock itself.

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
        mutex = threading.Lock()
        self._changed = threading.Condition(mutex)
        self._spare: list[Any] = []
        self._polling: set[Any] = set()  # lent to pollers, which bring them back
        self._ringing: set[Any] = set()  # kept by holders until their row is released
        self._closed = False
        self._marks_due = threading.Condition(mutex)  # a mark to take, or one ends
        self._wants: dict[str, float] = {}  # want lock -> until when (time.monotonic())
        self._held: set[str] = set()  # want locks taken, or being taken, by the marker
        self._marking: Any = None  # the marker's connection, while it holds some
        self._marker: threading.Thread | None = None

    def doorbell(self, key: str) -> Doorbell:
        return _Bell(self, _name(self._table, key))

    def waiting(self, key: str, ringing: bool = False) -> bool | None:
        """Whether a try of another process marked the key wanted, or a poller holds its
        named lock: someone is next in line. ``None``: the server could not be asked,
        or, when ``ringing`` (this process keeps the named lock), no mark shows."""
        sql = "SELECT IS_USED_LOCK(%s), IS_USED_LOCK(%s)"
        try:
            connection = self._borrow()
            bell, want = self._ask(connection, sql, _name(self._table, key), self._want(key))
        except _Failed:
            return None
        self._give_back(connection)
        if want is not None:
            with self._changed:
                own = self._marking is not None and want == self._marking.thread_id()
            if not own:
                return True
        return None if ringing else bell is not None

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` wanted for ``seconds``: the marker thread takes its want lock
        (started here if need be), or keeps the one it holds for longer."""
        name = self._want(key)
        until = time.monotonic() + seconds
        with self._changed:
            if self._closed or until <= self._wants.get(name, 0.0):
                return
            new = name not in self._wants
            self._wants[name] = until
            if not new:
                return
            self._marks_due.notify()
            if self._marker is None:
                self._marker = threading.Thread(
                    target=self._keep_marks, name="tierlock-marks", daemon=True
                )
                self._marker.start()

    def close(self) -> None:
        """Close every doorbell connection, waiting briefly for pollers' to come back;
        those kept by holders are closed now, which frees their named locks (the marker
        closes its own, which frees the want locks)."""
        with self._changed:
            self._closed = True
            self._marks_due.notify()
            marker = self._marker
            spare, self._spare = self._spare, []
            ringing, self._ringing = self._ringing, set()
            if not self._changed.wait_for(lambda: not self._polling, CLOSE_WAIT):
                logger.warning("closing with %d doorbell poller(s) still out", len(self._polling))
        for connection in spare + list(ringing):
            _close(connection)
        if marker is not None and marker is not threading.current_thread():
            marker.join(CLOSE_WAIT)

    def _keep_marks(self) -> None:
        """The marker thread: takes the want lock of each new mark and releases those
        whose time is up, on one connection, until no mark is left or ``close``."""
        while True:
            with self._changed:
                due = self._due_marks()
                if due is None:
                    self._marker = None
                    connection, self._marking = self._marking, None
                    break
            try:
                self._mark(*due)
            except _Failed:  # its connection is closed, which freed its want locks
                with self._changed:
                    self._marking = None
                    for name in self._held:
                        del self._wants[name]
                    self._held.clear()
        if connection is not None:
            self._give_back(connection)  # (as a spare: it holds no want lock now)

    def _due_marks(self) -> tuple[list[str], list[str]] | None:
        """(With the mutex held.) Wait for want locks to release and to take, in that
        order; ``None``: none is left, or the manager is closing."""
        while not self._closed:
            now = time.monotonic()
            ended = [name for name in self._held if self._wants[name] <= now]
            for name in ended:  # (a want from now on takes the lock anew)
                self._held.discard(name)
                del self._wants[name]
            taken = [name for name in self._wants if name not in self._held]
            self._held.update(taken)
            if ended or taken:
                return ended, taken
            if not self._wants:
                return None
            self._marks_due.wait(min(self._wants.values()) - now)
        return None

    def _mark(self, ended: list[str], taken: list[str]) -> None:
        """Release the want locks ``ended`` and take those ``taken`` (a lock some other
        process holds is its mark already: this one is dropped)."""
        connection = self._marking
        if connection is None:
            connection = self._marking = self._spare_or_new()
        for name in ended:
            self._query(connection, "SELECT RELEASE_LOCK(%s)", name)
        for name in taken:
            if self._query(connection, "SELECT GET_LOCK(%s, 0)", name) != 1:
                with self._changed:
                    self._held.discard(name)
                    self._wants.pop(name, None)

    def _borrow(self) -> Any:
        connection = self._spare_or_new()
        with self._changed:
            self._polling.add(connection)
        return connection

    def _spare_or_new(self) -> Any:
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
        """Run ``sql`` on ``connection``; the first column of its row. On any failure,
        or an interrupt, the connection is dropped (``_Failed``, or the interrupt
        raised again)."""
        row = self._ask(connection, sql, *args)
        return None if row is None else row[0]

    def _ask(self, connection: Any, sql: str, *args: object) -> Any:
        """``_query``, with the whole row."""
        self._counters.add("doorbell_queries")
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, args)
                return cursor.fetchone()
        except Exception as exc:
            logger.debug("doorbell query failed: %s", exc)
            self._give_back(connection, reuse=False)
            raise _Failed(str(exc)) from exc
        except BaseException:
            self._give_back(connection, reuse=False)
            raise

    def _want(self, key: str) -> str:
        # (a name of the same length as the doorbell's, which it never equals)
        return "tierwant" + _name(self._table, key)[len("tierlock") :]


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
