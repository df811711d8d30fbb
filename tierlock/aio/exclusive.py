"""Tier 1 of exclusive holds in the event loop: tasks of one manager that want a key
queue here, first come first served, and one poller per key asks the backend.

Everything here runs in the loop's thread, so no state needs a mutex; a change happens
between two awaits or not at all. A waiting task awaits a future of its own, and a
release passes the hold to the task at the head of the queue:

* with **no statement** when both renew their leases, within the cohort's bound (see
  ``cohorts``): the row stays with the process, the token goes up by one in memory,
  and the heartbeat writes the new holder into the row;
* otherwise back to the database, after which the poller asks for the head.

The poller is a task of the manager's, not of a waiter, so cancelling a waiter never
cuts a statement short: a row won for a waiter that has left goes to the next one, or
back. A waiter cancelled after its future got the hold hands the hold on at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import Callable

from ..backends import Doorbell
from ..errors import LockError, LockLostError, NotHeldError
from ..records import Hold
from ..tier1.cohorts import COURTESY_PAUSE, WANTED_FOR, released
from ..tier1.passing import OnLost, pass_locally, passes_locally
from ..tier1.tiers import FIRST_POLL
from .core import Core
from .waiters import Waiter, current_task, extend_hold, releasing_for, within

__all__ = ["Exclusive"]


class _Key:
    """One key claimed in the manager: its holder task, depth, hold and queue."""

    __slots__ = ("depth", "hold", "holder", "poller", "releasing", "waiters")

    def __init__(self) -> None:
        self.holder: asyncio.Task[object] | None = None
        self.depth = 0
        self.hold: Hold | None = None
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.poller: asyncio.Task[None] | None = None
        self.releasing = False  # the hold is on its way back to the database

    def head(self) -> Waiter | None:
        """The first waiter still waiting."""
        waiters = self.waiters
        while waiters and waiters[0].future.done():
            waiters.popleft()
        return waiters[0] if waiters else None

    def leave(self, waiter: Waiter) -> None:
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def settle(self, waiter: Waiter, hold: Hold) -> None:
        """Give ``hold`` to ``waiter``, the head."""
        self.waiters.popleft()
        self.holder, self.hold, self.depth = waiter.task, hold, 1
        waiter.answer(True)


class Exclusive:
    """Exclusive holds of one async manager's tasks."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._keys: dict[str, _Key] = {}

    # -- what a task holds -----------------------------------------------------------

    def _held(self, key: str) -> _Key | None:
        self._core.check_process(key)
        entry = self._keys.get(key)
        if entry is None or entry.holder is not (releasing_for.get() or asyncio.current_task()):
            return None
        return entry

    def hold(self, key: str) -> Hold | None:
        """The calling task's hold of ``key``, if it has one."""
        entry = self._held(key)
        return None if entry is None else entry.hold

    def depth(self, key: str) -> int:
        entry = self._held(key)
        return 0 if entry is None else entry.depth

    def is_held(self, key: str) -> bool:
        """Whether some task of this manager holds ``key``."""
        entry = self._keys.get(key)
        return entry is not None and entry.holder is not None

    def owned(self, key: str) -> bool:
        hold = self.hold(key)
        return hold is not None and hold.alive()

    # -- acquire ---------------------------------------------------------------------

    async def acquire(
        self, key: str, ttl: float, renew: bool, on_lost: OnLost | None, wait: float | None
    ) -> bool:
        core = self._core
        core.check_open(key)
        task = current_task()
        entry = self._keys.get(key)
        if entry is not None and entry.holder is task:
            entry.depth += 1
            core.counters.acquired(key, 0.0, reentrant=True)
            return True
        if wait == 0 and (
            (entry is not None and (not entry.releasing or entry.head() is not None))
            or core.cohorts.hot(key)
        ):
            # Another task holds or asks for it, or other processes fight for it. (A
            # hold on its way back to the database is waited out: one statement.)
            return False
        if entry is None:
            entry = self._keys[key] = _Key()
        else:
            core.counters.add("local_waits")
        waiter = Waiter(task, ttl, renew, on_lost, wait)
        entry.waiters.append(waiter)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(wait, self._expire, entry, waiter) if wait else None
        self._kick(key, entry)
        try:
            held: bool = await waiter.future
        except asyncio.CancelledError:
            if entry.holder is task:  # the hold reached it as it was cancelled: pass it on
                with contextlib.suppress(LockError):  # (closed: the row expires)
                    self.abandon(key)
            else:
                entry.leave(waiter)
                self._kick(key, entry)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if held:
            core.counters.acquired(key, 0.0)
        return held

    def _expire(self, entry: _Key, waiter: Waiter) -> None:
        waiter.answer(False)
        entry.leave(waiter)

    def _kick(self, key: str, entry: _Key) -> None:
        """Start the key's poller if its head must ask the backend, or forget the key
        if nobody holds or wants it."""
        if entry.holder is not None or entry.releasing or entry.poller is not None:
            return
        if entry.head() is None:
            if self._keys.get(key) is entry:
                del self._keys[key]
            return
        entry.poller = self._core.spawn(self._poll(key, entry))

    async def _poll(self, key: str, entry: _Key) -> None:
        """Ask the backend for the head of ``key``'s queue until one gets it."""
        core = self._core
        doorbell: Doorbell | None = None
        pause = FIRST_POLL
        missed = False  # whether another process held the key at some try
        try:
            while not core.closed:
                waiter = entry.head()
                if waiter is None:
                    return
                if waiter.courteous:  # a cohort ended: let other processes try first
                    waiter.courteous = False
                    await asyncio.sleep(within(COURTESY_PAUSE, waiter.deadline))
                    continue
                missed_before = core.cohorts.last_missed(key)
                hold = await self._try(key, waiter, doorbell, missed)
                if hold is not None:
                    core.cohorts.won(key)
                    self._won(key, entry, hold)
                    return
                if waiter.future.done():  # (the try failed, and told it why)
                    entry.leave(waiter)
                    continue
                missed = True
                core.cohorts.missed(key)
                if waiter.deadline is not None and time.monotonic() >= waiter.deadline:
                    if not waiter.patient and core.cohorts.missed_without_waiting(
                        key, missed_before
                    ):
                        await core.call(core.backend.want, key, WANTED_FOR)
                    self._expire(entry, waiter)
                    continue
                if doorbell is None:
                    doorbell = await core.call(core.backend.doorbell, key)
                elif doorbell.wakes_in_turn:
                    pause = core.poll_interval
                await core.pause(doorbell, pause, waiter.deadline)
                pause = min(pause * 2, core.poll_interval)
        finally:
            await self._stopped(key, entry, doorbell)

    async def _stopped(self, key: str, entry: _Key, doorbell: Doorbell | None) -> None:
        """The poller of ``key`` ends: another starts when a waiter needs one."""
        entry.poller = None
        if doorbell is not None:
            await self._core.call(doorbell.close)
        if self._core.closed:
            self._fail_waiters(key, entry)
        else:
            self._kick(key, entry)

    async def _try(
        self, key: str, waiter: Waiter, doorbell: Doorbell | None, missed: bool
    ) -> Hold | None:
        """One try of the backend for ``waiter``; a failure is given to the waiter."""
        backend = self._core.backend
        owner, ttl, renew = waiter.owner, waiter.ttl, waiter.renew
        sent = time.monotonic()
        limit = None if waiter.deadline is None else max(0.0, waiter.deadline - sent)

        def attempt() -> tuple[int, Callable[[], None] | None] | None:
            if doorbell is not None:
                doorbell.arm()
            token = backend.try_acquire(key, owner, ttl, ttl if renew else None, limit)
            if token is None:
                return None
            return token, None if doorbell is None else doorbell.keep()

        def sweep() -> None:
            backend.discard(key, owner.owner_id, certain=True)

        try:
            won = await self._core.call(attempt, undo=sweep)
        except LockError as exc:
            unsure = functools.partial(backend.discard, certain=False)
            await self._core.call(unsure, key, owner.owner_id)
            waiter.fail(exc)
            return None
        if won is None:
            return None
        token, ring = won
        on_lost = waiter.on_lost
        return Hold(key, owner, token, ttl, renew, sent, on_lost, contended=missed, ring=ring)

    def _won(self, key: str, entry: _Key, hold: Hold) -> None:
        """The poller won ``key``'s row: give it to the head of the queue, which may
        have changed during the try, or back."""
        core = self._core
        core.heartbeat.add(hold)
        waiter = entry.head()
        if waiter is not None and not core.closed:
            if waiter.owner is hold.holder:
                entry.settle(waiter, hold)
                return
            if passes_locally(hold, waiter) and hold.handoffs < core.backend.MAX_HANDOFFS:
                pass_locally(hold, waiter)
                entry.settle(waiter, hold)
                return
        entry.releasing = True
        core.spawn(self._give_back(key, entry, hold))

    # -- release ---------------------------------------------------------------------

    async def release(self, key: str) -> None:
        entry = self._held(key)
        if entry is None:
            raise NotHeldError(key)
        self._core.counters.add("releases")
        entry.depth -= 1
        if entry.depth:
            return
        job = self.abandon(key)
        if job is not None:
            await asyncio.shield(job)

    def abandon(self, key: str) -> asyncio.Task[None] | None:
        """Let go of the calling task's hold of ``key`` (its last level): to the head
        of the queue at once if it may pass with no statement, else in a task of the
        manager's, which is returned."""
        self._core.check_process(key)
        entry = self._keys[key]
        hold = entry.hold
        assert hold is not None
        entry.holder, entry.hold, entry.depth = None, None, 0
        core = self._core
        if core.closed:
            raise LockError("this AsyncLockManager is closed", key)
        waiter = entry.head()
        if (
            waiter is not None
            and not hold.lost
            and passes_locally(hold, waiter)
            and core.cohorts.within(hold)
        ):
            pass_locally(hold, waiter)
            core.counters.add("local_handoffs")
            entry.settle(waiter, hold)
            return None
        entry.releasing = True
        return core.spawn(self._hand_on(key, entry, hold))

    async def _hand_on(self, key: str, entry: _Key, hold: Hold) -> None:
        """Pass ``hold`` on where the cohort rules must ask the backend, or give it back."""
        core = self._core
        waiter = entry.head()
        if waiter is not None and not hold.lost and passes_locally(hold, waiter):
            goes_on = await core.call(core.cohorts.goes_on, hold)
            waiter = entry.head()
            if goes_on and waiter is not None and passes_locally(hold, waiter):
                pass_locally(hold, waiter)
                core.counters.add("local_handoffs")
                entry.releasing = False
                entry.settle(waiter, hold)
                return
        if waiter is None:
            core.cohorts.courteous(hold, False)  # (it forgets the key: nothing to ask)
        elif await core.call(core.cohorts.courteous, hold, True):
            waiter = entry.head()
            if waiter is not None:
                waiter.courteous = True
        await self._give_back(key, entry, hold)

    async def _give_back(self, key: str, entry: _Key, hold: Hold) -> None:
        """Release ``hold`` in the database, then let the poller ask for the next waiter.

        :raises LockLostError: the row was no longer ours.
        """
        core = self._core
        backend = core.backend
        core.heartbeat.remove(hold)
        believed = hold.alive()  # (a hold out of lease is lost; its row, if ours, goes too)
        try:
            given = (
                await core.call(backend.release, key, hold.owner_id, hold.live_until) and believed
            )
        except LockError:
            await core.call(functools.partial(backend.discard, certain=True), key, hold.owner_id)
            raise
        finally:
            released(key)
            if hold.ring is not None:
                await core.call(hold.ring)
            entry.releasing = False
            self._kick(key, entry)
        if not given:
            core.heartbeat.lost(hold, "its row was gone before its release", sweep=False)
            raise LockLostError(key, hold.token)

    def take_out(self, key: str) -> Hold:
        """Take the calling task's hold of ``key`` (its last level) out of tier 1, to
        turn it into a read hold; ``put_back`` lets the queue go on once that is done."""
        entry = self._keys[key]
        hold = entry.hold
        assert hold is not None
        entry.holder, entry.hold, entry.depth = None, None, 0
        entry.releasing = True
        return hold

    def put_back(self, key: str) -> None:
        entry = self._keys[key]
        entry.releasing = False
        self._kick(key, entry)

    # -- extend and close ------------------------------------------------------------

    async def extend(self, key: str, ttl: float) -> None:
        hold = self.hold(key)
        if hold is None:
            raise NotHeldError(key)
        await extend_hold(self._core, hold, key, ttl)

    def _fail_waiters(self, key: str, entry: _Key) -> None:
        for waiter in entry.waiters:
            waiter.fail(LockError("this AsyncLockManager was closed while waiting", key))
        entry.waiters.clear()

    def close(self) -> None:
        """Send every waiting task away with ``LockError``; holders keep their holds."""
        for key, entry in list(self._keys.items()):
            self._fail_waiters(key, entry)
