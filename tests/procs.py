"""What child processes of the multi-process tests run, and the group that ends them.

Children are forked: they start in milliseconds and inherit their arguments (shared
memory, events, pipes, even a ``LockManager``) instead of receiving pickles. Every
child a test starts goes through :class:`Children`, which kills what is left at the
end, so a failing test neither hangs nor leaks processes. ``run_python`` runs a
script or ``-m`` module of this checkout as a separate program, as a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import datetime
import itertools
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkProcess
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

from polling import wait_until
from sqlalchemy.pool.base import _ConnectionFairy

import tierlock
from tierlock.urls import engine_of

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
# A critical section of take_turns, busy (it holds the interpreter, as real work does).
SECTION = 100e-6


# The native ids of the threads Python started in this process since this module was
# imported (each notes its own as it starts), as opposed to threads of C libraries
# (a BLAS pool, say), which live on and never touch OpenSSL's locks.
_python_threads: set[int] = set()


def _note_thread(*_: object) -> None:
    _python_threads.add(threading.get_native_id())
    sys.setprofile(None)  # (this once only: the hook costs nothing afterwards)


threading.setprofile(_note_thread)


def wait_for_ended_threads() -> None:
    """Before a fork: wait until every thread that Python started and joined is gone.

    A thread that ``join()`` already returned from still runs its exit handlers for a
    moment, OpenSSL's among them (pymysql makes an SSL context for each connection),
    which hold OpenSSL's global lock: a child forked then inherits the lock held, and
    hangs at its first connect.
    """

    def only_live_ones() -> bool:
        tasks = {int(task) for task in os.listdir("/proc/self/task")}
        _python_threads.intersection_update(tasks)
        alive = {thread.native_id for thread in threading.enumerate()}
        return _python_threads <= alive

    wait_until(only_live_ones, "ended threads to exit", limit=WAIT_LIMIT)


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
        self._enter(index)
        value = self.counters[index]
        time.sleep(PAUSE)  # widens the race window; it synchronises nothing
        self.counters[index] = value + 1
        self._leave(index)

    async def asection(self, index: int) -> None:
        """``section`` for a task: the pause lets the loop run other tasks meanwhile."""
        self._enter(index)
        value = self.counters[index]
        await asyncio.sleep(PAUSE)
        self.counters[index] = value + 1
        self._leave(index)

    def _enter(self, index: int) -> None:
        with self._books:
            self.entries[index] += 1
            self.inside[index] += 1
            self.most_inside[index] = max(self.most_inside[index], self.inside[index])

    def _leave(self, index: int) -> None:
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


def ahammer(
    *,
    url: str,
    table: str,
    keys: Sequence[str],
    tally: Tally,
    tasks: int,
    sections: int,
    start: Barrier,
) -> None:
    """``hammer`` with ``tasks`` asyncio tasks of one ``AsyncLockManager``."""
    from tierlock.aio import AsyncLockManager

    async def main() -> None:
        async with AsyncLockManager(
            url, table=table, reaper_interval=None, poll_interval=0.01
        ) as locks:

            async def work() -> None:
                choose = random.Random()
                for _ in range(sections):
                    index = choose.randrange(len(keys))
                    async with locks.lock(keys[index], timeout=WAIT_LIMIT):
                        await tally.asection(index)

            await asyncio.to_thread(start.wait, WAIT_LIMIT)
            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(tasks))), HOLD_LIMIT)

    try:
        asyncio.run(main())
    except BaseException:
        start.abort()
        raise


def ahold(
    *,
    url: str,
    table: str,
    key: str,
    ttl: float,
    held: Event,
    resumed: Event,
    results: Connection[Any, Any],
) -> None:
    """``hold_through_a_stop`` for a task of an ``AsyncLockManager``, with a coroutine
    ``on_lost``: take ``key``, set ``held``, and once ``resumed`` is set (the parent may
    have stopped or killed this process meanwhile) send back what it learnt."""
    from tierlock.aio import AsyncLockManager

    async def main() -> dict[str, Any]:
        calls: list[tuple[str, int]] = []
        told = asyncio.Event()

        async def on_lost(lost_key: str, token: int) -> None:
            calls.append((lost_key, token))
            told.set()

        async with AsyncLockManager(
            url, table=table, reaper_interval=None, on_lost=on_lost
        ) as locks:
            lock = locks.lock(key, ttl=ttl)
            if not await lock.acquire(timeout=WAIT_LIMIT):
                raise AssertionError(f"could not take {key!r}")
            token = lock.token
            held.set()
            await asyncio.to_thread(resumed.wait, HOLD_LIMIT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(told.wait(), WAIT_LIMIT)
            report: dict[str, Any] = {"token": token, "told": told.is_set(), "calls": calls}
            report["owned"] = lock.owned()
            try:
                await lock.release()
                report["raised"] = None
            except tierlock.LockError as exc:
                report["raised"] = type(exc).__name__
            return report

    results.send(asyncio.run(main()))


def take_turns(
    *,
    url: str,
    table: str,
    key: str,
    threads: int,
    first: int,
    served: Any,
    start: Barrier,
    stop: Event,
) -> None:
    """Run ``threads`` threads that take ``key`` in turn, each for a short section, until
    ``stop``; thread ``i`` counts its sections in ``served[first + i]``."""
    manager = open_manager(url, table)
    failures: list[str] = []

    def work(slot: int) -> None:
        try:
            lock = manager.lock(key, timeout=WAIT_LIMIT)
            start.wait(WAIT_LIMIT)
            while not stop.is_set():
                with lock:
                    until = time.perf_counter() + SECTION
                    while time.perf_counter() < until:
                        pass
                served[slot] += 1
        except BaseException:
            start.abort()
            failures.append(traceback.format_exc())

    workers = [threading.Thread(target=work, args=(first + n,)) for n in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(2 * WAIT_LIMIT)
    finally:
        manager.close()
    if failures:
        raise AssertionError("\n".join(failures))


def hold(
    *,
    url: str,
    table: str,
    key: str,
    ttl: float,
    held: Event,
    may_release: Event,
    host_id: str | None = None,
) -> None:
    """Take ``key`` with lease ``ttl``, set ``held``, and release once ``may_release`` is
    set. With ``host_id``, the row names that host identity, as if the child ran on
    another host (whose processes a waiter here cannot see)."""
    if host_id is not None:
        tierlock.process.host_identity = lambda: host_id  # type: ignore[assignment]
    with open_manager(url, table) as manager:
        lock = manager.lock(key, ttl=ttl)
        if not lock.acquire(timeout=WAIT_LIMIT):
            raise AssertionError(f"could not take {key!r}")
        held.set()
        may_release.wait(HOLD_LIMIT)
        lock.release()


def start_holder(
    children: Children,
    db_url: str,
    table: str,
    key: str,
    *,
    ttl: float,
    host_id: str | None = None,
) -> tuple[ForkProcess, Event]:
    """Start a child that takes ``key`` with lease ``ttl`` (as if on host ``host_id``, if
    given); return it once it holds, and the event that lets it release."""
    held, may_release = CTX.Event(), CTX.Event()
    holder = children.start(
        hold,
        url=db_url,
        table=table,
        key=key,
        ttl=ttl,
        held=held,
        may_release=may_release,
        host_id=host_id,
    )
    assert held.wait(WAIT_LIMIT)
    return holder, may_release


def hold_through_a_stop(
    *,
    url: str,
    table: str,
    key: str,
    ttl: float,
    held: Event,
    resumed: Event,
    results: Connection[Any, Any],
) -> None:
    """Take ``key`` with a renewed lease ``ttl`` and set ``held``; the parent then stops
    this process past the lease, and sets ``resumed`` once it has continued it. Send
    back what this process learnt: the ``on_lost`` call and what ``release`` raised."""
    lost_calls: list[tuple[str, int]] = []
    lost = threading.Event()

    def on_lost(lost_key: str, token: int) -> None:
        lost_calls.append((lost_key, token))
        lost.set()

    with open_manager(url, table) as manager:
        lock = manager.lock(key, ttl=ttl, on_lost=on_lost)
        if not lock.acquire(timeout=WAIT_LIMIT):
            raise AssertionError(f"could not take {key!r}")
        token = lock.token
        held.set()
        resumed.wait(HOLD_LIMIT)
        told = lost.wait(WAIT_LIMIT)
        owned = lock.owned()
        try:
            lock.release()
            raised = None
        except tierlock.LockError as exc:
            raised = type(exc).__name__
        results.send(
            {"token": token, "told": told, "calls": lost_calls, "owned": owned, "raised": raised}
        )


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


def process_state(pid: int) -> str:
    """Process ``pid``'s state letter, as ``/proc`` shows it (``T``: stopped by a
    signal, ``Z``: a zombie)."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        return file.read().rsplit(b")", 1)[1].split()[0].decode()


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
        wait_for_ended_threads()
        process.start()
        self.processes.append(process)
        return process

    def join(self, timeout: float = 2 * WAIT_LIMIT) -> None:
        """Wait for every child to end; fail with their tracebacks if one failed or hung."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        failures = self.failures()
        for process in self.processes:
            if process.is_alive():
                failures.append(f"child {process.pid} still runs after {timeout} s")
            elif process.exitcode != 0:
                failures.append(f"child {process.pid} exited with {process.exitcode}")
        assert not failures, "\n".join(failures)

    def failures(self) -> list[str]:
        """The tracebacks of children that failed since the last call."""
        failures = []
        while not self._failures.empty():
            failures.append(self._failures.get())
        return failures

    def forget(self, process: ForkProcess) -> None:
        """Drop an ended child and free what it holds: a long run starts thousands."""
        self.processes.remove(process)
        process.close()

    def kill_all(self) -> None:
        """Kill the children still running and wait for them; teardown's last word."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(10)


