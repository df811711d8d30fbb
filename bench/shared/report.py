"""The report of ``python -m bench.shared``: figures of a cell, medians over repeats, a
table per scenario and database, and the header."""

from __future__ import annotations

import argparse
import math
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version

import redis
import sqlalchemy

import tierlock

from ..command import Started
from ..report import DATABASE_TITLES, figure, number, percentile, tallies
from .cell import Cell
from .holders import Entry
from .scenarios import BACKOFF, PERMITS, READ_MOSTLY, SEMAPHORE, Scenario


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
        "retries": cell.retries,
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
        ("retries", "retries", False),
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
        ("retries", "retries", False),
    ],
}
WHOLE = {"rate", "write_rate", "fewest", "most", "peak", "retries"}

LEGEND = (
    "ops/s: sections completed per second, all threads (writes/s: those that wrote); "
    "p50/p99 wait: time to acquire; fewest/most per thread: operations of the least and "
    "the most served thread; Jain: Jain's fairness index of the per-thread operations "
    "(1 = all equal, 1/16 = one thread did all); peak holders: the most semaphore holders "
    "a section saw inside at once (at most the permits); statements/op: SQL statements "
    "(Redis: commands) sent per operation; retries: statements the database refused "
    "for contention (a deadlock it broke, MariaDB's failed auto-increment read, a busy "
    "SQLite file) and tierlock sent again, whole run; violations: sections that met a hold they "
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
        return tallies(
            (
                (sum(cell.violations for cell in self.cells), "overlaps"),
                (sum(cell.lost for cell in self.cells), "lost writes"),
                (sum(cell.leftover for cell in self.cells), "rows left"),
            )
        )


def show(name: str, value: float) -> str:
    """Jain's index with three decimals; the rest as the lock benchmark shows them."""
    if name == "jain" and not math.isnan(value):
        return f"{value:.3f}"
    return number(value, name in WHOLE)


def table(rows: Sequence[Row], scenario: str) -> list[str]:
    columns = COLUMNS[scenario]
    reference = next((row for row in rows if row.entry.name == "tierlock"), None)
    lines = [
        "| implementation | " + " | ".join(header for _, header, _ in columns) + " | violations |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for row in rows:
        cells = [
            figure(row, name, reference if ratio else None, show) for name, _, ratio in columns
        ]
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
        "(redis-py has no semaphore); it needs no database and appears in every table. "
        f"pg_try_advisory_lock slots: the same on PostgreSQL's advisory locks, "
        "`pg_try_advisory_lock` of slots in turn, freed by `pg_advisory_unlock`, one psycopg "
        "connection per thread."
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


def header(args: argparse.Namespace, skipped: list[str], started: Started) -> list[str]:
    details = [
        f"- software: tierlock {tierlock.__version__}, SQLAlchemy {sqlalchemy.__version__}, "
        f"psycopg {version('psycopg')}, PyMySQL {version('PyMySQL')}, redis-py "
        f"{redis.__version__}, Python {platform.python_version()}",
        f"- settings: {args.seconds:g} s per cell, median of {args.repeats} interleaved "
        f"repeat(s); every section sleeps {args.section * 1e6:.0f} µs (I/O, the GIL "
        "released); tierlock with one manager per process, the default poll_interval, "
        "renewed leases, reaper off; `python -m bench.shared`",
        f"- legend: {LEGEND}",
    ]
    return started.header(
        "tierlock benchmark: read/write locks and semaphores", details, skipped, load_at_end=True
    )
