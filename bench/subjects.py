"""The lock implementations the harness drives through the same workload.

Each is a :class:`Subject`, opened once in every worker process, that gives every thread
of the process a :class:`Contender`: its way to take and free a key, named by index.
Statements are counted where they are sent, never assumed.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis
from sqlalchemy.engine import make_url

import tierlock

from .drivers import mysql_connection, postgresql_connection

# How long any acquire may wait before the run counts as broken rather than slow.
WAIT_LIMIT = 30.0
# The lease of every hold: far longer than any section, so none ever expires.
TTL = 60.0
FLOOR_LABEL = "floor: 2x SELECT 1"


class Contender(abc.ABC):
    """One thread's way to take and free keys by index, on connections of its own."""

    sent = 0  # statements sent, counted by subclasses that send their own

    def statements(self) -> int:
        """Statements or commands this contender has sent so far."""
        return self.sent

    @abc.abstractmethod
    def acquire(self, index: int) -> None: ...

    @abc.abstractmethod
    def release(self, index: int) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the contender opened."""


class Subject(abc.ABC):
    """One process's side of an implementation."""

    def __init__(self) -> None:
        self.contenders: list[Contender] = []
        self._mutex = threading.Lock()

    def contender(self) -> Contender:
        """A contender for the calling thread; its statements count towards this subject."""
        contender = self.make_contender()
        with self._mutex:
            self.contenders.append(contender)
        return contender

    @abc.abstractmethod
    def make_contender(self) -> Contender: ...

    def statements(self) -> int:
        """Statements or commands sent so far by all of this process's contenders."""
        with self._mutex:
            return sum(contender.statements() for contender in self.contenders)

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the subject opened."""


@dataclass(frozen=True)
class Implementation:
    """A lock implementation on one server, as a row of the report."""

    name: str  # for --impl: tierlock, table-only, get-lock, advisory, redis, floor
    label: str  # the row's label
    database: str | None  # None: needs none of them, shown in every database's table
    open: Callable[[], Subject]  # called in each worker process
    excludes: bool = True  # False for the floor, whose violations are expected


# -- tierlock and the bare lock table --------------------------------------------------------


class TierlockContender(Contender):
    """Takes keys through a manager's handles, made once per key."""

    def __init__(self, manager: tierlock.LockManager) -> None:
        self.manager = manager
        self.handles: dict[int, tierlock.Lock] = {}

    def handle(self, index: int) -> tierlock.Lock:
        handle = self.handles.get(index)
        if handle is None:
            handle = self.handles[index] = self.manager.lock(f"k{index}")
        return handle

    def acquire(self, index: int) -> None:
        if not self.handle(index).acquire(timeout=WAIT_LIMIT):
            raise TimeoutError(f"key {index} not acquired within {WAIT_LIMIT} s")

    def release(self, index: int) -> None:
        self.handle(index).release()

    def close(self) -> None:
        """Nothing: the manager is the subject's."""


def _manager(url: str, table: str) -> tierlock.LockManager:
    return tierlock.LockManager(url, table=table, ttl=TTL, create_table=False, reaper_interval=None)


class TierlockSubject(Subject):
    """One manager per process, shared by its threads: tier 1 at work."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__()
        self.manager = _manager(url, table)

    def make_contender(self) -> Contender:
        return TierlockContender(self.manager)

    def statements(self) -> int:
        stats = self.manager.stats()
        return stats.statements + stats.doorbell_queries

    def close(self) -> None:
        self.manager.close()


class TableOnlyContender(TierlockContender):
    """A contender with a manager of its own."""

    def statements(self) -> int:
        stats = self.manager.stats()
        return stats.statements + stats.doorbell_queries

    def close(self) -> None:
        self.manager.close()


class TableOnlySubject(Subject):
    """One manager per thread: each thread inserts and polls the table itself, as if
    there were no tier 1."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__()
        self.url, self.table = url, table

    def make_contender(self) -> Contender:
        return TableOnlyContender(_manager(self.url, self.table))

    def close(self) -> None:
        """Nothing: each contender closes its own manager."""


# -- the servers' own locks and the floor ----------------------------------------------------


