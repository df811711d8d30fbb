"""Tries are wanting: a process that only tries a key (``acquire(blocking=False)``)
marks it wanted when it finds it held elsewhere, and a process that passes the key
between its own threads then lets it go now and then, as it does for pollers.

Also what a holder knows of others: ``others_waiting`` says True while a mark lasts or a
poller waits, and no more once it ended; on PostgreSQL, a listener that has heard no
mark for long enough says False, so that a hot burst within one process passes the
key with no statement (before, it could not tell, and ended a cohort every 5 ms).
"""

from __future__ import annotations

import ctypes
import threading
import time

import procs
import pytest
from conftest import SQL_DATABASES, MakeManager
from counting import HEARTBEAT, DriverStatements
from polling import wait_until

from tierlock.backends.sql import notify

pytestmark = pytest.mark.multiprocess

TRIES = 200
# The pause between two tries: a process that tries now and then, as a job might.
TRY_EVERY = 0.01
# The share of its tries that the trying process wins at least. Before the marks it won
# none on SQLite and MariaDB (the passing process never let the key go); with them, 40-90 %
# on an idle machine. The issue asked for 5 %, which a loaded machine still meets.
LEAST_WON = 0.05
# A burst of short holds passed among the threads of one manager, with nobody else.
BURST_THREADS = 8
BURST_HOLDS = 200
BURST_HOLD = 0.001
# Statements per section of the burst, besides the heartbeat's: 0.02-0.025 measured on
# all three databases (PostgreSQL sent 0.34 before it could tell that nobody waits). A
# hand-off sends an UPDATE once per CONFIRMED_WITHIN (0.1 s), so a burst that a loaded
# machine stretches to a few seconds still keeps under this.
MOST_BURST_STATEMENTS = 0.2
# A mark in the unit-level tests: long enough for a loaded machine to see it.
MARKED_FOR = 2.0


class Passing:
    """A child process whose two threads pass ``key`` between them until ``stop``."""

    def __init__(self, children: procs.Children, db_url: str, table: str, key: str) -> None:
        self.served = procs.CTX.RawArray(ctypes.c_longlong, 2)  # sections per thread
        self.stop = procs.CTX.Event()
        start = procs.CTX.Barrier(3)
        children.start(
            procs.take_turns,
            url=db_url,
            table=table,
            key=key,
            threads=2,
            first=0,
            served=self.served,
            start=start,
            stop=self.stop,
        )
        start.wait(procs.WAIT_LIMIT)
        wait_until(lambda: self.passes() >= 100, "the child to pass the key between threads")

    def passes(self) -> int:
        return sum(self.served)


def test_a_process_that_only_tries_wins_some_tries(
    make_manager: MakeManager, db_url: str, table: str, key: str, children: procs.Children
) -> None:
    """A process passes the key between two threads all the time; another tries it every
    10 ms, and wins at least LEAST_WON of its tries."""
    passing = Passing(children, db_url, table, key)
    lock = make_manager().lock(key)
    won = 0
    passes_before = passing.passes()
    try:
        for _ in range(TRIES):
            if lock.acquire(blocking=False):
                won += 1
                lock.release()
            time.sleep(TRY_EVERY)  # the trying process's pace, not a wait for anything
        passes = passing.passes() - passes_before
    finally:
        passing.stop.set()
    children.join()
    assert passes >= TRIES, f"the child passed the key only {passes} times meanwhile"
    assert won >= LEAST_WON * TRIES, f"won {won} of {TRIES} tries ({passes} passes meanwhile)"


def test_a_process_that_waits_gets_the_key_from_one_that_passes_it(
    make_manager: MakeManager, db_url: str, table: str, key: str, children: procs.Children
) -> None:
    """A holder that is sure nobody waits passes the key on for good: a waiting poller
    of another process must show, or it would wait for ever."""
    passing = Passing(children, db_url, table, key)
    lock = make_manager().lock(key)
    try:
        for _ in range(20):
            assert lock.acquire(timeout=procs.WAIT_LIMIT), "a waiter of another process starved"
            lock.release()
    finally:
        passing.stop.set()
    children.join()


