"""``renewal``: what keeping holds alive costs the database.

One forked process takes ``holds`` locks through one manager, from one thread, and
keeps them for some seconds, doing nothing else. With ``renew=True`` the manager's
heartbeat renews them all at least every ``ttl / 3`` seconds, one UPDATE for each
512 holds; with ``renew=False`` the leases are fixed, long enough to outlast the hold,
and nothing should be sent. What is sent meanwhile is counted where it reaches the
driver (each ``execute`` on a DBAPI cursor of the process, see
:func:`bench.drivers.count_statements`; on a lock directory each file-system call, see
:func:`bench.drivers.count_file_calls`), beside the manager's own ``stats()``.

With renewal, the window is whole beats: it opens as one heartbeat ends and closes as
the first one to end at least the cell's seconds later does, so no beat is cut in two.
Both ends are read in the heartbeat's own thread as its beat returns: read from another
thread, a slow beat on a loaded machine could let the next one begin first.
"""

from __future__ import annotations

import math
import queue
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from typing import Any

import tierlock
from tierlock.urls import engine_of

from .drivers import count_file_calls, count_statements
from .interface import TTL, WAIT_LIMIT
from .report import DATABASE_TITLES, number
from .tally import CTX
from .workload import SETUP_LIMIT, CellError

RENEWAL = "renewal"
HOLDS = 1000
RENEWAL_TTL = 3.0  # a beat at least every second
# How often the process looks at its manager's counters for the end of a beat.
GLANCE = 0.002


@dataclass
class RenewalCell:
    """What one hold of ``holds`` locks for ``elapsed`` seconds sent."""

    holds: int
    elapsed: float
    statements: int  # executed at the driver during the window
    heartbeats: int  # renewal statements, by the manager's stats()
    renewals: int  # holds renewed, by the manager's stats()
    leftover: int = 0  # lock rows still in the table after the cell


@dataclass
class RenewalRow:
    """One database's manager with or without renewal, over all repeats."""

    database: str
    url: str
    renew: bool
    cells: list[RenewalCell] = field(default_factory=list)
    failure: str | None = None

    @property
    def label(self) -> str:
        return "tierlock, renew=True" if self.renew else "tierlock, renew=False"


Snapshot = tuple[int, tierlock.LockStats, float]  # statements at the driver, stats, clock


def _note_beat_ends(manager: tierlock.LockManager, executed: Callable[[], int]) -> list[Snapshot]:
    """What was sent by the end of each heartbeat from now on, noted in its thread."""
    ends: list[Snapshot] = []
    heartbeat = manager._tiers.heartbeat
    beat = heartbeat._beat

    def beat_and_note(holds: list[Any]) -> None:
        beat(holds)
        ends.append((executed(), manager.stats(), time.perf_counter()))

    heartbeat._beat = beat_and_note  # type: ignore[method-assign]
    return ends


def _beat_ended(ends: list[Snapshot], since: int, limit: float) -> Snapshot:
    """Wait until a beat ends after the first ``since``; what was sent by then."""
    deadline = time.monotonic() + limit
    while len(ends) <= since:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no heartbeat ended within {limit} s")
        time.sleep(GLANCE)
    return ends[since]


def hold(
    url: str, table: str, renew: bool, holds: int, ttl: float, seconds: float
) -> dict[str, Any]:
    """Take ``holds`` locks, keep them ``seconds`` (in whole beats with ``renew``), let
    them go; what was sent meanwhile. Run in a process of its own."""
    executed = count_file_calls() if engine_of(url) == "file" else count_statements()
    lease = ttl if renew else TTL + seconds + ttl  # fixed: outlasts the hold
    manager = tierlock.LockManager(
        url, table=table, ttl=lease, renew=renew, create_table=False, reaper_interval=None
    )
    try:
        locks = [manager.lock(f"renewal:{index}") for index in range(holds)]
        for lock in locks:
            if not lock.acquire(timeout=WAIT_LIMIT):
                raise TimeoutError(f"{lock.key!r} not acquired within {WAIT_LIMIT} s")
        beat = 2 * ttl  # far longer than a beat's period, ttl / 3, can take
        if renew:
            ends = _note_beat_ends(manager, executed)
            before, stats_before, began = _beat_ended(ends, 0, beat)
            time.sleep(seconds)
            after, stats_after, ended = _beat_ended(ends, len(ends), beat)
        else:
            before, stats_before, began = executed(), manager.stats(), time.perf_counter()
            time.sleep(seconds)
            after, stats_after, ended = executed(), manager.stats(), time.perf_counter()
        elapsed = ended - began
        for lock in locks:
            lock.release()
    finally:
        manager.close()
    return {
        "holds": holds,
        "elapsed": elapsed,
        "statements": after - before,
        "heartbeats": stats_after.heartbeats - stats_before.heartbeats,
        "renewals": stats_after.renewals - stats_before.renewals,
    }


