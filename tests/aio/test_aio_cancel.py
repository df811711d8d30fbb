"""Cancelling tasks at every await point of acquire and release, on every database:
a cancelled acquire leaves nothing held and nobody stuck behind it, and a cancelled
release still releases.

Each await point is reached deterministically: a ``Gate`` stops the backend call
where the test cancels, and lets it go on after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest
from aiohelpers import LONG, Gate, Holder, Opener, rows, run, settled
from conftest import SHARED_HOLDS, MakeManager

from tierlock.aio import AsyncLockManager


@pytest.fixture
def opener(db_url: str, table: str) -> Opener:
    return Opener(db_url, table)


async def cancelled(task: asyncio.Task[object]) -> None:
    """Cancel ``task`` and see it end cancelled."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def free_for_the_next(locks: AsyncLockManager, key: str) -> None:
    """Nothing is left: no row, and another task gets the key at its first try."""
    await settled(locks)
    assert await rows(locks) == []
    lock = locks.lock(key)

    async def take() -> bool:
        got = await lock.acquire(blocking=False)
        if got:
            await lock.release()
        return got

    assert await asyncio.create_task(take())


# -- acquire ---------------------------------------------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["before-the-insert", "after-the-insert"])
def test_cancelled_while_its_try_is_in_flight(opener: Opener, key: str, after: bool) -> None:
    async def main() -> None:
        async with opener() as locks:
            gate = Gate(locks._backend, "try_acquire", after=after)
            waiter = asyncio.create_task(locks.lock(key).acquire())
            await gate.reached()
            await cancelled(waiter)
            gate.open()
            await free_for_the_next(locks, key)

    run(main)


def test_the_row_won_for_a_cancelled_head_goes_to_the_next(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            gate = Gate(locks._backend, "try_acquire", after=True)
            first = asyncio.create_task(locks.lock(key).acquire())
            await gate.reached()
            second = Holder(locks.lock(key), name="second")
            await asyncio.sleep(0)  # (it queues behind the first)
            await cancelled(first)
            gate.open()
            assert await second.holds()
            assert gate.calls == 1  # no second insert: the first one's row passed
            await second.release()
            await free_for_the_next(locks, key)

    run(main)


@pytest.mark.parametrize("where", ["in-the-queue", "in-a-pause"])
def test_cancelled_while_waiting(
    opener: Opener, make_manager: MakeManager, key: str, where: str
) -> None:
    """Waiting behind a task of its own manager (in the queue), or behind another
    process's hold (while its poller pauses between tries)."""
    other = make_manager()

    async def main() -> None:
        async with opener() as locks:
            holder = None
            if where == "in-the-queue":
                holder = Holder(locks.lock(key))
                assert await holder.holds()
            else:
                assert await asyncio.to_thread(other.lock(key).acquire, False)
            gate = Gate(locks._backend, "try_acquire", after=True)
            doomed = asyncio.create_task(locks.lock(key).acquire())
            patient = Holder(locks.lock(key))
            if where == "in-a-pause":
                await gate.reached()  # its first try failed: the poller pauses next
            gate.open()
            await asyncio.sleep(0)
            await cancelled(doomed)
            if holder is not None:
                await holder.release()
            else:
                other.force_release(key)
            assert await patient.holds()
            await patient.release()
            await free_for_the_next(locks, key)

    run(main)


@pytest.mark.parametrize("waiting", [1, 0], ids=["another-waits", "none-waits"])
def test_cancelled_as_the_hold_reaches_it(opener: Opener, key: str, waiting: int) -> None:
    """The releasing task hands the hold over and cancels the receiver before it runs:
    the receiver passes it on (or back) and ends cancelled, holding nothing."""

    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            await lock.acquire()
            first_token = lock.token
            assert first_token is not None
            receiver = asyncio.create_task(locks.lock(key).acquire())
            await asyncio.sleep(0)
            others = [Holder(locks.lock(key)) for _ in range(waiting)]
            await asyncio.sleep(0)
            await lock.release()  # (a hand-off with no statement: no await in between)
            receiver.cancel()
            with pytest.raises(asyncio.CancelledError):
                await receiver
            for other in others:
                assert await other.holds()
                assert other.token is not None and other.token > first_token
                await other.release()
            await free_for_the_next(locks, key)

    run(main)


# How many turns of the loop the sweep below waits for before it cancels, at most.
TURNS = 500


def cancel_points() -> Iterator[tuple[int, float]]:
    """When the sweep cancels: after 0, 1, ... turns of the loop; then, since the
    backend's calls run in threads, whose replies come after time rather than turns (a
    server starved of CPU takes longer than ``TURNS`` turns), after pauses that double
    from 1 ms up to ``LONG``."""
    yield from ((turns, 0.0) for turns in range(TURNS))
    pause = 0.001
    while pause <= LONG:
        yield TURNS, pause
        pause *= 2


def test_cancelled_at_each_step_of_an_acquire_and_release(opener: Opener, key: str) -> None:
    """A sweep: cancel a task that acquires and releases at each of ``cancel_points``,
    until it is done before the cancel comes; each time nothing is left."""

    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)

            async def take_and_give_back() -> None:
                await lock.acquire()
                await lock.release()

            for turns, pause in cancel_points():
                task = asyncio.create_task(take_and_give_back())
                for _ in range(turns):
                    await asyncio.sleep(0)
                if pause:
                    await asyncio.sleep(pause)
                finished = task.done()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await free_for_the_next(locks, key)
                if finished:
                    return
            raise AssertionError(f"an acquire and release of a free key took over {LONG:g} s")

    run(main)


