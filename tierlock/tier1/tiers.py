"""The two tiers at work: how a thread of a manager acquires, passes on and releases a key.

Tier 1 (``local.Registry``) queues the threads of the process that want a key; the one
at the head asks the backend (tier 2). A released hold goes to the next local waiter:

* with **no statement** when both renew their leases: the row stays with the process,
  which the heartbeat keeps alive, and the successor's fencing token is one higher, in
  memory (the heartbeat writes the new holder and count into the row);
* with one UPDATE when either holds a fixed lease, which the database must set;
* back to the database once a cohort of hand-offs in a row reaches its bound while
  other processes may be waiting, so that they get their turn (see ``cohorts``).

A hold released with no local waiter, while a try without waiting of the process was
turned away from it, is kept for a moment for the next such try (see ``keeping``).

Every exit is safe: an acquire cut short at any point (a timeout, an exception raised
by a signal handler) passes on what it got, and waking a successor never depends on a
statement (see ``local``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NoReturn

from ..backends import Doorbell, LockBackend
from ..errors import LockError, LockLostError, NotHeldError
from ..records import Hold, Owner
from ..stats import Counters
from .cohorts import COURTESY_PAUSE, WANTED_FOR, Cohorts, released
from .keeping import Keeper
from .leases import Heartbeat
from .local import Registry, Waiter
from .passing import OnLost, Request, pass_locally, passes_locally

__all__ = ["FIRST_POLL", "OnLost", "Tiers"]

logger = logging.getLogger(__name__)

# Pauses between two tries at a key held elsewhere start here and double, with jitter
# so that waiting processes do not try in step, up to the manager's poll interval. A
# poller whose doorbell wakes it in turn pauses the poll interval after every try the
# doorbell was armed for: its ring, not the clock, says when to try again.
FIRST_POLL = 0.002


class Tiers:
    """Acquire, release and extend for one manager's threads."""

    def __init__(
        self, backend: LockBackend, counters: Counters, *, poll_interval: float, idle: float
    ) -> None:
        self.backend = backend
        self.counters = counters
        self.poll_interval = poll_interval
        self.registry: Registry[Hold, Request] = Registry(counters)
        self.heartbeat = Heartbeat(backend, counters, idle)
        self.keeper = Keeper(self.registry, self.heartbeat, backend)
        self.cohorts = Cohorts(backend)
        self.closed = False

    def after_fork(self) -> None:
        self.registry.reset()
        self.heartbeat.forget()
        self.keeper.forget()
        self.cohorts.forget()

    def close(self) -> None:
        self.closed = True
        self.keeper.close(self.registry.close())
        self.heartbeat.close()

    def check_open(self, key: str | None = None) -> None:
        if self.closed:
            raise LockError("this LockManager is closed", key)

    def check_thread(self, key: str) -> None:
        """Refuse an acquire when the manager is closed, or in an event loop's thread."""
        self.check_open(key)
        if asyncio._get_running_loop() is not None:
            # Coroutines of one loop share its thread, so a thread-owned lock would
            # let them all in at once, and a wait would stall the loop.
            raise LockError(
                "a LockManager's locks belong to threads and cannot be acquired in a "
                "thread that runs an asyncio event loop; use tierlock.aio.AsyncLockManager "
                "in coroutines",
                key,
            )

    # -- what a thread holds -------------------------------------------------------

    def owned(self, key: str) -> bool:
        """Whether the calling thread holds ``key`` with a lease that surely still runs."""
        hold = self.registry.hold(key)
        return hold is not None and hold.alive()

    def token(self, key: str) -> int | None:
        hold = self.registry.hold(key)
        return None if hold is None else hold.token

    # -- acquire -------------------------------------------------------------------

    def acquire(
        self, key: str, ttl: float, renew: bool, on_lost: OnLost | None, wait: float | None
    ) -> bool:
        self.check_thread(key)
        registry = self.registry
        called = time.monotonic() if self.counters.observers else 0.0  # (timed for metrics)
        if registry.reenter(key):
            self.counters.acquired(key, called, reentrant=True)
            return True
        if wait == 0 and (
            registry.turn_away(key)  # another thread of this process holds or asks for it
            or self.cohorts.hot(key)  # other processes fight over it
        ):
            return False
        deadline = None if wait is None else (called or time.monotonic()) + wait
        request = Request(Owner.current(), ttl, renew, on_lost)
        owner_id = request.owner.owner_id
        try:
            if not registry.claim(key, wait, request):
                return False
            self.check_open(key)
            hold = registry.hold(key)
            if hold is not None and hold.keep_until:
                hold = self._take_kept(key, hold, request)
            if hold is None:  # (else handed over by a local holder)
                missed_before = self.cohorts.last_missed(key)
                hold = self._acquire_remote(key, request, deadline)
                if hold is None:
                    self.backend.discard(key, owner_id, certain=False)
                    registry.unclaim(key)
                    if wait == 0 and self.cohorts.missed_without_waiting(key, missed_before):
                        self.backend.want(key, WANTED_FOR)
                    return False
                self.cohorts.won(key)
                registry.settle(key, hold)
                self.heartbeat.add(hold)
                logger.debug("acquired %r (token %d, owner %s)", key, hold.token, owner_id)
        except BaseException as exc:
            # An interrupt may have come at any point: after a statement was sent, or
            # once a hand-off gave this thread the claim; pass on whatever it got.
            self._abandon(key, owner_id, certain=not isinstance(exc, LockError))
            raise
        self.counters.acquired(key, called)
        return True

    def _abandon(self, key: str, owner_id: str, *, certain: bool) -> None:
        """Undo the calling thread's acquire of ``key`` that will not return a hold.

        ``certain``: the acquire was cut short by an exception that is not tierlock's,
        so a row of ``owner_id`` may exist that nothing confirmed.
        """
        registry = self.registry
        if not registry.claims(key):
            return  # it never left the queue, so it never talked to the database
        hold = registry.hold(key)
        if hold is None:
            registry.unclaim(key)
            self.backend.discard(key, owner_id, certain=certain)
            return
        registry.exit(key)
        try:
            self._let_go(key, hold)
        except LockError as exc:
            logger.warning("passing on %r after an interrupted acquire failed: %s", key, exc)

    def _take_kept(self, key: str, hold: Hold, request: Request) -> Hold | None:
        """Make ``hold``, kept by the process and claimed by the calling thread, its own:
        with no statement when it can, or with the UPDATE of a hand-off; ``None`` when
        the row is gone, and the thread must ask the database."""
        hold.keep_until = 0.0
        if not hold.lost:
            if passes_locally(hold, request):
                pass_locally(hold, request)
                self.counters.add("local_handoffs")
                return hold
            if self._hand_off(key, hold, request) is not None:
                return hold
        self.heartbeat.remove(hold)
        self.registry.drop_hold(key)
        if hold.ring is not None:
            hold.ring()
        return None

    def _let_others_first(self, key: str, doorbell: Doorbell, deadline: float | None) -> None:
        """Pause before a courteous waiter's first try, so that other processes that
        want ``key`` get it first."""
        if doorbell.wakes_in_turn:
            # It rings once those that waited before this thread had their turn.
            waiting = self.backend.others_waiting(key, False)
            courtesy = self.poll_interval if waiting else 0.0
        else:
            courtesy = COURTESY_PAUSE
        if deadline is not None:
            courtesy = min(courtesy, max(0.0, deadline - time.monotonic()))
        if doorbell.wakes_in_turn:
            doorbell.wait(courtesy)
        else:
            # A doorbell that rings for every release (PostgreSQL's NOTIFY) would ring
            # for this process's own, and end the courtesy at once.
            time.sleep(courtesy)

    def _acquire_remote(self, key: str, request: Request, deadline: float | None) -> Hold | None:
        """Try the backend until it grants ``key`` or ``deadline`` passes.

        No connection is held between tries: each takes one from the pool and returns it.
        """
        owner, ttl = request.owner, request.ttl
        lease = ttl if request.renew else None
        backend = self.backend
        doorbell = backend.doorbell(key) if request.courteous else None
        pause = FIRST_POLL
        missed = False  # whether another process held the key at some try
        try:
            if doorbell is not None:
                self._let_others_first(key, doorbell, deadline)
            while True:
                self.check_open(key)
                if doorbell is not None:
                    doorbell.arm()
                sent = time.monotonic()
                limit = None if deadline is None else deadline - sent
                token = backend.try_acquire(key, owner, ttl, lease, limit)
                if token is not None:
                    ring = None if doorbell is None else doorbell.keep()
                    return Hold(
                        key,
                        owner,
                        token,
                        ttl,
                        request.renew,
                        sent,
                        request.on_lost,
                        contended=missed,
                        ring=ring,
                    )
                missed = True
                self.cohorts.missed(key)
                self.check_open(key)
                if deadline is not None and time.monotonic() >= deadline:
                    return None  # (a try without waiting needs no doorbell)
                if doorbell is None:
                    doorbell = backend.doorbell(key)
                elif doorbell.wakes_in_turn:
                    pause = self.poll_interval
                if not doorbell.pause(pause, deadline):
                    return None
                pause = min(pause * 2, self.poll_interval)
        finally:
            if doorbell is not None:
                doorbell.close()

    # -- release ---------------------------------------------------------------------

    def release(self, key: str) -> None:
        hold = self.registry.exit(key)
        if hold is not None:  # (else an inner reentrant release)
            if self.counters.observers:
                self.counters.held(key)
            self._let_go(key, hold)
            logger.debug("released %r (token %d, owner %s)", key, hold.token, hold.owner_id)
        self.counters.add("releases")

    def _let_go(self, key: str, hold: Hold) -> None:
        """Pass the calling thread's last hold of ``key`` to the next local waiter, or
        release it in the database. The waiter is woken whatever happens here."""
        registry = self.registry
        if registry.turned_away(key) and self.cohorts.may_keep(hold) and self.keeper.keep(hold):
            return
        while True:
            # (with none, the entry stays until the row is gone: see Registry.released)
            successor = registry.successor(key, releasing=True)
            cohort = successor is not None and not hold.lost and self.cohorts.goes_on(hold)
            if cohort and successor is not None and passes_locally(hold, successor.request):
                pass_locally(hold, successor.request)
                self.counters.add("local_handoffs")
                if registry.pass_on(key, successor, hold):
                    return
                continue  # the successor left at the last moment: pass it on in turn
            handed: Hold | None = None
            try:
                if cohort and successor is not None:
                    handed = self._hand_off(key, hold, successor.request)
                    released = handed is not None
                else:
                    # (a hold out of lease is lost; its row, if still ours, goes too)
                    believed = hold.alive()
                    released = self._give_back(hold, successor) and believed
            except LockError:
                # Whether the row is still ours is unknown: make sure it goes.
                self.heartbeat.remove(hold)
                self.backend.discard(key, hold.owner_id, certain=True)
                raise
            finally:
                # Waking the successor comes first and cannot raise; ringing can.
                passed = self._pass_claim(key, successor, handed)
                if handed is None and hold.ring is not None:
                    hold.ring()  # the row left this process: wake pollers elsewhere
            if passed:
                break
            # The successor left just as the hold was handed to it: pass it on in turn.
            assert handed is not None
            hold = handed
        if not released:
            self._lost(hold, "its release")

    def _pass_claim(
        self, key: str, successor: Waiter[Hold, Request] | None, handed: Hold | None
    ) -> bool:
        """Wake ``successor`` with the claim and ``handed``, if made for it (``False``:
        it left, and ``handed`` comes back); with no successor, end the release in tier 1,
        which wakes a thread that came meanwhile."""
        if successor is None:
            self.registry.released(key)
            return True
        return self.registry.pass_on(key, successor, handed)

    def _give_back(self, hold: Hold, successor: Waiter[Hold, Request] | None) -> bool:
        """Release ``hold`` in the database; ``False`` if its row was gone. The next
        local waiter, if any, lets other processes try first if they may want the key."""
        if self.cohorts.courteous(hold, successor is not None):
            assert successor is not None
            successor.request.courteous = True
        self.heartbeat.remove(hold)
        given_back = self.backend.release(hold.key, hold.owner_id, hold.live_until)
        released(hold.key)
        return given_back

    def _hand_off(self, key: str, hold: Hold, request: Request) -> Hold | None:
        """Pass ``hold`` to a waiting thread with one UPDATE, which sets the lease the
        successor asks for; ``None`` if the row was no longer ours. If the database
        cannot confirm, the hold passes all the same (the row is ours either way), with
        the lease it surely has."""
        lease = request.ttl if request.renew else None
        heartbeat = self.heartbeat
        if lease is None:
            heartbeat.remove(hold)
        sent = time.monotonic()
        try:
            passed = self.backend.handoff(
                key, hold.owner_id, hold.handoffs + 1, request.owner, request.ttl, lease
            )
        except LockError as exc:
            logger.warning("lock %r passed without its new lease recorded: %s", key, exc)
            heartbeat.remove(hold)
            pass_locally(hold, request)
            hold.lease = None  # whatever the row says, nothing renews it now
            heartbeat.add(hold)  # (its belief ends with the lease it surely has)
            return hold
        if not passed:
            return None
        pass_locally(hold, request)
        hold.recorded = True
        hold.lease = lease
        if not heartbeat.confirm(hold, sent, request.ttl):
            return None  # (its belief ended meanwhile: the lease clock reports it)
        heartbeat.add(hold)
        self.counters.add("handoffs")
        return hold

    # -- extend ----------------------------------------------------------------------

    def extend(self, key: str, ttl: float) -> None:
        hold = self.registry.hold(key)
        if hold is None:
            raise NotHeldError(key)
        self.heartbeat.ensure_alive(hold, key, "it could be extended")
        # A renewed hold keeps being renewed, by the new length from now on.
        lease = None if hold.lease is None else ttl
        sent = time.monotonic()
        if not self.backend.extend(key, hold.owner_id, ttl, lease):
            self._lost(hold, "it could be extended")
        if not self.heartbeat.extended(hold, sent, ttl):
            raise LockLostError(key, hold.token)  # (its belief ended meanwhile)
        logger.debug("extended %r by %g s (token %d)", key, ttl, hold.token)

    def _lost(self, hold: Hold, before: str) -> NoReturn:
        """Report ``hold``, found gone at a release or extend, and raise."""
        self.heartbeat.lost(hold, f"its row was gone before {before}", sweep=False)
        raise LockLostError(hold.key, hold.token)
