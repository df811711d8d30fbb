"""The async twins of read locks and semaphores, on every database: owned by tasks,
excluding and excluded as the sync ones, and safe to cancel."""

from __future__ import annotations

import asyncio
import time

import procs
import pytest
from aiohelpers import Gate, Holder, Opener, rows, run, run_with_one_worker, settled, swept
from conftest import SHARED_HOLDS, MakeManager
from counting import HEARTBEAT, DriverStatements

import tierlock
from tierlock.aio import AsyncReadLock, AsyncSemaphore

pytestmark = SHARED_HOLDS


@pytest.fixture
def opener(db_url: str, table: str) -> Opener:
    return Opener(db_url, table)


# -- read locks ------------------------------------------------------------------------


def test_readers_share_and_writers_wait(
    opener: Opener, make_manager: MakeManager, key: str
) -> None:
    sync = make_manager()

    async def main() -> None:
        async with opener() as locks, opener() as others:
            readers = [Holder(locks.read_lock(key)) for _ in range(2)]
            readers.append(Holder(others.read_lock(key)))
            for reader in readers:
                assert await reader.holds()  # all at once
            assert isinstance(readers[0].lock, AsyncReadLock)
            assert len({reader.token for reader in readers}) == 3
            assert not await asyncio.to_thread(sync.lock(key).acquire, False)
            writer = Holder(locks.lock(key))
            # Until the writer's first try has marked the group: readers asking after.
            deadline = time.monotonic() + procs.WAIT_LIMIT
            while not await others.read_lock(key).locked():
                assert time.monotonic() < deadline, "the waiting writer's mark never showed"
                await asyncio.sleep(0.01)
            assert not writer.task.done()
            # A waiting writer keeps out readers that come after it.
            late = Holder(others.read_lock(key), timeout=0.3)
            assert not await late.holds()
            assert await locks.read_lock(key).locked()
            for reader in readers:
                await reader.release()
            assert await writer.holds()
            assert writer.token is not None
            assert writer.token > max(reader.token or 0 for reader in readers)
            await writer.release()
            await settled(locks)
            assert await rows(locks) == []

    run(main)