@SQL_DATABASES
def test_a_burst_within_one_process_sends_few_statements(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    """Eight threads of one manager pass the key 200 times, holding it 1 ms each, with
    no other process about: a fraction of a statement per section. The manager has held
    a key before and listened long enough to know that nobody else waits."""
    manager = make_manager()
    backend = manager._backend
    with manager.lock("warm-up"):
        wait_until(
            lambda: backend.others_waiting("warm-up", False) is False,
            "the manager to know that nobody else waits",
        )
    lock = manager.lock(key)
    ready = threading.Barrier(BURST_THREADS)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            ready.wait(procs.WAIT_LIMIT)
            for _ in range(BURST_HOLDS // BURST_THREADS):
                with lock:
                    time.sleep(BURST_HOLD)  # the section's work
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(BURST_THREADS)]
    before = driver_statements.count(but=HEARTBEAT)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(procs.WAIT_LIMIT)
    assert not failures and not any(thread.is_alive() for thread in threads)
    sent = (driver_statements.count(but=HEARTBEAT) - before) / BURST_HOLDS
    assert sent < MOST_BURST_STATEMENTS, f"{sent:.3f} statements per section"


def test_a_mark_shows_to_the_holder_until_it_ends(make_manager: MakeManager, key: str) -> None:
    """``want`` of one manager makes the holding manager's ``others_waiting`` True, and
    it says so no more once the mark has ended."""
    holder, trier = make_manager(), make_manager()
    with holder.lock(key):
        backend = holder._backend
        wait_until(lambda: backend.others_waiting(key, False) is False, "nobody waiting")
        trier._backend.want(key, MARKED_FOR)
        wait_until(lambda: backend.others_waiting(key, False) is True, "the mark to show")
        wait_until(lambda: not backend.others_waiting(key, False), "the mark to end")


def test_a_waiting_poller_shows_to_the_holder(make_manager: MakeManager, key: str) -> None:
    """A poller of another manager that waits for the key shows in ``others_waiting``."""
    holder, waiter = make_manager(), make_manager()
    lock = holder.lock(key)
    assert lock.acquire()
    backend = holder._backend
    wait_until(lambda: backend.others_waiting(key, False) is False, "nobody waiting")
    won: list[bool] = []
    poller = threading.Thread(
        target=lambda: won.append(waiter.lock(key).acquire(timeout=procs.WAIT_LIMIT))
    )
    poller.start()
    try:
        wait_until(lambda: backend.others_waiting(key, False) is True, "the poller to show")
    finally:
        lock.release()
        poller.join(procs.WAIT_LIMIT)
    assert won == [True]


# Readings of time.monotonic() (seconds since the machine's boot): at the first two,
# ``now - (now - 0.1)`` falls short of 0.1 in floating point (as from 64 to 256 s and
# from 1024 to 4096 s), at the last it does not.
CLOCK_READINGS = [150.0, 1300.0, 100_000.5]


@pytest.mark.parametrize("reading", CLOCK_READINGS)
def test_nobody_waits_whatever_the_clock_reads(
    make_manager: MakeManager, key: str, reading: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memories of marks keep times of the clock; one that took a time 0.1 s ago
    for a key never marked said, at some readings, that the key was wanted for ever
    (the lock-file engine did, in the first minutes after a boot)."""
    real = time.monotonic
    offset = reading - real()
    monkeypatch.setattr(time, "monotonic", lambda: real() + offset)
    holder = make_manager()
    try:
        with holder.lock(key):
            wait_until(lambda: holder._backend.others_waiting(key, False) is False, "nobody")
    finally:
        holder.close()  # (before the clock goes back)


def test_a_want_that_cannot_be_marked_does_not_raise(make_manager: MakeManager, key: str) -> None:
    manager = make_manager()
    manager.close()
    manager._backend.want(key, MARKED_FOR)  # closed: nothing to mark with


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
def test_a_mark_shows_on_mariadb_while_the_holder_keeps_the_doorbell(
    make_manager: MakeManager, key: str
) -> None:
    """A holder that keeps the key's named lock (it won after polling) cannot see the
    pollers behind it, but sees a mark; the marking manager does not see its own."""
    holder, trier = make_manager(), make_manager()
    backend = holder._backend
    with holder.lock(key):
        assert backend.others_waiting(key, True) is None
        trier._backend.want(key, MARKED_FOR)
        wait_until(lambda: backend.others_waiting(key, True) is True, "the mark to show")
        assert trier._backend.others_waiting(key, False) is False  # its own mark
        wait_until(lambda: backend.others_waiting(key, True) is None, "the mark to end")
    wait_until(
        lambda: "tierlock-marks" not in {thread.name for thread in threading.enumerate()},
        "the marking thread to end with its last mark",
    )


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_a_release_on_postgresql_answers_the_pollers_marks(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poller's mark lasts while it waits; the release it waited for answers it, so
    the poller that won leaves no mark with the next holder (the marks here would last
    longer than the wait for it, which would end on its own after POLLER_MARK)."""
    monkeypatch.setattr(notify, "POLLER_MARK", procs.WAIT_LIMIT)
    first, second = make_manager(), make_manager()
    lock = first.lock(key)
    assert lock.acquire()
    backend = first._backend
    wait_until(lambda: backend.others_waiting(key, False) is False, "nobody waiting")
    taken, may_release = threading.Event(), threading.Event()

    def wait_then_hold() -> None:
        other = second.lock(key)
        assert other.acquire(timeout=procs.WAIT_LIMIT)
        taken.set()
        may_release.wait(procs.WAIT_LIMIT)
        other.release()

    poller = threading.Thread(target=wait_then_hold)
    poller.start()
    try:
        wait_until(lambda: backend.others_waiting(key, False) is True, "the poller's mark")
        lock.release()
        assert taken.wait(procs.WAIT_LIMIT)
        wait_until(lambda: backend.others_waiting(key, False) is False, "the mark answered")
    finally:
        may_release.set()
        poller.join(procs.WAIT_LIMIT)
