"""The lock a user would write without tierlock: the floor of the scenarios with keys to
spare. Each thread has a bare DBAPI connection of its own (pymysql, psycopg, sqlite3) in
autocommit, with no pool and no SQLAlchemy, and keeps a row per held key in a table of
its own whose lease column the database's clock sets.

An acquire inserts the key's row unless there is one (``INSERT IGNORE`` on MariaDB,
``INSERT ... ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite) and reads the row count.
On a miss it deletes the row if its lease has ended (its holder died) and tries again at
once, or else sleeps :data:`POLL` first; a statement that a deadlock rolled back counts as
a miss. A release deletes the row by key and owner (again after a deadlock), and
finding none means the lease ended under the holder. So an uncontended section costs
the two statements tierlock sends, with nothing of tierlock's around them.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from .command import drop
from .drivers import mysql_connection, postgresql_connection
from .interface import TTL, WAIT_LIMIT, Contender

LABEL = "bare cursor"
# Where the bare cursor is the floor: keys to spare, so a miss is rare. On one hot key a
# poller with a fixed sleep measures its sleep, not its statements.
SCENARIOS = ("uncontended", "spread-4x4")
# The sleep between two tries at a key held elsewhere: tierlock's own first pause
# (FIRST_POLL), so that neither gains on the rare miss.
POLL = 0.002


@dataclass(frozen=True)
class Dialect:
    """One database's table and statements, in its driver's parameter style."""

    create: str
    insert: str  # key, owner, seconds of lease: one row if it was absent, else none
    clear_expired: str  # key: deletes its row if the lease has ended
    delete_owned: str  # key, owner


DIALECTS = {
    "mysql": Dialect(
        "CREATE TABLE {table} (name VARCHAR(255) PRIMARY KEY, owner CHAR(32) NOT NULL, "
        "expires_at DATETIME(6) NOT NULL)",
        "INSERT IGNORE INTO {table} (name, owner, expires_at) "
        "VALUES (%s, %s, NOW(6) + INTERVAL %s SECOND)",
        "DELETE FROM {table} WHERE name = %s AND expires_at < NOW(6)",
        "DELETE FROM {table} WHERE name = %s AND owner = %s",
    ),
    "postgresql": Dialect(
        "CREATE TABLE {table} (name VARCHAR(255) PRIMARY KEY, owner CHAR(32) NOT NULL, "
        "expires_at TIMESTAMP WITH TIME ZONE NOT NULL)",
        "INSERT INTO {table} (name, owner, expires_at) "
        "VALUES (%s, %s, now() + %s * INTERVAL '1 second') ON CONFLICT DO NOTHING",
        "DELETE FROM {table} WHERE name = %s AND expires_at < now()",
        "DELETE FROM {table} WHERE name = %s AND owner = %s",
    ),
    # Leases in Julian days: SQLite's clock is julianday('now').
    "sqlite": Dialect(
        "CREATE TABLE {table} (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
        "expires_at REAL NOT NULL)",
        "INSERT INTO {table} (name, owner, expires_at) "
        "VALUES (?, ?, julianday('now') + ? / 86400.0) ON CONFLICT DO NOTHING",
        "DELETE FROM {table} WHERE name = ? AND expires_at < julianday('now')",
        "DELETE FROM {table} WHERE name = ? AND owner = ?",
    ),
}


def bare_table(table: str) -> str:
    """The bare cursor's table, beside tierlock's ``table``."""
    return f"{table}_bare"


def dialect_of(url: str) -> Dialect:
    backend = make_url(url).get_backend_name()
    return DIALECTS["mysql" if backend == "mariadb" else backend]


def connect(url: str) -> Any:
    """A bare autocommit connection to the database of the SQLAlchemy URL ``url``."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return postgresql_connection(parsed)
    if backend == "sqlite":
        # A writer waits for the file's write lock in SQLite's busy handler; WAL, as
        # tierlock's connections (the database file keeps it anyway).
        connection = sqlite3.connect(
            parsed.database or "", timeout=WAIT_LIMIT, isolation_level=None
        )
        connection.execute("PRAGMA journal_mode = WAL")
        return connection
    return mysql_connection(parsed)


def deadlocked(error: Exception) -> bool:
    """Whether the server rolled a statement back as a deadlock's victim (MariaDB 1213,
    PostgreSQL 40P01). On MariaDB a delete and the inserts waiting on the row's lock
    meet so, so a hand-written lock there must expect it."""
    return error.args[:1] == (1213,) or getattr(error, "sqlstate", None) == "40P01"


class BareCursorContender(Contender):
    """A thread's lock on a connection of its own, holding keys under one owner id for
    leases of ``ttl`` seconds (never renewed: the benchmark's sections are short)."""

    def __init__(self, url: str, table: str, ttl: float = TTL) -> None:
        dialect = dialect_of(url)
        self.insert = dialect.insert.format(table=table)
        self.clear_expired = dialect.clear_expired.format(table=table)
        self.delete_owned = dialect.delete_owned.format(table=table)
        self.connection = connect(url)
        self.cursor = self.connection.cursor()
        self.owner = uuid.uuid4().hex
        self.ttl = ttl

    def execute(self, sql: str, *parameters: object) -> int | None:
        """Send one statement; the rows it changed, or None if the server rolled it back
        as a deadlock's victim, which changed nothing."""
        self.sent += 1
        try:
            self.cursor.execute(sql, parameters)
        except Exception as exc:
            if deadlocked(exc):
                return None
            raise
        return int(self.cursor.rowcount)

    def try_acquire(self, index: int) -> bool:
        key = f"k{index}"
        if self.execute(self.insert, key, self.owner, self.ttl) == 1:
            return True
        return (
            self.execute(self.clear_expired, key) == 1
            and self.execute(self.insert, key, self.owner, self.ttl) == 1
        )

    def acquire(self, index: int) -> None:
        deadline = time.monotonic() + WAIT_LIMIT
        while not self.try_acquire(index):
            if time.monotonic() > deadline:
                raise TimeoutError(f"key {index} not acquired within {WAIT_LIMIT} s")
            time.sleep(POLL)

    def release(self, index: int) -> None:
        deleted = None
        while deleted is None:
            deleted = self.execute(self.delete_owned, f"k{index}", self.owner)
        if deleted != 1:
            raise RuntimeError(f"key {index} was no longer held: its lease had ended")

    def close(self) -> None:
        self.connection.close()


@contextlib.contextmanager
def bare_tables(urls: Iterable[str], table: str) -> Iterator[None]:
    """The bare cursor's table beside ``table`` on each SQL database of ``urls``, for
    the block, and dropped after it."""
    made: list[str] = []
    try:
        for url in urls:
            engine = create_engine(url, poolclass=NullPool)
            try:
                with engine.begin() as connection:
                    connection.execute(text(dialect_of(url).create.format(table=bare_table(table))))
            finally:
                engine.dispose()
            made.append(url)
        yield
    finally:
        for url in made:
            drop(url, bare_table(table))
