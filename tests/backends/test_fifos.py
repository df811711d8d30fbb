"""Wake-ups on SQLite: FIFOs beside the database file, rung across real processes.

Each child makes its own ``FifoBells`` (or ``LockManager``) on the test's path, as
another program would; events and pipes, not sleeps, say when a child is polling.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import procs
import pytest
from polling import wait_until
from sqlalchemy.engine import make_url

import tierlock
from tierlock.backends.sql.fifos import FifoBells, sqlite_file
from tierlock.stats import Counters

pytestmark = pytest.mark.multiprocess

SQLITE = pytest.mark.parametrize("db", ["sqlite"], indirect=True)
TABLE = "tl_fifos"
# A pause that no test waits out: a waiter back before it was woken.
LONG_PAUSE = 30.0


@pytest.fixture
def database(tmp_path: Path) -> str:
    """A database path; the FIFOs need only the directory beside it."""
    return str(tmp_path / "locks.db")


def _bells(database: str) -> FifoBells:
    return FifoBells(database, TABLE, Counters())


def _fifos(database: str) -> list[str]:
    directory = Path(database + ".tierlock")
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _poll(
    *, database: str, key: str, polling: Event, results: Connection[Any, Any], pause: float
) -> None:
    """Poll ``key`` once for up to ``pause`` seconds; send back (woken, when woken)."""
    bells = _bells(database)
    bell = bells.doorbell(key)
    assert bell is not None
    polling.set()
    woken = bell.wait(pause)
    results.send((woken, time.monotonic()))
    bell.close()
    bells.close()


def _poll_and_die(*, database: str, key: str, polling: Event) -> None:
    bells = _bells(database)
    assert bells.doorbell(key) is not None
    polling.set()
    os.kill(os.getpid(), signal.SIGKILL)  # leaves its FIFO behind


def _poll_until_told(*, database: str, key: str, polling: Event, stop: Event) -> None:
    bells = _bells(database)
    bell = bells.doorbell(key)
    assert bell is not None
    polling.set()
    stop.wait(procs.HOLD_LIMIT)
    bell.close()
    bells.close()


def test_notify_wakes_a_poller_in_another_process(database: str, children: procs.Children) -> None:
    key = f"key:{uuid.uuid4().hex}"
    polling = procs.CTX.Event()
    receiver, sender = procs.CTX.Pipe(duplex=False)
    children.start(
        _poll, database=database, key=key, polling=polling, results=sender, pause=LONG_PAUSE
    )
    assert polling.wait(procs.WAIT_LIMIT)
    notifier = _bells(database)
    rung = time.monotonic()
    assert notifier.notify(key)
    assert receiver.poll(procs.WAIT_LIMIT), "the poller was not woken"
    woken, at = receiver.recv()
    assert woken and at - rung < 2.0  # against a pause of LONG_PAUSE
    children.join()
    assert _fifos(database) == []  # its poller's close() removed it
    assert not notifier.notify(key)  # nobody polls now


def test_notify_removes_the_fifo_of_a_dead_process(database: str, children: procs.Children) -> None:
    key = f"key:{uuid.uuid4().hex}"
    polling = procs.CTX.Event()
    child = children.start(_poll_and_die, database=database, key=key, polling=polling)
    assert polling.wait(procs.WAIT_LIMIT)
    child.join(procs.WAIT_LIMIT)
    assert child.exitcode == -signal.SIGKILL
    (stale,) = _fifos(database)
    assert f".{child.pid}." in stale
    notifier = _bells(database)
    assert not notifier.waiting(key)  # a FIFO with no reader is nobody waiting...
    assert not notifier.notify(key)
    assert _fifos(database) == []  # ...and gets removed


def test_waiting_tells_whether_another_process_polls_the_key(
    database: str, children: procs.Children
) -> None:
    key, other_key = f"key:{uuid.uuid4().hex}", f"key:{uuid.uuid4().hex}"
    bells = _bells(database)
    assert not bells.waiting(key)  # no directory yet
    polling, stop = procs.CTX.Event(), procs.CTX.Event()
    children.start(_poll_until_told, database=database, key=key, polling=polling, stop=stop)
    assert polling.wait(procs.WAIT_LIMIT)
    assert bells.waiting(key)
    assert not bells.waiting(other_key)
    own = bells.doorbell(other_key)  # this process's own poller is not "another"
    assert own is not None
    assert not bells.waiting(other_key)
    own.close()
    stop.set()
    children.join()
    assert not bells.waiting(key)


def test_notify_wakes_the_longest_waiting_poller_first(database: str) -> None:
    key = f"key:{uuid.uuid4().hex}"
    first, second = _bells(database), _bells(database)  # two managers: "other" to all
    older = first.doorbell(key)
    newer = second.doorbell(key)
    assert older is not None and newer is not None
    notifier = _bells(database)
    assert notifier.notify(key)
    assert older.wait(0) and not newer.wait(0)
    older.close()  # done: it won the key
    assert notifier.notify(key)
    assert newer.wait(0)
    newer.close()


def test_close_removes_own_fifos_and_wakes_their_pollers(database: str) -> None:
    key = f"key:{uuid.uuid4().hex}"
    bells = _bells(database)
    bell = bells.doorbell(key)
    assert bell is not None and len(_fifos(database)) == 1
    woken = threading.Event()

    def wait() -> None:
        bell.wait(LONG_PAUSE)
        woken.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    bells.close()
    assert woken.wait(procs.WAIT_LIMIT), "close() did not cut the pause short"
    waiter.join(procs.WAIT_LIMIT)
    assert _fifos(database) == []
    bell.close()
    assert bells.doorbell(key) is None  # closed: pollers just sleep


def _fork_and_close(bells: FifoBells, bell: Any) -> int:
    """Fork a child that forgets, closes and exits as a manager's fork hook would."""
    procs.wait_for_ended_threads()
    pid = os.fork()
    if pid == 0:
        try:
            bells.forget()
            bell.close()  # a poller the parent had: the child must not remove its FIFO
            bells.close()
        finally:
            os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_child_leaves_the_parents_fifos(database: str) -> None:
    key = f"key:{uuid.uuid4().hex}"
    bells = _bells(database)
    bell = bells.doorbell(key)
    assert bell is not None
    before = _fifos(database)
    assert _fork_and_close(bells, bell) == 0
    assert _fifos(database) == before
    notifier = _bells(database)
    assert notifier.notify(key) and bell.wait(0)  # still rung, still read here
    bell.close()
    assert _fifos(database) == []


