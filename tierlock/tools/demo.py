"""``tierlock demo``: money moving between accounts, first guarded by tierlock, then not.

Worker processes run threads that move random amounts between random accounts kept in
a table of the database under test. A transfer reads both balances, pauses and writes
both back in separate autocommit statements, with no transaction around them: two
transfers that overlap on an account overwrite each other's writes unless something
keeps them apart. The guarded run takes both accounts' locks with ``lock_all``, which
takes them in one order, so that no two transfers can wait for each other in a circle;
the unguarded run takes none. Both totals are summed from the table itself, before and
after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import queue
import random
import threading
import time
from collections.abc import Iterator
from multiprocessing.context import ForkProcess
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..manager import LockManager
from ..stats import LockStats
from ..urls import shown_url
from .demo_accounts import Accounts, open_accounts

__all__ = ["DemoConfig", "DemoRun", "run_demo"]

CTX = multiprocessing.get_context("fork")

# Two processes of four threads keep both cores of a small machine busy and give tier 1
# several local threads to queue; twenty accounts make transfers collide often.
DEFAULT_PROCESSES = 2
DEFAULT_THREADS = 4
DEFAULT_ACCOUNTS = 20
DEFAULT_SECONDS = 4.0
OPENING_BALANCE = 1000
MAX_AMOUNT = 100
# Bounds that only a broken lock or a hung worker reaches; they end the demo with a
# message instead of a hang.
LOCK_WAIT_LIMIT = 30.0
START_LIMIT = 60.0
KEY_PREFIX = "tierlock-demo:account"


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    url: str
    table: str  # the lock table
    processes: int = DEFAULT_PROCESSES
    threads: int = DEFAULT_THREADS
    accounts: int = DEFAULT_ACCOUNTS
    seconds: float = DEFAULT_SECONDS


@dataclasses.dataclass(frozen=True)
class WorkerReport:
    """What one worker process sends back."""

    transfers: int = 0
    elapsed: float = 0.0
    waits: list[float] = dataclasses.field(default_factory=list)  # seconds per transfer
    stats: LockStats | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class DemoRun:
    """One run, guarded or not, with every worker's numbers summed."""

    guarded: bool
    transfers: int
    elapsed: float
    total_before: int
    total_after: int
    stats: LockStats | None  # None for the unguarded run
    waits: list[float]
    errors: list[str]

    @property
    def conserved(self) -> bool:
        return self.total_before == self.total_after

    @property
    def rate(self) -> float:
        return self.transfers / self.elapsed if self.elapsed else 0.0


def counted(number: int, one: str, many: str) -> str:
    """ "1 thread", "4 threads"."""
    return f"{number} {one if number == 1 else many}"


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _work(
    config: DemoConfig,
    guarded: bool,
    start: Barrier,
    done: Synchronized[int],
    reports: Queue[WorkerReport],
) -> None:
    """A worker process: ``config.threads`` threads transferring until the time is up."""
    try:
        reports.put(_transfer_until_done(config, guarded, start, done))
    except BaseException as exc:
        start.abort()  # the parent and the other workers stop waiting for this one
        reports.put(WorkerReport(error=_one_line(exc)))


