"""The asyncio scenarios: one process whose tasks, all in one event loop, take keys
again and again, beside the sync ``LockManager`` doing the same work with threads.

Worker ``n`` of ``w`` (a task or a thread) takes keys ``n``, ``n + w``, ... in turn,
each its own, or key ``n % keys`` when there are fewer keys than workers: in
``async-hot`` every worker wants the one key, in ``async-spread`` each task has a key
of its own and each of the sync manager's threads a 32nd of them. A section reads the
key's counter in shared memory, awaits ``asyncio.sleep(0)`` (threads: ``time.sleep(0)``,
which lets another thread run) and writes the counter plus one: the holder yields
while it holds, and a lock that let two in would lose an update. There is no busy-wait.

The sync manager runs threads, not ``asyncio.to_thread`` per section: threads are
how it is meant to be used, and ``to_thread`` would run the whole section in a thread
anyway (a hold belongs to the thread that took it), only through the loop's default
executor (at most min(32, cores + 4) threads: 6 on 2 cores) and two more hops. On one
key it has as many threads as there are tasks; over 1000 keys a pool of 32 (the cap
of a default ``ThreadPoolExecutor``), more than its pool of connections (5, and 10 more
on demand) serves at once; 1000 threads would measure the machine's scheduler.

A cell is one forked process, started and stopped as :func:`bench.workload.run_workers`
does; its figures are :class:`bench.workload.Cell`'s, per task in the task rows, and
the threads of the process as the run stopped.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from .asyncio_subjects import TASK_ROWS
from .interface import AsyncContender, AsyncSubject, Contender, Implementation, Subject
from .tally import Tally
from .workload import (
    KEYS,
    Cell,
    Closes,
    Opened,
    ProcessWorker,
    Report,
    Signals,
    Threaded,
    run_workers,
    section_report,
)

T = TypeVar("T")
S = TypeVar("S", bound=Opened)
M = TypeVar("M", bound=Closes)

ASYNC_HOT = "async-hot"
ASYNC_SPREAD = "async-spread"


@dataclass(frozen=True)
class AsyncScenario:
    name: str
    tasks: int  # in the one event loop of the one process
    threads: int  # of the sync manager's row, doing the same work
    keys: int
    blocking: bool = True  # every worker waits for its key (for the report and charts)

    @property
    def description(self) -> str:
        keys = "one key" if self.keys == 1 else f"{self.keys} keys"
        if 1 < self.keys < self.tasks:
            keys += ", shared in turn"
        elif self.keys >= self.tasks > 1:
            keys += ", each task its own"
        return (
            f"1 process x {self.tasks} asyncio tasks in one event loop, {keys}; "
            f"the sync manager with {self.threads} threads"
        )


ASYNC_SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        AsyncScenario(ASYNC_HOT, tasks=100, threads=100, keys=1),
        AsyncScenario(ASYNC_SPREAD, tasks=KEYS, threads=32, keys=KEYS),
    )
}


@dataclass
class AsyncCell(Cell):
    """A cell of an asyncio scenario."""

    threads: int = 0  # of the worker process as the run stopped


def keys_of(number: int, workers: int, keys: int) -> list[int]:
    """The keys of worker ``number`` (from 0) of ``workers``, taken in turn."""
    return list(range(number % keys, keys, workers))


def thread_count() -> int:
    """Threads of this process, Python's and any other's."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def enter(tally: Tally, index: int, me: int) -> tuple[bool, int]:
    """The first half of a section: whether someone is inside, and the counter."""
    overlapped = tally.occupants[index] != 0
    tally.occupants[index] = me
    return overlapped, tally.counters[index]


def leave(tally: Tally, index: int, me: int, value: int) -> bool:
    """The second half: the counter bumped; whether someone came in meanwhile."""
    overlapped = tally.occupants[index] != me
    tally.occupants[index] = 0
    tally.counters[index] = value + 1
    return overlapped


class TaskSide:
    """A task worker's side: its statements, counted until its tasks end."""

    def __init__(self, implementation: Implementation) -> None:
        self.implementation = implementation
        self.subject: AsyncSubject | None = None  # opened by the loop's thread
        self.final: int | None = None  # the count as the tasks ended

    def statements(self) -> int:
        if self.final is not None:
            return self.final
        return 0 if self.subject is None else self.subject.statements()

    def close(self) -> None:
        """Nothing: the loop's thread closes the subject."""


class Loop:
    """The event loop of a task worker's one thread, the subject opened in that thread,
    and a contender per task."""

    def __init__(self, side: TaskSide, tasks: int) -> None:
        subject = side.implementation.open()
        if not isinstance(subject, AsyncSubject):
            raise TypeError(f"{side.implementation.label} is driven by threads, not tasks")
        self.side, self.subject = side, subject
        side.subject = subject
        self.loop = asyncio.new_event_loop()
        self.contenders = [subject.contender() for _ in range(tasks)]

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.subject.aclose())
        finally:
            self.loop.close()