def _child(results: Queue[dict[str, Any]], *args: Any) -> None:
    try:
        results.put(hold(*args))
    except BaseException:
        results.put({"error": traceback.format_exc()})


def run_renewal(row: RenewalRow, table: str, holds: int, ttl: float, seconds: float) -> RenewalCell:
    """One cell of ``row``, in a forked process."""
    results: Queue[dict[str, Any]] = CTX.Queue()
    process = CTX.Process(
        target=_child,
        args=(results, row.url, table, row.renew, holds, ttl, seconds),
        daemon=True,
    )
    process.start()
    try:
        report = results.get(timeout=2 * SETUP_LIMIT + seconds)
    except queue.Empty:
        report = {"error": f"the holding process sent nothing within {2 * SETUP_LIMIT} s"}
    finally:
        process.join(SETUP_LIMIT)
        if process.is_alive():
            process.kill()
            process.join()
        results.close()
    if "error" in report:
        raise CellError(report["error"])
    return RenewalCell(**report)


# -- the report ------------------------------------------------------------------------------


def _figures(cell: RenewalCell) -> dict[str, float]:
    per_second = cell.statements / cell.elapsed
    beats = cell.renewals / cell.holds  # every beat renews every hold
    return {
        "rate": per_second,
        "per_1000": per_second * 1000 / cell.holds,
        "per_beat": cell.statements / beats if beats else math.nan,
        "heartbeats": cell.heartbeats / cell.elapsed,
        "renewals": cell.renewals / cell.elapsed,
    }


COLUMNS = {
    "rate": "statements/s at the driver",
    "per_1000": "per 1000 holds",
    "per_beat": "statements/beat",
    "heartbeats": "stats: heartbeats/s",
    "renewals": "stats: renewals/s",
}


def renewal_section(
    rows: Sequence[RenewalRow], databases: Sequence[str], holds: int, ttl: float
) -> list[str]:
    """The renewal tables, one per database."""
    lines = [
        f"## {RENEWAL}: 1 process holding {holds} locks, nothing else",
        "",
        f"renew=True: ttl={ttl:g} s, so a heartbeat at least every {ttl / 3:g} s, on SQL "
        "one statement per 512 holds; the window is whole beats. renew=False: fixed leases "
        "that outlast the hold. Statements: every execute on a DBAPI cursor of the "
        "process (Redis: every command; ZooKeeper: every request; lock directory: every "
        "file-system call) during the window; "
        "per 1000 holds: that rate scaled linearly (the SQL heartbeat sends one statement "
        "per started 512); statements/beat: statements per "
        "renewal of every hold; stats: the manager's own counters over the same window. "
        "Medians over repeats.",
        "",
    ]
    for database in databases:
        chosen = [row for row in rows if row.database == database]
        if not chosen:
            continue
        lines += [
            f"### {DATABASE_TITLES[database]}",
            "",
            "| manager | window s | " + " | ".join(COLUMNS.values()) + " | rows left |",
            "|---|---:|" + "---:|" * len(COLUMNS) + "---:|",
        ]
        for row in chosen:
            if row.failure is not None or not row.cells:
                lines.append(f"| {row.label} | failed |" + " - |" * (len(COLUMNS) + 1))
                continue
            window = statistics.median(cell.elapsed for cell in row.cells)
            values = [
                number(statistics.median(_figures(cell)[name] for cell in row.cells))
                for name in COLUMNS
            ]
            leftover = sum(cell.leftover for cell in row.cells)
            lines.append(
                f"| {row.label} | {window:.2f} | " + " | ".join(values) + f" | {leftover} |"
            )
        for row in chosen:
            if row.failure is not None:
                lines.append(f"\n{row.label} failed: {row.failure.strip()}")
        lines.append("")
    return lines
