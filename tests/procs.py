"""What child processes of the multi-process tests run, and the group that ends them.

Children are forked: they start in milliseconds and inherit their arguments (shared
memory, events, pipes, even a ``LockManager``) instead of receiving pickles. Every
child a test starts goes through :class:`Children`, which kills what is left at the
end, so a failing test neither hangs nor leaks processes. ``run_python`` runs a
script or ``-m`` module of this checkout as a separate program, as a user would.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import ForkProcess
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import tierlock

ROOT = Path(__file__).resolve().parent.parent

CTX = multiprocessing.get_context("fork")

# Upper bounds that only a broken lock or a hung child ever reaches; they turn a hang
# into a failure with a message.
WAIT_LIMIT = 30.0
# How long a child that holds a lock waits to be told to release it: long enough for
# any test, short enough that an orphan does not linger.
HOLD_LIMIT = 60.0
# How long a critical section leaves the shared counter between read and write: wide
# enough that overlapping sections lose updates every time, short enough to run fast.
PAUSE = 0.001


def open_manager(url: str, table: str) -> tierlock.LockManager:
    """A child's own manager: no reaper, quick polls."""
    return tierlock.LockManager(url, table=table, reaper_interval=None, poll_interval=0.01)


class Tally:
    """Shared-memory counters, one per key, that lose updates when sections overlap.

    Only the bookkeeping of who is inside a section takes a mutex; the counter itself
    is read, left alone for ``PAUSE`` seconds and written back, so two sections of a
    key that overlap lose an update unless something else keeps them apart.
    """

    def __init__(self, keys: int) -> None:
        self.counters = CTX.RawArray(ctypes.c_longlong, keys)
        self.entries = CTX.RawArray(ctypes.c_longlong, keys)
        self.inside = CTX.RawArray(ctypes.c_longlong, keys)
        self.most_inside = CTX.RawArray(ctypes.c_longlong, keys)
        self._books = CTX.Lock()

    def section(self, index: int) -> None:
        """One critical section on key ``index``: an unprotected read-modify-write."""
        with self._books:
            self.entries[index] += 1
            self.inside[index] += 1
            self.most_inside[index] = max(self.most_inside[index], self.inside[index])
        value = self.counters[index]
        time.sleep(PAUSE)  # widens the race window; it synchronises nothing
        self.counters[index] = value + 1
        with self._books:
            self.inside[index] -= 1


def hammer(
    *,
    url: str | None,
    table: str,
    keys: Sequence[str],
    tally: Tally,
    threads: int,
    sections: int,
    start: Barrier,
) -> None:
    """Run ``threads`` threads that each do ``sections`` critical sections on random keys.

    Each section holds the lock of its key, taken through this process's own manager;
    with ``url=None`` no lock is taken at all (the control). All threads of all
    processes start together at ``start``.
    """
    try:
        manager = None if url is None else open_manager(url, table)
    except BaseException:
        start.abort()  # the other threads fail at once instead of waiting for this process
        raise
    failures: list[str] = []

    def work() -> None:
        try:
            choose = random.Random()  # not the module's: forked children share its state
            start.wait(WAIT_LIMIT)
            for _ in range(sections):
                index = choose.randrange(len(keys))
                if manager is None:
                    tally.section(index)
                else:
                    with manager.lock(keys[index], timeout=WAIT_LIMIT):
                        tally.section(index)
        except BaseException:
            start.abort()
            failures.append(traceback.format_exc())

    workers = [threading.Thread(target=work) for _ in range(threads)]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 2 * WAIT_LIMIT
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
    finally:
        if manager is not None:
            manager.close()
    if any(worker.is_alive() for worker in workers):
        failures.append("a worker thread did not finish")
    if failures:
        raise AssertionError("\n".join(failures))


def hold(*, url: str, table: str, key: str, ttl: float, held: Event, may_release: Event) -> None:
    """Take ``key`` with lease ``ttl``, set ``held``, and release once ``may_release`` is set."""
    with open_manager(url, table) as manager:
        lock = manager.lock(key, ttl=ttl)
        if not lock.acquire(timeout=WAIT_LIMIT):
            raise AssertionError(f"could not take {key!r}")
        held.set()
        may_release.wait(HOLD_LIMIT)
        lock.release()


def report_inherited(
    *,
    manager: tierlock.LockManager,
    lock: tierlock.Lock,
    other_key: str,
    results: Connection[Any, Any],
) -> None:
    """Send back what a forked child sees of ``lock``, which its parent holds.

    Also takes ``other_key`` with the inherited ``manager``, whose connection pool was
    replaced in the child.
    """
    report: dict[str, object] = {"owned": lock.owned(), "token": lock.token}
    try:
        lock.release()
    except Exception as exc:
        report["release"] = type(exc)
    else:
        report["release"] = None
    report["acquire"] = lock.acquire(blocking=False)
    report["locked"] = lock.locked()
    other = manager.lock(other_key)
    report["other_acquire"] = other.acquire(timeout=WAIT_LIMIT)
    other_info = manager.info(other_key)
    report["other_pid"] = None if other_info is None else other_info.pid
    other.release()
    report["other_free_after"] = manager.info(other_key) is None
    results.send(report)


def _run(
    failures: SimpleQueue[str], target: Callable[..., object], arguments: dict[str, Any]
) -> None:
    try:
        target(**arguments)
    except BaseException:
        failures.put(traceback.format_exc())
        raise SystemExit(1) from None


class Children:
    """The forked children of one test."""

    def __init__(self) -> None:
        self.processes: list[ForkProcess] = []
        self._failures: SimpleQueue[str] = CTX.SimpleQueue()

    def start(self, target: Callable[..., object], /, **arguments: Any) -> ForkProcess:
        """Fork a child that runs ``target(**arguments)``; an exception fails :meth:`join`."""
        process = CTX.Process(target=_run, args=(self._failures, target, arguments), daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def join(self, timeout: float = 2 * WAIT_LIMIT) -> None:
        """Wait for every child to end; fail with their tracebacks if one failed or hung."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        failures = []
        while not self._failures.empty():
            failures.append(self._failures.get())
        for process in self.processes:
            if process.is_alive():
                failures.append(f"child {process.pid} still runs after {timeout} s")
            elif process.exitcode != 0:
                failures.append(f"child {process.pid} exited with {process.exitcode}")
        assert not failures, "\n".join(failures)

    def kill_all(self) -> None:
        """Kill the children still running and wait for them; teardown's last word."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(10)


def run_python(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` as a user would, with this checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
