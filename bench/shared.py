"""``python -m bench.shared``: read/write locks and semaphores next to their peers.

Two scenarios, each run as a cell per implementation and database, ``--repeats`` times
interleaved (every cell of a repeat before the next repeat), reported as medians with
ratios to tierlock's row on the same database:

- ``read-mostly``: 4 processes x 4 threads, 10 keys (``--keys``), a random key per
  operation; 95% of operations read, 5% write. tierlock takes ``read_lock(key)`` to read and
  ``lock(key)`` to write; "tierlock lock only" takes ``lock(key)`` for both, as before
  read locks existed; on PostgreSQL, ``pg_advisory_lock_shared`` and
  ``pg_advisory_lock`` on one psycopg connection per thread. redis-py has no read/write
  lock (its one lock, ``redis.lock.Lock``, is exclusive) and MariaDB's ``GET_LOCK`` has
  no shared mode, so neither has a row.
- ``semaphore``: 4 processes x 4 threads on one key with 5 permits. tierlock's
  ``semaphore(key, permits=5)`` next to a Redis slot semaphore: a thread tries
  ``SET key:<slot> token NX PX ttl`` for slots 0..4 in turn and, when all are taken,
  sleeps about a millisecond and tries again; it frees its slot with a Lua
  compare-and-delete.

Every section sleeps ``--section`` seconds (200 µs; I/O: the GIL is released, so readers of one
process can overlap). What is checked, with shared memory and no mutex: each thread marks
which key it is inside and how; a writer that finds anyone else inside its key, a reader
that finds a writer, a write that lands during a read, or a writer's lost update counts
as a violation, and so does a semaphore section that sees more holders than permits. A
run with no lock at all, shown as a note under each scenario, proves that the check
catches what it should. Rows left in the lock table after a cell count as violations too.

::

    python -m bench.shared                              # into bench/results/shared.md
    python -m bench.shared --db postgresql --scenario read-mostly --seconds 5
    python -m bench.shared --scenario read-mostly --keys 1   # one hot key instead of 10
"""

from __future__ import annotations

import abc
import argparse
import ctypes
import datetime
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from importlib.metadata import version
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any, Protocol

import redis
import sqlalchemy
from sqlalchemy.engine import make_url

import tierlock

from .drivers import postgresql_connection
from .harness import (
    DATABASES,
    REDIS_URL,
    drop,
    machine,
    positive_float,
    positive_int,
    rows_in,
    unreachable,
)
from .interface import TTL, WAIT_LIMIT
from .peers import CountingRedis
from .report import DATABASE_TITLES, number, percentile
from .tally import CTX
from .workload import SETUP_LIMIT, CellError

OUTPUT = Path(__file__).resolve().parent / "results" / "shared.md"
READ_MOSTLY, SEMAPHORE = "read-mostly", "semaphore"
WRITE_SHARE = 0.05  # of read-mostly's operations
PERMITS = 5  # of the semaphore
SECTION = 200e-6  # seconds asleep in every section
BACKOFF = 1e-3  # the Redis slot semaphore's sleep when every slot is taken, +-50%
IMPLEMENTATIONS = ("tierlock", "tierlock-exclusive", "advisory", "redis-slots", "none")


@dataclass(frozen=True)
class Scenario:
    name: str
    processes: int
    threads: int  # per process
    keys: int  # contended keys; each thread warms up on one of its own beyond them
    semaphore: bool

    @property
    def description(self) -> str:
        shape = f"{self.processes} processes x {self.threads} threads"
        if self.semaphore:
            return f"{shape}, one semaphore of {PERMITS} permits"
        keys = "one key" if self.keys == 1 else f"{self.keys} keys, a random one per operation"
        return f"{shape}, {keys}; {1 - WRITE_SHARE:.0%} reads, {WRITE_SHARE:.0%} writes"


SCENARIOS = {
    READ_MOSTLY: Scenario(READ_MOSTLY, 4, 4, 10, semaphore=False),
    SEMAPHORE: Scenario(SEMAPHORE, 4, 4, 1, semaphore=True),
}


# -- what a thread takes and frees ----------------------------------------------------------


