"""One cell of the benchmark: an implementation under a scenario, timed for some seconds.

Every worker is a forked process (it inherits the shared tally, barrier, events and
queue) whose threads each open a contender, warm it up on a key of their own, and wait
at one barrier with the parent. The parent then lets them run for the cell's seconds
and sets the stop event; each process sends back per-thread counts and wait samples.
On a machine so loaded that no thread has finished a section by then, the cell runs
on until one has: a cell that counted nothing would measure nothing. A lost try does not
count: tierlock turns a try away in the process, in microseconds, while another of its
threads asks the server, so a cell shorter than one round trip would end with thousands
of tries and no sale.

In most scenarios a thread waits for its key and runs a section, again and again. In a
scenario with ``blocking=False`` it first spends ``io`` seconds asleep (a network call,
with the GIL released), then tries the key without waiting and runs a section only if
the try won: a flash sale, where a request that finds the stock locked gives up.
"""

from __future__ import annotations

import abc
import queue
import random
import threading
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any, Generic, Protocol, TypeVar

from .interface import Contender, Implementation, Subject
from .tally import CTX, Tally

# Length of a critical section, spent busy-waiting on time.perf_counter().
SECTION = 100e-6
# Keys of the scenarios with many; each thread warms up on key KEYS + its number.
KEYS = 1000
# How long the parent waits for workers to connect and warm up, or to finish after the
# stop; only a hung or broken worker takes this long.
SETUP_LIMIT = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    processes: int
    threads: int  # per process
    keys: int
    round_robin: bool  # keys in turn, else a random key per section
    blocking: bool = True  # wait for the key, else try it once and give up if taken
    io: float = 0.0  # seconds asleep before each acquire or try
    section: float = SECTION  # seconds of each critical section, busy-waiting

    @property
    def description(self) -> str:
        processes = "1 process" if self.processes == 1 else f"{self.processes} processes"
        threads = "1 thread" if self.threads == 1 else f"{self.threads} threads"
        if self.keys == 1:
            shape = f"{processes} x {threads}, one key"
        else:
            order = "in turn" if self.round_robin else "a random one per section"
            shape = f"{processes} x {threads}, {self.keys} keys, {order}"
        if self.blocking:
            return shape
        return (
            f"{shape}; each request sleeps {self.io * 1e6:.0f} µs (I/O), then tries the key "
            f"without waiting, and on a win runs a {self.section * 1e3:g} ms section"
        )


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("uncontended", 1, 1, KEYS, round_robin=True),
        Scenario("hot-1x8", 1, 8, 1, round_robin=False),
        Scenario("hot-4x4", 4, 4, 1, round_robin=False),
        Scenario("spread-4x4", 4, 4, KEYS, round_robin=False),
        Scenario("flash-sale", 4, 8, 1, round_robin=False, blocking=False, io=200e-6, section=1e-3),
    )
}


@dataclass
class Cell:
    """What one run of a cell measured."""

    elapsed: float  # seconds between the start and the stop
    sections: list[int] = field(default_factory=list)  # per thread, finished before the stop
    # Seconds each of those waited to acquire; without blocking, each try's length.
    waits: list[float] = field(default_factory=list)
    ran: int = 0  # all sections run, including those that finished after the stop
    tries: int = 0  # acquires or tries that finished before the stop
    tried: int = 0  # all acquires or tries, including those that finished after the stop
    statements: int = 0  # sent during the run by all processes, for all ``tried``
    lost: int = 0  # updates the tally lost: sections that overlapped
    overlaps: int = 0  # sections that saw another inside their key
    leftover: int = 0  # lock rows still in the table after the run


Report = dict[str, Any]  # what a worker process sends back


@dataclass(frozen=True)
class Signals:
    """What the parent and its workers share to run a cell."""

    start: Barrier  # every thread warmed up, and the parent: the clock starts
    stop: Event  # set by the parent at the end, or by a worker that failed
    counted: Event  # set by the first thread to count a section (a won try)


class Opened(Protocol):
    """What a worker process opens once: its side of an implementation."""

    def statements(self) -> int: ...

    def close(self) -> None: ...


class Closes(Protocol):
    """What each thread of a worker process takes keys with."""

    def close(self) -> None: ...


S = TypeVar("S", bound=Opened)
M = TypeVar("M", bound=Closes)