# -- inside and release -------------------------------------------------------------------


def test_cancelled_inside_its_critical_section(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            inside = asyncio.Event()

            async def section() -> None:
                async with locks.lock(key):
                    inside.set()
                    await asyncio.Event().wait()

            task = asyncio.create_task(section())
            next_one = Holder(locks.lock(key))
            await inside.wait()
            await cancelled(task)
            assert await next_one.holds()
            await next_one.release()
            await free_for_the_next(locks, key)

    run(main)


@pytest.mark.parametrize("waiting", [True, False], ids=["another-waits", "none-waits"])
def test_cancelled_while_its_release_is_in_flight(
    opener: Opener, make_manager: MakeManager, key: str, waiting: bool
) -> None:
    """The release's statement runs on; a waiter of the manager gets the key after it."""

    async def main() -> None:
        # A fixed lease cannot pass without a statement: the release goes to the database.
        async with opener(renew=False) as locks:
            lock = locks.lock(key)
            acquired, go = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                await lock.acquire()
                acquired.set()
                await go.wait()
                await lock.release()

            releasing = asyncio.create_task(hold())
            await acquired.wait()
            waiter = Holder(locks.lock(key)) if waiting else None
            gate = Gate(locks._backend, "release")
            go.set()
            await gate.reached()
            await cancelled(releasing)
            gate.open()
            if waiter is not None:
                assert await waiter.holds()
                await waiter.release()
            await free_for_the_next(locks, key)

    run(main)


@pytest.mark.parametrize("kind", ["lock", pytest.param("semaphore", marks=SHARED_HOLDS)])
def test_cancelled_just_after_its_wait_timed_out(
    opener: Opener, key: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait's time runs out, and a cancel comes before the task runs again: the
    task holds nothing, and the holder keeps its hold."""

    async def main() -> None:
        async with opener() as locks:
            handle = locks.lock(key) if kind == "lock" else locks.semaphore(key, 1)
            holder = Holder(handle)
            assert await holder.holds()
            loop = asyncio.get_running_loop()
            waiter = asyncio.create_task(handle.acquire(timeout=0.05))
            await asyncio.sleep(0)  # (it waits, its timer set)
            loop.call_later(0.06, waiter.cancel)
            time.sleep(0.2)  # both timers are due at the loop's next turn, in that order
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await settled(locks)
            assert await rows(locks) != []
            assert not handle.owned()
            await holder.release()  # still the holder's to release
            await settled(locks)
            assert await rows(locks) == []

    run(main)
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
