"""One cell: an implementation under a scenario, run by :func:`bench.workload.run_workers`,
and the check, in shared memory, of what its holds let overlap."""

from __future__ import annotations

import ctypes
import random
import time
from array import array
from dataclasses import dataclass, field
from functools import partial

from ..tally import CTX
from ..workload import ProcessWorker, Signals, run_workers
from .holders import Entry, Holder, Side
from .scenarios import PERMITS, WRITE_SHARE, Scenario


class Check:
    """Who is inside which key, and a counter per key that only writers bump.

    Each thread (numbered from 1) writes only its own slot: the key it is inside plus
    one, negated for a write; and, under a semaphore, its own count of turns, odd while
    it is inside. Nothing guards them with a mutex, so the check adds no
    synchronisation that could hide a broken lock.
    """

    def __init__(self, threads: int, keys: int) -> None:
        self.slots = CTX.RawArray(ctypes.c_longlong, threads + 1)
        self.turns = CTX.RawArray(ctypes.c_longlong, threads + 1)
        self.counters = CTX.RawArray(ctypes.c_longlong, keys)

    def conflict(self, me: int, index: int, write: bool) -> bool:
        """Whether another thread is inside key ``index`` beside this one as it must not
        be; each slot read shows who is inside at that moment, as this thread is."""
        others = self.slots[:]
        others[me] = 0
        return -(index + 1) in others or (write and index + 1 in others)

    def read_write(self, index: int, write: bool, me: int, seconds: float) -> bool:
        """A section on key ``index``; whether it met a hold it should have excluded."""
        self.slots[me] = -(index + 1) if write else index + 1
        before = self.counters[index]
        seen = self.conflict(me, index, write)
        time.sleep(seconds)
        seen = self.conflict(me, index, write) or seen
        if write:
            self.counters[index] = before + 1  # lost if another writer overlapped
        elif self.counters[index] != before:
            seen = True  # a write landed during this read
        self.slots[me] = 0
        return seen

    def permit(self, me: int, seconds: float) -> int:
        """A section under the semaphore; the most holders it saw inside, itself included."""
        turns = self.turns
        turns[me] += 1
        first = self.inside_at_once()
        time.sleep(seconds)
        last = self.inside_at_once()
        turns[me] += 1
        return max(first, last)

    def inside_at_once(self) -> int:
        """How many threads were inside at one moment: those whose turn was odd and the
        same in two readings of all. (One reading, element by element, may count a
        thread that left and, later in it, one that came after: a process switched
        out halfway through the reading would count more holders than there are.)"""
        before = self.turns[:]
        after = self.turns[:]
        steady = zip(before, after, strict=True)
        return sum(1 for turn, again in steady if turn == again and turn % 2)

    def lost(self, writes: int) -> int:
        """How many of ``writes`` left no trace in the counters."""
        return writes - sum(self.counters)


# -- one cell -------------------------------------------------------------------------------


@dataclass
class Cell:
    """What one run of a cell measured."""

    elapsed: float
    ops: list[int] = field(default_factory=list)  # per thread, finished before the stop
    reads: int = 0  # of those (in the semaphore, every hold is a read)
    writes: int = 0
    read_waits: list[float] = field(default_factory=list)  # seconds to acquire
    write_waits: list[float] = field(default_factory=list)
    ran: int = 0  # all sections, including those that finished after the stop
    ran_writes: int = 0
    statements: int = 0  # sent during the run by all processes, for all ``ran``
    retries: int = 0  # statements refused for contention and sent again, by all processes
    violations: int = 0  # sections that met a hold they should have excluded
    lost: int = 0  # writes whose update was lost
    peak: int = 0  # semaphore: the most holders a section saw inside
    leftover: int = 0  # rows still in the lock table after the run


class Worker(ProcessWorker[Side, Holder]):
    """A worker process of this benchmark. Its report adds per-thread operations, reads,
    writes, their waits, sections run in all, violations and the peak of holders."""

    def __init__(
        self,
        entry: Entry,
        scenario: Scenario,
        section: float,
        check: Check,
        number: int,
        signals: Signals,
    ) -> None:
        report = {
            "ops": [],
            "reads": 0,
            "writes": 0,
            "read_waits": array("d"),
            "write_waits": array("d"),
            "ran": 0,
            "ran_writes": 0,
            "violations": 0,
            "peak": 0,
            "retries": 0,
        }
        super().__init__(scenario.threads, number, signals, report)
        self.entry, self.scenario, self.section, self.check = entry, scenario, section, check

    def open(self) -> Side:
        return self.entry.open()

    def member(self, side: Side) -> Holder:
        return side.holder()

    def warm_up(self, member: Holder, me: int) -> None:
        warm = me if self.scenario.semaphore else self.scenario.keys + me
        for write in (True, False):
            member.take(warm, write)
            member.give(warm, write)

    def run(self, holder: Holder, me: int) -> None:
        """Sections until the stop; the one under way then is run but not counted."""
        keys, semaphore, length = self.scenario.keys, self.scenario.semaphore, self.section
        check, stop, clock = self.check, self.stop, time.perf_counter
        choose = random.Random()  # not the module's: forked processes share its state
        waits = {False: array("d"), True: array("d")}
        counted = {False: 0, True: 0}
        ran = ran_writes = violations = peak = 0
        index, write = 0, False
        while True:
            if not semaphore:
                index, write = choose.randrange(keys), choose.random() < WRITE_SHARE
            began = clock()
            holder.take(index, write)
            waited = clock() - began
            if semaphore:
                seen = check.permit(me, length)
                peak = max(peak, seen)
                violations += seen > PERMITS
            else:
                violations += check.read_write(index, write, me, length)
            holder.give(index, write)
            ran += 1
            ran_writes += write
            if stop.is_set():
                break
            counted[write] += 1
            waits[write].append(waited)
            if ran == 1:
                self.count_one()
        with self.gather:
            report = self.report
            report["ops"].append(counted[False] + counted[True])
            report["reads"] += counted[False]
            report["writes"] += counted[True]
            report["read_waits"].extend(waits[False])
            report["write_waits"].extend(waits[True])
            report["ran"] += ran
            report["ran_writes"] += ran_writes
            report["violations"] += violations
            report["peak"] = max(report["peak"], peak)
            report["retries"] = max(report["retries"], holder.retries())  # (one per process)


def run_cell(entry: Entry, scenario: Scenario, seconds: float, section: float) -> Cell:
    """Run ``entry`` under ``scenario`` for ``seconds`` and gather what happened."""
    check = Check(scenario.processes * scenario.threads, scenario.keys)
    worker = partial(Worker, entry, scenario, section, check)
    elapsed, reports = run_workers(scenario.processes, scenario.threads, seconds, worker)
    cell = Cell(elapsed=elapsed)
    for report in reports:
        cell.ops += report["ops"]
        cell.read_waits += report["read_waits"]
        cell.write_waits += report["write_waits"]
        for name in ("reads", "writes", "ran", "ran_writes", "violations", "statements", "retries"):
            setattr(cell, name, getattr(cell, name) + report[name])
        cell.peak = max(cell.peak, report["peak"])
    if not scenario.semaphore:
        cell.lost = check.lost(cell.ran_writes)
    return cell
