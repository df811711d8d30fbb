"""What one uncontended acquire + release costs through tierlock, next to its floor.

The floor is the two statements a hold needs (tierlock's own insert-if-absent and its
delete by key and owner, compiled for the server) sent on one persistent autocommit
connection of the bare driver: sqlite3, pymysql or psycopg. Both run against the same
table, on disjoint pools of keys, so the row and index work is the same. The rest of
tierlock's time is its own: tier 1, SQLAlchemy, the connection pool.

Rounds visit every database in turn; within a round the two sides take turns every
few dozen cycles, the first side alternating by round, so noise hits both alike. Each
sample is one acquire + release; medians and 90th percentiles are over all rounds.

::

    python -m bench                       # SQLite, MariaDB and PostgreSQL
    python -m bench --db sqlite --rounds 3 --iterations 500 --output bench.md
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.sql.expression import ClauseElement

import tierlock
from tierlock.backends.sqltable import Statements, lock_table

DATABASES: dict[str, str | None] = {
    "sqlite": None,  # a file in a temporary directory
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
}
KEYS = 1000  # keys are used round-robin, so each hold inserts a row for a free key
WARMUP = 200  # untimed cycles per side first: connections, statement caches, pages
# Within a round the two sides take turns every BLOCK cycles, so that a burst of noise
# (another process, a slow fsync) lands on both rather than on one side's whole round.
BLOCK = 50

Cycle = Callable[[int], None]  # one acquire + release of the key with this index


class Side:
    """One way to hold and free a key; ``cycle(i)`` does it once for key ``i``."""

    def __init__(self, cycle: Cycle, close: Callable[[], None]) -> None:
        self.cycle = cycle
        self.close = close
        self.samples: list[int] = []  # nanoseconds
        self.count = 0

    def run(self, iterations: int, *, record: bool = True) -> None:
        cycle = self.cycle
        clock = time.perf_counter_ns
        samples = self.samples if record else []
        start = self.count
        gc_was_enabled = gc.isenabled()
        gc.disable()  # as timeit does: a collection would land on one side only
        try:
            for index in range(start, start + iterations):
                began = clock()
                cycle(index % KEYS)
                samples.append(clock() - began)
        finally:
            if gc_was_enabled:
                gc.enable()
        self.count = start + iterations


def tierlock_side(url: str, table: str) -> Side:
    locks = tierlock.LockManager(url, table=table, reaper_interval=None)
    handles = [locks.lock(f"bench:tierlock:{index}") for index in range(KEYS)]

    def cycle(index: int) -> None:
        lock = handles[index]
        lock.acquire()
        lock.release()

    return Side(cycle, locks.close)


def _compiled(statement: ClauseElement, dialect: Dialect) -> tuple[str, list[str] | None]:
    """The SQL text tierlock sends, and the parameter order for a positional driver."""
    compiled = statement.compile(dialect=dialect)
    order = compiled.positiontup  # type: ignore[attr-defined]
    return str(compiled), None if order is None else list(order)


def raw_side(url: URL, dialect: Dialect, table: str) -> Side:
    """The same two statements on the bare driver, parameters prepared beforehand."""
    sql = Statements(lock_table(table), dialect.name)
    insert_sql, insert_order = _compiled(sql.insert_if_absent, dialect)  # type: ignore[arg-type]
    delete_sql, delete_order = _compiled(sql.delete_owned, dialect)
    values = [
        {
            "key": f"bench:raw:{index}",
            "owner": uuid.uuid4().hex,
            "host_name": platform.node(),
            "proc": os.getpid(),
            "thread": 1,
            "thread_label": "MainThread",
            "ttl": 30.0,
        }
        for index in range(KEYS)
    ]

    def arguments(order: list[str] | None) -> list[Any]:
        if order is None:
            return values
        return [[value[name] for name in order] for value in values]

    inserts, deletes = arguments(insert_order), arguments(delete_order)
    backend = url.get_backend_name()

    if backend == "sqlite":
        sqlite = sqlite3.connect(url.database or "", isolation_level=None)
        sqlite.execute("PRAGMA busy_timeout = 10000")
        sqlite.execute("PRAGMA journal_mode = WAL")

        def sqlite_cycle(index: int) -> None:
            if sqlite.execute(insert_sql, inserts[index]).rowcount != 1:
                raise RuntimeError("the raw insert found its key taken")
            sqlite.execute(delete_sql, deletes[index])

        def sqlite_close() -> None:
            sqlite.execute(f"DROP TABLE IF EXISTS {table}")
            sqlite.close()

        return Side(sqlite_cycle, sqlite_close)

    if backend in ("mysql", "mariadb"):
        import pymysql

        mysql = pymysql.connect(
            host=url.host or "localhost",
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            database=url.database,
            autocommit=True,
        )
        cursor = mysql.cursor()

        def mysql_cycle(index: int) -> None:
            if cursor.execute(insert_sql, inserts[index]) != 1:
                raise RuntimeError("the raw insert found its key taken")
            cursor.execute(delete_sql, deletes[index])

        def mysql_close() -> None:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
            mysql.close()

        return Side(mysql_cycle, mysql_close)

    if backend == "postgresql":
        import psycopg

        postgresql = psycopg.connect(
            host=url.host,
            port=url.port,
            user=url.username,
            password=url.password,
            dbname=url.database,
            autocommit=True,
        )
        pg_cursor = postgresql.cursor()

        def postgresql_cycle(index: int) -> None:
            if pg_cursor.execute(insert_sql, inserts[index]).fetchone() is None:
                raise RuntimeError("the raw insert found its key taken")
            pg_cursor.execute(delete_sql, deletes[index])

        def postgresql_close() -> None:
            pg_cursor.execute(f"DROP TABLE IF EXISTS {table}")
            postgresql.close()

        return Side(postgresql_cycle, postgresql_close)

    raise ValueError(f"no raw driver for {backend!r}")


def connected_dialect(url: str) -> Dialect:
    """The dialect tierlock compiles with on this server, initialised by a first connect."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            return engine.dialect
    finally:
        engine.dispose()