async def all_of(work: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run coroutines as tasks until all end; if one fails, cancel the rest first."""
    tasks = [asyncio.ensure_future(each) for each in work]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Counted:
    """What one task or thread counted, for its process's report."""

    def __init__(self) -> None:
        self.waits = array("d")  # of the sections counted
        self.counted = self.ran = self.overlaps = 0

    def add_to(self, report: Report) -> None:
        report["sections"].append(self.counted)
        report["waits"].extend(self.waits)
        report["ran"] += self.ran
        report["tried"] += self.ran
        report["tries"] += self.counted
        report["overlaps"] += self.overlaps


class Workers(ProcessWorker[S, M]):
    """The one worker process of a cell; its report is :class:`bench.workload.Worker`'s,
    per task or thread, with the threads of the process as the first worker saw the stop."""

    def __init__(
        self,
        implementation: Implementation,
        scenario: AsyncScenario,
        tally: Tally,
        threads: int,
        number: int,
        signals: Signals,
    ) -> None:
        super().__init__(threads, number, signals, {**section_report(), "threads": 0})
        self.implementation, self.scenario, self.tally = implementation, scenario, tally

    def stopped(self) -> bool:
        """Whether the run is over; the first to see it counts the process's threads."""
        if not self.stop.is_set():
            return False
        with self.gather:
            if not self.report["threads"]:
                self.report["threads"] = thread_count()
        return True


class TaskWorker(Workers[TaskSide, Loop]):
    """A task row's process: one thread, whose event loop runs every task."""

    def open(self) -> TaskSide:
        return TaskSide(self.implementation)

    def member(self, side: TaskSide) -> Loop:
        return Loop(side, self.scenario.tasks)

    def warm_up(self, member: Loop, me: int) -> None:
        """Every task connects on a key of its own, off the clock."""

        async def warm(contender: AsyncContender, number: int) -> None:
            async with contender.lock(KEYS + 1 + number):
                pass

        work = [warm(each, number) for number, each in enumerate(member.contenders)]
        member.loop.run_until_complete(all_of(work))

    def run(self, member: Loop, me: int) -> None:
        work = [self.task(each, number) for number, each in enumerate(member.contenders)]
        counts = member.loop.run_until_complete(all_of(work))
        member.side.final = member.subject.statements()  # (not the closing's)
        for counted in counts:
            counted.add_to(self.report)

    async def task(self, contender: AsyncContender, number: int) -> Counted:
        """Sections until the stop; the one under way then is run but not counted."""
        tally, clock, sleep = self.tally, time.perf_counter, asyncio.sleep
        me = number + 1
        keys = keys_of(number, self.scenario.tasks, self.scenario.keys)
        mine = Counted()
        while True:
            index = keys[mine.ran % len(keys)]
            began = clock()
            async with contender.lock(index):
                waited = clock() - began
                overlapped, value = enter(tally, index, me)
                await sleep(0)  # the holder yields: every other ready task runs
                overlapped = leave(tally, index, me, value) or overlapped
            mine.ran += 1
            mine.overlaps += overlapped
            if self.stopped():
                return mine
            mine.counted += 1
            mine.waits.append(waited)
            if mine.counted == 1:
                self.count_one()


class ThreadWorker(Threaded, Workers[Subject, Contender]):
    """The sync manager's process: a thread per worker, as the other scenarios run."""

    def run(self, contender: Contender, me: int) -> None:
        """Sections until the stop; the one under way then is run but not counted."""
        tally, clock, sleep = self.tally, time.perf_counter, time.sleep
        keys = keys_of(me - 1, self.scenario.threads, self.scenario.keys)
        mine = Counted()
        while True:
            index = keys[mine.ran % len(keys)]
            began = clock()
            contender.acquire(index)
            waited = clock() - began
            overlapped, value = enter(tally, index, me)
            sleep(0)  # the holder lets another thread run
            overlapped = leave(tally, index, me, value) or overlapped
            contender.release(index)
            mine.ran += 1
            mine.overlaps += overlapped
            if self.stopped():
                break
            mine.counted += 1
            mine.waits.append(waited)
            if mine.counted == 1:
                self.count_one()
        with self.gather:
            mine.add_to(self.report)


def run_async_cell(
    implementation: Implementation, scenario: AsyncScenario, seconds: float
) -> AsyncCell:
    """Run ``implementation`` under ``scenario`` for ``seconds`` and gather what happened."""
    tally = Tally(scenario.keys)
    worker: Callable[[int, Signals], ProcessWorker[Any, Any]]
    if implementation.name in TASK_ROWS:
        worker = partial(TaskWorker, implementation, scenario, tally, 1)
        threads = 1
    else:
        worker = partial(ThreadWorker, implementation, scenario, tally, scenario.threads)
        threads = scenario.threads
    elapsed, reports = run_workers(1, threads, seconds, worker)
    (report,) = reports
    cell = AsyncCell(
        elapsed=elapsed,
        sections=report["sections"],
        waits=list(report["waits"]),
        ran=report["ran"],
        tries=report["tries"],
        tried=report["tried"],
        statements=report["statements"],
        overlaps=report["overlaps"],
        threads=report["threads"],
    )
    cell.lost = tally.lost(cell.ran)
    return cell
