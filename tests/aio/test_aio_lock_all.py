"""``AsyncLockManager.lock_all``: several keys held as one by a task, all or nothing.
Opposite transfers in two processes neither deadlock nor lose money; a timeout or a
cancellation part of the way leaves none of the keys held; ``synchronized`` takes
several templates for coroutines."""

from __future__ import annotations

import asyncio

import procs
import pytest
from aiohelpers import LONG, Holder, Opener, run
from transfers import Bank, transfer_tasks

import tierlock
from tierlock.aio import AsyncLockManager, AsyncMultiLock

PROCESSES = 2
TASKS = 2
TRANSFERS = 40
ONLY_SQLITE = pytest.mark.parametrize("db", ["sqlite"], indirect=True)


@pytest.fixture
def opener(db_url: str, table: str) -> Opener:
    return Opener(db_url, table)


@pytest.fixture
def keys(key: str) -> list[str]:
    """Three keys, in the order a set takes them."""
    return [f"{key}:a", f"{key}:b", f"{key}:c"]


async def assert_free(other: AsyncLockManager, keys: list[str]) -> None:
    """A task of another manager takes each of ``keys`` at its first try."""

    async def take(key: str) -> bool:
        lock = other.lock(key)
        got = await lock.acquire(blocking=False)
        if got:
            await lock.release()
        return got

    for key in keys:
        assert await asyncio.create_task(take(key)), f"{key!r} is still held"


async def acquiring(locks: AsyncLockManager, key: str) -> None:
    """Return once a task of ``locks`` waits for ``key`` (behind a task of its own
    manager, or for the store); looked at in the loop, between its steps."""
    deadline = asyncio.get_running_loop().time() + LONG
    while True:
        entry = locks._exclusive._keys.get(key)
        if entry is not None and entry.head() is not None:
            return
        assert asyncio.get_running_loop().time() < deadline, f"nobody waits for {key!r}"
        await asyncio.sleep(0.01)


# -- many processes ------------------------------------------------------------------


@pytest.mark.multiprocess
def test_opposite_transfers_in_two_processes_never_deadlock_and_lose_nothing(
    db_url: str, table: str, key: str, children: procs.Children
) -> None:
    bank = Bank()
    start = procs.CTX.Barrier(PROCESSES)
    for process in range(PROCESSES):
        children.start(
            transfer_tasks,
            url=db_url,
            table=table,
            prefix=key,
            bank=bank,
            process=process,
            tasks=TASKS,
            transfers=TRANSFERS,
            start=start,
        )
    children.join()
    assert bank.read() == bank.expected(TRANSFERS, PROCESSES * TASKS)


# -- all or nothing ------------------------------------------------------------------


def test_a_timeout_leaves_none_of_the_keys_held(opener: Opener, keys: list[str]) -> None:
    first, middle, last = keys

    async def main() -> None:
        async with opener() as locks, opener() as other:
            holder = Holder(other.lock(middle))
            assert await holder.holds()
            held = locks.lock_all([last, middle, first], timeout=0.2)
            assert not await held.acquire(timeout=0.2)
            with pytest.raises(tierlock.LockTimeout) as raised:
                async with held:
                    pytest.fail("entered without the keys")
            assert raised.value.key == middle
            assert not held.owned() and held.tokens == {}
            assert await held.locked()
            await assert_free(other, [first, last])
            await holder.release()
            async with held:
                assert held.owned() and held.tokens.keys() == set(keys)
            assert not await held.locked()

    run(main)


@pytest.mark.parametrize("holder_of_the_middle", ["same-manager", "other-manager"])
def test_a_cancellation_while_waiting_for_a_later_key_releases_the_earlier(
    opener: Opener, keys: list[str], holder_of_the_middle: str
) -> None:
    first, middle, last = keys

    async def main() -> None:
        async with opener() as locks, opener() as other:
            owner = locks if holder_of_the_middle == "same-manager" else other
            holder = Holder(owner.lock(middle))
            assert await holder.holds()
            held = locks.lock_all(keys)
            task = asyncio.create_task(held.acquire())
            await acquiring(locks, middle)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await assert_free(other, [first, last])
            await holder.release()
            await assert_free(other, keys)

    run(main)


def test_a_release_that_fails_on_one_key_still_releases_the_others(
    opener: Opener, keys: list[str]
) -> None:
    async def main() -> None:
        async with opener() as locks, opener() as admin:
            held = locks.lock_all(keys)
            assert await held.acquire()
            assert await admin.force_release(keys[-1])  # the first one released
            with pytest.raises(tierlock.LockLostError) as raised:
                await held.release()
            assert raised.value.key == keys[-1]
            assert not any(lock.owned() for lock in held.locks)
            await assert_free(admin, keys)
            with pytest.raises(tierlock.NotHeldError):
                await held.release()

    run(main)


# -- the handle ----------------------------------------------------------------------


@ONLY_SQLITE
def test_a_task_s_handle_checked_reentrant_and_shown(opener: Opener, key: str) -> None:
    async def main() -> None:
        async with opener() as locks:
            held = locks.lock_all([f"{key}:b", (key, "a"), f"{key}:b"])
            assert isinstance(held, AsyncMultiLock)
            assert held.keys == (f"{key}:a", f"{key}:b")
            with pytest.raises(TypeError, match="async with"), held:
                pass
            for bad, error in [(key, TypeError), ([], ValueError), ([None], TypeError)]:
                with pytest.raises(error):
                    locks.lock_all(bad)  # type: ignore[arg-type]
            async with held:
                assert await held.acquire(blocking=False)  # again, at once
                await held.release()
                assert held.owned()
                assert repr(held).startswith(
                    f"<locked tierlock.aio.AsyncMultiLock object keys={held.keys!r} at 0x"
                )

                async def elsewhere() -> tuple[bool, bool]:
                    try:
                        await held.release()
                    except tierlock.NotHeldError:
                        return held.owned(), await held.acquire(blocking=False)
                    raise AssertionError("another task released the set")

                assert await asyncio.create_task(elsewhere()) == (False, False)
            assert not held.owned()
            assert repr(held).startswith("<unlocked tierlock.aio.AsyncMultiLock")

    run(main)


def test_synchronized_with_several_templates_holds_every_key_for_the_call(
    opener: Opener, key: str
) -> None:
    async def main() -> None:
        async with opener() as locks, opener() as other:
            seen: list[bool] = []

            @locks.synchronized(f"{key}:{{source}}", f"{key}:{{target}}", timeout=0.2)
            async def move(source: int, target: int) -> None:
                seen.append(locks.lock_all([(key, source), (key, target)]).owned())
                for account in (source, target):
                    lock = other.lock((key, account))
                    seen.append(await asyncio.create_task(lock.acquire(blocking=False)))

            await move(2, 1)
            assert seen == [True, False, False]
            await assert_free(other, [f"{key}:1", f"{key}:2"])
            holder = Holder(other.lock((key, 2)))
            assert await holder.holds()
            with pytest.raises(tierlock.LockTimeout) as raised:
                await move(1, 2)
            assert raised.value.key == f"{key}:2"
            await assert_free(other, [f"{key}:1"])
            await holder.release()
            with pytest.raises(ValueError, match="'amount'"):
                locks.synchronized("a:{source}", "b:{amount}")(move)

    run(main)