def test_read_holds_belong_to_their_task(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            reader = locks.read_lock(key)
            await reader.acquire()
            await reader.acquire()  # reentrant
            assert reader.owned()
            info = [info for info in await locks.holders() if info.mode == "shared"]
            assert len(info) == 1 and info[0].token == reader.token

            async def intruder() -> None:
                assert not reader.owned()
                with pytest.raises(tierlock.NotHeldError):
                    await reader.release()

            await asyncio.create_task(intruder())
            await reader.release()
            assert reader.owned()
            await reader.release()
            assert not reader.owned()
            await settled(locks)
            assert await rows(locks) == []

    run(main)


def test_upgrade_is_refused_at_once(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            async with locks.read_lock(key):
                with pytest.raises(tierlock.LockError, match="read lock"):
                    await locks.lock(key).acquire()
            await settled(locks)
            assert await rows(locks) == []

    run(main)


def test_reading_under_the_write_hold_and_downgrading(
    opener: Opener, make_manager: MakeManager, key: str
) -> None:
    sync = make_manager()

    async def main() -> None:
        async with opener() as locks:
            writer, reader = locks.lock(key), locks.read_lock(key)
            await writer.acquire()
            statements = locks.stats().statements
            await reader.acquire()  # covered: no statement
            assert locks.stats().statements == statements
            assert reader.token == writer.token and reader.owned()
            await writer.release()  # the row becomes this task's read hold
            assert reader.owned() and not writer.owned()
            modes = [info.mode for info in await locks.holders()]
            assert "shared" in modes and "exclusive" not in modes
            assert not await asyncio.to_thread(sync.lock(key).acquire, False)
            assert await asyncio.to_thread(sync.read_lock(key).acquire, False)
            await asyncio.to_thread(sync.read_lock(key).release)
            await reader.release()
            await settled(locks)
            assert await rows(locks) == []

    run_with_one_worker(main)


# -- semaphores ------------------------------------------------------------------------


def test_at_most_permits_holders(opener: Opener, make_manager: MakeManager, key: str) -> None:
    sync = make_manager()

    async def main() -> None:
        async with opener() as locks:
            holders = [Holder(locks.semaphore(key, 2)) for _ in range(2)]
            for holder in holders:
                assert await holder.holds()
            assert isinstance(holders[0].lock, AsyncSemaphore)
            assert await locks.semaphore(key, 2).locked()
            assert not await asyncio.to_thread(sync.semaphore(key, 2).acquire, False)
            third = Holder(locks.semaphore(key, 2))
            await asyncio.sleep(0.1)
            assert not third.task.done()
            await holders[0].release()
            assert await third.holds()
            with pytest.raises(ValueError, match="permits"):
                await locks.semaphore(key, 3).acquire(timeout=0)
            await holders[1].release()
            await third.release()
            await settled(locks)
            assert await rows(locks) == []

    run(main)


def test_a_task_holds_several_permits_and_only_its_own(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            semaphore = locks.semaphore(key, 3)
            assert await semaphore.acquire() and await semaphore.acquire()
            assert len(await rows(locks)) == 2
            first_tokens = semaphore.token

            async def intruder() -> None:
                assert not semaphore.owned()
                with pytest.raises(tierlock.NotHeldError):
                    await semaphore.release()

            await asyncio.create_task(intruder())
            await semaphore.release()
            assert semaphore.owned() and semaphore.token != first_tokens
            await semaphore.release()
            assert not semaphore.owned()
            assert await rows(locks) == []

    run(main)


# -- cancellation ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["read", "permit"])
@pytest.mark.parametrize("after", [False, True], ids=["before-the-try", "after-the-try"])
def test_cancelled_while_its_try_is_in_flight(
    opener: Opener, key: str, kind: str, after: bool
) -> None:
    async def main() -> None:
        async with opener() as locks:
            shared = locks._backend.shared
            assert shared is not None
            gate = Gate(shared, "try_share" if kind == "read" else "try_permit", after=after)
            handle = locks.read_lock(key) if kind == "read" else locks.semaphore(key, 1)
            waiter = asyncio.create_task(handle.acquire())
            follower = Holder(handle)
            await gate.reached()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            gate.open()
            assert await follower.holds()  # the next waiter is not stuck
            await follower.release()
            await settled(locks)
            assert await rows(locks) == []

    run(main)


def test_cancelled_while_its_downgrade_is_in_flight(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            writer, reader = locks.lock(key), locks.read_lock(key)
            go, released = asyncio.Event(), asyncio.Event()
            outcome: list[bool] = []

            async def downgrade() -> None:
                await writer.acquire()
                await reader.acquire()
                await go.wait()
                try:
                    await writer.release()
                finally:
                    outcome.append(reader.owned())
                    try:
                        await reader.release()
                    except tierlock.NotHeldError:
                        outcome.append(False)  # it knows it holds no read hold
                    released.set()

            task = asyncio.create_task(downgrade())
            await asyncio.sleep(0)
            shared = locks._backend.shared
            assert shared is not None
            gate = Gate(shared, "downgrade", after=True)
            go.set()
            await gate.reached()
            task.cancel()
            await released.wait()
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert outcome == [False, False]  # the task holds nothing, and knows it
            await swept(locks)
            follower = Holder(locks.lock(key))
            assert await follower.holds()
            await follower.release()

    run(main)


def test_a_released_permit_passes_to_a_waiting_task_with_no_statement(
    opener: Opener, key: str, driver_statements: DriverStatements
) -> None:
    """Permits are held by the process in the event loop too: a task that releases one
    while another task of its manager waits passes it on in memory, one token higher."""

    async def main() -> None:
        async with opener() as locks:
            first = Holder(locks.semaphore(key, 1))
            assert await first.holds()
            waiting = Holder(locks.semaphore(key, 1))

            def between_tries() -> bool:  # (its poller asked once, and pauses)
                line = locks._shares._lines.get((key, True))
                asked = driver_statements.count(but=HEARTBEAT) > before
                return asked and line is not None and bool(line.waiters) and line.asking is None

            before = driver_statements.count(but=HEARTBEAT)
            while not between_tries():
                await asyncio.sleep(0.005)
            before = driver_statements.count(but=HEARTBEAT)
            await first.release()
            assert await waiting.holds()
            assert driver_statements.count(but=HEARTBEAT) == before
            assert first.token is not None
            assert waiting.token == first.token + 1
            assert locks.stats().local_handoffs == 1
            await waiting.release()
            await settled(locks)
            assert await rows(locks) == []

    run(main)
