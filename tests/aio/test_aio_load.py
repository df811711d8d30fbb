"""Many tasks, async beside sync managers in several processes, and async holders
stopped or killed, on every database."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import procs
import pytest
from aiohelpers import FEW_THREADS, LONG, Opener, run

from tierlock.aio import AsyncLockManager

TASKS = 1000
# How often the thread count is looked at while the tasks wait.
LOOKS = 20


@pytest.fixture
def opener(db_url: str, table: str) -> Opener:
    return Opener(db_url, table)


@pytest.mark.slow
def test_a_thousand_tasks_on_one_key(
    db_url: str, table: str, opener: Opener, key: str, children: procs.Children
) -> None:
    """1,000 tasks of one manager wait for a key another process holds: few threads
    while they wait; then one at a time, in the order they came."""
    held, may_release = procs.CTX.Event(), procs.CTX.Event()
    children.start(
        procs.hold, url=db_url, table=table, key=key, ttl=LONG, held=held, may_release=may_release
    )
    assert held.wait(LONG)

    async def main() -> tuple[int, list[int], int]:
        before = threading.active_count()
        async with opener() as locks:
            order: list[int] = []
            inside = most_inside = 0

            async def section(index: int) -> None:
                nonlocal inside, most_inside
                async with locks.lock(key, timeout=4 * LONG):
                    inside += 1
                    most_inside = max(most_inside, inside)
                    order.append(index)
                    await asyncio.sleep(0)
                    inside -= 1

            tasks = [asyncio.create_task(section(index)) for index in range(TASKS)]
            most_threads = 0
            for _ in range(LOOKS):  # (the poller meanwhile tries and pauses on its doorbell)
                await asyncio.sleep(0.02)
                most_threads = max(most_threads, threading.active_count() - before)
            assert not any(task.done() for task in tasks)
            may_release.set()
            await asyncio.gather(*tasks)
            return most_inside, order, most_threads

    most_inside, order, most_threads = run(main)
    children.join()
    assert most_inside == 1
    assert order == list(range(TASKS))
    assert most_threads <= FEW_THREADS, f"{most_threads} threads while {TASKS} tasks waited"


@pytest.mark.slow
def test_sync_and_async_processes_exclude_each_other(
    db_url: str, table: str, key: str, children: procs.Children
) -> None:
    """Two processes of tasks and two of threads on three keys: no section overlaps."""
    keys = [f"{key}:{index}" for index in range(3)]
    tally = procs.Tally(len(keys))
    async_processes, sync_processes, threads = 2, 2, 3
    start = procs.CTX.Barrier(async_processes + sync_processes * threads)
    for _ in range(async_processes):
        children.start(
            procs.ahammer,
            url=db_url,
            table=table,
            keys=keys,
            tally=tally,
            tasks=6,
            sections=25,
            start=start,
        )
    for _ in range(sync_processes):
        children.start(
            procs.hammer,
            url=db_url,
            table=table,
            keys=keys,
            tally=tally,
            threads=threads,
            sections=25,
            start=start,
        )
    children.join()
    total = 25 * (async_processes * 6 + sync_processes * threads)
    assert sum(tally.entries) == total
    assert list(tally.most_inside) == [1, 1, 1]
    assert sum(tally.counters) == total  # no update lost to an overlap


def test_the_tally_sees_overlapping_tasks(db_url: str, table: str, key: str) -> None:
    """The control: without locks, the tasks' sections overlap and lose updates."""
    tally = procs.Tally(1)

    async def main() -> None:
        await asyncio.gather(*(tally.asection(0) for _ in range(20)))

    asyncio.run(main())
    assert tally.most_inside[0] > 1
    assert tally.counters[0] < 20


def test_managers_do_not_share_threads_per_key(opener: Opener, key: str) -> None:
    """Keys held at once each cost a row, not a thread."""

    async def main() -> int:
        before = threading.active_count()
        async with opener() as locks:
            held = asyncio.Event()
            go = asyncio.Event()
            count = 0

            async def hold(index: int) -> None:
                nonlocal count
                async with locks.lock(f"{key}:{index}"):
                    count += 1
                    if count == 300:
                        held.set()
                    await go.wait()

            tasks = [asyncio.create_task(hold(index)) for index in range(300)]
            await asyncio.wait_for(held.wait(), LONG)
            grown = threading.active_count() - before
            assert len(await locks.holders()) == 300
            go.set()
            await asyncio.gather(*tasks)
            return grown

    assert run(main) <= FEW_THREADS


def test_a_manager_per_loop(opener: Opener, key: str) -> None:
    """A manager made in one loop and closed there; another loop makes its own."""
    for _ in range(2):

        async def main() -> None:
            locks = AsyncLockManager(**opener.options())
            async with locks.lock(key):
                pass
            await locks.aclose()

        run(main)


def start_async_holder(
    children: procs.Children, db_url: str, table: str, key: str, ttl: float
) -> tuple[int, Any, Any, Any]:
    """A child whose task holds ``key``; its pid, ``resumed`` event and report pipe."""
    held, resumed = procs.CTX.Event(), procs.CTX.Event()
    reader, writer = procs.CTX.Pipe(duplex=False)
    child = children.start(
        procs.ahold,
        url=db_url,
        table=table,
        key=key,
        ttl=ttl,
        held=held,
        resumed=resumed,
        results=writer,
    )
    writer.close()
    assert held.wait(procs.WAIT_LIMIT)
    assert child.pid is not None
    return child.pid, resumed, reader, child


@pytest.mark.slow
def test_a_killed_async_holder_s_key_is_reclaimed_at_once(
    db_url: str, table: str, opener: Opener, key: str, children: procs.Children
) -> None:
    pid, _, _, child = start_async_holder(children, db_url, table, key, ttl=LONG)
    os.kill(pid, signal.SIGKILL)
    child.join(LONG)

    async def main() -> float:
        async with opener() as locks:
            lock = locks.lock(key)
            began = time.monotonic()
            assert await lock.acquire(timeout=LONG)
            waited = time.monotonic() - began
            assert locks.stats().reclaims == 1
            await lock.release()
            return waited

    assert run(main) < LONG / 3  # not the lease: the holder was seen gone
    children.forget(child)


@pytest.mark.slow
def test_a_stopped_async_holder_loses_its_hold_and_is_told(
    db_url: str, table: str, opener: Opener, key: str, children: procs.Children
) -> None:
    ttl = 1.0
    pid, resumed, reader, _ = start_async_holder(children, db_url, table, key, ttl=ttl)
    os.kill(pid, signal.SIGSTOP)

    async def main() -> int:
        async with opener() as locks:
            lock = locks.lock(key)
            try:
                assert await lock.acquire(timeout=LONG)  # once the stopped lease ended
            finally:
                os.kill(pid, signal.SIGCONT)
            resumed.set()
            assert await asyncio.to_thread(reader.poll, LONG), "no report from the holder"
            info = await locks.info(key)
            assert info is not None and info.token == lock.token  # untouched by it
            token = lock.token
            assert token is not None
            await lock.release()
            return token

    token = run(main)
    report = reader.recv()
    children.join()
    assert token > report["token"]
    assert report == {
        "token": report["token"],
        "told": True,
        "calls": [(key, report["token"])],
        "owned": False,
        "raised": "LockLostError",
    }
