"""The lock implementations the harness drives through the same workload: tierlock,
its lock table alone, and the peers of :mod:`bench.peers`, on every server given."""

from __future__ import annotations

from functools import partial

import tierlock

from .interface import TTL, WAIT_LIMIT, Contender, Implementation, Subject
from .peers import (
    FLOOR_LABEL,
    AdvisoryContender,
    ConnectionSubject,
    GetLockContender,
    RedisContender,
    mysql_floor,
    postgresql_floor,
)

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

    def try_acquire(self, index: int) -> bool:
        return self.handle(index).acquire(blocking=False)

    def release(self, index: int) -> None:
        self.handle(index).release()

    def close(self) -> None:
        """Nothing: the manager is the subject's."""


def manager(url: str, table: str) -> tierlock.LockManager:
    """A manager as the benchmarks run it: renewed leases, reaper off, on a table made."""
    return tierlock.LockManager(url, table=table, ttl=TTL, create_table=False, reaper_interval=None)


def sent(manager: tierlock.LockManager) -> int:
    """Statements ``manager`` has sent, its doorbell's included."""
    stats = manager.stats()
    return stats.statements + stats.doorbell_queries


class TierlockSubject(Subject):
    """One manager per process, shared by its threads: tier 1 at work."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__()
        self.manager = manager(url, table)

    def make_contender(self) -> Contender:
        return TierlockContender(self.manager)

    def statements(self) -> int:
        return sent(self.manager)

    def close(self) -> None:
        self.manager.close()


class TableOnlyContender(TierlockContender):
    """A contender with a manager of its own, which asks the table at every try."""

    def try_acquire(self, index: int) -> bool:
        # Failing a try from memory of a key held elsewhere is tier 1's doing.
        self.manager._tiers.cohorts.forget()
        return super().try_acquire(index)

    def statements(self) -> int:
        return sent(self.manager)

    def close(self) -> None:
        self.manager.close()


class TableOnlySubject(Subject):
    """One manager per thread: each thread inserts and polls the table itself, as if
    there were no tier 1."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__()
        self.url, self.table = url, table

    def make_contender(self) -> Contender:
        return TableOnlyContender(manager(self.url, self.table))

    def close(self) -> None:
        """Nothing: each contender closes its own manager."""


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