class GetLockContender(Contender):
    """MariaDB's ``GET_LOCK``: the thread blocks on the server until the name is free."""

    def __init__(self, url: str, prefix: str) -> None:
        self.connection = mysql_connection(make_url(url))
        self.cursor = self.connection.cursor()
        self.prefix = prefix

    def query(self, sql: str, *args: object) -> Any:
        self.sent += 1
        self.cursor.execute(sql, args)
        return self.cursor.fetchone()[0]

    def acquire(self, index: int) -> None:
        if self.query("SELECT GET_LOCK(%s, %s)", f"{self.prefix}{index}", WAIT_LIMIT) != 1:
            raise TimeoutError(f"GET_LOCK of key {index} failed")

    def release(self, index: int) -> None:
        if self.query("SELECT RELEASE_LOCK(%s)", f"{self.prefix}{index}") != 1:
            raise RuntimeError(f"RELEASE_LOCK of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


class AdvisoryContender(Contender):
    """PostgreSQL's session advisory locks on ``base + index``."""

    def __init__(self, url: str, base: int) -> None:
        self.connection = postgresql_connection(make_url(url))
        self.base = base

    def query(self, sql: str, *args: object) -> Any:
        self.sent += 1
        row = self.connection.execute(sql, args).fetchone()
        return None if row is None else row[0]

    def acquire(self, index: int) -> None:
        self.query("SELECT pg_advisory_lock(%s)", self.base + index)

    def release(self, index: int) -> None:
        if self.query("SELECT pg_advisory_unlock(%s)", self.base + index) is not True:
            raise RuntimeError(f"pg_advisory_unlock of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


class FloorContender(Contender):
    """Two round trips of ``SELECT 1`` per section and no exclusion: the least any lock
    on this server can cost."""

    def __init__(self, query: Callable[[], object], close: Callable[[], None]) -> None:
        self._query, self._close = query, close

    def acquire(self, index: int) -> None:
        self.sent += 1
        self._query()

    release = acquire

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


class RedisContender(Contender):
    """redis-py's ``Lock``, blocking with its default sleep between tries."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = CountingRedis(connection_pool=redis.ConnectionPool.from_url(url))
        self.prefix = prefix
        self.locks: dict[int, redis.lock.Lock] = {}

    def statements(self) -> int:
        return self.client.commands

    def lock(self, index: int) -> redis.lock.Lock:
        lock = self.locks.get(index)
        if lock is None:
            lock = self.locks[index] = self.client.lock(f"{self.prefix}{index}", timeout=TTL)
        return lock

    def acquire(self, index: int) -> None:
        if not self.lock(index).acquire(blocking_timeout=WAIT_LIMIT):
            raise TimeoutError(f"redis lock of key {index} not acquired within {WAIT_LIMIT} s")

    def release(self, index: int) -> None:
        self.lock(index).release()

    def close(self) -> None:
        self.client.close()


class ConnectionSubject(Subject):
    """Threads that each open their own connection with ``connect``."""

    def __init__(self, connect: Callable[[], Contender]) -> None:
        super().__init__()
        self.connect = connect

    def make_contender(self) -> Contender:
        return self.connect()

    def close(self) -> None:
        """Nothing: each contender closes its own connection."""


def implementations(
    urls: dict[str, str], table: str, run: str, redis_url: str | None
) -> list[Implementation]:
    """Every implementation on the given databases (name to URL) and Redis server.

    ``run`` makes lock names that no other run shares; ``table`` is the lock table.
    """
    prefix = f"bench:{run}:"
    base = int(run[:10], 16) << 16  # this run's advisory keys: 40 random bits, 16 for the index
    found: list[Implementation] = []
    for database, url in urls.items():
        found += [
            Implementation("tierlock", "tierlock", database, partial(TierlockSubject, url, table)),
            Implementation(
                "table-only", "table-only", database, partial(TableOnlySubject, url, table)
            ),
        ]
        if database == "mariadb":
            found += [
                Implementation(
                    "get-lock",
                    "GET_LOCK",
                    database,
                    partial(ConnectionSubject, partial(GetLockContender, url, prefix)),
                ),
                Implementation(
                    "floor",
                    FLOOR_LABEL,
                    database,
                    partial(ConnectionSubject, partial(mysql_floor, url)),
                    excludes=False,
                ),
            ]
        if database == "postgresql":
            found += [
                Implementation(
                    "advisory",
                    "pg_advisory_lock",
                    database,
                    partial(ConnectionSubject, partial(AdvisoryContender, url, base)),
                ),
                Implementation(
                    "floor",
                    FLOOR_LABEL,
                    database,
                    partial(ConnectionSubject, partial(postgresql_floor, url)),
                    excludes=False,
                ),
            ]
    if redis_url is not None:
        found.append(
            Implementation(
                "redis",
                "redis-py Lock",
                None,
                partial(ConnectionSubject, partial(RedisContender, redis_url, prefix)),
            )
        )
    return found
