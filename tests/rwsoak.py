"""What the child processes of the read/write lock and semaphore tests run.

The load (:class:`RWLoad`): worker processes of several threads take read holds, write
holds and semaphore permits of a few keys at random, while the parent SIGKILLs one of
them inside a section now and then and starts another in its place. The sections keep
their books in a :class:`rwboard.Board` in shared memory; the slots of a process the
parent is about to kill are marked dying first, so that those who take its holds over
once it is gone do not count it as still inside.

The other workers here take part in the tests of writer preference and of dead holders.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkProcess
from multiprocessing.synchronize import Event
from typing import Any, Protocol

import procs
from rwboard import MODE_NAMES, PERMIT, READ, VIOLATIONS, WRITE, Board, RWReport, Timeline

from tierlock.tier1 import readholds

# How the soak's threads choose: the share of reads, writes and permits.
MIX = ((READ, 0.5), (WRITE, 0.2), (PERMIT, 0.3))
TRY_SHARE = 0.25  # holds that begin with one try without waiting, skipped if it fails
# How long a soak section lasts, seconds. A permit's is longer: with a quick section,
# two permit holders of a loaded machine might never be inside at once.
SECTION = {READ: (0.0005, 0.003), WRITE: (0.0005, 0.003), PERMIT: (0.005, 0.02)}
KILL_GAP = (0.3, 0.8)  # how far apart the parent asks for a kill, seconds
SOAK_WAIT = 10.0  # the longest a soak's blocking acquire may wait (a lease is longer)
TRY, RELEASE, CLOSE = 1, 2, 3  # calls that never wait for another holder
CALL_NAMES = {TRY: "try without waiting", RELEASE: "release", CLOSE: "close"}


class Hold(Protocol):
    """What the load needs of a read lock, a write lock and a semaphore."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...

    @property
    def token(self) -> int | None: ...


class NoLock:
    """A lock that locks nothing: the control run's."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        pass

    @property
    def token(self) -> int | None:
        return None


def _timed(board: Board, slot: int, what: int, began: float) -> None:
    """Note how long a call that never waits took, if it is the slot's slowest."""
    took = time.monotonic() - began
    if took > board.slowest_call[slot]:
        board.slowest_call[slot] = took
        board.slowest_what[slot] = what


def _take(board: Board, slot: int, mode: int, hold: Hold, *, trying: bool) -> bool:
    """Acquire ``hold`` with one try without waiting, or waiting up to ``SOAK_WAIT``."""
    began = time.monotonic()
    if trying:
        got = hold.acquire(blocking=False)
        _timed(board, slot, mode * 10 + TRY, began)
        return got
    if not hold.acquire(timeout=SOAK_WAIT):
        board.timeouts[slot] += 1
        return False
    board.longest_wait[slot] = max(board.longest_wait[slot], time.monotonic() - began)
    return True


def _run_slots(work: Callable[[int], None], slots: Iterable[int]) -> None:
    """Run ``work(slot)`` in a thread of its own for each of ``slots`` and wait for them
    all; fail with the tracebacks of those that raised."""
    failures: list[str] = []

    def guarded(slot: int) -> None:
        try:
            work(slot)
        except BaseException:
            failures.append(traceback.format_exc())

    workers = [threading.Thread(target=guarded, args=(slot,)) for slot in slots]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise AssertionError("\n".join(failures))


def churn(
    *,
    url: str | None,
    table: str,
    rw_keys: list[str],
    sem_keys: list[str],
    board: Board,
    process: int,
    ttl: float,
) -> None:
    """``board.threads`` threads that take random holds and do sections in them until
    ``board.stopping``; with ``url=None`` the holds lock nothing (the control).

    When the parent asks (``board.kill_request``), the first thread inside a hold of
    the mode asked for stays inside and says so; the parent then kills this process.
    """
    manager = None if url is None else procs.open_manager(url, table)
    claimed = threading.Lock()  # the kill request goes to one thread only
    modes = [mode for mode, _ in MIX]
    weights = [weight for _, weight in MIX]

    def hold_of(mode: int, key: int) -> Hold:
        if manager is None:
            return NoLock()
        if mode == READ:
            return manager.read_lock(rw_keys[key], ttl=ttl)
        if mode == WRITE:
            return manager.write_lock(rw_keys[key], ttl=ttl)
        return manager.semaphore(sem_keys[key], board.permits, ttl=ttl)

    def work(slot: int) -> None:
        choose = random.Random()  # not the module's: forked children share its state
        while not board.stopping.value:
            mode = choose.choices(modes, weights)[0]
            key = choose.randrange(len(sem_keys if mode == PERMIT else rw_keys))
            hold = hold_of(mode, key)
            if not _take(board, slot, mode, hold, trying=choose.random() < TRY_SHARE):
                continue
            try:
                board.enter(slot, mode, key, hold.token)
                if board.kill_request[process] == mode and claimed.acquire(blocking=False):
                    board.awaiting_kill[process] = slot + 1
                    time.sleep(procs.HOLD_LIMIT)  # inside the hold until SIGKILL comes
                    raise AssertionError("the parent did not kill this process")
                time.sleep(choose.uniform(*SECTION[mode]))  # the section's work
                board.leave(slot, mode, key)
            finally:
                began = time.monotonic()
                hold.release()
                _timed(board, slot, mode * 10 + RELEASE, began)

    try:
        _run_slots(work, board.process_slots(process))
    finally:
        if manager is not None:
            began = time.monotonic()
            manager.close()  # (every hold is released by now)
            _timed(board, board.process_slots(process)[0], CLOSE, began)


