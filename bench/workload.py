"""One cell of the benchmark: an implementation under a scenario, timed for some seconds.

Every worker is a forked process (it inherits the shared tally, barrier, event and
queue) whose threads each open a contender, warm it up on a key of their own, and wait
at one barrier with the parent. The parent then lets them run for the cell's seconds
and sets the stop event; each process sends back per-thread counts and wait samples.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import traceback
from array import array
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from .subjects import Contender, Implementation, Subject
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

    @property
    def description(self) -> str:
        processes = "1 process" if self.processes == 1 else f"{self.processes} processes"
        threads = "1 thread" if self.threads == 1 else f"{self.threads} threads"
        if self.keys == 1:
            return f"{processes} x {threads}, one key"
        order = "in turn" if self.round_robin else "a random one per section"
        return f"{processes} x {threads}, {self.keys} keys, {order}"


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("uncontended", 1, 1, KEYS, round_robin=True),
        Scenario("hot-1x8", 1, 8, 1, round_robin=False),
        Scenario("hot-4x4", 4, 4, 1, round_robin=False),
        Scenario("spread-4x4", 4, 4, KEYS, round_robin=False),
    )
}


@dataclass
class Cell:
    """What one run of a cell measured."""

    elapsed: float  # seconds between the start and the stop
    sections: list[int] = field(default_factory=list)  # per thread, finished before the stop
    waits: list[float] = field(default_factory=list)  # seconds each of those waited to acquire
    ran: int = 0  # all sections run, including those that finished after the stop
    statements: int = 0  # sent during the run by all processes, for all ``ran`` sections
    lost: int = 0  # updates the tally lost: sections that overlapped
    overlaps: int = 0  # sections that saw another inside their key
    leftover: int = 0  # lock rows still in the table after the run


class Worker:
    """One worker process: ``scenario.threads`` threads that run sections until ``stop``.

    Its report, put on ``results`` once whatever happens: per-thread section counts,
    wait samples, sections run in all, overlaps seen, statements sent, and errors.
    """

    def __init__(
        self,
        implementation: Implementation,
        scenario: Scenario,
        number: int,
        tally: Tally,
        start: Barrier,
        stop: Event,
    ) -> None:
        self.implementation, self.scenario, self.number = implementation, scenario, number
        self.tally, self.start, self.stop = tally, start, stop
        self.ready = threading.Barrier(scenario.threads + 1)  # warmed up, statements counted
        self.gather = threading.Lock()
        self.report: dict[str, Any] = {
            "sections": [],
            "waits": array("d"),
            "ran": 0,
            "overlaps": 0,
            "statements": 0,
            "errors": [],
        }

    def fail(self) -> None:
        self.report["errors"].append(traceback.format_exc())
        self.ready.abort()
        self.start.abort()  # the others give up at once instead of waiting for this one
        self.stop.set()

    def __call__(self, results: Queue[dict[str, Any]]) -> None:
        try:
            subject = self.implementation.open()
        except BaseException:
            self.fail()
            results.put(self.report)
            return
        first = self.number * self.scenario.threads + 1
        threads = [
            threading.Thread(target=self.thread, args=(subject, first + offset), daemon=True)
            for offset in range(self.scenario.threads)
        ]
        try:
            for thread in threads:
                thread.start()
            self.ready.wait(SETUP_LIMIT)
            baseline = subject.statements()
            deadline = time.monotonic() + SETUP_LIMIT
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            self.report["statements"] = subject.statements() - baseline
            if any(thread.is_alive() for thread in threads):
                self.report["errors"].append(f"a thread of process {self.number} did not stop")
        except threading.BrokenBarrierError:
            pass  # a thread failed and said why
        except BaseException:
            self.fail()
        finally:
            try:
                subject.close()
            except BaseException:
                self.fail()
            results.put(self.report)

    def thread(self, subject: Subject, me: int) -> None:
        try:
            contender = subject.contender()
            try:
                contender.acquire(KEYS + me)  # connects and fills caches, off the clock
                contender.release(KEYS + me)
                self.ready.wait(SETUP_LIMIT)
                self.start.wait(SETUP_LIMIT)
                self.run(contender, me)
            finally:
                contender.close()
        except BaseException:
            self.fail()

    def run(self, contender: Contender, me: int) -> None:
        """Sections until the stop; the one under way then is run but not counted."""
        keys, round_robin = self.scenario.keys, self.scenario.round_robin
        section, stop = self.tally.section, self.stop
        clock = time.perf_counter
        choose = random.Random()  # not the module's: forked processes share its state
        waits = array("d")
        counted = ran = overlaps = 0
        while True:
            index = ran % keys if round_robin else choose.randrange(keys)
            began = clock()
            contender.acquire(index)
            waited = clock() - began
            overlaps += section(index, me, SECTION)
            contender.release(index)
            ran += 1
            if stop.is_set():
                break
            counted += 1
            waits.append(waited)
        with self.gather:
            self.report["sections"].append(counted)
            self.report["waits"].extend(waits)
            self.report["ran"] += ran
            self.report["overlaps"] += overlaps


class CellError(RuntimeError):
    """A cell could not run: a worker failed or hung."""


def run_cell(implementation: Implementation, scenario: Scenario, seconds: float) -> Cell:
    """Run ``implementation`` under ``scenario`` for ``seconds`` and gather what happened."""
    tally = Tally(scenario.keys)
    start = CTX.Barrier(scenario.processes * scenario.threads + 1)
    stop = CTX.Event()
    results: Queue[dict[str, Any]] = CTX.Queue()
    processes = [
        CTX.Process(
            target=Worker(implementation, scenario, number, tally, start, stop),
            args=(results,),
            daemon=True,
        )
        for number in range(scenario.processes)
    ]
    cell = Cell(elapsed=0.0)
    errors: list[str] = []
    try:
        for process in processes:
            process.start()
        try:
            start.wait(SETUP_LIMIT)
        except threading.BrokenBarrierError:
            pass  # a worker failed; its report says why
        else:
            began = time.perf_counter()
            stop.wait(seconds)  # returns early if a worker fails
            cell.elapsed = time.perf_counter() - began
        stop.set()
        for _ in processes:
            try:
                report = results.get(timeout=SETUP_LIMIT)
            except queue.Empty:
                errors.append(f"a worker sent nothing within {SETUP_LIMIT} s")
                break
            errors += report["errors"]
            cell.sections += report["sections"]
            cell.waits += report["waits"]
            cell.statements += report["statements"]
            cell.overlaps += report["overlaps"]
            cell.ran += report["ran"]
        deadline = time.monotonic() + SETUP_LIMIT
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.is_alive():
                errors.append(f"worker {process.pid} still ran; killed")
                process.kill()
                process.join()
        results.close()
    if errors:
        raise CellError("\n".join(errors))
    cell.lost = tally.lost(cell.ran)
    return cell