def test_database_file_of_a_url() -> None:
    assert sqlite_file(make_url("sqlite:///locks.db")) == "locks.db"
    assert sqlite_file(make_url("sqlite:////tmp/x/locks.db")) == "/tmp/x/locks.db"
    uri = make_url("sqlite:///file:/tmp/a%20b.db?mode=rwc&uri=true")
    assert sqlite_file(uri) == "/tmp/a b.db"
    assert sqlite_file(make_url("sqlite://")) is None
    assert sqlite_file(make_url("sqlite:///file:x?mode=memory&uri=true")) is None


# -- through the manager ------------------------------------------------------------------


def _take_after_release(
    *, url: str, table: str, key: str, polling: Event, results: Connection[Any, Any]
) -> None:
    """Wait for ``key`` with a long poll interval; set ``polling`` once past the first,
    short pause; send back when the key was won."""
    with tierlock.LockManager(
        url, table=table, reaper_interval=None, poll_interval=LONG_PAUSE
    ) as manager:
        lock = manager.lock(key)

        def take() -> None:
            assert lock.acquire(timeout=procs.WAIT_LIMIT)
            results.send(time.monotonic())
            lock.release()

        taker = threading.Thread(target=take)
        taker.start()
        # Two tries missed: the next pause is the poll interval (a release after the
        # second try rings the FIFO all the same).
        wait_until(lambda: manager.stats().insert_conflicts >= 2, "two tries")
        polling.set()
        taker.join(procs.WAIT_LIMIT)


@SQLITE
def test_a_release_wakes_a_waiter_of_another_process_at_once(
    manager: tierlock.LockManager, db_url: str, table: str, key: str, children: procs.Children
) -> None:
    lock = manager.lock(key)
    assert lock.acquire()
    polling = procs.CTX.Event()
    receiver, sender = procs.CTX.Pipe(duplex=False)
    children.start(
        _take_after_release, url=db_url, table=table, key=key, polling=polling, results=sender
    )
    assert polling.wait(procs.WAIT_LIMIT)
    assert manager._backend.others_waiting(key, False)
    released = time.monotonic()
    lock.release()
    assert receiver.poll(procs.WAIT_LIMIT)
    assert receiver.recv() - released < 2.0  # against a poll interval of LONG_PAUSE
    children.join()
    assert manager.stats().wakeups == 1


def test_a_fifo_made_after_a_kept_listing_is_found(database: str) -> None:
    """A releasing process keeps its listing of the directory while the directory's
    mtime stays put; a poller that comes later changes the mtime, and is found."""
    releasing, polling = _bells(database), _bells(database)
    key, other = "k", "other"
    first = polling.doorbell(other)  # makes the directory
    assert first is not None
    directory = database + ".tierlock"
    long_ago = time.time_ns() - 10**9
    os.utime(directory, ns=(long_ago, long_ago))  # settled: the listing is kept
    for _ in range(2):
        assert releasing.waiting(other)
        assert not releasing.waiting(key)
    bell = polling.doorbell(key)
    assert bell is not None
    assert releasing.waiting(key)
    assert releasing.notify(key)
    assert bell.wait(0)
    for each in (bell, first):
        each.close()
    assert not releasing.waiting(key)
    for bells in (releasing, polling):
        bells.close()


# -- want marks: a try without waiting leaves no FIFO ---------------------------------


def _mark(*, database: str, key: str) -> None:
    _bells(database).want(key, LONG_PAUSE)  # (not closed: a process that just exits)


def test_a_want_mark_shows_to_other_processes_and_goes_with_its_manager(
    database: str, children: procs.Children
) -> None:
    """A mark written by another process shows in ``waiting``; one's own does not, and
    ``close`` removes it. A mark is never taken for a FIFO to ring."""
    key = f"key:{uuid.uuid4().hex}"
    children.start(_mark, database=database, key=key)
    children.join()
    holding, marking = _bells(database), _bells(database)
    assert holding.waiting(key)  # the child's
    assert not holding.notify(key)  # nobody polls
    marking.want(key, LONG_PAUSE)  # overwrites the child's: the key stays wanted
    assert holding.waiting(key)
    assert not marking.waiting(key)  # its own
    marking.close()
    assert not holding.waiting(key)
    assert _fifos(database) == []
    holding.close()


def test_a_mark_long_past_goes_and_one_too_far_ahead_is_ignored(database: str) -> None:
    """A mark that ended long ago is removed by its reader; one that would end an hour
    from now was written before the host last booted (the monotonic clock began
    again), and says nothing."""
    key = f"key:{uuid.uuid4().hex}"
    holding, marking = _bells(database), _bells(database)
    marking.want(key, -2.0)  # ended two seconds ago
    assert _fifos(database) != []
    assert not holding.waiting(key)
    assert _fifos(database) == []
    marking.want(key, 3600.0)
    assert not holding.waiting(key)
    for bells in (holding, marking):
        bells.close()