class ProcessWorker(abc.ABC, Generic[S, M]):
    """One worker process: ``threads`` threads that each take keys with a member of the
    side the process opened, warm it up off the clock, wait at ``start`` with the parent,
    and run sections until ``stop``.

    Its report, put on ``results`` once whatever happens: what ``report`` starts as, which
    the threads add to, the statements the side sent while they ran, and errors.
    """

    def __init__(self, threads: int, number: int, signals: Signals, report: Report) -> None:
        self.threads, self.number = threads, number
        self.start, self.stop, self.counted = signals.start, signals.stop, signals.counted
        self.told = False  # whether this process has set ``counted``
        self.ready = threading.Barrier(threads + 1, action=self.note_baseline)  # warmed up
        self.sent: Callable[[], int] = lambda: 0  # the side's statements, once opened
        self.baseline = 0  # what the side had sent as all its threads were warmed up
        self.gather = threading.Lock()
        self.report: Report = {**report, "statements": 0, "errors": []}

    @abc.abstractmethod
    def open(self) -> S:
        """The process's side, opened in the worker process."""

    @abc.abstractmethod
    def member(self, side: S) -> M:
        """The calling thread's own member of ``side``."""

    @abc.abstractmethod
    def warm_up(self, member: M, me: int) -> None:
        """Connect and fill caches on a key of the thread's own, off the clock."""

    @abc.abstractmethod
    def run(self, member: M, me: int) -> None:
        """Sections until the stop, added to the report."""

    def count_one(self) -> None:
        """Tell the parent a section was counted, once per process."""
        if not self.told:
            self.told = True  # another thread may also set it: harmless
            self.counted.set()

    def note_baseline(self) -> None:
        """Run by ``ready`` as its last party arrives, before it lets any go: once the
        main thread is let go, the others may be past the start already."""
        self.baseline = self.sent()

    def fail(self) -> None:
        self.report["errors"].append(traceback.format_exc())
        self.ready.abort()
        self.start.abort()  # the others give up at once instead of waiting for this one
        self.stop.set()
        self.counted.set()

    def __call__(self, results: Queue[Report]) -> None:
        try:
            side = self.open()
            self.sent = side.statements
        except BaseException:
            self.fail()
            results.put(self.report)
            return
        first = self.number * self.threads + 1
        threads = [
            threading.Thread(target=self.thread, args=(side, first + offset), daemon=True)
            for offset in range(self.threads)
        ]
        try:
            for thread in threads:
                thread.start()
            self.ready.wait(SETUP_LIMIT)
            deadline = time.monotonic() + SETUP_LIMIT
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            self.report["statements"] = side.statements() - self.baseline
            if any(thread.is_alive() for thread in threads):
                self.report["errors"].append(f"a thread of process {self.number} did not stop")
        except threading.BrokenBarrierError:
            pass  # a thread failed and said why
        except BaseException:
            self.fail()
        finally:
            try:
                side.close()
            except BaseException:
                self.fail()
            results.put(self.report)

    def thread(self, side: S, me: int) -> None:
        try:
            member = self.member(side)
            try:
                self.warm_up(member, me)
                self.ready.wait(SETUP_LIMIT)
                self.start.wait(SETUP_LIMIT)
                self.run(member, me)
            finally:
                member.close()
        except BaseException:
            self.fail()


class Threaded:
    """What a worker process whose threads each drive a contender of a subject does to
    open, join and warm up."""

    implementation: Implementation

    def open(self) -> Subject:
        subject = self.implementation.open()
        if not isinstance(subject, Subject):
            raise TypeError(f"{self.implementation.label} is driven by tasks, not threads")
        return subject

    def member(self, side: Subject) -> Contender:
        return side.contender()

    def warm_up(self, member: Contender, me: int) -> None:
        member.acquire(KEYS + me)
        member.release(KEYS + me)


