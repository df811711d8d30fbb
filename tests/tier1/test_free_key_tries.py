"""A try without waiting never takes a key nobody holds for held: a hold on its way back
to the database (a release, or a kept hold whose time is up) stays in tier 1 until its
DELETE has committed, and a try of another thread (task) of the process waits for that
one statement instead of meeting the row and failing."""

from __future__ import annotations

import asyncio
import threading

import procs
from aiohelpers import Gate, Opener, run
from conftest import MakeManager
from polling import wait_until

import tierlock


def try_in_a_thread(lock: tierlock.Lock, outcome: list[bool]) -> threading.Thread:
    """A thread that tries ``lock`` without waiting, appends whether it won to
    ``outcome``, and releases it if so."""

    def attempt() -> None:
        won = lock.acquire(blocking=False)
        outcome.append(won)
        if won:
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    return thread


class Holder(threading.Thread):
    """A thread that acquires ``lock``, then releases it once told to ``let_go``."""

    def __init__(self, lock: tierlock.Lock) -> None:
        super().__init__()
        self.lock = lock
        self.held = threading.Event()
        self.let_go = threading.Event()
        self.token: int | None = None

    def run(self) -> None:
        assert self.lock.acquire(timeout=procs.WAIT_LIMIT)
        self.token = self.lock.token
        self.held.set()
        assert self.let_go.wait(procs.WAIT_LIMIT)
        self.lock.release()

    def hold(self) -> Holder:
        self.start()
        assert self.held.wait(procs.WAIT_LIMIT)
        return self


def try_while_the_delete_waits(manager: tierlock.LockManager, holder: Holder) -> bool:
    """Stop ``manager``'s next DELETE, which ``holder`` sends when it lets go, try the
    key from another thread meanwhile, and let the DELETE go once the try has queued in
    tier 1 or has finished; return whether the try won."""
    gate = Gate(manager._backend, "release")
    holder.let_go.set()
    assert gate.entered.wait(procs.WAIT_LIMIT), "no DELETE was sent"
    queued = manager.stats().local_waits
    outcome: list[bool] = []
    trier = try_in_a_thread(holder.lock, outcome)
    wait_until(
        lambda: outcome or manager.stats().local_waits > queued,
        "the try to finish or wait in tier 1",
    )
    gate.open()
    for thread in (trier, holder):
        thread.join(procs.WAIT_LIMIT)
        assert not thread.is_alive()
    return outcome == [True]


def test_a_try_during_a_release_waits_for_its_delete(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    holder = Holder(lock).hold()
    assert try_while_the_delete_waits(manager, holder)
    assert other.info(key) is None
    assert lock.acquire(blocking=False) and lock.token not in (None, holder.token)
    lock.release()


def test_a_try_during_a_kept_holds_release_waits_for_its_delete(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    holder = Holder(lock).hold()
    turned_away: list[bool] = []
    try_in_a_thread(lock, turned_away).join(procs.WAIT_LIMIT)
    assert turned_away == [False]  # so the release keeps the hold for the next try

    # The keeper thread sends the DELETE once cohorts.KEEP_TIME is up.
    assert try_while_the_delete_waits(manager, holder)
    assert manager.stats().local_handoffs == 0  # (the try's hold came from the database)
    assert other.info(key) is None


def test_release_then_try_never_fails(make_manager: MakeManager, key: str) -> None:
    """Each round, one thread releases while another, told that the DELETE is on its
    way, tries without waiting: the try always wins, whichever comes first."""
    manager = make_manager()
    lock = manager.lock(key)
    real = manager._backend.release
    deleting = threading.Event()

    def release(key: str, owner_id: str, live_until: float) -> bool:
        deleting.set()
        return real(key, owner_id, live_until)

    manager._backend.release = release  # type: ignore[method-assign]
    outcomes: list[bool] = []

    def after_the_delete_began() -> None:
        assert deleting.wait(procs.WAIT_LIMIT)
        won = lock.acquire(blocking=False)
        outcomes.append(won)
        if won:
            lock.release()

    for _ in range(150):
        assert lock.acquire()
        deleting.clear()
        trier = threading.Thread(target=after_the_delete_began)
        trier.start()
        lock.release()
        trier.join(procs.WAIT_LIMIT)
    assert outcomes.count(False) == 0 and len(outcomes) == 150


def test_an_async_try_during_a_release_waits_for_its_delete(
    db_url: str, table: str, key: str
) -> None:
    async def main() -> None:
        async with Opener(db_url, table)() as locks:
            lock = locks.lock(key)
            assert await lock.acquire()
            gate = Gate(locks._backend, "release")
            queued = locks.stats().local_waits

            async def attempt() -> bool:
                await gate.reached()
                won = await lock.acquire(blocking=False)
                if won:
                    await lock.release()
                return won

            async def open_once_tried() -> None:
                await gate.reached()
                while not trier.done() and locks.stats().local_waits == queued:
                    await asyncio.sleep(0.001)  # (the loop runs the try meanwhile)
                gate.open()

            trier = asyncio.create_task(attempt())
            opener = asyncio.create_task(open_once_tried())
            await lock.release()
            await opener
            assert await trier
            assert await locks.info(key) is None

    run(main)
