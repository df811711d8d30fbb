"""Permits held by the process: a permit released while another thread of the process
waits for one passes to it in memory, with no statement, and a process passing permits
among its threads still lets other processes in (the cohort's bound)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event

import procs
import pytest
from conftest import SHARED_HOLDS, MakeManager
from counting import HEARTBEAT, DriverStatements
from interrupts import Interrupted, Steps, interrupting
from polling import wait_until

import tierlock
import tierlock.aio
from tierlock.tier1 import passing as passing_module

pytestmark = SHARED_HOLDS

LONG = 30.0


def _listening(
    manager: tierlock.LockManager, key: str, thread: str, sent: DriverStatements
) -> bool:
    """Whether ``thread`` waits for a permit of ``key`` where a pass reaches it, after
    its try at the database (which found every permit taken)."""
    line = manager._permits._lines.get(key)
    return (
        sent.count(thread=thread) > 0
        and line is not None
        and bool(line.queue)
        and line.queue[0].listening
    )


def test_a_released_permit_passes_to_a_waiting_thread_with_no_statement(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    manager, other = make_manager(ttl=3), make_manager()  # (a heartbeat each second)
    sem = manager.semaphore(key, 1)
    assert sem.acquire(timeout=LONG)
    first = sem.token
    assert first is not None
    got: list[int | None] = []
    taken, let_go = threading.Event(), threading.Event()

    def take() -> None:
        assert sem.acquire(timeout=LONG)
        got.append(sem.token)
        taken.set()
        assert let_go.wait(LONG)
        sem.release()

    taker = threading.Thread(target=take, name="taker")
    taker.start()
    try:
        wait_until(
            lambda: _listening(manager, key, "taker", driver_statements), "a listening taker"
        )
        before = driver_statements.count(but=HEARTBEAT)
        sem.release()
        assert taken.wait(LONG)
        # Neither the release nor the acquire sent anything: the row stayed the process's.
        assert driver_statements.count(but=HEARTBEAT) == before
        assert got == [first + 1]  # one hand-off more, in memory
        assert manager.stats().local_handoffs == 1
        # The heartbeat writes the new holder into the row.
        wait_until(
            lambda: (
                [(row.thread_name, row.token) for row in other.holders()] == [("taker", first + 1)]
            ),
            "the row naming its new holder",
        )
    finally:
        let_go.set()
        taker.join(LONG)
    assert other.holders() == []
    assert not taker.is_alive()


@pytest.fixture
def interrupt() -> Iterator[Callable[[Steps], None]]:
    """``interrupt(steps)``: see ``interrupts.interrupting``."""
    yield from interrupting(Interrupted)


def test_a_waiter_interrupted_in_line_is_passed_nothing(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    interrupt: Callable[[Steps], None],
) -> None:
    """A thread whose wait for a permit a signal handler cuts short leaves the line:
    the permit released after it goes back to the database, where another process's
    manager takes it at once, instead of to the thread that left."""
    manager, other = make_manager(), make_manager()
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with manager.semaphore(key, 1):
            held.set()
            assert let_go.wait(LONG)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    try:
        assert held.wait(LONG)
        main = threading.current_thread().name
        interrupt(
            lambda: wait_until(
                lambda: _listening(manager, key, main, driver_statements), "a listening waiter"
            )
        )
        with pytest.raises(Interrupted):
            manager.semaphore(key, 1).acquire(timeout=LONG)
    finally:
        let_go.set()
        holder.join(LONG)
    assert not holder.is_alive()
    assert manager.stats().local_handoffs == 0
    assert other.semaphore(key, 1).acquire(blocking=False)
    assert manager._permits._lines == {}


def _pass_permits(url: str, table: str, key: str, passing: Event, stop: Event) -> None:
    """Eight threads of this process take turns at the one permit of ``key`` until
    ``stop``; ``passing`` once they have passed it in memory a hundred times. A hold
    passes in memory here however long ago its row was last proved the process's, so
    that only the cohort's bound gives the permit back to the database."""
    passing_module.CONFIRMED_WITHIN = 2 * LONG
    manager = procs.open_manager(url, table)
    failures: list[BaseException] = []

    def work() -> None:
        sem = manager.semaphore(key, 1)
        try:
            while not stop.is_set():
                with sem:
                    time.sleep(0.0005)
                if manager.stats().local_handoffs >= 100:
                    passing.set()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LONG)
    manager.close()
    if failures:
        raise failures[0]


def _pass_permits_in_tasks(url: str, table: str, key: str, passing: Event, stop: Event) -> None:
    """``_pass_permits`` with eight tasks of an event loop instead of threads."""
    passing_module.CONFIRMED_WITHIN = 2 * LONG

    async def main() -> None:
        async with tierlock.aio.AsyncLockManager(url, table=table) as locks:

            async def work() -> None:
                sem = locks.semaphore(key, 1)
                while not stop.is_set():
                    async with sem:
                        await asyncio.sleep(0.0005)
                    if locks.stats().local_handoffs >= 100:
                        passing.set()

            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(8))), LONG)

    asyncio.run(main())


@pytest.mark.parametrize(
    "passer", [_pass_permits, _pass_permits_in_tasks], ids=["threads", "tasks"]
)
def test_a_process_passing_permits_lets_other_processes_in(
    make_manager: MakeManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
    passer: Callable[..., None],
) -> None:
    """While eight threads (or tasks) of another process pass the one permit among
    themselves, a waiter here gets in: the other process's cohort ends and gives the
    permit back while it is waited for (after 5 ms), and its next waiter lets this one
    try first (for 20 ms). Without that bound the other process keeps the permit forever."""
    passing, stop = procs.CTX.Event(), procs.CTX.Event()
    children.start(passer, url=db_url, table=table, key=key, passing=passing, stop=stop)
    try:
        assert passing.wait(LONG), "the other process did not pass its permit"
        sem = make_manager().semaphore(key, 1)
        began = time.monotonic()
        got = sem.acquire(timeout=10)
        waited = time.monotonic() - began
        if got:
            sem.release()
    finally:
        stop.set()
    children.join()
    assert got
    assert waited < 5, f"waited {waited:.3f} s"