class RWLoad:
    """``processes`` forked workers of ``threads`` threads each on ``rw_keys`` read/write
    keys and ``sem_keys`` semaphore keys of ``permits`` permits; see :meth:`run`.
    ``url=None``: the control, whose holds lock nothing."""

    def __init__(
        self,
        url: str | None,
        table: str,
        *,
        rw_keys: int = 2,
        sem_keys: int = 1,
        permits: int = 3,
        processes: int = 4,
        threads: int = 4,
        ttl: float = 30.0,
    ) -> None:
        self.url = url
        self.table = table
        run = uuid.uuid4().hex
        self.rw_keys = [f"rw:{run}:{n}" for n in range(rw_keys)]
        self.sem_keys = [f"sem:{run}:{n}" for n in range(sem_keys)]
        self.processes = processes
        self.ttl = ttl
        self.board = Board(
            rw_keys=rw_keys,
            sem_keys=sem_keys,
            permits=permits,
            processes=processes,
            threads=threads,
        )
        self.children = procs.Children()
        self._live: dict[int, ForkProcess] = {}
        self._choose = random.Random()
        self._kill_modes = itertools.cycle(MODE_NAMES)

    def run(self, seconds: float) -> RWReport:
        """Run for ``seconds`` and on until a process was killed inside each mode of
        hold (up to ``procs.WAIT_LIMIT`` more), then stop every worker and tally."""
        report = RWReport()
        began = time.monotonic()
        try:
            for process in range(self.processes):
                self._start(process)
            self._supervise(report, began + seconds)
            self.board.stopping.value = 1
            for process, child in self._live.items():
                child.join(procs.WAIT_LIMIT)
                if child.exitcode != 0:
                    report.failures.append(f"worker {process} ended with {child.exitcode}")
        finally:
            self.children.kill_all()
        report.seconds = time.monotonic() - began
        report.failures += self.children.failures()
        self._tally(report)
        return report

    def _start(self, process: int) -> None:
        self._live[process] = self.children.start(
            churn,
            url=self.url,
            table=self.table,
            rw_keys=self.rw_keys,
            sem_keys=self.sem_keys,
            board=self.board,
            process=process,
            ttl=self.ttl,
        )

    def _supervise(self, report: RWReport, until: float) -> None:
        board = self.board
        next_kill = time.monotonic() + self._choose.uniform(*KILL_GAP)
        victim: int | None = None
        give_up = until + procs.WAIT_LIMIT
        while (now := time.monotonic()) < give_up and (
            now < until or victim is not None or not all(report.kills.values())
        ):
            wait([child.sentinel for child in self._live.values()], timeout=0.002)
            for process, child in list(self._live.items()):
                if not child.is_alive():  # none may die but of the parent's kills
                    child.join()
                    report.failures.append(f"worker {process} ended with {child.exitcode}")
                    board.clear(process)
                    self._start(process)
            if victim is None and now >= next_kill:
                victim = self._choose.randrange(self.processes)
                board.kill_request[victim] = next(self._kill_modes)
            elif victim is not None and board.awaiting_kill[victim]:
                report.kills[MODE_NAMES[board.kill_request[victim]]] += 1
                self._kill(victim)
                victim = None
                next_kill = time.monotonic() + self._choose.uniform(*KILL_GAP)
        if victim is not None:
            report.failures.append(f"worker {victim} never reached a hold to be killed in")

    def _kill(self, process: int) -> None:
        """SIGKILL worker ``process``, whose thread waits inside a hold, and replace it.
        Its slots are marked dying first: once it is gone, others take its holds over
        at once, and must not find it still inside."""
        board, child = self.board, self._live.pop(process)
        for slot in board.process_slots(process):
            board.dying[slot] = 1
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(procs.WAIT_LIMIT)
        assert child.exitcode == -signal.SIGKILL, child.exitcode
        self.children.forget(child)
        board.clear(process)
        self._start(process)

    def _tally(self, report: RWReport) -> None:
        board = self.board
        report.sections = {
            name: sum(board.sections[slot * 4 + mode] for slot in range(board.slots))
            for mode, name in MODE_NAMES.items()
        }
        kinds = len(VIOLATIONS)
        report.violations = {
            name: sum(board.violations[slot * kinds + kind] for slot in range(board.slots))
            for kind, name in enumerate(VIOLATIONS)
        }
        report.first_violation = board.describe_first()
        report.most_readers = max(board.most_readers)
        report.most_permits = max(board.most_permits)
        report.longest_wait = max(board.longest_wait)
        report.timeouts = sum(board.timeouts)
        slot = max(range(board.slots), key=lambda slot: board.slowest_call[slot])
        report.slowest_call = board.slowest_call[slot]
        if report.slowest_call:
            mode, call = divmod(board.slowest_what[slot], 10)
            hold = f" of a {MODE_NAMES[mode]} hold" if mode else " of the manager"
            report.slowest_what = CALL_NAMES[call] + hold


