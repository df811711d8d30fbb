"""Fork-safety on SQLite, which runs inside the process: a child forked while the
parent's threads use the database starts cleanly, and SQLite's own waits stay within
an acquire's timeout."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import MakeManager
from polling import wait_until

import tierlock
from tierlock.backends.gate import Gate

SQLITE = pytest.mark.parametrize("db", ["sqlite"], indirect=True)

CHILDREN = 20
THREADS = 4
# How long a child may take to open a manager and take a lock; a hung child never ends.
CHILD_LIMIT = 20.0


def _child(url: str, table: str, number: int) -> int:
    """In a forked child: a new manager, one lock, close. The exit code says how it went."""
    try:
        with (
            tierlock.LockManager(url, table=table, reaper_interval=None) as locks,
            locks.lock(("child", number), timeout=CHILD_LIMIT),
        ):
            pass
    except BaseException:
        return 1
    return 0


@SQLITE
@pytest.mark.multiprocess
def test_children_forked_while_threads_use_sqlite_do_not_hang(db_url: str, table: str) -> None:
    locks = tierlock.LockManager(db_url, table=table, reaper_interval=None, poll_interval=0.01)
    stop = threading.Event()

    def hammer() -> None:
        choose = random.Random()
        while not stop.is_set():
            with locks.lock(("busy", choose.randrange(8)), timeout=CHILD_LIMIT):
                pass

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    wait_until(lambda: locks.stats().releases > 100, "the threads to get going")
    hung, failed = 0, 0
    try:
        for number in range(CHILDREN):
            pid = os.fork()
            if pid == 0:
                os._exit(_child(db_url, table, number))
            deadline = time.monotonic() + CHILD_LIMIT
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
            else:
                failed += os.waitstatus_to_exitcode(done[1]) != 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(CHILD_LIMIT)
        locks.close()
    assert (hung, failed) == (0, 0), f"{hung} children hung and {failed} failed of {CHILDREN}"


def test_fork_waits_for_statements_under_way() -> None:
    """The gate a fork pauses: it waits for the operation under way, and holds new
    ones back until it resumes."""
    gate = Gate()
    gate.enter()
    paused = threading.Event()

    def pause() -> None:
        gate.pause(timeout=5)
        paused.set()

    pauser = threading.Thread(target=pause)
    pauser.start()
    assert not paused.wait(0.2), "paused while an operation was under way"
    gate.leave()
    assert paused.wait(5)
    entered = threading.Event()

    def enter() -> None:
        gate.enter()
        entered.set()

    entrant = threading.Thread(target=enter)
    entrant.start()
    assert not entered.wait(0.2), "an operation began during the pause"
    gate.resume()
    assert entered.wait(5)
    pauser.join(5)
    entrant.join(5)


@SQLITE
def test_sqlite_busy_wait_keeps_within_the_timeout(
    make_manager: MakeManager, db_url: str, key: str
) -> None:
    """Another connection holds SQLite's write lock: an acquire gives up at its timeout
    instead of waiting out SQLite's busy timeout."""
    locks = make_manager()
    assert locks.info(key) is None  # the table exists
    writer = sqlite3.connect(Path(db_url.removeprefix("sqlite:///")), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        lock = locks.lock(key)
        for blocking, timeout, bound in ((True, 0.3, 1.5), (False, -1, 0.5)):
            started = time.monotonic()
            assert not lock.acquire(blocking, timeout)
            took = time.monotonic() - started
            assert took < bound, f"acquire({blocking}, {timeout}) took {took:.2f} s"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert lock.acquire(timeout=5)
    lock.release()
