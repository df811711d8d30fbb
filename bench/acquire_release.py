"""What one uncontended acquire + release costs through tierlock, next to its floors.

The first floor, raw, is the two statements a hold needs (tierlock's own
insert-if-absent and its delete by key and owner, taken from its backend and compiled
for the server; on PostgreSQL the delete also announces the release with NOTIFY) sent
on one persistent autocommit connection of the bare driver: sqlite3, pymysql or
psycopg. Both use the same table, on disjoint pools of keys, so the row and index work
is the same: the rest of tierlock's time is its own (tier 1, the runner, the
connection pool). The second is the lock a user would write on a bare cursor
(:mod:`bench.bare`), on its narrow table of its own: what its statements and its
table cost besides.

Rounds visit every database in turn; within a round the sides take turns every few
dozen cycles, their order reversed every other round, so noise hits all alike. Each
sample is one acquire + release; medians and 90th percentiles are over all rounds.
"""

from __future__ import annotations

import gc
import os
import platform
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.sql.expression import ClauseElement

import tierlock
from tierlock.backends.sql import SQLBackend
from tierlock.backends.sql.table import Statements

from .bare import BareCursorContender, bare_table, bare_tables
from .drivers import mysql_connection, postgresql_connection
from .report import percentile

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


def tierlock_side(url: str, table: str) -> tuple[Side, Statements]:
    """tierlock's side, and the statements its backend sends, for the raw side to send."""
    locks = tierlock.LockManager(url, table=table, reaper_interval=None)  # creates the table
    backend = locks._backend
    if not isinstance(backend, SQLBackend):
        raise TypeError(f"{url!r} is not served by the SQL backend")
    handles = [locks.lock(f"bench:tierlock:{index}") for index in range(KEYS)]

    def cycle(index: int) -> None:
        lock = handles[index]
        lock.acquire()
        lock.release()

    return Side(cycle, locks.close), backend.sql


def _compiled(
    statement: ClauseElement, dialect: Dialect, values: list[dict[str, Any]]
) -> tuple[str, list[Any]]:
    """The SQL text tierlock sends, and the driver's parameters for each of ``values``,
    with the values the statement carries itself (such as the NOTIFY channel)."""
    compiled = statement.compile(dialect=dialect)
    merged = [{**compiled.params, **value} for value in values]
    order = compiled.positiontup  # type: ignore[attr-defined]
    if order is not None:
        return str(compiled), [[value[name] for name in order] for value in merged]
    return str(compiled), merged


def raw_side(url: URL, dialect: Dialect, sql: Statements, table: str) -> Side:
    """The same two statements on the bare driver, parameters prepared beforehand."""
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

    insert_sql, inserts = _compiled(sql.insert_if_absent, dialect, values)
    delete_sql, deletes = _compiled(sql.delete_owned, dialect, values)
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
        mysql = mysql_connection(url)
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
        postgresql = postgresql_connection(url)
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


def bare_side(url: str, table: str) -> Side:
    """The bare cursor's lock, on its table beside ``table``."""
    contender = BareCursorContender(url, bare_table(table))

    def cycle(index: int) -> None:
        contender.acquire(index)
        contender.release(index)

    return Side(cycle, contender.close)


def connected_dialect(url: str) -> Dialect:
    """The dialect tierlock compiles with on this server, initialised by a first connect."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            return engine.dialect
    finally:
        engine.dispose()


class Pair:
    """One database: the tierlock side and the raw side, on one table, and the bare
    cursor's on its own."""

    def __init__(self, name: str, url: str, table: str) -> None:
        self.name = name
        # tierlock first: it creates the table, which the raw side then shares.
        self.tierlock, statements = tierlock_side(url, table)
        try:
            self.raw = raw_side(make_url(url), connected_dialect(url), statements, table)
        except BaseException:
            self.tierlock.close()
            raise
        try:
            self.bare = bare_side(url, table)
        except BaseException:
            self.tierlock.close()
            self.raw.close()
            raise
        self.sides = (self.tierlock, self.raw, self.bare)

    def close(self) -> None:
        self.tierlock.close()
        self.raw.close()  # and drops the table
        self.bare.close()


def table_rows(pairs: Sequence[Pair]) -> list[str]:
    """The comparison table, one row per database."""
    lines = [
        "| database | tierlock median µs | tierlock p90 µs | raw median µs | raw p90 µs "
        "| ratio | bare cursor median µs | bare cursor p90 µs | ratio to bare cursor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in pairs:
        ours, raw, bare = (side.samples for side in pair.sides)
        medians = [statistics.median(samples) for samples in (ours, raw, bare)]
        lines.append(
            f"| {pair.name} | {medians[0] / 1000:.1f} | {percentile(ours, 0.9) / 1000:.1f} "
            f"| {medians[1] / 1000:.1f} | {percentile(raw, 0.9) / 1000:.1f} "
            f"| {medians[0] / medians[1]:.2f} | {medians[2] / 1000:.1f} "
            f"| {percentile(bare, 0.9) / 1000:.1f} | {medians[0] / medians[2]:.2f} |"
        )
    return lines


def compare(urls: dict[str, str], rounds: int, iterations: int, table: str) -> list[str]:
    """Measure each database (name to URL) on a scratch ``table``, dropped afterwards;
    return the report's markdown lines."""
    pairs: list[Pair] = []
    with bare_tables(urls.values(), table):
        try:
            for name, url in urls.items():
                pairs.append(Pair(name, url, table))
            for pair in pairs:
                for side in pair.sides:
                    side.run(min(WARMUP, iterations), record=False)
            for number in range(rounds):
                print(f"acquire-release: round {number + 1} of {rounds}", file=sys.stderr)
                for pair in pairs:
                    sides = pair.sides if number % 2 == 0 else pair.sides[::-1]
                    for done in range(0, iterations, BLOCK):
                        for side in sides:
                            side.run(min(BLOCK, iterations - done))
        finally:
            for pair in pairs:
                pair.close()
    caption = (
        f"Uncontended acquire + release, {rounds} interleaved round(s) x {iterations} "
        f"iterations per side over {KEYS} keys, one thread. raw: the same two statements "
        "tierlock sends, on the bare driver; ratio: tierlock median / raw median; bare "
        "cursor: the lock a user would write on the bare driver, on a table of its own "
        "(see the uncontended scenario)."
    )
    return [caption, "", *table_rows(pairs)]
