"""Counters of what a manager did, read with ``LockManager.stats()``, and the hook
through which ``tierlock.metrics`` times acquires and holds."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol

__all__ = ["Counters", "LockStats", "Observer"]


@dataclasses.dataclass(frozen=True)
class LockStats:
    """Counts since the manager was made (or since the fork that made this process).

    ``local_waits`` are acquisitions that queued in tier 1 behind another thread of the
    process instead of polling the database: the contention tier 1 absorbed.
    """

    acquisitions: int = 0  #: successful ``acquire()`` calls, reentrant ones included
    reentrant_acquisitions: int = 0  #: acquisitions by a thread that already held the key
    local_waits: int = 0  #: acquisitions that waited in tier 1 behind a local thread
    #: requests sent: SQL statements, Redis commands, ZooKeeper requests, file-system calls
    statements: int = 0
    doorbell_queries: int = 0  #: MariaDB/MySQL named-lock queries that wake pollers
    wakeups: int = 0  #: SQLite: pollers of other processes woken after a row left
    #: SQL statements that carried the inserts or releases of several threads at once
    shared_statements: int = 0
    #: statements the database refused for contention, sent again at once or, in a try
    #: to acquire, at the next try: a deadlock it broke or a lock wait that timed out
    #: (MariaDB/MySQL 1213, 1205, and 1467, its auto-increment read; PostgreSQL 40P01,
    #: 40001, 55P03), SQLite's busy file
    contention_retries: int = 0
    inserts: int = 0  #: lock rows inserted (holds won in the database, keys or nodes made)
    insert_conflicts: int = 0  #: inserts that found the key held elsewhere
    takeovers: int = 0  #: expired rows of other holders replaced by ours
    local_handoffs: int = 0  #: holds passed to a local waiter with no statement at all
    #: holds passed to a local waiter with one UPDATE: a fixed lease, or a renewed one
    #: last proved ours over ``passing.CONFIRMED_WITHIN`` ago
    handoffs: int = 0
    reclaims: int = 0  #: rows of holder processes proven gone, taken over before their lease
    releases: int = 0  #: successful ``release()`` calls, reentrant ones included
    heartbeats: int = 0  #: renewal statements the heartbeat sent
    renewals: int = 0  #: holds renewed (one heartbeat statement renews many)
    failed_renewals: int = 0  #: renewals that could not reach the database (retried soon)
    heartbeat_errors: int = 0  #: beats that failed unexpectedly (logged; the next one runs)
    #: holds found lost: their lease ran out unconfirmed, or a renewal, hand-off,
    #: release or extend found their row gone
    lost_holds: int = 0
    reaped: int = 0  #: expired rows deleted by ``reap()`` and the reaper


_FIELDS = tuple(field.name for field in dataclasses.fields(LockStats))


class Observer(Protocol):
    """Told how long acquires waited and holds lasted, in seconds; called in the thread
    that acquired or released, so it must be quick and must not raise."""

    def waited(self, seconds: float) -> None: ...

    def held(self, seconds: float) -> None: ...


class Counters:
    """The mutable, thread-safe side of :class:`LockStats`, and its ``observers``.

    One uncontended ``threading.Lock`` per increment costs well under a microsecond,
    against hundreds for the database round trip of any counted event. With no
    observers (no metrics registered), timing costs an acquire and a release one check
    of an empty tuple each, and no clock reading.
    """

    def __init__(self) -> None:
        self.observers: tuple[Observer, ...] = ()
        self.reset()

    def add(self, name: str, amount: int = 1) -> None:
        with self._mutex:
            self._counts[name] += amount

    def acquired(self, key: str, called: float, *, reentrant: bool = False) -> None:
        """Count an acquire that succeeded; if it was timed (``called``: when it was
        called, by ``time.monotonic()``), tell the observers how long it waited, and
        note when the outermost hold began for ``held``."""
        with self._mutex:
            self._counts["acquisitions"] += 1
            if reentrant:
                self._counts["reentrant_acquisitions"] += 1
        if called:
            now = time.monotonic()
            for observer in self.observers:
                observer.waited(now - called)
            if self.observers and not reentrant:
                self._began()[key] = now

    def held(self, key: str) -> None:
        """Tell the observers how long the calling thread's outermost hold of ``key``
        lasted, now that its last release begins (if its acquire was timed)."""
        began = self._began().pop(key, None)
        if began is not None:
            seconds = time.monotonic() - began
            for observer in self.observers:
                observer.held(seconds)

    def observe(self, observer: Observer) -> None:
        with self._mutex:
            self._set_observers((*self.observers, observer))

    def unobserve(self, observer: Observer) -> None:
        with self._mutex:
            self._set_observers(tuple(one for one in self.observers if one is not observer))

    def _set_observers(self, observers: tuple[Observer, ...]) -> None:
        # Holds begun under the old observers are not timed: a hold begun while there
        # were none left no mark, and a mark left before must not time a later hold.
        self.observers = observers
        self._begins = threading.local()

    def _began(self) -> dict[str, float]:
        """When the calling thread's timed holds began, by key."""
        begins = self._begins
        try:
            began: dict[str, float] = begins.by_key
        except AttributeError:
            began = begins.by_key = {}
        return began

    def snapshot(self) -> LockStats:
        with self._mutex:
            return LockStats(**self._counts)

    def reset(self) -> None:
        """Start again from zero; used in a forked child, which holds nothing."""
        self._mutex = threading.Lock()
        self._counts = dict.fromkeys(_FIELDS, 0)
        self._begins = threading.local()
