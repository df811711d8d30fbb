"""Tier 1 of read holds and semaphore permits in the event loop.

Each task's read hold or permit is a hold of its own in the backend (a reader row, a
slot), with a lease, renewal and ``on_lost``. Tasks that wait for a key queue first
come, first served; one poller per key asks the backend for the head, gives what it
gets to that task (or back, if the task has left), and goes on with the next. A permit
released while tasks wait for one passes to the first of them (the one the poller is
not asking for, if another waits) with no statement, within a cohort's bound, as a
thread's does (see ``tier1.permits``); when the cohort ends, the permit goes back to
the database and the poller lets other processes try first. A task
that holds the write hold of a key reads under it with no statement; if it releases
the write hold first, the row becomes its read hold with no moment in which the key
is free. A task that holds only a read hold and asks for the write hold gets
``LockError`` at once: that upgrade would wait for itself.
"""

from __future__ import annotations

import asyncio
import collections
import time

from ..backends import Doorbell, SharedHolds
from ..errors import LockError, LockLostError, NotHeldError
from ..keys import reader_key
from ..records import Hold, Owner
from ..tier1.cohorts import COURTESY_PAUSE
from ..tier1.passing import pass_locally, passes_locally
from ..tier1.pollers import reporting, shared_holds
from ..tier1.tiers import FIRST_POLL, OnLost
from .core import Core
from .exclusive import Exclusive
from .sharetries import Got, one_try, sweeper
from .waiters import Waiter, current_task, extend_hold

__all__ = ["Shares"]


class _Line:
    """Tasks waiting for one key, and the key's poller."""

    __slots__ = ("asking", "courteous_until", "permits", "poller", "waiters")

    def __init__(self, permits: int) -> None:
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.poller: asyncio.Task[None] | None = None
        self.permits = permits  # what the process's semaphores of the key agree on (0: reads)
        self.asking: Waiter | None = None  # whom the poller asks the backend for now
        self.courteous_until = 0.0  # the poller lets other processes try first until then


class _Held:
    """A task's holds of one key: read holds (one, or none while covered by its write
    hold) or permits, each with its group (reads) or 0, and the read depth."""

    __slots__ = ("covered", "depth", "holds", "options")

    def __init__(self, options: tuple[float, bool, OnLost | None]) -> None:
        self.holds: list[Got] = []
        self.depth = 0  # read levels (permits count in holds)
        self.covered = False  # a read under the task's own write hold
        self.options = options


