"""Counters of what a manager did, read with ``LockManager.stats()``."""

from __future__ import annotations

import dataclasses
import threading

__all__ = ["Counters", "LockStats"]


@dataclasses.dataclass(frozen=True)
class LockStats:
    """Counts since the manager was made (or since the fork that made this process).

    ``local_waits`` are acquisitions that queued in tier 1 behind another thread of the
    process instead of polling the database: the contention tier 1 absorbed.
    """

    acquisitions: int = 0  #: successful ``acquire()`` calls, reentrant ones included
    reentrant_acquisitions: int = 0  #: acquisitions by a thread that already held the key
    local_waits: int = 0  #: acquisitions that waited in tier 1 behind a local thread
    statements: int = 0  #: SQL statements sent on the lock table
    doorbell_queries: int = 0  #: MariaDB/MySQL named-lock queries that wake pollers
    wakeups: int = 0  #: SQLite: pollers of other processes woken after a row left
    inserts: int = 0  #: lock rows inserted (holds won in the database)
    insert_conflicts: int = 0  #: inserts that found the key held elsewhere
    takeovers: int = 0  #: expired rows of other holders replaced by ours
    local_handoffs: int = 0  #: holds passed to a local waiter with no statement at all
    handoffs: int = 0  #: holds passed to a local waiter with one UPDATE (a fixed lease)
    reclaims: int = 0  #: rows of holder processes proven gone, taken over before their lease
    releases: int = 0  #: successful ``release()`` calls, reentrant ones included
    heartbeats: int = 0  #: renewal statements the heartbeat sent
    renewals: int = 0  #: holds renewed (one heartbeat statement renews many)
    lost_holds: int = 0  #: holds found lost: by a renewal, a release or an extend
    reaped: int = 0  #: expired rows deleted by ``reap()`` and the reaper


_FIELDS = tuple(field.name for field in dataclasses.fields(LockStats))


class Counters:
    """The mutable, thread-safe side of :class:`LockStats`.

    One uncontended ``threading.Lock`` per increment costs well under a microsecond,
    against hundreds for the database round trip of any counted event.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._counts = dict.fromkeys(_FIELDS, 0)

    def add(self, name: str, amount: int = 1) -> None:
        with self._mutex:
            self._counts[name] += amount

    def snapshot(self) -> LockStats:
        with self._mutex:
            return LockStats(**self._counts)

    def reset(self) -> None:
        """Start again from zero; used in a forked child."""
        self._mutex = threading.Lock()
        self._counts = dict.fromkeys(_FIELDS, 0)
