"""``python -m bench``: tierlock next to its peers and floors, under the same workloads,
on each engine: SQLite, MariaDB, PostgreSQL, Redis, ZooKeeper and a lock directory
(``file``, next to filelock's ``FileLock``).

Every implementation runs every scenario for ``--seconds``, ``--repeats`` times, the
repeats interleaved so that noise spreads over all; the report gives the median of
each figure and its ratio to tierlock's on the same engine. On the SQL databases the
uncontended and spread scenarios end with tierlock's ratios to its floor there, the
lock a user would write on a bare cursor (see :mod:`bench.bare`), and to its table
alone. A last section times one uncontended acquire + release against the same two
statements on the bare driver (SQL databases only).
Beside the report, a PNG chart per scenario (see :mod:`bench.charts`) is linked from it.
The exit status is 1 if a cell failed or a lock let two sections of a key overlap.

::

    python -m bench                                  # everything, into bench/results/results.md
    python -m bench --db mariadb --scenario hot-4x4 --impl tierlock --impl get-lock
    python -m bench --db postgresql --scenario flash-sale --scenario renewal
    python -m bench --db redis --db zookeeper --scenario hot-4x4
    python -m bench --db file --output bench/results/files/results.md

The ``renewal`` scenario measures tierlock alone: one process holding many locks, with
and without renewed leases (see :mod:`bench.renewal`). The asyncio scenarios,
``async-hot`` and ``async-spread``, put tierlock's ``AsyncLockManager`` (``--impl
tierlock-aio``) next to its sync manager driven by threads (``--impl tierlock``) and
redis-py's asyncio ``Lock`` (``--impl redis-aio``, on Redis); see
:mod:`bench.asyncio_cells`.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import filelock
import kazoo.version
import redis
import redis_lock
import sqlalchemy

import tierlock

from .acquire_release import compare
from .asyncio_cells import ASYNC_SCENARIOS, AsyncScenario, run_async_cell
from .asyncio_report import async_section
from .asyncio_subjects import async_implementations
from .bare import POLL, bare_table, bare_tables
from .charts import chart_file, draw
from .command import (
    DATABASES,
    ENGINES,
    Started,
    cell_parser,
    lock_tables,
    parse_cell_args,
    positive_float,
    positive_int,
    publish,
    rows_in,
    servers,
)
from .interface import Implementation
from .renewal import HOLDS, RENEWAL, RENEWAL_TTL, RenewalRow, renewal_section, run_renewal
from .report import LEGEND, Row, floor_summary, scenario_section
from .subjects import implementations
from .workload import SCENARIOS, SECTION, Cell, CellError, Scenario, run_cell

IMPLEMENTATIONS = (
    *("tierlock", "table-only", "bare-cursor", "get-lock", "advisory", "redis"),
    *("python-redis-lock", "kazoo", "filelock", "floor"),
    *("tierlock-aio", "redis-aio"),  # the asyncio scenarios'
)
ACQUIRE_RELEASE = "acquire-release"
MEASURED: dict[str, Scenario | AsyncScenario] = {**SCENARIOS, **ASYNC_SCENARIOS}
ALL = (*MEASURED, RENEWAL, ACQUIRE_RELEASE)
OUTPUT = Path(__file__).resolve().parent / "results" / "results.md"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cell_parser(
        "python -m bench",
        "tierlock next to the lock table alone, a lock on a bare cursor, the servers' own "
        "locks, redis-py's Lock, python-redis-lock, kazoo's Lock, filelock's FileLock and "
        "two bare round trips (file-system calls), under the same workloads; tierlock.aio "
        "next to threads and redis-py's asyncio Lock.",
        IMPLEMENTATIONS,
        ALL,
        ENGINES,
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        default=1000,
        help=f"{ACQUIRE_RELEASE}: cycles per side in each of --repeats rounds (1000)",
    )
    parser.add_argument(
        "--renewal-holds",
        type=positive_int,
        default=HOLDS,
        help=f"{RENEWAL}: locks held by the one process ({HOLDS})",
    )
    parser.add_argument(
        "--renewal-ttl",
        type=positive_float,
        default=RENEWAL_TTL,
        help=f"{RENEWAL}: lease of the renewed holds, beats every third of it ({RENEWAL_TTL:g})",
    )
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help=f"report file, charts beside it ({OUTPUT})"
    )
    return parse_cell_args(parser, argv)


def header(args: argparse.Namespace, skipped: list[str], started: Started) -> list[str]:
    details = [
        f"- software: tierlock {tierlock.__version__}, SQLAlchemy {sqlalchemy.__version__}, "
        f"redis-py {redis.__version__}, python-redis-lock {redis_lock.__version__}, "
        f"kazoo {kazoo.version.__version__}, filelock {filelock.__version__}, "
        f"Python {platform.python_version()}",
        f"- settings: {args.seconds:g} s per cell, median of {args.repeats} interleaved "
        f"repeat(s); critical section {SECTION * 1e6:.0f} µs busy-waiting on "
        "time.perf_counter() unless the scenario says otherwise; tierlock and table-only "
        "with the default poll_interval, renewed leases, reaper off; bare cursor (uncontended "
        "and spread-4x4 only): INSERT IGNORE (MariaDB) or INSERT ... ON CONFLICT DO NOTHING "
        "of a row with a lease from the server's clock, the row count checked, DELETE by key "
        f"and owner, on a bare DBAPI connection per thread in autocommit, {POLL * 1e3:g} ms "
        "sleep between tries; GET_LOCK and advisory "
        "locks block on the server, one connection per thread; redis-py Lock (and its "
        "asyncio Lock) blocks with its default 0.1 s sleep, python-redis-lock in BLPOP "
        "on its signal list, each thread with a client of its own; kazoo Lock watches "
        "the node before its own, one KazooClient (one session) per process shared by "
        "its threads, a Lock per thread and key; filelock FileLock polls "
        "flock(LOCK_EX | LOCK_NB) every 0.05 s (its default poll_interval), a FileLock per "
        "thread and key with its defaults; tierlock: one manager per process; "
        "floors: 2x SELECT 1, 2x PING (a client per thread), 2x exists (on the process's "
        "KazooClient), 2x stat (of a file in the lock directory); on a lock directory "
        "the statements of every row of the thread scenarios are the file-system calls "
        "(os functions and fcntl.flock) its processes make, counted as Python makes them, "
        "tierlock's too (asyncio scenarios: tierlock's own count of them); tries without "
        "waiting: acquire(blocking=False), GET_LOCK(k, 0), pg_try_advisory_lock",
        f"- legend: {LEGEND}",
    ]
    return started.header("tierlock benchmark", details, skipped, load_at_end=False)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = Started()
    scenarios = [name for name in ALL if name in (args.scenario or ALL)]
    chosen = set(args.impl or IMPLEMENTATIONS)
    with tempfile.TemporaryDirectory(prefix="tierlock-bench-") as scratch:
        urls, _, skipped = servers(args, Path(scratch), redis_wanted=False)
        for note in skipped:
            print(f"skipped {note}", file=sys.stderr)
        run = args.table[-12:]
        subjects = {
            name: [
                implementation
                for implementation in (
                    async_implementations(urls, args.table, run, urls.get("redis"))
                    if isinstance(scenario, AsyncScenario)
                    else implementations(urls, args.table, run)
                )
                if implementation.name in chosen and implementation.runs_in(name)
            ]
            for name, scenario in MEASURED.items()
            if name in scenarios
        }
        renewals = [
            RenewalRow(database, url, renew)
            for database, url in urls.items()
            if RENEWAL in scenarios and "tierlock" in chosen
            for renew in (True, False)
        ]
        if not any(subjects.values()) and not urls:
            print("nothing to measure", file=sys.stderr)
            return 1
        bare_urls = {
            urls[implementation.database]
            for implementations_chosen in subjects.values()
            for implementation in implementations_chosen
            if implementation.name == "bare-cursor" and implementation.database is not None
        }
        with lock_tables(urls.values(), args.table), bare_tables(bare_urls, args.table):
            rows = run_cells(args, subjects, urls, renewals)
        lines: list[str] = []
        charts = {
            name: chart_file(MEASURED[name])
            for name, scenario_rows in rows.items()
            if scenario_rows and urls
        }
        for name, scenario_rows in rows.items():
            scenario = MEASURED[name]
            if isinstance(scenario, AsyncScenario):
                lines += async_section(scenario, scenario_rows, list(urls), charts.get(name))
            else:
                lines += scenario_section(scenario, scenario_rows, list(urls), charts.get(name))
                lines += floor_summary(scenario_rows, list(urls))
        if renewals:
            lines += renewal_section(renewals, list(urls), args.renewal_holds, args.renewal_ttl)
        databases = {name: url for name, url in urls.items() if name in DATABASES}
        if ACQUIRE_RELEASE in scenarios and databases:
            lines += [
                f"## {ACQUIRE_RELEASE}: tierlock next to its own two statements on the bare driver",
                "",
                *compare(databases, args.repeats, args.iterations, args.table),
                "",
            ]
    publish(header(args, skipped, started) + lines, args.output)
    for name, file in charts.items():  # after the report, which a failed chart must not cost
        draw(MEASURED[name], rows[name], list(urls), args.output.parent / file)
    every = [row for scenario_rows in rows.values() for row in scenario_rows]
    failed = any(row.failure is not None or row.violated() for row in every) or any(
        row.failure is not None or any(cell.leftover for cell in row.cells) for row in renewals
    )
    return 1 if failed else 0


def run_cells(
    args: argparse.Namespace,
    subjects: dict[str, list[Implementation]],
    urls: dict[str, str],
    renewals: list[RenewalRow],
) -> dict[str, list[Row]]:
    """Every cell of each scenario (by name) and its ``subjects``, ``args.repeats``
    times, interleaved; rows by scenario name. Renewal cells are added to their
    ``renewals`` rows.

    After each cell of a lock table, the rows left in it are counted (and removed).
    """
    rows = {name: [Row(subject, []) for subject in chosen] for name, chosen in subjects.items()}
    for repeat in range(args.repeats):
        for name, scenario_rows in rows.items():
            scenario = MEASURED[name]
            for row in scenario_rows:
                implementation = row.implementation
                if row.failure is not None:
                    continue
                where = f"{implementation.label} on {implementation.database}"
                cell: Cell
                try:
                    if isinstance(scenario, AsyncScenario):
                        cell = run_async_cell(implementation, scenario, args.seconds)
                    else:
                        cell = run_cell(implementation, scenario, args.seconds)
                except CellError as exc:
                    row.failure = str(exc)
                    print(f"{name}, {where} failed:\n{exc}", file=sys.stderr)
                    continue
                database = implementation.database
                if implementation.name in ("tierlock", "table-only", "tierlock-aio"):
                    assert database is not None
                    cell.leftover = rows_in(urls[database], args.table)
                elif implementation.name == "bare-cursor":
                    assert database is not None
                    cell.leftover = rows_in(urls[database], bare_table(args.table))
                row.cells.append(cell)
                print(
                    f"repeat {repeat + 1}/{args.repeats} {name}, {where}: "
                    f"{sum(cell.sections) / cell.elapsed:.0f} sections/s",
                    file=sys.stderr,
                )
        for renewal in renewals:
            if renewal.failure is None:
                run_renewal_cell(args, renewal, repeat)
    return rows


def run_renewal_cell(args: argparse.Namespace, row: RenewalRow, repeat: int) -> None:
    where = f"{row.label} on {row.database}"
    try:
        cell = run_renewal(row, args.table, args.renewal_holds, args.renewal_ttl, args.seconds)
    except CellError as exc:
        row.failure = str(exc)
        print(f"{RENEWAL}, {where} failed:\n{exc}", file=sys.stderr)
        return
    cell.leftover = rows_in(row.url, args.table)
    row.cells.append(cell)
    print(
        f"repeat {repeat + 1}/{args.repeats} {RENEWAL}, {where}: "
        f"{cell.statements / cell.elapsed:.2f} statements/s",
        file=sys.stderr,
    )