def _transfer_until_done(
    config: DemoConfig, guarded: bool, start: Barrier, done: Synchronized[int]
) -> WorkerReport:
    accounts = open_accounts(config.url, config.table, config.threads)
    locks = (
        LockManager(config.url, table=config.table, create_table=False, reaper_interval=None)
        if guarded
        else None
    )
    waits: list[float] = []
    errors: list[str] = []
    counts = [0] * config.threads

    def transfer(source: int, target: int, amount: int) -> None:
        if locks is None:
            accounts.move(source, target, amount)
            return
        both = locks.lock_all([(KEY_PREFIX, source), (KEY_PREFIX, target)], timeout=LOCK_WAIT_LIMIT)
        began = time.perf_counter()
        with both:
            waits.append(time.perf_counter() - began)
            accounts.move(source, target, amount)

    def loop(index: int, deadline: float) -> None:
        choose = random.Random()  # not the module's: forked workers share its state
        try:
            while time.monotonic() < deadline:
                source, target = choose.sample(range(config.accounts), 2)
                transfer(source, target, choose.randint(1, MAX_AMOUNT))
                counts[index] += 1
                with done.get_lock():
                    done.value += 1
        except Exception as exc:
            errors.append(_one_line(exc))

    try:
        start.wait(START_LIMIT)
        began = time.monotonic()
        deadline = began + config.seconds
        threads = [
            threading.Thread(target=loop, args=(index, deadline), name=f"transfers-{index}")
            for index in range(config.threads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        stats = None if locks is None else locks.stats()
    finally:
        if locks is not None:
            locks.close()
        accounts.close()
    return WorkerReport(
        transfers=sum(counts),
        elapsed=elapsed,
        waits=waits,
        stats=stats,
        error=errors[0] if errors else None,
    )


def _sum_stats(stats: list[LockStats]) -> LockStats:
    return LockStats(
        **{
            field.name: sum(getattr(one, field.name) for one in stats)
            for field in dataclasses.fields(LockStats)
        }
    )


@contextlib.contextmanager
def _accounts(config: DemoConfig) -> Iterator[Accounts]:
    """The accounts, for this process between forks: the workers are forked, and must
    inherit no connection (nor a ZooKeeper client's threads) to share."""
    accounts = open_accounts(config.url, config.table, 1)
    try:
        yield accounts
    finally:
        accounts.close()


def _run(config: DemoConfig, guarded: bool, console: Console) -> DemoRun:
    """Seed the accounts, run the workers, and sum up what they did."""
    with _accounts(config) as accounts:
        accounts.seed(config.accounts, OPENING_BALANCE)
        before = accounts.total()

    start = CTX.Barrier(config.processes + 1)
    done: Synchronized[int] = CTX.Value("q", 0)
    reports: Queue[WorkerReport] = CTX.Queue()
    workers: list[ForkProcess] = [
        CTX.Process(target=_work, args=(config, guarded, start, done, reports), daemon=True)
        for _ in range(config.processes)
    ]
    for worker in workers:
        worker.start()
    label = "with tierlock" if guarded else "without a lock"
    received = _collect(workers, start, done, reports, config.seconds, _progress(console, label))
    for worker in workers:
        worker.join(START_LIMIT)
    errors = [report.error for report in received if report.error is not None]
    with _accounts(config) as accounts:
        after = accounts.total()
        if not guarded:
            accounts.drop()
    if len(received) < len(workers):
        errors.append(f"{len(workers) - len(received)} worker(s) ended without a report")
    return DemoRun(
        guarded=guarded,
        transfers=sum(report.transfers for report in received),
        elapsed=max((report.elapsed for report in received), default=0.0),
        total_before=before,
        total_after=after,
        stats=_sum_stats([r.stats for r in received if r.stats is not None]) if guarded else None,
        waits=[wait for report in received for wait in report.waits],
        errors=errors,
    )


def _collect(
    workers: list[ForkProcess],
    start: Barrier,
    done: Synchronized[int],
    reports: Queue[WorkerReport],
    seconds: float,
    progress: Progress,
) -> list[WorkerReport]:
    """Show progress until every worker has reported or died.

    The progress bar's thread starts only now, after the fork: a child forked while it
    runs could inherit a lock it holds.
    """
    received: list[WorkerReport] = []
    with progress:
        task = progress.add_task("", total=seconds, transfers=0)
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(START_LIMIT)  # broken if a worker failed to start; its report says why
        began = time.monotonic()
        while len(received) < len(workers):
            try:
                received.append(reports.get(timeout=0.1))
            except queue.Empty:
                if not any(worker.is_alive() for worker in workers) and reports.empty():
                    break
            elapsed = min(time.monotonic() - began, seconds)
            progress.update(task, completed=elapsed, transfers=done.value)
        progress.update(task, completed=seconds, transfers=done.value)
    return received


def _progress(console: Console, label: str) -> Progress:
    return Progress(
        TextColumn(f"{label:<15}"),
        BarColumn(),
        TextColumn("{task.fields[transfers]:>7,} transfers"),
        TimeElapsedColumn(),
        console=console,
    )


def run_demo(config: DemoConfig, console: Console) -> tuple[DemoRun, DemoRun]:
    """The guarded run, then the unguarded one, with a progress bar for each."""
    # Made here, before any worker exists, so the workers need not race to make it.
    LockManager(config.url, table=config.table, reaper_interval=None).close()
    console.print(
        f"tierlock demo on {shown_url(config.url)}: "
        f"{counted(config.processes, 'process', 'processes')} x "
        f"{counted(config.threads, 'thread', 'threads')} move money between "
        f"{config.accounts} accounts, {config.seconds:g} s with tierlock, then "
        f"{config.seconds:g} s without a lock",
        highlight=False,
    )
    return _run(config, True, console), _run(config, False, console)