class Subject:
    """One database: the tierlock side and the raw side, on one table."""

    def __init__(self, name: str, url: str, table: str) -> None:
        self.name = name
        # tierlock first: it creates the table, which the raw side then shares.
        self.tierlock = tierlock_side(url, table)
        try:
            self.raw = raw_side(make_url(url), connected_dialect(url), table)
        except BaseException:
            self.tierlock.close()
            raise
        self.sides = (self.tierlock, self.raw)

    def close(self) -> None:
        self.tierlock.close()
        self.raw.close()  # and drops the table


def percentile(samples: list[int], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def table_rows(subjects: Sequence[Subject]) -> list[str]:
    lines = [
        "| database | tierlock median µs | tierlock p90 µs | raw median µs | raw p90 µs | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for subject in subjects:
        ours, raw = subject.tierlock.samples, subject.raw.samples
        ours_median, raw_median = statistics.median(ours), statistics.median(raw)
        lines.append(
            f"| {subject.name} | {ours_median / 1000:.1f} | {percentile(ours, 0.9) / 1000:.1f} "
            f"| {raw_median / 1000:.1f} | {percentile(raw, 0.9) / 1000:.1f} "
            f"| {ours_median / raw_median:.2f} |"
        )
    return lines


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Uncontended tierlock acquire+release versus the same SQL on the bare driver.",
    )
    parser.add_argument(
        "--db", action="append", choices=sorted(DATABASES), help="database (repeatable; all)"
    )
    parser.add_argument(
        "--dburi", action="append", default=[], metavar="NAME=URL", help="URL for database NAME"
    )
    parser.add_argument("--rounds", type=positive, default=5, help="rounds (default 5)")
    parser.add_argument(
        "--iterations", type=positive, default=2000, help="cycles per side per round (2000)"
    )
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--table",
        default=f"bench_{uuid.uuid4().hex[:12]}",
        help="scratch table, created and dropped on each database (default: a random name)",
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = [name for name in DATABASES if not args.db or name in args.db]
    subjects: list[Subject] = []
    with tempfile.TemporaryDirectory(prefix="tierlock-bench-") as scratch:
        try:
            for name in names:
                url = args.urls[name] or f"sqlite:///{Path(scratch) / 'bench.db'}"
                try:
                    subjects.append(Subject(name, url, args.table))
                except Exception as exc:
                    shown = make_url(url).render_as_string(hide_password=True)
                    print(f"{name}: skipped, cannot use {shown}: {exc}")
            if not subjects:
                print("no database to measure")
                return 1
            for subject in subjects:
                for side in subject.sides:
                    side.run(min(WARMUP, args.iterations), record=False)
            for number in range(args.rounds):
                print(f"round {number + 1} of {args.rounds}", file=sys.stderr)
                for subject in subjects:
                    sides = subject.sides if number % 2 == 0 else subject.sides[::-1]
                    for done in range(0, args.iterations, BLOCK):
                        for side in sides:
                            side.run(min(BLOCK, args.iterations - done))
        finally:
            for subject in subjects:
                subject.close()
    caption = (
        f"Uncontended acquire + release, {args.rounds} round(s) x {args.iterations} iterations "
        f"over {KEYS} keys; tierlock {tierlock.__version__}, SQLAlchemy "
        f"{sqlalchemy.__version__}, Python {platform.python_version()}. "
        "raw: the same two statements on the bare driver; ratio: tierlock median / raw median."
    )
    report = "\n".join([caption, "", *table_rows(subjects)]) + "\n"
    print()
    print(report, end="")
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    return 0