def run_python(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` as a user would, with this checkout (and the tests' helpers,
    for a test module run as a script) importable."""
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- a load whose workers get killed -------------------------------------------------

# Where a doomed worker kills itself with SIGKILL: right after its INSERT committed
# (before acquire() returns), inside the critical section, and on either side of the
# DELETE of its release. The supervisor also kills workers at random moments.
DOOMS = ("after insert", "in section", "before delete", "after delete")
AT_RANDOM = "at random"
# How far apart the supervisor's random kills are, in seconds. It kills only workers
# without a doom, so that every doom is reached in a short run too.
RANDOM_KILL_GAP = (0.3, 1.2)
# How many sections a doomed worker thread completes before it dies.
DOOM_AFTER = (1, 10)
# How far apart the supervisor asks a worker to stop itself (SIGSTOP) while it holds a
# key, in seconds, and for how many leases it is left stopped before SIGCONT.
STOP_GAP = (1.0, 3.0)
STOP_LEASES = 1.5
# Room for a loaded machine in the bounds the load checks.
SLACK = 3.0


class Ledger:
    """Shared-memory books of a killing load, written so that a SIGKILL anywhere
    leaves them consistent.

    No cross-process mutex is taken (a killed holder would keep it for good): every
    field has one writer. Per worker thread (a *slot*): the key it works on,
    the key whose section it is inside, its counts. Per key: a counter that a section
    reads, sleeps on and writes back, and the highest fencing token seen in a section;
    a section that finds another slot inside its key or the counter changed under it
    counts an overlap, and one whose token is not above the last a stale token. The
    supervisor alone writes ``killed_at``; a slot's first acquire of that key after the
    kill is ``first_after``.
    """

    def __init__(self, keys: int, processes: int, threads: int) -> None:
        self.keys = keys
        self.threads = threads
        self.slots = slots = processes * threads
        self.stopping = CTX.RawValue(ctypes.c_int, 0)
        self.working_on = CTX.RawArray(ctypes.c_longlong, [-1] * slots)
        self.inside = CTX.RawArray(ctypes.c_longlong, [-1] * slots)
        self.sections = CTX.RawArray(ctypes.c_longlong, slots)
        self.overlaps = CTX.RawArray(ctypes.c_longlong, slots)
        self.stale_tokens = CTX.RawArray(ctypes.c_longlong, slots)
        self.lost = CTX.RawArray(ctypes.c_longlong, slots)
        self.outlived = CTX.RawArray(ctypes.c_longlong, slots)  # sections past the lease
        # What a section found at its first overlap: its token, the slot inside, that
        # slot's token, and the pids of both (for the summary).
        self.token_of = CTX.RawArray(ctypes.c_longlong, slots)
        self.pid_of = CTX.RawArray(ctypes.c_longlong, slots)
        self.first_overlap = CTX.RawArray(ctypes.c_longlong, [-1] * 5)
        self.errors = CTX.RawArray(ctypes.c_longlong, slots)
        self.slowest_error = CTX.RawArray(ctypes.c_double, slots)
        # Set for every slot of a process once it is sent SIGKILL: a process that takes
        # a while to die (a thread in a slow fsync) can never run its section on.
        self.dying = CTX.RawArray(ctypes.c_int, slots)
        self.dying_at = CTX.RawArray(ctypes.c_double, slots)
        self.doomed_at = CTX.RawArray(ctypes.c_int, [-1] * slots)  # index into DOOMS
        # Per process: the supervisor asks it to stop itself while it holds a key; it
        # says when it did, and the supervisor continues it some leases later.
        self.stop_request = CTX.RawArray(ctypes.c_int, processes)
        self.stopped_at = CTX.RawArray(ctypes.c_double, processes)
        self.counters = CTX.RawArray(ctypes.c_longlong, keys)
        self.highest_token = CTX.RawArray(ctypes.c_longlong, keys)
        self.killed_at = CTX.RawArray(ctypes.c_double, keys)
        self.seen_kill = CTX.RawArray(ctypes.c_double, slots * keys)
        self.first_after = CTX.RawArray(ctypes.c_double, slots * keys)

    def acquired(self, slot: int, key: int) -> None:
        killed_at = self.killed_at[key]
        cell = slot * self.keys + key
        if killed_at and self.seen_kill[cell] != killed_at:
            self.first_after[cell] = time.monotonic()  # written before seen_kill
            self.seen_kill[cell] = killed_at

    def process_slots(self, slot: int) -> range:
        first = slot - slot % self.threads
        return range(first, first + self.threads)

    def _others_inside(self, slot: int, key: int) -> bool:
        for other in range(self.slots):
            if other != slot and self.inside[other] == key and not self.dying[other]:
                if self.first_overlap[0] < 0:
                    note = (self.token_of[slot], other, self.token_of[other])
                    self.first_overlap[1:5] = [*note, self.pid_of[other]]
                    self.first_overlap[0] = slot
                return True
        return False

    def overlap_note(self) -> str:
        slot, token, other, other_token, other_pid = self.first_overlap
        if slot < 0:
            return "none"
        return (
            f"slot {slot} (pid {self.pid_of[slot]}) with token {token} found slot "
            f"{other} (pid {other_pid}) inside with token {other_token}"
        )

    def section(self, slot: int, key: int, token: int, *, die: bool) -> None:
        """One critical section of ``slot`` on ``key``, which it holds with ``token``."""
        self.token_of[slot], self.pid_of[slot] = token, os.getpid()
        self.inside[slot] = key
        if self._others_inside(slot, key):
            self.overlaps[slot] += 1
        if token <= self.highest_token[key]:
            self.stale_tokens[slot] += 1
        self.highest_token[key] = token
        value = self.counters[key]
        time.sleep(PAUSE)  # widens the race window; it synchronises nothing
        if die:
            _die(self, slot, "in section")
        if self._others_inside(slot, key) or self.counters[key] != value:
            self.overlaps[slot] += 1
        self.counters[key] = value + 1
        self.inside[slot] = -1
        self.sections[slot] += 1


def _die(ledger: Ledger, slot: int, doom: str) -> None:
    ledger.dying_at[slot] = time.monotonic()
    ledger.doomed_at[slot] = DOOMS.index(doom)
    for own in ledger.process_slots(slot):
        ledger.dying[own] = 1
    os.kill(os.getpid(), signal.SIGKILL)


_plan = threading.local()  # what a doomed thread dies at: .doom, .key, .slot, .ledger


def _die_at(when: str, verb: str | None, succeeded: bool) -> None:
    """Kill this process if its doomed thread just reached its point of a hold: after a
    write that took the key, before the one that frees it, or after that one freed it."""
    doom: str | None = getattr(_plan, "doom", None)
    if doom is None:
        return
    point = (doom, when, verb)
    if point == ("before delete", "before", "DELETE") or (
        point in {("after insert", "after", "INSERT"), ("after delete", "after", "DELETE")}
        and succeeded
    ):
        _die(_plan.ledger, _plan.slot, doom)


def _die_at_statement(when: str, statement: str, parameters: object, rowcount: int) -> None:
    """``_die_at`` an SQL INSERT or DELETE of the doomed thread's key."""
    if getattr(_plan, "doom", None) is None:
        return
    values = parameters.values() if isinstance(parameters, dict) else parameters
    if not isinstance(values, Iterable) or _plan.key not in values:
        return
    # PostgreSQL's release is a DELETE inside a WITH that also sends a NOTIFY.
    verb = next((verb for verb in ("INSERT", "DELETE") if verb in statement.upper()), None)
    _die_at(when, verb, rowcount == 1)


def _hook_backend(backend: Any) -> None:
    """``_die_at`` the backend's takes and releases of the doomed thread's key: engines
    other than SQL, whose requests are not statements."""
    take, free = backend.try_acquire, backend.release

    def try_acquire(key: str, *args: Any, **kwargs: Any) -> int | None:
        token: int | None = take(key, *args, **kwargs)
        if key == getattr(_plan, "key", None):
            _die_at("after", "INSERT", token is not None)
        return token

    def release(key: str, *args: Any, **kwargs: Any) -> bool:
        doomed = key == getattr(_plan, "key", None)
        if doomed:
            _die_at("before", "DELETE", True)
        freed: bool = free(key, *args, **kwargs)
        if doomed:
            _die_at("after", "DELETE", freed)
        return freed

    backend.try_acquire, backend.release = try_acquire, release


class _WatchedCursor:
    """A driver cursor that calls ``_die_at_statement`` around each statement."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, statement: str, *parameters: Any) -> Any:
        _die_at_statement("before", statement, parameters[0] if parameters else None, -1)
        result = self._cursor.execute(statement, *parameters)
        rowcount: int = self._cursor.rowcount
        _die_at_statement("after", statement, parameters[0] if parameters else None, rowcount)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def _install_doom_hooks(url: str, manager: tierlock.LockManager) -> None:
    """Watch every statement this (child) process sends through a connection pool,
    whichever way it is sent (see ``_die_at_statement``); on other engines, the
    manager's backend."""
    if engine_of(url) != "sql":
        _hook_backend(manager._backend)
        return
    cursor = _ConnectionFairy.cursor

    def watched_cursor(self: _ConnectionFairy, *args: Any, **kwargs: Any) -> Any:
        return _WatchedCursor(cursor(self, *args, **kwargs))

    setattr(_ConnectionFairy, "cursor", watched_cursor)  # noqa: B010 (mypy: method)


class _StopGate:
    """Stops a worker process with SIGSTOP while it holds a key, when the supervisor
    asks. The process's other threads hold still outside their sections meanwhile: a
    thread stopped inside a section past its lease would overlap its successor, which
    no lock can prevent (fencing tokens are what guard such writes)."""

    def __init__(self, ledger: Ledger, process: int) -> None:
        self._ledger = ledger
        self._process = process
        self._changed = threading.Condition()
        self._stopping = False
        self._in_sections = 0

    def stop_if_asked(self) -> None:
        """Stop this process if asked, once no thread of it is inside a section; the
        supervisor continues it some leases later."""
        ledger, process = self._ledger, self._process
        with self._changed:
            if not ledger.stop_request[process] or self._stopping:
                return
            ledger.stop_request[process] = 0
            self._stopping = True
            while self._in_sections:
                self._changed.wait()
        ledger.stopped_at[process] = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)
        # The stop may reach this thread a moment after the call returns (another thread
        # can take the signal): the gate stays shut until the supervisor has continued
        # the process, which it marks by clearing stopped_at.
        while ledger.stopped_at[process]:
            time.sleep(0.001)
        with self._changed:
            self._stopping = False
            self._changed.notify_all()

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        with self._changed:
            while self._stopping:
                self._changed.wait()
            self._in_sections += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_sections -= 1
                self._changed.notify_all()


def _take(manager: tierlock.LockManager, lock: tierlock.Lock, *, trying: bool) -> bool:
    """Acquire ``lock``: with one try without waiting if ``trying`` (``False``: it
    failed), else waiting for it."""
    if trying:
        return lock.acquire(blocking=False)
    if not lock.acquire(timeout=WAIT_LIMIT):
        held = _who_holds(manager, lock.key)
        raise AssertionError(f"{lock.key!r} not acquired in {WAIT_LIMIT:g} s: {held}")
    return True


def _who_holds(manager: tierlock.LockManager, key: str) -> str:
    """What holds ``key``, and the state of that holder's process, for a report."""
    try:
        info = manager.info(key)
    except tierlock.LockError as exc:
        return f"its holder could not be read ({exc!r})"
    if info is None:
        return "nothing holds it now"
    try:
        state = process_state(info.pid)
    except OSError:
        state = "gone"
    return f"held by {info} (process state {state}; now {datetime.datetime.now(datetime.UTC)})"


def churn(
    *,
    url: str,
    table: str,
    keys: Sequence[str],
    ledger: Ledger,
    first_slot: int,
    ttl: float,
    doom: str | None = None,
    database_timeout: float = 20.0,
) -> None:
    """``ledger.threads`` threads that take random keys and do sections until
    ``ledger.stopping``.

    Half the holds not doomed begin with a try without waiting, and are skipped if it
    fails (tier 1's refusals, kept holds and the memory of keys held elsewhere at work).
    With ``doom``, the first thread kills this process at that point of a hold after a
    few sections. A hold lost to an expired lease counts in ``ledger.lost``; a
    ``BackendError`` counts in ``ledger.errors``, with the longest a call took to raise
    it in ``ledger.slowest_error``, and the thread goes on.
    """
    gate = _StopGate(ledger, first_slot // ledger.threads)
    manager = tierlock.LockManager(
        url,
        table=table,
        reaper_interval=None,
        poll_interval=0.01,
        database_timeout=database_timeout,
    )
    _install_doom_hooks(url, manager)
    failures: list[str] = []

    def hold_once(slot: int, key: int, dies: bool, trying: bool) -> None:
        ledger.working_on[slot] = key
        lock = manager.lock(keys[key], ttl=ttl)
        _plan.key, _plan.slot, _plan.ledger = keys[key], slot, ledger
        _plan.doom = doom if dies and doom == "after insert" else None
        if not _take(manager, lock, trying=trying and not dies):
            return
        ledger.acquired(slot, key)
        gate.stop_if_asked()
        with gate.section():
            # A hold whose process was stopped past its lease is no longer owned: the
            # section is skipped, and the release tells whether the row was taken.
            if lock.owned():
                assert lock.token is not None
                ledger.section(slot, key, lock.token, die=dies and doom == "in section")
                if not lock.owned():  # its renewal came too late (a starved process)
                    ledger.outlived[slot] += 1
        _plan.doom = doom if dies and doom in ("before delete", "after delete") else None
        try:
            lock.release()
        except tierlock.LockLostError:
            ledger.lost[slot] += 1

    def work(slot: int) -> None:
        choose = random.Random()
        doomed_after = choose.randint(*DOOM_AFTER) if doom and slot == first_slot else -1
        try:
            while not ledger.stopping.value:
                began = time.monotonic()
                try:
                    hold_once(
                        slot,
                        choose.randrange(len(keys)),
                        doomed_after >= 0 and ledger.sections[slot] >= doomed_after,
                        choose.random() < 0.5,
                    )
                except tierlock.BackendError:
                    ledger.errors[slot] += 1
                    took = time.monotonic() - began
                    ledger.slowest_error[slot] = max(ledger.slowest_error[slot], took)
                _plan.doom = None
                ledger.working_on[slot] = -1
        except BaseException:
            failures.append(traceback.format_exc())

    workers = [
        threading.Thread(target=work, args=(slot,))
        for slot in range(first_slot, first_slot + ledger.threads)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        manager.close()
    if failures:
        raise AssertionError("\n".join(failures))


@dataclasses.dataclass
class KillReport:
    """What a killing load did; ``violations`` must be 0."""

    seconds: float
    sections: int = 0
    kills: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys((*DOOMS, AT_RANDOM), 0)
    )
    overlaps: int = 0  # sections of a key that overlapped (seen from either side)
    stale_tokens: int = 0  # holds whose token was not above the key's last one
    stops: int = 0  # workers stopped (SIGSTOP) while holding, past their leases
    lost_holds: int = 0
    outlived: int = 0  # sections whose lease could not be confirmed by their end
    first_overlap: str = "none"
    backend_errors: int = 0
    # From a kill to the next successful acquire of a key the victim worked on (or,
    # for kills near the end, to when the reaper had emptied the table).
    longest_blocked: float = 0.0
    # From the end of the load until the table was empty.
    emptied_after: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.overlaps + self.stale_tokens

    def summary(self) -> str:
        kills = ", ".join(f"{count} {doom}" for doom, count in self.kills.items())
        return "\n".join(
            [
                f"ran for {self.seconds:.1f} s",
                f"critical sections: {self.sections}",
                f"kills: {sum(self.kills.values())} ({kills})",
                f"violations: {self.violations} ({self.overlaps} overlapping sections, "
                f"{self.stale_tokens} tokens not above the last)",
                f"first overlap: {self.first_overlap}",
                f"workers stopped while holding, past their leases: {self.stops}",
                f"holds lost to an expired lease: {self.lost_holds}",
                f"sections that outlived their lease's last renewal: {self.outlived}",
                f"backend errors: {self.backend_errors}",
                f"longest a key stayed blocked after its holder died: {self.longest_blocked:.2f} s",
                f"table empty {self.emptied_after:.2f} s after the load stopped",
                f"worker failures: {len(self.failures)}",
                *self.failures,
            ]
        )


class KillingLoad:
    """``processes`` forked workers of ``threads`` threads each on ``keys`` keys, killed
    with SIGKILL at every point of a hold and restarted; see :meth:`run`."""

    def __init__(
        self,
        url: str,
        table: str,
        *,
        keys: int = 3,
        processes: int = 4,
        threads: int = 2,
        ttl: float = 1.0,
        reaper_interval: float = 0.5,
        stops: bool = True,
    ) -> None:
        self.url = url
        self.stops = stops
        self.table = table
        self.keys = [f"kill:{uuid.uuid4().hex}:{n}" for n in range(keys)]
        self.processes = processes
        self.threads = threads
        self.ttl = ttl
        self.reaper_interval = reaper_interval
        self.ledger = Ledger(keys, processes, threads)
        self.children = Children()
        self._choose = random.Random()
        self._dooms = itertools.cycle((*DOOMS, None, None))
        self._live: dict[int, ForkProcess] = {}
        self._dooms_of: dict[int, str | None] = {}

    def run(self, seconds: float) -> KillReport:
        """Run the load for ``seconds`` and on until every doom has struck (a loaded
        machine may need longer), stop it, wait for the table to empty (the reaper runs
        every ``reaper_interval``) and take every key once more."""
        report = KillReport(seconds)
        began = time.monotonic()
        with tierlock.LockManager(
            self.url, table=self.table, reaper_interval=self.reaper_interval
        ) as manager:
            try:
                for index in range(self.processes):
                    self._start(index)
                self._supervise(report, began + seconds)
                self.ledger.stopping.value = 1
                self._wait_for_workers(report)
                stopped = time.monotonic()
                self._wait_until_empty(manager, report, stopped)
                self._take_every_key(manager, report)
            finally:
                self.children.kill_all()
        ledger = self.ledger
        report.seconds = time.monotonic() - began
        report.sections = sum(ledger.sections)
        report.overlaps = sum(ledger.overlaps)
        report.stale_tokens = sum(ledger.stale_tokens)
        report.lost_holds = sum(ledger.lost)
        report.outlived = sum(ledger.outlived)
        report.first_overlap = ledger.overlap_note()
        report.backend_errors = sum(ledger.errors)
        report.failures += self.children.failures()
        return report

    def _start(self, index: int) -> None:
        self._dooms_of[index] = doom = next(self._dooms)
        self._live[index] = self.children.start(
            churn,
            url=self.url,
            table=self.table,
            keys=self.keys,
            ledger=self.ledger,
            first_slot=index * self.threads,
            ttl=self.ttl,
            doom=doom,
        )

    def _supervise(self, report: KillReport, until: float) -> None:
        next_kill = time.monotonic() + self._choose.uniform(*RANDOM_KILL_GAP)
        next_stop = time.monotonic() + self._choose.uniform(*STOP_GAP)
        give_up = until + WAIT_LIMIT
        while (now := time.monotonic()) < give_up and (
            now < until
            or not all(report.kills[doom] for doom in DOOMS)
            or (self.stops and not report.stops)
        ):
            wait(
                [process.sentinel for process in self._live.values()],
                timeout=max(0.0, min(0.05, next_kill - now)),
            )
            for index, process in list(self._live.items()):
                if not process.is_alive():
                    self._buried(index, report)
                    self._start(index)
            if time.monotonic() >= next_kill:
                self._kill_at_random(report)
                next_kill = time.monotonic() + self._choose.uniform(*RANDOM_KILL_GAP)
            if self.stops and time.monotonic() >= next_stop:
                self._ask_to_stop()
                next_stop = time.monotonic() + self._choose.uniform(*STOP_GAP)
            self._continue_stopped(report, self.ttl * STOP_LEASES)
            self._resolve_kills(report)

    def _ask_to_stop(self) -> None:
        """Ask a worker without a doom to stop itself the next time it holds a key."""
        ledger = self.ledger
        idle = [
            index
            for index, doom in self._dooms_of.items()
            if doom is None and not ledger.stop_request[index] and not ledger.stopped_at[index]
        ]
        if idle:
            ledger.stop_request[self._choose.choice(idle)] = 1

    def _continue_stopped(self, report: KillReport, after: float) -> None:
        """SIGCONT the workers stopped for ``after`` seconds or longer. A worker marks
        the stop just before its SIGSTOP lands: it is continued only once stopped, as
        a SIGCONT sent before would leave it stopped for good."""
        ledger = self.ledger
        for index, process in self._live.items():
            stopped_at = ledger.stopped_at[index]
            if stopped_at and time.monotonic() - stopped_at >= after:
                assert process.pid is not None
                if process_state(process.pid) != "T":
                    continue  # (its stop is on its way)
                os.kill(process.pid, signal.SIGCONT)
                ledger.stopped_at[index] = 0.0
                report.stops += 1

    def _kill_at_random(self, report: KillReport) -> None:
        ledger = self.ledger
        undoomed = [
            index
            for index, doom in self._dooms_of.items()
            if doom is None and not ledger.stop_request[index] and not ledger.stopped_at[index]
        ]
        if not undoomed:
            return
        index = self._choose.choice(undoomed)
        victim = self._live[index]
        assert victim.pid is not None
        # Marked dying first, as a doomed worker marks itself: a waiter on this host
        # takes a dead holder's key over at once, and must not find it still inside.
        for slot in self.ledger.process_slots(index * self.threads):
            self.ledger.dying[slot] = 1
        os.kill(victim.pid, signal.SIGKILL)
        self._buried(index, report)
        self._start(index)

    def _buried(self, index: int, report: KillReport) -> None:
        """Account for the dead worker ``index`` and clear its slots. A worker that
        recorded a doom died of it; any other was killed at random."""
        process = self._live.pop(index)
        process.join(WAIT_LIMIT)
        if process.exitcode != -signal.SIGKILL:
            report.failures.append(f"worker {process.pid} exited with {process.exitcode}")
        else:
            self.children.forget(process)
        ledger = self.ledger
        ledger.stop_request[index] = 0
        ledger.stopped_at[index] = 0.0
        slots = range(index * self.threads, (index + 1) * self.threads)
        died_at = time.monotonic()
        doom = AT_RANDOM
        for slot in slots:
            if ledger.doomed_at[slot] >= 0:
                doom = DOOMS[ledger.doomed_at[slot]]
                died_at = ledger.dying_at[slot]
                if doom == "after insert":
                    # It took its key as it died: a wait for that key ended there, and
                    # a new one begins.
                    self._resolve_kills(report, ledger.working_on[slot], died_at)
        report.kills[doom] += 1
        for slot in slots:
            key = ledger.working_on[slot]
            freed = ledger.doomed_at[slot] == DOOMS.index("after delete")  # left no row
            if key >= 0 and not freed:
                self._resolve_kills(report, key)  # it may have taken the key since
                if not ledger.killed_at[key]:
                    ledger.killed_at[key] = died_at
            ledger.inside[slot] = -1
            ledger.working_on[slot] = -1
            ledger.doomed_at[slot] = -1
            ledger.dying[slot] = 0

    def _resolve_kills(
        self, report: KillReport, only: int | None = None, free_at: float | None = None
    ) -> None:
        """Turn kills followed by an acquire of their key (or by ``free_at``, when the
        key was surely free) into blocked times; ``only``: just that key."""
        ledger = self.ledger
        for key in range(ledger.keys) if only is None else [only]:
            killed_at = ledger.killed_at[key]
            if not killed_at:
                continue
            ends = [
                ledger.first_after[slot * ledger.keys + key]
                for slot in range(ledger.slots)
                if ledger.seen_kill[slot * ledger.keys + key] == killed_at
            ]
            if free_at is not None:
                ends.append(free_at)
            if ends:
                report.longest_blocked = max(report.longest_blocked, min(ends) - killed_at)
                ledger.killed_at[key] = 0.0

    def _wait_for_workers(self, report: KillReport) -> None:
        """Let every worker finish its hold and exit; a doomed one may still die, and a
        stopped one is continued at once."""
        deadline = time.monotonic() + WAIT_LIMIT
        for index in self._live:
            self.ledger.stop_request[index] = 0
        for index, process in list(self._live.items()):
            while process.is_alive() and time.monotonic() < deadline:
                self._continue_stopped(report, 0.0)
                process.join(0.05)
            if process.exitcode == -signal.SIGKILL:
                self._buried(index, report)
            elif process.exitcode != 0:
                report.failures.append(f"worker {process.pid} ended with {process.exitcode}")

    def _wait_until_empty(
        self, manager: tierlock.LockManager, report: KillReport, stopped: float
    ) -> None:
        """Rows that dead holders left must expire and be reaped without help. A key
        killed near the end that nobody asked for again counts as blocked until its
        row is gone."""
        deadline = stopped + self.ttl + self.reaper_interval + SLACK
        while held := {info.key for info in manager.holders()}:
            for index, key in enumerate(self.keys):
                if key not in held:
                    self._resolve_kills(report, index, free_at=time.monotonic())
            if time.monotonic() > deadline:
                report.failures.append(f"rows left {deadline - stopped:.1f} s after the load")
                return
            time.sleep(0.02)
        emptied = time.monotonic()
        report.emptied_after = emptied - stopped
        self._resolve_kills(report, free_at=emptied)

    def _take_every_key(self, manager: tierlock.LockManager, report: KillReport) -> None:
        for key in self.keys:
            lock = manager.lock(key)
            if lock.acquire(blocking=False):
                lock.release()
            else:
                report.failures.append(f"{key!r} cannot be taken after the load")
