"""Leases that live with the process: one heartbeat per manager renews every renewed
hold, and a lease clock ends the belief in every hold whose lease runs out unconfirmed.

A renewed hold's row carries its ``lease``; the heartbeat sends one statement per table
(per 512 holds) that moves each listed row's expiry to its lease from now, by the
database's clock, at least every third of the shortest lease. The rows live as long as
the process does and can reach the database, like a ZooKeeper session: a process that
dies, is stopped, or loses the database for about a lease loses its holds, and nothing
else does.

Two threads share the work, so that neither waits for the other:

* the **heartbeat** sends the renewals, which may block on the database for as long as
  its retries last; an unexpected error in a beat is logged and counted
  (``heartbeat_errors``), and the next beat runs;
* the **lease clock** never touches the database: when a hold's ``live_until`` passes
  with no renewal, hand-off or extend having confirmed it (fixed leases included), it
  marks the hold lost and calls its ``on_lost(key, token)``, once. So a holder learns
  that its belief ended at the moment it ends, even while the heartbeat still waits
  for an unreachable database, and a renewal that succeeds later never revives it.

A renewal's answer is applied only to a hold whose lease no other thread changed while
it was in flight (``Hold.version``): a hand-off, an extend or a release in between
wins. The heartbeat runs in threads of its own rather than as a job of the reaper's
scheduler: renewal has a deadline, which a scheduler's misfire and coalescing rules and
its one worker shared with reaper passes cannot promise; it must run when the reaper is
off; and a new hold with a shorter lease must be able to wake it early.

A lost hold's row, if still there, is deleted once the database can be reached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..backends import LockBackend
from ..errors import LockError, LockLostError, PartialRenewal
from ..keys import user_key
from ..records import NO_BOUND, Hold, lease_end
from ..stats import Counters

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)

# Renewals come at least this many times per lease: losing one or two to a slow
# database still leaves the lease alive.
BEATS_PER_LEASE = 3
# After a failed renewal, the next try comes after this share of the time the earliest
# lease surely has left (and at least after RETRY_FLOOR seconds).
RETRY_SHARE = 0.25
RETRY_FLOOR = 0.05
# How often the heartbeat writes a hold's holder again when another thread changed the
# hold while the write was in flight (each time, the write is what the hold now is).
RECORD_TRIES = 3

Snapshot = tuple[Hold, int, float]  # a renewed hold, its version and lease at a beat


class Heartbeat:
    """Renews the renewed holds of one manager and ends the belief in lapsed ones; see
    the module docstring."""

    def __init__(self, backend: LockBackend, counters: Counters, idle_period: float) -> None:
        self._backend = backend
        self._counters = counters
        self._idle_period = idle_period  # the manager's ttl / 3; idle, the threads wake so often
        self.forget()

    def forget(self) -> None:
        """Start afresh: a forked child holds nothing, and the parent's threads are gone."""
        mutex = threading.Lock()
        self._beat_due = threading.Condition(mutex)
        self._lapse_due = threading.Condition(mutex)
        self._renewed: dict[str, Hold] = {}  # renewed holds by owner id
        self._watched: dict[str, Hold] = {}  # every hold whose belief may lapse
        self._callbacks: list[Hold] = []  # lost holds whose on_lost is still to be called
        self._heartbeat: threading.Thread | None = None
        self._clock: threading.Thread | None = None
        self._beat_at = float("inf")
        self._lapse_at = float("inf")
        self._beat_now = False  # a renewal is due at once: a row may have been taken
        self._watching = False  # whether the backend tells of forced releases
        self._stopped = False

    # -- what the heartbeat and the clock watch ---------------------------------------

    def add(self, hold: Hold) -> None:
        """Watch ``hold`` as it is now: its belief ends at its ``live_until`` unless
        confirmed, and a renewed one (``lease`` set) is renewed."""
        with self._beat_due:
            owner_id = hold.owner_id
            if hold.promise is NO_BOUND:  # (the promise of the session it was won in)
                hold.promise = self._backend.promise
            self._watched[owner_id] = hold
            self._clock = self._started(self._clock, self._keep_time, "tierlock-lease-clock")
            # (An idle clock or heartbeat wakes before a new hold of the manager's ttl
            # needs it, so an acquire wakes neither, which cost a thread switch each.)
            if min(hold.live_until, hold.promise.until) < self._lapse_at:
                self._lapse_due.notify()
            if hold.lease is None:
                self._renewed.pop(owner_id, None)
                return
            self._renewed[owner_id] = hold
            self._heartbeat = self._started(self._heartbeat, self._beat_loop, "tierlock-heartbeat")
            if not self._watching:
                self._watching = True
                self._backend.ask_for_renewals(self._renew_now)
            if self._due(hold) < self._beat_at:
                self._beat_due.notify()

    def remove(self, hold: Hold) -> None:
        """Stop watching ``hold`` (released, or about to change hands or lease)."""
        with self._beat_due:
            self._watched.pop(hold.owner_id, None)
            self._renewed.pop(hold.owner_id, None)
            hold.version += 1

    def confirm(self, hold: Hold, sent: float, length: float, version: int | None = None) -> bool:
        """The store proved ``hold``'s row ours, with a lease of ``length`` from a moment
        after ``sent``: belief in it runs on. ``False`` if it already ended (or, with
        ``version``, if another thread changed the hold since then), and then nothing
        changes. Without ``version``, renewals in flight no longer apply to the hold."""
        with self._beat_due:
            if hold.lost or (version is not None and version != hold.version):
                return False
            hold.live_until = lease_end(sent, length)
            hold.confirmed = sent
            if version is None:
                hold.version += 1
            return True

    def extended(self, hold: Hold, sent: float, ttl: float) -> bool:
        """An extend sent at ``sent`` set ``hold``'s lease to ``ttl`` (a renewed one is
        renewed by ``ttl`` from now on); ``False`` if its belief had ended meanwhile."""
        if not self.confirm(hold, sent, ttl):
            return False
        hold.ttl = ttl
        if hold.lease is not None:
            hold.lease = ttl
        self.add(hold)  # (its next beat or lapse may now be due sooner)
        return True

    def ensure_alive(self, hold: Hold, key: str, before: str) -> None:
        """:raises LockLostError: belief in ``hold`` has ended (and is reported now, if
        the lease clock has not yet), so nothing may be done ``before`` with it."""
        if not hold.alive():
            self.lost(hold, f"its lease ran out before {before}", sweep=False)
            raise LockLostError(key, hold.token)

    def lost(self, hold: Hold, why: str, *, sweep: bool = True, version: int | None = None) -> None:
        """Give up ``hold`` as lost (once; with ``version``, only if no other thread
        changed it since): no longer renewed, its row deleted if still there (``sweep``;
        not when the row is known gone), its ``on_lost`` called by the lease clock."""
        with self._beat_due:
            if hold.lost or (version is not None and version != hold.version):
                return
            self._mark_lost(hold)
        self._report(hold, why, sweep)

    def _renew_now(self, key: str | None) -> None:
        """Renew at once: another process force-released ``key`` (the renewal finds out
        which holds of it are gone; one taken after the release is not), or (``None``)
        the store is reachable again, after renewals may have failed."""
        with self._beat_due:
            renewed = self._renewed.values()
            if any(key is None or user_key(hold.key) == key for hold in renewed):
                self._beat_now = True
                self._beat_due.notify()

    def _mark_lost(self, hold: Hold) -> None:
        """(With the mutex held.)"""
        hold.lost = True
        self._watched.pop(hold.owner_id, None)
        self._renewed.pop(hold.owner_id, None)
        if hold.on_lost is not None:
            self._callbacks.append(hold)
            self._clock = self._started(self._clock, self._keep_time, "tierlock-lease-clock")
            self._lapse_due.notify()

    def _report(self, hold: Hold, why: str, sweep: bool) -> None:
        self._counters.add("lost_holds")
        logger.warning("lock %r (token %d) was lost: %s", user_key(hold.key), hold.token, why)
        if sweep:
            self._backend.discard(hold.key, hold.owner_id, certain=True)

    def close(self) -> None:
        with self._beat_due:
            self._stopped = True
            threads = (self._heartbeat, self._clock)
            self._beat_due.notify()
            self._lapse_due.notify()
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(5.0)

    def _started(
        self, thread: threading.Thread | None, run: Callable[[], None], name: str
    ) -> threading.Thread | None:
        """``thread``, or a new one running ``run`` if it never started or has ended
        (with the mutex held)."""
        if self._stopped or (thread is not None and thread.is_alive()):
            return thread
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    # -- the lease clock -----------------------------------------------------------------

    def _keep_time(self) -> None:
        while True:
            with self._beat_due:
                lapsed = self._wait_for_lapses()
                if lapsed is None:
                    return
                for hold in lapsed:
                    self._mark_lost(hold)
                callbacks, self._callbacks = self._callbacks, []
            for hold in lapsed:
                # A renewal in flight may still push a renewed row's lease: delete it.
                # A fixed lease's row ends by itself, and shows as expired until then.
                why = "its lease ran out before a renewal confirmed it"
                self._report(hold, why, sweep=hold.lease is not None)
            for hold in callbacks:
                self._call_on_lost(hold)

    def _wait_for_lapses(self) -> list[Hold] | None:
        """Wait until a watched hold's belief lapses or an ``on_lost`` is due; the
        lapsed holds, or ``None`` once stopped (with the mutex held)."""
        while not self._stopped:
            now = time.monotonic()
            lapse = min(
                (min(hold.live_until, hold.promise.until) for hold in self._watched.values()),
                default=None,
            )
            if self._callbacks or (lapse is not None and lapse <= now):
                self._lapse_at = float("inf")
                return [hold for hold in self._watched.values() if not hold.alive()]
            if lapse is None:  # (a hold of the manager's ttl, taken from now on, lapses later)
                lapse = now + self._idle_period
            self._lapse_at = lapse
            self._lapse_due.wait(lapse - now)
        return None

    def _call_on_lost(self, hold: Hold) -> None:
        assert hold.on_lost is not None
        try:
            hold.on_lost(hold.key, hold.token)
        except Exception:
            logger.exception("on_lost(%r, %d) raised", hold.key, hold.token)

    # -- the heartbeat -------------------------------------------------------------------

    @staticmethod
    def _due(hold: Hold) -> float:
        """When ``hold`` should next be renewed (its lease's first third has passed)."""
        lease = hold.lease if hold.lease is not None else hold.ttl
        return hold.live_until - lease * (1 - 1 / BEATS_PER_LEASE)

    def _beat_loop(self) -> None:
        while True:
            with self._beat_due:
                while not self._stopped:
                    now = time.monotonic()
                    renewed = self._renewed.values()
                    # (idle: a hold of the manager's ttl, taken from now on, is due later)
                    due = min(map(self._due, renewed), default=now + self._idle_period / 2)
                    if due <= now or self._beat_now:
                        break
                    self._beat_at = due
                    self._beat_due.wait(due - now)
                self._beat_at = float("inf")
                self._beat_now = False
                if self._stopped:
                    return
                holds = [(hold, hold.version, hold.lease or hold.ttl) for hold in renewed]
            try:
                self._beat(holds)
            except Exception:
                # A beat must never end the heartbeat: the next one runs, and the lease
                # clock reports any hold whose lease runs out meanwhile.
                self._counters.add("heartbeat_errors")
                logger.exception("a heartbeat failed; the next one runs as due")
                self._pause([hold for hold, _, _ in holds])

    def _beat(self, holds: list[Snapshot]) -> None:
        sent = time.monotonic()
        unreached: set[str] = set()  # owner ids the renewal could not tell about
        try:
            renewed = self._backend.renew([(hold.key, hold.owner_id) for hold, _, _ in holds])
        except PartialRenewal as exc:  # (some nodes of a cluster did not answer)
            renewed, unreached = exc.renewed, exc.unreached
            self._counters.add("failed_renewals")
            logger.warning("renewing %d lock(s) failed, will try again: %s", len(unreached), exc)
        except LockError as exc:
            self._counters.add("failed_renewals")
            logger.warning("renewing %d lock(s) failed, will try again: %s", len(holds), exc)
            self._pause([hold for hold, _, _ in holds])
            return
        self._counters.add("renewals", len(renewed))
        for hold, version, lease in holds:
            if hold.owner_id in renewed:
                self.confirm(hold, sent, lease, version)
            elif hold.owner_id not in unreached:
                why = "its row was gone or its lease had ended at a renewal"
                self.lost(hold, why, version=version)
        for hold, _, _ in holds:
            if not hold.recorded and not hold.lost:
                self._record(hold)
        if unreached:
            self._pause([hold for hold, _, _ in holds if hold.owner_id in unreached])

    def _pause(self, holds: list[Hold]) -> None:
        """Wait before the next try after a failed beat: a share of the time the
        earliest lease surely has left."""
        now = time.monotonic()
        left = [hold.live_until - now for hold in holds if not hold.lost]
        if left:
            with self._beat_due:
                self._beat_due.wait(max(RETRY_FLOOR, RETRY_SHARE * min(left)))

    def _record(self, hold: Hold) -> None:
        """Make the row name the thread that holds it now (after hand-offs that sent no
        statement), with the hand-off count and the lease it now asks for."""
        for _ in range(RECORD_TRIES):
            with self._beat_due:
                if hold.lost:
                    return
                version, renewed = hold.version, hold.lease is not None
                hold.recorded = True  # (a hand-off during the statement clears it again)
            holder, handoffs, lease = hold.holder, hold.handoffs, hold.ttl if renewed else None
            try:
                if not self._backend.record_holder(
                    hold.key, hold.owner_id, holder, handoffs, lease
                ):
                    return  # (the row is gone: the next beat finds out)
            except LockError as exc:
                hold.recorded = False
                logger.debug("recording the holder of %r failed: %s", hold.key, exc)
                return
            with self._beat_due:
                if hold.version == version:
                    hold.lease = lease
                    return
            # Another thread changed the hold meanwhile, and its statement may have
            # reached the row first: write what the hold is now.
        hold.recorded = False
