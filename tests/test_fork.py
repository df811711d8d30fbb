"""Fork-safety on SQLite, which runs inside the process: a child forked while the
parent's threads use the database starts cleanly, and SQLite's own waits stay within
an acquire's timeout. And the threads of a new process, which all ask at once for
owner ids, get whole and unique ones."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
import time
from pathlib import Path

import procs
import pytest
from conftest import MakeManager
from polling import wait_until

import tierlock
from tierlock import process, records
from tierlock.backends.gate import Gate
from tierlock.backends.sql.engine import PAUSED_FOR_FORKS

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
            procs.wait_for_ended_threads()
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


@SQLITE
def test_a_forked_child_s_own_forks_wait_for_its_statements(make_manager: MakeManager) -> None:
    """The child's manager starts with a new gate, and its own children's forks must
    pause that one (the parent's gate, paused for the fork, is gone with the fork)."""
    locks = make_manager()
    assert locks.info("anything") is None
    procs.wait_for_ended_threads()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if locks._backend._runner.gate in PAUSED_FOR_FORKS else 1)  # type: ignore[attr-defined]
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


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


def test_threads_first_asking_in_a_process_get_whole_and_unique_owner_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first threads of a process (a forked child's, say) to acquire race to make
    its owner ids; none may see a half-made set, and no id may repeat."""
    identity = process.host_identity()

    def slow_host_identity() -> str | None:
        time.sleep(0.02)  # widens the race
        return identity

    monkeypatch.setattr(process, "host_identity", slow_host_identity)
    monkeypatch.setattr(records, "_ids", records._ProcessIds())  # as in a new process
    start = threading.Barrier(THREADS * 2)
    owners: list[records.Owner] = []
    errors: list[BaseException] = []

    def ask() -> None:
        start.wait()
        try:
            owners.extend(records.Owner.current() for _ in range(100))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(THREADS * 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({owner.owner_id for owner in owners}) == len(owners) == THREADS * 200
    assert {(owner.host_id, owner.pid) for owner in owners} == {(identity, os.getpid())}
    assert {owner.proc_start for owner in owners} == {process.own_start_time()}
