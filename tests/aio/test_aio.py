"""``tierlock.aio.AsyncLockManager`` on every database: task ownership, reentrancy,
timeouts, the admin calls, ``synchronized``, ``on_lost`` and closing.

Cancellation is tested in ``test_aio_cancel``, many tasks and processes in
``test_aio_load``, read locks and semaphores in ``test_aio_shared``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from aiohelpers import FEW_THREADS, LONG, Opener, rows, run, run_with_one_worker
from conftest import MakeManager
from engines import keeps_expired

import tierlock
from tierlock.aio import AsyncLock, AsyncLockManager


@pytest.fixture
def opener(db_url: str, table: str) -> Opener:
    return Opener(db_url, table)


# -- holding -------------------------------------------------------------------------


def test_a_hold_is_a_row_that_names_the_task(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            assert isinstance(lock, AsyncLock)
            assert not await lock.locked()
            assert lock.token is None and not lock.owned()

            async def hold() -> None:
                async with lock:
                    assert lock.owned()
                    assert await lock.locked()
                    info = await locks.info(key)
                    assert info is not None
                    assert info.token == lock.token
                    assert info.thread_name == "payer"
                    assert info.mode == "exclusive"
                    assert "<locked tierlock.AsyncLock object key=" in repr(lock)

            await asyncio.create_task(hold(), name="payer")
            assert not lock.owned()
            assert await rows(locks) == []
            assert "<unlocked tierlock.AsyncLock" in repr(lock)

    run(main)


def test_reentrant_within_a_task(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            assert await lock.acquire()
            token = lock.token
            assert await lock.acquire(blocking=False)
            assert await locks.lock(key).acquire(timeout=0)  # another handle, same lock
            assert lock.token == token
            await lock.release()
            await lock.release()
            assert lock.owned()
            assert await rows(locks) == [key]
            await lock.release()
            assert not lock.owned()
            assert await rows(locks) == []
            with pytest.raises(tierlock.NotHeldError):
                await lock.release()

    run(main)


def test_another_task_cannot_release(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            await lock.acquire()

            async def intruder() -> None:
                assert not lock.owned()
                assert lock.token is None
                with pytest.raises(tierlock.NotHeldError):
                    await lock.release()
                with pytest.raises(tierlock.NotHeldError):
                    await lock.extend()

            await asyncio.create_task(intruder())
            assert lock.owned()
            assert await rows(locks) == [key]
            await lock.release()

    run(main)


def test_child_tasks_do_not_inherit_holds(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            async with lock:
                parent_token = lock.token

                async def child() -> bool:
                    assert not lock.owned()
                    assert lock.token is None
                    # Not reentrant for the child: it waits for its parent, in vain.
                    return await lock.acquire(timeout=0.2)

                assert await asyncio.create_task(child()) is False
                assert not await asyncio.create_task(lock.acquire(blocking=False))
                assert lock.token == parent_token

    run(main)


def test_tasks_take_turns_and_tokens_rise(opener: Opener, key: str) -> None:
    tasks = 20

    async def main() -> None:
        async with opener() as locks:
            inside = 0
            tokens: list[int] = []

            async def section() -> None:
                nonlocal inside
                async with locks.lock(key):
                    inside += 1
                    assert inside == 1
                    token = locks.lock(key).token
                    assert token is not None
                    tokens.append(token)
                    await asyncio.sleep(0.001)
                    inside -= 1

            await asyncio.gather(*(section() for _ in range(tasks)))
            assert len(tokens) == tasks
            assert tokens == sorted(tokens) and len(set(tokens)) == tasks
            assert await rows(locks) == []

    run(main)


# -- timeouts --------------------------------------------------------------------------


def test_timeouts_and_tries_without_waiting(
    opener: Opener, make_manager: MakeManager, key: str
) -> None:
    holder = make_manager()
    with holder.lock(key):

        async def main() -> None:
            async with opener() as locks:
                lock = locks.lock(key)
                assert not await lock.acquire(blocking=False)
                began = time.monotonic()
                assert not await lock.acquire(timeout=0.3)
                assert 0.3 <= time.monotonic() - began < LONG
                with pytest.raises(tierlock.LockTimeout):
                    async with locks.lock(key, timeout=0.1):
                        pass
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await lock.acquire()
                assert not lock.owned()

        run(main)
    assert holder.holders() == []


def test_asyncio_timeout_leaves_the_next_waiter_free_to_go(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            await lock.acquire()

            async def impatient() -> None:
                async with asyncio.timeout(0.1):
                    await lock.acquire()

            patient = asyncio.create_task(lock.acquire(timeout=LONG))
            with pytest.raises(TimeoutError):
                await asyncio.create_task(impatient())
            await lock.release()
            assert await patient

    run(main)


def test_bad_arguments_are_refused_as_threading_does(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            lock = locks.lock(key)
            with pytest.raises(ValueError, match="non-blocking"):
                await lock.acquire(blocking=False, timeout=1)
            with pytest.raises(ValueError, match="non-negative"):
                await lock.acquire(timeout=-2)
            with pytest.raises(OverflowError):
                await lock.acquire(timeout=threading.TIMEOUT_MAX * 2)
            with pytest.raises(TypeError):
                locks.lock(3.5)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="async with"), lock:
                pass
            assert await rows(locks) == []

    run(main)


def test_outside_a_task_is_refused(opener: Opener, key: str) -> None:
    async def main() -> AsyncLockManager:
        return AsyncLockManager(**opener.options())

    locks = run(main)
    coroutine = locks.lock(key).acquire()
    with pytest.raises(tierlock.LockError, match="tasks"):
        coroutine.send(None)
    coroutine.close()
    run(locks.aclose)


# -- sync and async managers -------------------------------------------------------------


def test_sync_and_async_managers_exclude_each_other(
    opener: Opener, make_manager: MakeManager, key: str
) -> None:
    sync = make_manager()

    async def main() -> None:
        async with opener() as locks:
            async with locks.lock(key):
                assert not await asyncio.to_thread(sync.lock(key).acquire, blocking=False)
            assert await asyncio.to_thread(sync.lock(key).acquire, blocking=False)
            assert not await locks.lock(key).acquire(timeout=0.1)
            await asyncio.to_thread(sync.lock(key).release)
            assert await locks.lock(key).acquire(timeout=LONG)
            await locks.lock(key).release()

    run_with_one_worker(main)


# -- synchronized -------------------------------------------------------------------------


def test_synchronized_guards_coroutines(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            inside: dict[int, int] = {}

            @locks.synchronized(key + ":{user_id}")
            async def pay(user_id: int, amount: int = 1) -> int:
                inside[user_id] = inside.get(user_id, 0) + 1
                assert inside[user_id] == 1
                info = await locks.info(f"{key}:{user_id}")
                assert info is not None
                await asyncio.sleep(0.001)
                inside[user_id] -= 1
                return amount

            results = await asyncio.gather(*(pay(n % 3, amount=n) for n in range(30)))
            assert results == list(range(30))
            assert await rows(locks) == []

            with pytest.raises(TypeError, match="async def"):
                locks.synchronized(key)(lambda: None)  # type: ignore[type-var]
            with pytest.raises(ValueError, match="'missing'"):

                @locks.synchronized("{missing}")
                async def nothing() -> None: ...

    run(main)


# -- extend, on_lost, admin ----------------------------------------------------------------


def test_extend_and_a_lost_hold(opener: Opener, key: str) -> None:
    async def main() -> None:
        lost: list[tuple[str, int, bool]] = []
        reported = asyncio.Condition()

        async def on_lost(lost_key: str, token: int) -> None:
            # A coroutine function runs in the manager's loop.
            lost.append((lost_key, token, asyncio.current_task() is not None))
            async with reported:
                reported.notify_all()

        async with opener(ttl=0.6, on_lost=on_lost) as locks:
            lock = locks.lock(key, renew=False)
            await lock.acquire()
            first = lock.token
            await lock.extend(LONG)
            info = await locks.info(key)
            assert info is not None and (info.expires_at - info.acquired_at).total_seconds() > 5
            assert await locks.force_release(key)
            with pytest.raises(tierlock.LockLostError):
                await lock.extend()
            with pytest.raises(tierlock.LockLostError):
                await lock.release()

            renewed = locks.lock(key + ":renewed")
            await renewed.acquire()
            token = renewed.token
            assert await locks.force_release(key + ":renewed")
            async with reported:  # the heartbeat finds it gone
                await asyncio.wait_for(reported.wait_for(lambda: len(lost) == 2), LONG)
            assert lost == [(key, first, True), (key + ":renewed", token, True)]
            assert not renewed.owned()
            with pytest.raises(tierlock.LockLostError):
                await renewed.release()

    run(main)


def test_admin_calls(opener: Opener, key: str, db: str) -> None:
    async def main() -> None:
        async with opener(ttl=0.2) as locks:
            lock = locks.lock(key, renew=False)
            await lock.acquire()
            assert [info.key for info in await locks.holders()] == [key]
            deadline = time.monotonic() + LONG
            reaped = 1 if keeps_expired(db) else 0  # (Redis deletes it when its lease ends)
            while (holders := await locks.holders()) and not holders[0].expired:
                assert time.monotonic() < deadline  # the database's clock decides
                await asyncio.sleep(0.05)
            assert await locks.reap() == reaped
            assert await locks.holders() == []
            assert not await locks.force_release(key)
            stats = locks.stats()
            assert stats.acquisitions == 1 and stats.reaped == reaped
            with pytest.raises(tierlock.LockLostError):
                await lock.release()

    run(main)


# -- closing ----------------------------------------------------------------------------


def test_closing_sends_waiters_away(opener: Opener, key: str) -> None:
    async def main() -> None:
        locks = AsyncLockManager(**opener.options())
        lock = locks.lock(key)
        await lock.acquire()
        waiters = [asyncio.create_task(lock.acquire()) for _ in range(3)]
        await asyncio.sleep(0)  # (they queue)
        await locks.aclose()
        for waiter in waiters:
            with pytest.raises(tierlock.LockError, match="closed"):
                await waiter
        with pytest.raises(tierlock.LockError, match="closed"):
            locks.lock(key)
        with pytest.raises(tierlock.LockError, match="closed"):
            await lock.release()
        await locks.aclose()  # again: nothing

    run(main)


def test_threads_stay_few(opener: Opener, key: str) -> None:
    """The manager's threads are a constant few, whatever the number of keys."""

    async def main() -> None:
        before = threading.active_count()
        async with opener() as locks:
            holds = [locks.lock(f"{key}:{n}") for n in range(200)]

            async def hold(lock: AsyncLock) -> None:
                async with lock:
                    await asyncio.sleep(0.01)

            await asyncio.gather(*(hold(lock) for lock in holds))
            assert threading.active_count() - before <= FEW_THREADS
        await asyncio.sleep(0)

    run(main)


def test_options_are_checked(opener: Opener) -> None:
    options: dict[str, Any] = opener.options()
    with pytest.raises(ValueError, match="ttl"):
        AsyncLockManager(**{**options, "ttl": 0})
    with pytest.raises(TypeError, match="on_lost"):
        AsyncLockManager(**{**options, "on_lost": 3})
