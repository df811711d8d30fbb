"""Leases that live with the process: one heartbeat per manager renews every renewed
hold, and reports the holds it finds lost.

A renewed hold's row carries its ``lease``; the heartbeat sends one statement per table
(per 512 holds) that moves each listed row's expiry to its lease from now, by the
database's clock, at least every third of the shortest lease. The rows live as long as
the process does and can reach the database, like a ZooKeeper session: a process that
dies, is stopped, or loses the database for about a lease loses its holds, and nothing
else does.

The heartbeat runs in a thread of its own rather than as a job of the reaper's
scheduler: renewal has a deadline, which a scheduler's misfire and coalescing rules and
its one worker shared with reaper passes cannot promise; it must run when the reaper is
off; and a new hold with a shorter lease must be able to wake it early.

A hold is lost when a renewal finds its row gone or its lease ended, or when the
database stayed out of reach until the lease may have ended (``Hold.live_until``, on
the process's own monotonic clock). Its ``on_lost(key, token)`` is then called once, in
this thread, and its row, if still there, is deleted once the database can be reached.
"""

from __future__ import annotations

import logging
import threading
import time

from .backends import LockBackend
from .errors import LockError
from .keys import user_key
from .records import Hold
from .stats import Counters

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)

# Renewals come at least this many times per lease: losing one or two to a slow
# database still leaves the lease alive.
BEATS_PER_LEASE = 3
# After a failed renewal, the next try comes after this share of the time the earliest
# lease surely has left (and at least after RETRY_FLOOR seconds).
RETRY_SHARE = 0.25
RETRY_FLOOR = 0.05


class Heartbeat:
    """Renews the renewed holds of one manager; see the module docstring."""

    def __init__(self, backend: LockBackend, counters: Counters, idle_period: float) -> None:
        self._backend = backend
        self._counters = counters
        self._idle_period = idle_period  # how long the thread sleeps with nothing to renew
        self.forget()

    def forget(self) -> None:
        """Start afresh: a forked child holds nothing, and the parent's thread is gone."""
        self._changed = threading.Condition(threading.Lock())
        self._holds: dict[str, Hold] = {}  # renewed holds by owner id
        self._callbacks: list[Hold] = []  # lost holds whose on_lost is still to be called
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        self._stopped = False

    def add(self, hold: Hold) -> None:
        """Renew ``hold`` from now on."""
        due = self._due(hold)
        with self._changed:
            self._holds[hold.owner_id] = hold
            self._start()
            if due < self._wake_at:
                self._changed.notify()

    def remove(self, hold: Hold) -> None:
        """Stop renewing ``hold`` (released, or passed to a fixed-lease holder)."""
        with self._changed:
            self._holds.pop(hold.owner_id, None)

    def lost(self, hold: Hold, why: str, *, sweep: bool = True) -> None:
        """Give up ``hold`` as lost (once): no longer renewed, its row deleted if still
        there (``sweep``; not when the row is known gone), its ``on_lost`` called in the
        heartbeat's thread."""
        with self._changed:
            if hold.lost:
                return
            hold.lost = True
            self._holds.pop(hold.owner_id, None)
            if hold.on_lost is not None:
                self._callbacks.append(hold)
                self._start()
                self._changed.notify()
        self._counters.add("lost_holds")
        logger.warning("lock %r (token %d) was lost: %s", user_key(hold.key), hold.token, why)
        if sweep:
            self._backend.discard(hold.key, hold.owner_id, certain=True)

    def close(self) -> None:
        with self._changed:
            self._stopped = True
            thread = self._thread
            self._changed.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def _start(self) -> None:
        if self._thread is None and not self._stopped:
            thread = threading.Thread(target=self._run, name="tierlock-heartbeat", daemon=True)
            self._thread = thread
            thread.start()

    @staticmethod
    def _due(hold: Hold) -> float:
        """When ``hold`` should next be renewed (its lease's first third has passed)."""
        lease = hold.lease if hold.lease is not None else hold.ttl
        return hold.live_until - lease * (1 - 1 / BEATS_PER_LEASE)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and not self._callbacks:
                    now = time.monotonic()
                    due = min(map(self._due, self._holds.values()), default=now + self._idle_period)
                    if due <= now:
                        break
                    self._wake_at = due
                    self._changed.wait(due - now)
                self._wake_at = float("inf")
                if self._stopped:
                    return
                callbacks, self._callbacks = self._callbacks, []
                holds = list(self._holds.values())
            for hold in callbacks:
                self._call_on_lost(hold)
            if holds and min(map(self._due, holds)) <= time.monotonic():
                self._beat(holds)

    def _beat(self, holds: list[Hold]) -> None:
        sent = time.monotonic()
        try:
            renewed = self._backend.renew([(hold.key, hold.owner_id) for hold in holds])
        except LockError as exc:
            self._unreachable(holds, exc)
            return
        self._counters.add("renewals", len(renewed))
        for hold in holds:
            if hold.owner_id in renewed:
                assert hold.lease is not None
                hold.live_until = sent + hold.lease
            elif self._holds.get(hold.owner_id) is hold:  # (not released meanwhile)
                self.lost(hold, "its row was gone or its lease had ended at a renewal")
        for hold in holds:
            if not hold.recorded and not hold.lost:
                self._record(hold)

    def _unreachable(self, holds: list[Hold], exc: LockError) -> None:
        """A renewal failed: holds whose lease may have ended are lost; the others are
        tried again soon."""
        now = time.monotonic()
        self._counters.add("failed_renewals")
        logger.warning("renewing %d lock(s) failed, will try again: %s", len(holds), exc)
        for hold in holds:
            if hold.live_until <= now and self._holds.get(hold.owner_id) is hold:
                self.lost(hold, "the database could not be reached before its lease ended")
        left = [hold.live_until - now for hold in holds if not hold.lost]
        if left:
            pause = max(RETRY_FLOOR, RETRY_SHARE * min(left))
            with self._changed:
                self._changed.wait(pause)

    def _record(self, hold: Hold) -> None:
        """Make the row name the thread that holds it now (after hand-offs that sent no
        statement), with the hand-off count and the lease it now asks for."""
        hold.recorded = True  # (a hand-off during the statement clears it again)
        holder, handoffs, lease = hold.holder, hold.handoffs, hold.ttl
        try:
            if self._backend.record_holder(hold.key, hold.owner_id, holder, handoffs, lease):
                hold.lease = lease
        except LockError as exc:
            hold.recorded = False
            logger.debug("recording the holder of %r failed: %s", hold.key, exc)

    def _call_on_lost(self, hold: Hold) -> None:
        assert hold.on_lost is not None
        try:
            hold.on_lost(hold.key, hold.token)
        except Exception:
            logger.exception("on_lost(%r, %d) raised", hold.key, hold.token)
