"""``python -m bench``: tierlock next to its peers and floors, under the same workloads.

Every implementation runs every scenario for ``--seconds``, ``--repeats`` times, the
repeats interleaved so that noise spreads over all; the report gives the median of
each figure and its ratio to tierlock's on the same database. A last section times one
uncontended acquire + release against the same two statements on the bare driver.
Beside the report, a PNG chart per scenario (see :mod:`bench.charts`) is linked from it.
The exit status is 1 if a cell failed or a lock let two sections of a key overlap.

::

    python -m bench                                  # everything, into bench/results/results.md
    python -m bench --db mariadb --scenario hot-4x4 --impl tierlock --impl get-lock
    python -m bench --db postgresql --scenario flash-sale --scenario renewal

The ``renewal`` scenario measures tierlock alone: one process holding many locks, with
and without renewed leases (see :mod:`bench.renewal`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis
import sqlalchemy
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import tierlock

from .acquire_release import compare
from .charts import chart_file, draw
from .interface import Implementation
from .renewal import HOLDS, RENEWAL, RENEWAL_TTL, RenewalRow, renewal_section, run_renewal
from .report import LEGEND, Row, scenario_section
from .subjects import implementations
from .workload import SCENARIOS, SECTION, CellError, Scenario, run_cell

DATABASES: dict[str, str | None] = {
    "sqlite": None,  # a file in a temporary directory
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
}
REDIS_URL = "redis://127.0.0.1:6379/0"
IMPLEMENTATIONS = ("tierlock", "table-only", "get-lock", "advisory", "redis", "floor")
ACQUIRE_RELEASE = "acquire-release"
ALL = (*SCENARIOS, RENEWAL, ACQUIRE_RELEASE)
OUTPUT = Path(__file__).resolve().parent / "results" / "results.md"


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="tierlock next to the lock table alone, the servers' own locks, "
        "redis-py's Lock and two bare round trips, under the same workloads.",
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
        "--scenario",
        action="append",
        choices=ALL,
        help="scenario (repeatable; all)",
    )
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per cell (3)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="of each cell (3)")
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
    parser.add_argument(
        "--table",
        default=f"bench_{uuid.uuid4().hex[:12]}",
        help="lock table, created and dropped on each database (default: a random name)",
    )
    args = parser.parse_args(argv)
    urls = dict(DATABASES)
    for item in args.dburi:
        name, _, url = item.partition("=")
        if name not in DATABASES or not url:
            parser.error(f"--dburi takes NAME=URL with NAME in {sorted(DATABASES)}")
        urls[name] = url
    args.urls = urls
    return args


def unreachable(url: str) -> str | None:
    """Why the database or Redis server at ``url`` cannot be used, or None."""
    try:
        if url.startswith("redis://"):
            client = redis.Redis.from_url(url, socket_connect_timeout=5)
            try:
                client.ping()
            finally:
                client.close()
            return None
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        return f"cannot use {make_url(url).render_as_string(hide_password=True)}: {exc}"
    return None


def rows_in(url: str, table: str) -> int:
    """How many rows ``table`` holds; deletes them, so the next cell starts clean."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            count: int = connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
            if count:
                connection.execute(text(f"DELETE FROM {table}"))
        return count
    finally:
        engine.dispose()


def drop(url: str, table: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        engine.dispose()


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in cpuinfo
                    if line.startswith("model name")
                ),
                model,
            )
    except OSError:
        pass
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({model}), "
        f"load average {load} at the start"
    )


def header(
    args: argparse.Namespace, skipped: list[str], wall: float, started: str, host: str
) -> list[str]:
    lines = [
        "# tierlock benchmark",
        "",
        f"- date: {started}; wall time {wall / 60:.1f} min",
        f"- machine: {host}",
        f"- software: tierlock {tierlock.__version__}, SQLAlchemy {sqlalchemy.__version__}, "
        f"redis-py {redis.__version__}, Python {platform.python_version()}",
        f"- settings: {args.seconds:g} s per cell, median of {args.repeats} interleaved "
        f"repeat(s); critical section {SECTION * 1e6:.0f} µs busy-waiting on "
        "time.perf_counter() unless the scenario says otherwise; tierlock and table-only "
        "with the default poll_interval, renewed leases, reaper off; GET_LOCK and advisory "
        "locks block on the server, one connection per thread; redis-py Lock blocks with "
        "its default 0.1 s sleep; tries without waiting: acquire(blocking=False), "
        "GET_LOCK(k, 0), pg_try_advisory_lock, redis-py acquire(blocking=False)",
        f"- legend: {LEGEND}",
    ]
    lines += [f"- skipped: {note}" for note in skipped]
    return [*lines, ""]