class Shares:
    """Read holds and permits of one async manager's tasks."""

    def __init__(self, core: Core, exclusive: Exclusive) -> None:
        self._core = core
        self._exclusive = exclusive
        self._lines: dict[tuple[str, bool], _Line] = {}  # by key, and whether a semaphore's
        # by key, task and whether permits (else read holds)
        self._held: dict[tuple[str, asyncio.Task[object], bool], _Held] = {}

    def _mine(self, key: str, permits: bool = False) -> _Held | None:
        self._core.check_process(key)
        return self._held.get((key, current_task(), permits))

    def _shared(self, key: str) -> SharedHolds:
        return shared_holds(self._core.backend, key)

    # -- reads -----------------------------------------------------------------------

    def refuse_upgrade(self, key: str) -> None:
        """Refuse the write hold to a task that holds only a read hold of ``key``."""
        held = self._mine(key)
        if held is not None and held.depth and not held.covered:
            raise LockError(
                "this task holds a read lock and asks for the write lock: that would "
                "wait for itself; release the read lock first",
                key,
            )

    def reading(self, key: str) -> bool:
        held = self._mine(key)
        return held is not None and held.depth > 0

    async def read(
        self, key: str, ttl: float, renew: bool, on_lost: OnLost | None, wait: float | None
    ) -> bool:
        core = self._core
        core.check_open(key)
        self._shared(key)
        task = current_task()
        held = self._mine(key)
        if held is not None and held.depth:
            held.depth += 1
            core.counters.acquired(key, 0.0, reentrant=True)
            return True
        if self._exclusive.depth(key):  # under its own write hold
            held = self._held[(key, task, False)] = _Held((ttl, renew, on_lost))
            held.depth, held.covered = 1, True
            core.counters.acquired(key, 0.0)
            return True
        got = await self._wait(key, 0, Waiter(task, ttl, renew, on_lost, wait))
        if got is None:
            return False
        held = self._held[(key, task, False)] = _Held((ttl, renew, on_lost))
        held.holds.append(got)
        held.depth = 1
        core.counters.acquired(key, 0.0)
        return True

    async def unread(self, key: str) -> None:
        held = self._mine(key)
        if held is None or not held.depth:
            raise NotHeldError(key)
        self._core.counters.add("releases")
        held.depth -= 1
        if held.depth:
            return
        del self._held[(key, current_task(), False)]
        if held.holds:
            await self._let_go(key, held.holds.pop())

    def covered(self, key: str) -> bool:
        """Whether the calling task reads ``key`` under its own write hold."""
        held = self._mine(key)
        return held is not None and held.covered

    async def downgrade(self, key: str) -> None:
        """The calling task releases the last level of its write hold of ``key`` while
        it reads under it: make the row its read hold."""
        core = self._core
        held = self._mine(key)
        assert held is not None and held.covered
        ttl, renew, on_lost = held.options
        hold = self._exclusive.take_out(key)
        core.heartbeat.remove(hold)
        reader = Owner.current(current_task().get_name())
        row = reader_key(key, reader.owner_id)
        sent = time.monotonic()
        shared = self._shared(key)
        try:
            share = None
            if not hold.lost:
                share = await core.call(
                    shared.downgrade,
                    key,
                    hold.owner_id,
                    reader,
                    ttl,
                    ttl if renew else None,
                    undo=lambda: core.backend.discard(row, reader.owner_id, certain=True),
                )
        except asyncio.CancelledError:  # (its read hold is swept: the task has none)
            del self._held[(key, current_task(), False)]
            raise
        finally:
            self._exclusive.put_back(key)
            if hold.ring is not None:
                await core.call(hold.ring)
        if share is None:
            del self._held[(key, current_task(), False)]
            core.heartbeat.lost(hold, "its row was gone before it became a read hold")
            raise LockLostError(key, hold.token)
        mine = Hold(row, reader, share.token, ttl, renew, sent, reporting(key, on_lost))
        core.heartbeat.add(mine)
        held.holds.append((mine, share.group))
        held.covered = False

    # -- permits ---------------------------------------------------------------------

    async def take_permit(
        self,
        key: str,
        permits: int,
        ttl: float,
        renew: bool,
        on_lost: OnLost | None,
        wait: float | None,
    ) -> bool:
        core = self._core
        core.check_open(key)
        self._shared(key)
        task = current_task()
        got = await self._wait(key, permits, Waiter(task, ttl, renew, on_lost, wait))
        if got is None:
            return False
        held = self._held.setdefault((key, task, True), _Held((ttl, renew, on_lost)))
        held.holds.append(got)
        core.counters.acquired(key, 0.0)
        return True

    async def give_permit(self, key: str) -> None:
        self._core.check_process(key)
        task = current_task()
        held = self._held.get((key, task, True))
        if held is None or not held.holds:
            raise NotHeldError(key)
        self._core.counters.add("releases")
        got = held.holds.pop()
        if not held.holds:
            del self._held[(key, task, True)]
        if not self._pass_permit(key, got[0]):
            await self._let_go(key, got)

    def _pass_permit(self, key: str, hold: Hold) -> bool:
        """Pass ``hold``, a permit of ``key``, to a task waiting for one, with no
        statement, if the cohort's bound allows; when it does not, the key's poller
        lets other processes try first."""
        line = self._lines.get((key, True))
        if line is None or hold.lost:
            return False
        waiting = [waiter for waiter in line.waiters if not waiter.future.done()]
        if not waiting:
            return False
        if not self._core.cohorts.within(hold):
            line.courteous_until = time.monotonic() + COURTESY_PAUSE
            return False
        waiter = next((each for each in waiting if each is not line.asking), waiting[0])
        if not passes_locally(hold, waiter):
            return False
        pass_locally(hold, waiter)
        hold.on_lost = reporting(key, waiter.on_lost)
        self._core.counters.add("local_handoffs")
        waiter.answer((hold, 0))
        return True

    # -- what both share -------------------------------------------------------------

    def latest(self, key: str, permits: bool = False) -> Hold | None:
        """The calling task's latest read hold (or permit) of ``key``."""
        held = self._mine(key, permits)
        return held.holds[-1][0] if held is not None and held.holds else None

    async def extend(self, key: str, ttl: float, permits: bool = False) -> None:
        held = self._mine(key, permits)
        if held is None or not (held.holds or held.covered):
            raise NotHeldError(key)
        if held.covered:
            await self._exclusive.extend(key, ttl)
        for hold, _ in held.holds:
            await extend_hold(self._core, hold, key, ttl)

    async def _wait(self, key: str, permits: int, waiter: Waiter) -> Got | None:
        """Queue ``waiter`` for ``key`` until the poller gets it a hold (``None``: its
        time ran out)."""
        line = self._lines.get((key, bool(permits)))
        if line is None:
            line = self._lines[(key, bool(permits))] = _Line(permits)
        elif line.permits != permits:
            raise ValueError(
                f"semaphore {key!r} asked for with permits={permits}, but this process "
                f"uses it with permits={line.permits}"
            )
        line.waiters.append(waiter)
        loop = asyncio.get_running_loop()
        timer = None
        if waiter.deadline is not None and waiter.patient:
            timer = loop.call_later(waiter.deadline - time.monotonic(), waiter.answer, None)
        if line.poller is None:
            line.poller = self._core.spawn(self._poll(key, line))
        try:
            got: Got | None = await waiter.future
        except asyncio.CancelledError:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                got = future.result()
                if got is not None:  # it reached the task as it was cancelled: give it back
                    self._core.spawn(self._let_go(key, got))
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return got

    async def _poll(self, key: str, line: _Line) -> None:
        """Ask the backend for the head of ``key``'s line until the line is empty."""
        core = self._core
        doorbell: Doorbell | None = None
        pause = FIRST_POLL
        try:
            while not core.closed:
                while line.waiters and line.waiters[0].future.done():
                    line.waiters.popleft()
                if not line.waiters:
                    return
                waiter = line.waiters[0]
                got = await self._ask_for(key, line, waiter, doorbell)
                if got is not None:
                    if waiter.future.done() or core.closed:
                        core.spawn(self._let_go(key, got))
                    else:
                        waiter.answer(got)
                    pause = FIRST_POLL
                elif waiter.future.done():
                    continue  # (the try failed, and told it why)
                elif waiter.deadline is not None and time.monotonic() >= waiter.deadline:
                    waiter.answer(None)
                else:
                    if doorbell is None:
                        doorbell = await core.call(core.backend.doorbell, key)
                    await core.pause(doorbell, pause, waiter.deadline)
                    pause = min(pause * 2, core.poll_interval)
        finally:
            await self._stopped(key, line, doorbell)

    async def _ask_for(
        self, key: str, line: _Line, waiter: Waiter, doorbell: Doorbell | None
    ) -> Got | None:
        """``_try`` for the head of ``line``, once other processes had their turn after
        a cohort of passes ended."""
        courtesy = line.courteous_until - time.monotonic()
        if waiter.deadline is not None:
            courtesy = min(courtesy, waiter.deadline - time.monotonic())
        if courtesy > 0:
            await asyncio.sleep(courtesy)
            if waiter.future.done():  # (passed a permit meanwhile)
                return None
        line.asking = waiter
        try:
            return await self._try(key, line.permits, waiter, doorbell)
        finally:
            line.asking = None

    async def _stopped(self, key: str, line: _Line, doorbell: Doorbell | None) -> None:
        """The poller of ``key`` ends, with its line."""
        line.poller = None
        if self._lines.get((key, bool(line.permits))) is line:
            del self._lines[(key, bool(line.permits))]
        if self._core.closed:
            for waiter in line.waiters:
                waiter.fail(LockError("this AsyncLockManager was closed while waiting", key))
        if doorbell is not None:
            await self._core.call(doorbell.close)

    async def _try(
        self, key: str, permits: int, waiter: Waiter, doorbell: Doorbell | None
    ) -> Got | None:
        """One try of the backend for ``waiter``; a failure is given to the waiter."""
        core = self._core
        sent = time.monotonic()
        limit = None if waiter.deadline is None else max(0.0, waiter.deadline - sent)
        attempt = one_try(self._shared(key), key, permits, waiter, doorbell, limit)
        sweep = sweeper(core.backend, key, permits, waiter.owner)
        try:
            got = await core.call(attempt, undo=sweep)
        except (LockError, ValueError) as exc:
            await core.call(sweep)
            waiter.fail(exc)
            return None
        if got is not None:
            core.heartbeat.add(got[0])
        return got

    async def _let_go(self, key: str, got: Got) -> None:
        """Release a read hold or permit in the database.

        :raises LockLostError: it was no longer ours.
        """
        hold, group = got
        core = self._core
        core.heartbeat.remove(hold)
        believed = hold.alive()  # (a hold out of lease is lost; its row, if ours, goes too)
        if group:
            done = await core.call(
                self._shared(key).unshare, key, hold.owner_id, group, hold.live_until
            )
        else:
            done = await core.call(core.backend.release, hold.key, hold.owner_id, hold.live_until)
        if not done or not believed:
            core.heartbeat.lost(hold, "its row was gone before its release", sweep=False)
            raise LockLostError(key, hold.token)

    def close(self) -> None:
        """Send every waiting task away with ``LockError``; holders keep their holds."""
        for (key, _), line in self._lines.items():
            for waiter in line.waiters:
                waiter.fail(LockError("this AsyncLockManager was closed while waiting", key))