class Holder(abc.ABC):
    """One thread's way to take and free key ``index``, to write or to read (a
    semaphore ignores ``write``: every hold is a permit)."""

    sent = 0  # statements or commands sent, counted by holders that send their own

    def statements(self) -> int:
        return self.sent

    @abc.abstractmethod
    def take(self, index: int, write: bool) -> None:
        """Take the key, waiting as long as it takes (up to ``WAIT_LIMIT``)."""

    @abc.abstractmethod
    def give(self, index: int, write: bool) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the holder opened."""


class Side:
    """One worker process's side of an implementation: a holder per thread."""

    def __init__(self, make: Callable[[], Holder]) -> None:
        self.make = make
        self.holders: list[Holder] = []
        self._mutex = threading.Lock()

    def holder(self) -> Holder:
        holder = self.make()
        with self._mutex:
            self.holders.append(holder)
        return holder

    def statements(self) -> int:
        with self._mutex:
            return sum(holder.statements() for holder in self.holders)

    def close(self) -> None:
        """Nothing: each thread closes its own holder."""


class Hold(Protocol):
    """What tierlock's handles (lock, read lock, semaphore) have in common here."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


# How tierlock's holders take keys.
READ_WRITE, EXCLUSIVE, PERMIT = "read-write", "exclusive", "permit"


class TierlockHolder(Holder):
    """A thread's handles on the process's manager, made once per key and mode."""

    def __init__(self, manager: tierlock.LockManager, mode: str) -> None:
        self.manager, self.mode = manager, mode
        self.handles: dict[tuple[int, bool], Hold] = {}

    def handle(self, index: int, write: bool) -> Hold:
        handle = self.handles.get((index, write))
        if handle is None:
            if self.mode == PERMIT:
                handle = self.manager.semaphore(f"sem{index}", permits=PERMITS)
            elif write or self.mode == EXCLUSIVE:
                handle = self.manager.lock(f"doc{index}")
            else:
                handle = self.manager.read_lock(f"doc{index}")
            self.handles[index, write] = handle
        return handle

    def take(self, index: int, write: bool) -> None:
        if not self.handle(index, write).acquire(timeout=WAIT_LIMIT):
            raise TimeoutError(f"key {index} not acquired within {WAIT_LIMIT} s")

    def give(self, index: int, write: bool) -> None:
        self.handle(index, write).release()

    def close(self) -> None:
        """Nothing: the manager is the side's."""


class TierlockSide(Side):
    """One manager per process, shared by its threads: tier 1 at work."""

    def __init__(self, url: str, table: str, mode: str) -> None:
        self.manager = tierlock.LockManager(
            url, table=table, ttl=TTL, create_table=False, reaper_interval=None
        )
        super().__init__(partial(TierlockHolder, self.manager, mode))

    def statements(self) -> int:
        stats = self.manager.stats()
        return stats.statements + stats.doorbell_queries

    def close(self) -> None:
        self.manager.close()