# -- writer preference -----------------------------------------------------------------


def read_continuously(
    *,
    url: str,
    table: str,
    key: str,
    timeline: Timeline,
    first_slot: int,
    threads: int,
    hold_for: tuple[float, float],
    stop: Event,
) -> None:
    """``threads`` threads that each take a read hold of ``key``, keep it for a while
    and take it again at once, until ``stop``; every hold goes into ``timeline``."""
    with procs.open_manager(url, table) as manager:

        def work(slot: int) -> None:
            choose = random.Random()
            reader = manager.read_lock(key)
            while not stop.is_set():
                asked = time.monotonic()
                if not reader.acquire(timeout=procs.WAIT_LIMIT):
                    raise AssertionError(f"no read hold in {procs.WAIT_LIMIT:g} s")
                entered = timeline.inside_since[slot] = time.monotonic()
                time.sleep(choose.uniform(*hold_for))  # the reader's work
                timeline.inside_since[slot] = 0.0
                left = time.monotonic()
                reader.release()
                timeline.add(slot, asked, entered, left)

        _run_slots(work, range(first_slot, first_slot + threads))


def write_once(
    *,
    url: str,
    table: str,
    key: str,
    limit: float,
    hold_for: float,
    go: Event,
    results: Connection[Any, Any],
) -> None:
    """Once ``go`` is set, ask for the write hold of ``key`` for up to ``limit`` seconds,
    keep it ``hold_for`` seconds, and send back when it asked, got and released it."""
    with procs.open_manager(url, table) as manager:
        writer = manager.write_lock(key)
        if not go.wait(procs.WAIT_LIMIT):
            raise AssertionError("never told to write")
        asked = time.monotonic()
        got = writer.acquire(timeout=limit)
        entered = time.monotonic()
        left = None
        if got:
            time.sleep(hold_for)  # the writer's work, while readers pile up behind it
            left = time.monotonic()
            writer.release()
        results.send({"got": got, "asked": asked, "entered": entered, "left": left})


# -- dead holders ----------------------------------------------------------------------


def hold_shared(
    *,
    url: str,
    table: str,
    key: str,
    permits: int | None,
    ttl: float,
    held: Event,
    kept: bool = False,
) -> None:
    """Take a read hold of ``key`` (``permits=None``) or a permit of its semaphore with
    lease ``ttl``, set ``held`` and keep it until killed. ``kept``: read the key twice
    and release it, so that the process keeps the hold with no thread in it (with a
    join window that outlasts the test)."""
    manager = procs.open_manager(url, table)
    hold: Hold = (
        manager.read_lock(key, ttl=ttl)
        if permits is None
        else manager.semaphore(key, permits, ttl=ttl)
    )
    if kept:
        readholds.JOIN_WINDOW = readholds.READ_AGAIN = procs.HOLD_LIMIT
        for _ in range(2):
            hold.acquire()
            hold.release()
        if not manager.holders():
            raise AssertionError(f"the hold of {key!r} was not kept")
    elif not hold.acquire(timeout=procs.WAIT_LIMIT):
        raise AssertionError(f"could not take {key!r}")
    held.set()
    time.sleep(procs.HOLD_LIMIT)  # holds until the parent's SIGKILL comes
    raise AssertionError("the parent did not kill this process")


def keep_then_read_again(
    *,
    url: str,
    table: str,
    key: str,
    ttl: float,
    kept: Event,
    go: Event,
    tried: Event,
    results: Connection,
) -> None:
    """Keep a read hold of ``key`` (lease ``ttl``) with no thread in it and set
    ``kept``; once ``go`` is set (the parent stopped this process past the lease and
    took the write hold meanwhile), try a read hold without waiting and set ``tried``,
    then wait for one; send whether the try got in, and the token of the hold waited for."""
    readholds.JOIN_WINDOW = readholds.READ_AGAIN = procs.HOLD_LIMIT
    manager = procs.open_manager(url, table)
    reader = manager.read_lock(key, ttl=ttl)
    for _ in range(2):
        reader.acquire()
        reader.release()
    if not manager.holders():
        raise AssertionError(f"the hold of {key!r} was not kept")
    kept.set()
    if not go.wait(procs.WAIT_LIMIT):
        raise AssertionError("the parent did not let this process go on")
    got_in = reader.acquire(blocking=False)
    if got_in:
        reader.release()
    tried.set()
    if not reader.acquire(timeout=procs.WAIT_LIMIT):
        raise AssertionError(f"no read hold of {key!r} once the writer left")
    results.send({"got_in": got_in, "token": reader.token})
    reader.release()
    manager.close()