class Worker(Threaded, ProcessWorker[Subject, Contender]):
    """A worker process of the lock benchmark. Its report adds per-thread section counts,
    wait samples, sections run in all and overlaps seen."""

    def __init__(
        self,
        implementation: Implementation,
        scenario: Scenario,
        tally: Tally,
        number: int,
        signals: Signals,
    ) -> None:
        super().__init__(scenario.threads, number, signals, section_report())
        self.implementation, self.scenario, self.tally = implementation, scenario, tally

    def run(self, contender: Contender, me: int) -> None:
        """Sections until the stop; the one under way then is run but not counted."""
        scenario = self.scenario
        keys, round_robin, blocking = scenario.keys, scenario.round_robin, scenario.blocking
        io, length = scenario.io, scenario.section
        section, stop = self.tally.section, self.stop
        clock, sleep = time.perf_counter, time.sleep
        choose = random.Random()  # not the module's: forked processes share its state
        waits = array("d")
        counted = ran = tries = tried = overlaps = 0
        while True:
            index = tried % keys if round_robin else choose.randrange(keys)
            if io:
                sleep(io)
            began = clock()
            if blocking:
                contender.acquire(index)
                won = True
            else:
                won = contender.try_acquire(index)
            waited = clock() - began
            tried += 1
            if won:
                overlaps += section(index, me, length)
                contender.release(index)
                ran += 1
            if stop.is_set():
                break
            tries += 1
            counted += won
            waits.append(waited)
            if won and counted == 1:
                self.count_one()
        with self.gather:
            self.report["sections"].append(counted)
            self.report["waits"].extend(waits)
            self.report["ran"] += ran
            self.report["tries"] += tries
            self.report["tried"] += tried
            self.report["overlaps"] += overlaps


class CellError(RuntimeError):
    """A cell could not run: a worker failed or hung."""


def section_report() -> Report:
    """A worker's empty report of critical sections: per-thread counts, wait samples,
    sections run in all, tries without waiting (all and won) and overlaps seen."""
    return {"sections": [], "waits": array("d"), "ran": 0, "tries": 0, "tried": 0, "overlaps": 0}


def run_workers(
    processes: int,
    threads: int,
    seconds: float,
    worker: Callable[[int, Signals], ProcessWorker[Any, Any]],
) -> tuple[float, list[Report]]:
    """Run ``processes`` workers of ``threads`` threads each, made by ``worker(number,
    signals)``, for ``seconds`` once all are ready, and on until one has counted a
    section: the seconds they ran, and their reports.

    :raises CellError: if a worker failed, sent nothing or hung.
    """
    signals = Signals(CTX.Barrier(processes * threads + 1), CTX.Event(), CTX.Event())
    start, stop = signals.start, signals.stop
    results: Queue[Report] = CTX.Queue()
    workers = [
        CTX.Process(target=worker(number, signals), args=(results,), daemon=True)
        for number in range(processes)
    ]
    elapsed = 0.0
    reports: list[Report] = []
    errors: list[str] = []
    try:
        for process in workers:
            process.start()
        try:
            start.wait(SETUP_LIMIT)
        except threading.BrokenBarrierError:
            pass  # a worker failed; its report says why
        else:
            began = time.perf_counter()
            stop.wait(seconds)  # returns early if a worker fails
            if not stop.is_set():
                signals.counted.wait(SETUP_LIMIT)  # (a failing worker sets it too)
            elapsed = time.perf_counter() - began
        stop.set()
        for _ in workers:
            try:
                report = results.get(timeout=SETUP_LIMIT)
            except queue.Empty:
                errors.append(f"a worker sent nothing within {SETUP_LIMIT} s")
                break
            errors += report["errors"]
            reports.append(report)
        deadline = time.monotonic() + SETUP_LIMIT
        for process in workers:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in workers:
            if process.is_alive():
                errors.append(f"worker {process.pid} still ran; killed")
                process.kill()
                process.join()
        results.close()
    if errors:
        raise CellError("\n".join(errors))
    return elapsed, reports


def run_cell(implementation: Implementation, scenario: Scenario, seconds: float) -> Cell:
    """Run ``implementation`` under ``scenario`` for ``seconds`` and gather what happened."""
    tally = Tally(scenario.keys)
    worker = partial(Worker, implementation, scenario, tally)
    elapsed, reports = run_workers(scenario.processes, scenario.threads, seconds, worker)
    cell = Cell(elapsed=elapsed)
    for report in reports:
        cell.sections += report["sections"]
        cell.waits += report["waits"]
        cell.statements += report["statements"]
        cell.overlaps += report["overlaps"]
        cell.ran += report["ran"]
        cell.tries += report["tries"]
        cell.tried += report["tried"]
    cell.lost = tally.lost(cell.ran)
    return cell
