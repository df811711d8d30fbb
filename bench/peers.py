"""tierlock's peers on the SQL databases: the servers' own locks and the floor, each on
connections of the bare driver, one per thread; and the counting Redis client of the
peers on Redis (see :mod:`bench.engine_peers`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from sqlalchemy.engine import make_url

from .drivers import mysql_connection, postgresql_connection
from .interface import WAIT_LIMIT, Contender, Subject

FLOOR_LABEL = "floor: 2x SELECT 1"


class GetLockContender(Contender):
    """MariaDB's ``GET_LOCK``: the thread blocks on the server until the name is free;
    a try asks with a timeout of 0."""

    def __init__(self, url: str, prefix: str) -> None:
        self.connection = mysql_connection(make_url(url))
        self.cursor = self.connection.cursor()
        self.prefix = prefix

    def query(self, sql: str, *args: object) -> Any:
        self.sent += 1
        self.cursor.execute(sql, args)
        return self.cursor.fetchone()[0]

    def get_lock(self, index: int, timeout: float) -> bool:
        got = self.query("SELECT GET_LOCK(%s, %s)", f"{self.prefix}{index}", timeout)
        if got is None:
            raise RuntimeError(f"GET_LOCK of key {index} failed")
        return bool(got == 1)

    def acquire(self, index: int) -> None:
        if not self.get_lock(index, WAIT_LIMIT):
            raise TimeoutError(f"GET_LOCK of key {index} timed out")

    def try_acquire(self, index: int) -> bool:
        return self.get_lock(index, 0)

    def release(self, index: int) -> None:
        if self.query("SELECT RELEASE_LOCK(%s)", f"{self.prefix}{index}") != 1:
            raise RuntimeError(f"RELEASE_LOCK of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


class AdvisoryContender(Contender):
    """PostgreSQL's session advisory locks on ``base + index``: ``pg_advisory_lock``
    waits, ``pg_try_advisory_lock`` does not."""

    def __init__(self, url: str, base: int) -> None:
        self.connection = postgresql_connection(make_url(url))
        self.base = base

    def query(self, sql: str, *args: object) -> Any:
        self.sent += 1
        row = self.connection.execute(sql, args).fetchone()
        return None if row is None else row[0]

    def acquire(self, index: int) -> None:
        self.query("SELECT pg_advisory_lock(%s)", self.base + index)

    def try_acquire(self, index: int) -> bool:
        return self.query("SELECT pg_try_advisory_lock(%s)", self.base + index) is True

    def release(self, index: int) -> None:
        if self.query("SELECT pg_advisory_unlock(%s)", self.base + index) is not True:
            raise RuntimeError(f"pg_advisory_unlock of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


class FloorContender(Contender):
    """Two round trips (``SELECT 1``, or a Redis or ZooKeeper equivalent; on a lock
    directory, two file-system calls) per section and no exclusion: the least any lock
    on this engine can cost. Every try wins."""

    def __init__(self, query: Callable[[], object], close: Callable[[], None]) -> None:
        self._query, self._close = query, close

    def acquire(self, index: int) -> None:
        self.sent += 1
        self._query()

    release = acquire

    def try_acquire(self, index: int) -> bool:
        self.acquire(index)
        return True

    def close(self) -> None:
        self._close()


def mysql_floor(url: str) -> Contender:
    connection = mysql_connection(make_url(url))
    cursor = connection.cursor()

    def select_one() -> object:
        cursor.execute("SELECT 1")
        return cursor.fetchone()

    return FloorContender(select_one, connection.close)


def postgresql_floor(url: str) -> Contender:
    connection = postgresql_connection(make_url(url))
    return FloorContender(lambda: connection.execute("SELECT 1").fetchone(), connection.close)


class CountingRedis(redis.Redis):
    """A client that counts the commands it sends (scripts included)."""

    commands = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


class ConnectionSubject(Subject):
    """Threads that each open their own connection with ``connect``."""

    def __init__(self, connect: Callable[[], Contender]) -> None:
        super().__init__()
        self.connect = connect

    def make_contender(self) -> Contender:
        return self.connect()

    def close(self) -> None:
        """Nothing: each contender closes its own connection."""