class AdvisoryHolder(Holder):
    """PostgreSQL's session advisory locks on ``base + index`` on a connection of the
    thread's own: shared to read, exclusive to write, waiting on the server."""

    def __init__(self, url: str, base: int) -> None:
        self.connection = postgresql_connection(make_url(url))
        self.base = base

    def query(self, sql: str, index: int) -> Any:
        self.sent += 1
        row = self.connection.execute(sql, (self.base + index,)).fetchone()
        return None if row is None else row[0]

    def take(self, index: int, write: bool) -> None:
        shared = "" if write else "_shared"
        self.query(f"SELECT pg_advisory_lock{shared}(%s)", index)

    def give(self, index: int, write: bool) -> None:
        shared = "" if write else "_shared"
        if self.query(f"SELECT pg_advisory_unlock{shared}(%s)", index) is not True:
            raise RuntimeError(f"pg_advisory_unlock{shared} of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


# KEYS[1]: a slot; ARGV[1]: the holder's token. Deletes the slot only if it is still ours.
COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class RedisSlotsHolder(Holder):
    """A semaphore of ``PERMITS`` slot keys: ``SET <key>:<slot> token NX PX ttl`` for
    slots 0.. in turn until one is set; when none is, a sleep of about ``BACKOFF`` and
    the round again. Freed with a Lua compare-and-delete."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = CountingRedis(connection_pool=redis.ConnectionPool.from_url(url))
        self.release_script = self.client.register_script(COMPARE_AND_DELETE)
        self.prefix = prefix
        self.token = uuid.uuid4().hex
        self.held: dict[int, list[str]] = {}  # slot keys held, by index
        self.choose = random.Random()

    def statements(self) -> int:
        return self.client.commands

    def take(self, index: int, write: bool) -> None:
        deadline = time.monotonic() + WAIT_LIMIT
        ttl_ms = int(TTL * 1000)
        while True:
            for slot in range(PERMITS):
                key = f"{self.prefix}{index}:{slot}"
                if self.client.set(key, self.token, nx=True, px=ttl_ms):
                    self.held.setdefault(index, []).append(key)
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no slot of key {index} within {WAIT_LIMIT} s")
            time.sleep(BACKOFF * self.choose.uniform(0.5, 1.5))

    def give(self, index: int, write: bool) -> None:
        key = self.held[index].pop()
        if self.release_script(keys=[key], args=[self.token]) != 1:
            raise RuntimeError(f"slot {key} was no longer ours")

    def close(self) -> None:
        self.client.close()


class NoLockHolder(Holder):
    """Takes nothing: the check must catch the overlaps."""

    def take(self, index: int, write: bool) -> None:
        pass

    def give(self, index: int, write: bool) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Entry:
    """An implementation under one scenario on one server: a row of the report."""

    name: str  # for --impl
    label: str
    scenario: str
    database: str | None  # None: needs no database, shown in every database's table
    open: Callable[[], Side]  # called in each worker process
    excludes: bool = True  # False for the run without a lock, whose violations are expected


def entries(urls: dict[str, str], table: str, run: str, redis_url: str | None) -> list[Entry]:
    """Every row on the given databases and Redis server; ``run`` keeps this run's
    advisory keys and Redis keys apart from any other run's."""
    prefix = f"bench-shared:{run}:"
    base = int(run[:10], 16) << 16  # 40 random bits, 16 for the index
    found: list[Entry] = []
    for database, url in urls.items():
        found += [
            Entry(
                "tierlock",
                "tierlock read_lock/lock",
                READ_MOSTLY,
                database,
                partial(TierlockSide, url, table, READ_WRITE),
            ),
            Entry(
                "tierlock-exclusive",
                "tierlock lock only",
                READ_MOSTLY,
                database,
                partial(TierlockSide, url, table, EXCLUSIVE),
            ),
        ]
        if database == "postgresql":
            found.append(
                Entry(
                    "advisory",
                    "pg_advisory_lock_shared/pg_advisory_lock",
                    READ_MOSTLY,
                    database,
                    partial(Side, partial(AdvisoryHolder, url, base)),
                )
            )
        found.append(
            Entry(
                "tierlock",
                "tierlock semaphore",
                SEMAPHORE,
                database,
                partial(TierlockSide, url, table, PERMIT),
            )
        )
    if redis_url is not None:
        found.append(
            Entry(
                "redis-slots",
                "Redis SET NX PX slots",
                SEMAPHORE,
                None,
                partial(Side, partial(RedisSlotsHolder, redis_url, prefix)),
            )
        )
    found += [
        Entry("none", "no lock", name, None, partial(Side, NoLockHolder), excludes=False)
        for name in SCENARIOS
    ]
    return found


# -- the check ------------------------------------------------------------------------------


class Check:
    """Who is inside which key, and a counter per key that only writers bump.

    Each thread (numbered from 1) writes only its own slot: the key it is inside plus
    one, negated for a write (1 for a permit). Nothing guards them with a mutex, so the
    check adds no synchronisation that could hide a broken lock.
    """

    def __init__(self, threads: int, keys: int) -> None:
        self.slots = CTX.RawArray(ctypes.c_longlong, threads + 1)
        self.counters = CTX.RawArray(ctypes.c_longlong, keys)

    def conflict(self, me: int, index: int, write: bool) -> bool:
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
        self.slots[me] = 1
        first = sum(self.slots[:])
        time.sleep(seconds)
        last = sum(self.slots[:])
        self.slots[me] = 0
        return max(first, last)

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
    violations: int = 0  # sections that met a hold they should have excluded
    lost: int = 0  # writes whose update was lost
    peak: int = 0  # semaphore: the most holders a section saw inside
    leftover: int = 0  # rows still in the lock table after the run


class Worker:
    """One worker process: ``scenario.threads`` threads that run sections until ``stop``."""

    def __init__(
        self,
        entry: Entry,
        scenario: Scenario,
        number: int,
        section: float,
        check: Check,
        start: Barrier,
        stop: Event,
    ) -> None:
        self.entry, self.scenario, self.number, self.section = entry, scenario, number, section
        self.check, self.start, self.stop = check, start, stop
        self.ready = threading.Barrier(scenario.threads + 1)
        self.gather = threading.Lock()
        self.report: dict[str, Any] = {
            "ops": [],
            "reads": 0,
            "writes": 0,
            "read_waits": array("d"),
            "write_waits": array("d"),
            "ran": 0,
            "ran_writes": 0,
            "violations": 0,
            "peak": 0,
            "statements": 0,
            "errors": [],
        }

    def fail(self) -> None:
        self.report["errors"].append(traceback.format_exc())
        self.ready.abort()
        self.start.abort()
        self.stop.set()

    def __call__(self, results: Queue[dict[str, Any]]) -> None:
        try:
            side = self.entry.open()
        except BaseException:
            self.fail()
            results.put(self.report)
            return
        first = self.number * self.scenario.threads + 1
        threads = [
            threading.Thread(target=self.thread, args=(side, first + offset), daemon=True)
            for offset in range(self.scenario.threads)
        ]
        try:
            for thread in threads:
                thread.start()
            self.ready.wait(SETUP_LIMIT)
            baseline = side.statements()
            deadline = time.monotonic() + SETUP_LIMIT
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            self.report["statements"] = side.statements() - baseline
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

    def thread(self, side: Side, me: int) -> None:
        try:
            holder = side.holder()
            try:
                # Connects and fills caches on a key of its own, off the clock.
                warm = me if self.scenario.semaphore else self.scenario.keys + me
                for write in (True, False):
                    holder.take(warm, write)
                    holder.give(warm, write)
                self.ready.wait(SETUP_LIMIT)
                self.start.wait(SETUP_LIMIT)
                self.run(holder, me)
            finally:
                holder.close()
        except BaseException:
            self.fail()

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


def run_cell(entry: Entry, scenario: Scenario, seconds: float, section: float) -> Cell:
    """Run ``entry`` under ``scenario`` for ``seconds`` and gather what happened."""
    check = Check(scenario.processes * scenario.threads, scenario.keys)
    start = CTX.Barrier(scenario.processes * scenario.threads + 1)
    stop = CTX.Event()
    results: Queue[dict[str, Any]] = CTX.Queue()
    processes = [
        CTX.Process(
            target=Worker(entry, scenario, number, section, check, start, stop),
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
            cell.ops += report["ops"]
            cell.read_waits += report["read_waits"]
            cell.write_waits += report["write_waits"]
            for name in ("reads", "writes", "ran", "ran_writes", "violations", "statements"):
                setattr(cell, name, getattr(cell, name) + report[name])
            cell.peak = max(cell.peak, report["peak"])
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
    if not scenario.semaphore:
        cell.lost = check.lost(cell.ran_writes)
    return cell


# -- the report -----------------------------------------------------------------------------


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index of per-thread counts: 1 when all are equal, 1/n when one
    thread did everything."""
    squares = sum(count * count for count in counts)
    return sum(counts) ** 2 / (len(counts) * squares) if squares else math.nan


def figures(cell: Cell) -> dict[str, float]:
    reads, writes = sorted(cell.read_waits), sorted(cell.write_waits)
    elapsed = cell.elapsed or math.nan
    return {
        "rate": sum(cell.ops) / elapsed,
        "write_rate": cell.writes / elapsed,
        "p50_read": percentile(reads, 0.50) * 1000,
        "p99_read": percentile(reads, 0.99) * 1000,
        "p50_write": percentile(writes, 0.50) * 1000,
        "p99_write": percentile(writes, 0.99) * 1000,
        "fewest": min(cell.ops, default=0),
        "most": max(cell.ops, default=0),
        "jain": jain(cell.ops),
        "peak": cell.peak,
        "per_op": cell.statements / cell.ran if cell.ran else math.nan,
    }


# Columns of each scenario's table: figure name, header, whether to show a ratio.
COLUMNS = {
    READ_MOSTLY: [
        ("rate", "ops/s", True),
        ("write_rate", "writes/s", True),
        ("p50_read", "p50 read wait ms", True),
        ("p99_read", "p99 read wait ms", True),
        ("p50_write", "p50 write wait ms", True),
        ("p99_write", "p99 write wait ms", True),
        ("fewest", "fewest/thread", False),
        ("most", "most/thread", False),
        ("jain", "Jain", False),
        ("per_op", "statements/op", True),
    ],
    SEMAPHORE: [
        ("rate", "ops/s", True),
        ("p50_read", "p50 wait ms", True),
        ("p99_read", "p99 wait ms", True),
        ("fewest", "fewest/thread", False),
        ("most", "most/thread", False),
        ("jain", "Jain", False),
        ("peak", "peak holders", False),
        ("per_op", "statements/op", True),
    ],
}
WHOLE = {"rate", "write_rate", "fewest", "most", "peak"}

LEGEND = (
    "ops/s: sections completed per second, all threads (writes/s: those that wrote); "
    "p50/p99 wait: time to acquire; fewest/most per thread: operations of the least and "
    "the most served thread; Jain: Jain's fairness index of the per-thread operations "
    "(1 = all equal, 1/16 = one thread did all); peak holders: the most semaphore holders "
    "a section saw inside at once (at most the permits); statements/op: SQL statements "
    "(Redis: commands) sent per operation; violations: sections that met a hold they "
    "should have excluded, lost writes, and rows left in the table, summed over repeats. "
    "Each figure is the median over repeats and (0.83x) its ratio to the first tierlock "
    "row's on the same database, measured in the same run."
)


@dataclass
class Row:
    entry: Entry
    cells: list[Cell] = field(default_factory=list)
    failure: str | None = None

    def median(self, name: str) -> float:
        return statistics.median(figures(cell)[name] for cell in self.cells)

    def violated(self) -> bool:
        return self.entry.excludes and any(
            cell.violations or cell.lost or cell.leftover for cell in self.cells
        )

    def violations(self) -> str:
        if self.failure is not None:
            return "failed"
        parts = [
            f"{count} {what}"
            for count, what in (
                (sum(cell.violations for cell in self.cells), "overlaps"),
                (sum(cell.lost for cell in self.cells), "lost writes"),
                (sum(cell.leftover for cell in self.cells), "rows left"),
            )
            if count
        ]
        return ", ".join(parts) or "0"


def figure(row: Row, name: str, ratio: bool, reference: Row | None) -> str:
    if row.failure is not None or not row.cells:
        return "-"
    value = row.median(name)
    shown = number(value, name in WHOLE)
    if name == "jain" and not math.isnan(value):
        shown = f"{value:.3f}"
    if not ratio or reference is None or reference is row:
        return shown
    if reference.failure is not None or not reference.cells:
        return shown
    base = reference.median(name)
    if math.isnan(value) or math.isnan(base) or base == 0:
        return shown
    return f"{shown} ({value / base:.2f}x)"


def table(rows: Sequence[Row], scenario: str) -> list[str]:
    columns = COLUMNS[scenario]
    reference = next((row for row in rows if row.entry.name == "tierlock"), None)
    lines = [
        "| implementation | " + " | ".join(header for _, header, _ in columns) + " | violations |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for row in rows:
        cells = [figure(row, name, ratio, reference) for name, _, ratio in columns]
        lines.append(f"| {row.entry.label} | " + " | ".join(cells) + f" | {row.violations()} |")
    lines += [
        f"\n{row.entry.label} failed: {row.failure.strip()}"
        for row in rows
        if row.failure is not None
    ]
    return lines


NOTES = {
    READ_MOSTLY: (
        "tierlock read_lock/lock: `read_lock(key)` to read, `lock(key)` to write; tierlock "
        "lock only: `lock(key)` for both, as before read locks; pg_advisory_lock_shared/"
        "pg_advisory_lock: the server's own shared and exclusive advisory locks, waiting on "
        "the server, one psycopg connection per thread. No Redis row: redis-py "
        f"{redis.__version__} has no read/write lock (its one lock, `redis.lock.Lock`, is "
        "exclusive). No server peer on MariaDB, whose `GET_LOCK` has no shared mode, nor on "
        "SQLite."
    ),
    SEMAPHORE: (
        f"tierlock semaphore: `semaphore(key, permits={PERMITS})`; Redis SET NX PX slots: "
        f"`SET key:<slot> token NX PX ttl` for slots 0..{PERMITS - 1} in turn, a sleep of "
        f"{BACKOFF * 1000:g} ms +-50% when all are taken, freed by a Lua compare-and-delete "
        "(redis-py has no semaphore); it needs no database and appears in every table."
    ),
}


def no_lock_note(row: Row) -> str:
    if row.failure is not None:
        return f"The run without a lock failed: {row.failure.strip()}"
    caught = sum(cell.violations for cell in row.cells)
    lost = sum(cell.lost for cell in row.cells)
    peak = max((cell.peak for cell in row.cells), default=0)
    rate = number(row.median("rate"), True) if row.cells else "-"
    what = f"{caught} overlaps and {lost} lost writes"
    if row.entry.scenario == SEMAPHORE:
        what = f"{caught} sections with more than {PERMITS} holders inside (peak {peak})"
    return (
        f"The check has teeth: with no lock at all, the same workload ran {rate} ops/s and "
        f"the check caught {what}."
    )


def section(scenario: Scenario, rows: Sequence[Row], databases: Sequence[str]) -> list[str]:
    lines = [f"## {scenario.name}: {scenario.description}", "", NOTES[scenario.name], ""]
    shown = [row for row in rows if row.entry.excludes]
    for database in databases:
        chosen = [row for row in shown if row.entry.database in (database, None)]
        if any(row.entry.database == database for row in chosen):
            title = DATABASE_TITLES[database]
            lines += [f"### {title}", "", *table(chosen, scenario.name), ""]
    if not any(row.entry.database for row in shown) and shown:  # (--impl chose no tierlock)
        lines += ["### Without a database", "", *table(shown, scenario.name), ""]
    lines += [no_lock_note(row) for row in rows if not row.entry.excludes]
    return [*lines, ""]


def header(
    args: argparse.Namespace, skipped: list[str], wall: float, started: str, host: str
) -> list[str]:
    lines = [
        "# tierlock benchmark: read/write locks and semaphores",
        "",
        f"- date: {started}; wall time {wall / 60:.1f} min",
        f"- machine: {host}, {' '.join(f'{v:.2f}' for v in os.getloadavg())} at the end",
        f"- software: tierlock {tierlock.__version__}, SQLAlchemy {sqlalchemy.__version__}, "
        f"psycopg {version('psycopg')}, PyMySQL {version('PyMySQL')}, redis-py "
        f"{redis.__version__}, Python {platform.python_version()}",
        f"- settings: {args.seconds:g} s per cell, median of {args.repeats} interleaved "
        f"repeat(s); every section sleeps {args.section * 1e6:.0f} µs (I/O, the GIL "
        "released); tierlock with one manager per process, the default poll_interval, "
        "renewed leases, reaper off; `python -m bench.shared`",
        f"- legend: {LEGEND}",
    ]
    lines += [f"- skipped: {note}" for note in skipped]
    return [*lines, ""]


# -- the command ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.shared",
        description="tierlock's read/write locks and semaphores next to PostgreSQL's shared "
        "advisory locks and a Redis slot semaphore.",
    )
    parser.add_argument(
        "--db", action="append", choices=sorted(DATABASES), help="database (repeatable; all)"
    )
    parser.add_argument(
        "--dburi", action="append", default=[], metavar="NAME=URL", help="URL for database NAME"
    )
    parser.add_argument(
        "--impl", action="append", choices=IMPLEMENTATIONS, help="implementation (repeatable; all)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS), help="scenario (repeatable; all)"
    )
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per cell (3)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="of each cell (3)")
    parser.add_argument(
        "--section",
        type=positive_float,
        default=SECTION,
        help=f"seconds asleep in each section ({SECTION:g})",
    )
    parser.add_argument(
        "--keys",
        type=positive_int,
        default=SCENARIOS[READ_MOSTLY].keys,
        help=f"{READ_MOSTLY}: keys ({SCENARIOS[READ_MOSTLY].keys})",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"report file ({OUTPUT})")
    parser.add_argument(
        "--table",
        default=f"bench_{uuid.uuid4().hex[:12]}",
        help="lock table, created and dropped on each database (default: a random name)",
    )
    args = parser.parse_args(argv)
    args.scenarios = {**SCENARIOS, READ_MOSTLY: replace(SCENARIOS[READ_MOSTLY], keys=args.keys)}
    urls = dict(DATABASES)
    for item in args.dburi:
        name, _, url = item.partition("=")
        if name not in DATABASES or not url:
            parser.error(f"--dburi takes NAME=URL with NAME in {sorted(DATABASES)}")
        urls[name] = url
    args.urls = urls
    return args


def run_cells(args: argparse.Namespace, rows: list[Row], urls: dict[str, str]) -> None:
    """Every row's cell, ``args.repeats`` times, interleaved; after each cell of a lock
    table, the rows left in it are counted (and removed)."""
    for repeat in range(args.repeats):
        for row in rows:
            entry = row.entry
            if row.failure is not None:
                continue
            where = f"{entry.label} on {entry.database or 'no database'}"
            try:
                cell = run_cell(entry, args.scenarios[entry.scenario], args.seconds, args.section)
            except CellError as exc:
                row.failure = str(exc)
                print(f"{entry.scenario}, {where} failed:\n{exc}", file=sys.stderr)
                continue
            if entry.name.startswith("tierlock") and entry.database is not None:
                cell.leftover = rows_in(urls[entry.database], args.table)
            row.cells.append(cell)
            print(
                f"repeat {repeat + 1}/{args.repeats} {entry.scenario}, {where}: "
                f"{sum(cell.ops) / cell.elapsed:.0f} ops/s",
                file=sys.stderr,
            )


def servers(
    args: argparse.Namespace, scratch: Path, redis_wanted: bool
) -> tuple[dict[str, str], str | None, list[str]]:
    """The databases' URLs (by name) and the Redis server's that can be used, and a
    note for each that cannot. SQLite's default: a file in ``scratch``."""
    urls: dict[str, str] = {}
    skipped: list[str] = []
    for name in DATABASES:
        if args.db and name not in args.db:
            continue
        url = args.urls[name] or f"sqlite:///{scratch / 'bench.db'}"
        reason = unreachable(url)
        if reason is None:
            urls[name] = url
        else:
            skipped.append(f"{name}: {reason}")
    redis_url: str | None = None
    if redis_wanted:
        reason = unreachable(REDIS_URL)
        if reason is None:
            redis_url = REDIS_URL
        else:
            skipped.append(f"redis: {reason}")
    return urls, redis_url, skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    scenarios = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    chosen = set(args.impl or IMPLEMENTATIONS)
    redis_wanted = "redis-slots" in chosen and SEMAPHORE in scenarios
    with tempfile.TemporaryDirectory(prefix="tierlock-bench-shared-") as scratch:
        urls, redis_url, skipped = servers(args, Path(scratch), redis_wanted)
        for note in skipped:
            print(f"skipped {note}", file=sys.stderr)
        rows = [
            Row(entry)
            for entry in entries(urls, args.table, uuid.uuid4().hex[:12], redis_url)
            if entry.name in chosen and entry.scenario in scenarios
        ]
        if not any(row.entry.excludes for row in rows):
            print("nothing to measure", file=sys.stderr)
            return 1
        try:
            for url in urls.values():
                tierlock.LockManager(url, table=args.table, reaper_interval=None).close()
            run_cells(args, rows, urls)
        finally:
            for url in urls.values():
                drop(url, args.table)
    lines: list[str] = []
    for name in scenarios:
        chosen_rows = [row for row in rows if row.entry.scenario == name]
        lines += section(args.scenarios[name], chosen_rows, list(urls))
    report = "\n".join(header(args, skipped, time.monotonic() - began, started, host) + lines)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report, encoding="utf-8")
    failed = any(row.failure is not None or row.violated() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