def servers(
    args: argparse.Namespace, chosen: set[str], scratch: Path
) -> tuple[dict[str, str], str | None, list[str]]:
    """The databases' URLs (by name) and the Redis server's that can be used, and a
    note for each that cannot."""
    skipped: list[str] = []
    urls: dict[str, str] = {}
    for name in DATABASES:
        if args.db and name not in args.db:
            continue
        url = args.urls[name] or f"sqlite:///{scratch / 'bench.db'}"
        reason = unreachable(url)
        if reason is None:
            urls[name] = url
        else:
            skipped.append(f"{name}: {reason}")
    redis_url = REDIS_URL if "redis" in chosen else None
    if redis_url is not None and (reason := unreachable(redis_url)) is not None:
        skipped.append(f"redis: {reason}")
        redis_url = None
    return urls, redis_url, skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    scenarios = [name for name in ALL if name in (args.scenario or ALL)]
    chosen = set(args.impl or IMPLEMENTATIONS)
    with tempfile.TemporaryDirectory(prefix="tierlock-bench-") as scratch:
        urls, redis_url, skipped = servers(args, chosen, Path(scratch))
        for note in skipped:
            print(f"skipped {note}", file=sys.stderr)
        subjects = [
            implementation
            for implementation in implementations(urls, args.table, args.table[-12:], redis_url)
            if implementation.name in chosen
        ]
        renewals = [
            RenewalRow(database, url, renew)
            for database, url in urls.items()
            if RENEWAL in scenarios and "tierlock" in chosen
            for renew in (True, False)
        ]
        if not subjects and not urls:
            print("nothing to measure", file=sys.stderr)
            return 1
        try:
            for url in urls.values():
                tierlock.LockManager(url, table=args.table, reaper_interval=None).close()
            rows = run_cells(
                args, [SCENARIOS[n] for n in scenarios if n in SCENARIOS], subjects, urls, renewals
            )
        finally:
            for url in urls.values():
                drop(url, args.table)
        lines: list[str] = []
        charts = {
            name: chart_file(SCENARIOS[name])
            for name, scenario_rows in rows.items()
            if scenario_rows and urls
        }
        for name, scenario_rows in rows.items():
            lines += scenario_section(SCENARIOS[name], scenario_rows, list(urls), charts.get(name))
        if renewals:
            lines += renewal_section(renewals, list(urls), args.renewal_holds, args.renewal_ttl)
        if ACQUIRE_RELEASE in scenarios and urls:
            lines += [
                f"## {ACQUIRE_RELEASE}: tierlock next to its own two statements on the bare driver",
                "",
                *compare(urls, args.repeats, args.iterations, args.table),
                "",
            ]
    report = "\n".join(header(args, skipped, time.monotonic() - began, started, host) + lines)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report, encoding="utf-8")
    for name, file in charts.items():  # after the report, which a failed chart must not cost
        draw(SCENARIOS[name], rows[name], list(urls), args.output.parent / file)
    every = [row for scenario_rows in rows.values() for row in scenario_rows]
    failed = any(row.failure is not None or row.violated() for row in every) or any(
        row.failure is not None or any(cell.leftover for cell in row.cells) for row in renewals
    )
    return 1 if failed else 0


def run_cells(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    subjects: list[Implementation],
    urls: dict[str, str],
    renewals: list[RenewalRow],
) -> dict[str, list[Row]]:
    """Every cell, ``args.repeats`` times, interleaved; rows by scenario name. Renewal
    cells are added to their ``renewals`` rows.

    After each cell of a lock table, the rows left in it are counted (and removed).
    """
    rows = {scenario.name: [Row(subject, []) for subject in subjects] for scenario in scenarios}
    for repeat in range(args.repeats):
        for scenario in scenarios:
            for row in rows[scenario.name]:
                implementation = row.implementation
                if row.failure is not None:
                    continue
                where = f"{implementation.label} on {implementation.database or 'redis'}"
                try:
                    cell = run_cell(implementation, scenario, args.seconds)
                except CellError as exc:
                    row.failure = str(exc)
                    print(f"{scenario.name}, {where} failed:\n{exc}", file=sys.stderr)
                    continue
                if implementation.name in ("tierlock", "table-only"):
                    assert implementation.database is not None
                    cell.leftover = rows_in(urls[implementation.database], args.table)
                row.cells.append(cell)
                print(
                    f"repeat {repeat + 1}/{args.repeats} {scenario.name}, {where}: "
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
