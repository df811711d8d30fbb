"""The lock implementations the harness drives through the same workload, on every
engine given: tierlock everywhere; on the SQL databases its lock table alone, the lock
a user would write on a bare cursor (:mod:`bench.bare`) and the peers of
:mod:`bench.peers`; on Redis, ZooKeeper and a lock directory the peers of
:mod:`bench.engine_peers`. A floor of two bare round trips (on a lock directory, two
file-system calls) runs on every engine but SQLite."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import tierlock

from .bare import LABEL as BARE_LABEL
from .bare import SCENARIOS as BARE_SCENARIOS
from .bare import BareCursorContender, bare_table
from .engine_peers import (
    FILE_FLOOR_LABEL,
    REDIS_FLOOR_LABEL,
    ZOOKEEPER_FLOOR_LABEL,
    FileCallsSubject,
    FileLockContender,
    KazooContender,
    KazooSubject,
    RedisContender,
    RedisLockContender,
    file_floor,
    redis_floor,
    zookeeper_floor,
)
from .engines import lock_directory, peer_namespace
from .interface import TTL, WAIT_LIMIT, Contender, Implementation, Subject
from .peers import (
    FLOOR_LABEL,
    AdvisoryContender,
    ConnectionSubject,
    GetLockContender,
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


def implementations(urls: dict[str, str], table: str, run: str) -> list[Implementation]:
    """Every implementation on the given engines (name to URL).

    ``run`` makes lock names that no other run shares; ``table`` is the lock table (on
    Redis, the key prefix; on ZooKeeper, the node; on a lock directory, the directory in
    it), beside which the peers there keep theirs (see
    :func:`bench.engines.peer_namespace`). On a lock directory every implementation,
    tierlock included, is counted in file-system calls (see
    :class:`bench.engine_peers.FileCallsSubject`).
    """
    found: list[Implementation] = []
    for database, url in urls.items():
        subject: Callable[[], Subject] = partial(TierlockSubject, url, table)
        if database == "file":
            subject = partial(FileCallsSubject, subject)
        found.append(Implementation("tierlock", "tierlock", database, subject))
        if database == "redis":
            found += redis_peers(url, peer_namespace(table))
        elif database == "zookeeper":
            found += zookeeper_peers(url, peer_namespace(table))
        elif database == "file":
            found += file_peers(lock_directory(url, peer_namespace(table)))
        else:
            found += sql_peers(database, url, table, run)
    return found


def sql_peers(database: str, url: str, table: str, run: str) -> list[Implementation]:
    """The lock table alone, the bare cursor's lock, the server's own lock and the floor
    of two ``SELECT 1``."""
    bare = partial(BareCursorContender, url, bare_table(table))
    found = [
        Implementation("table-only", "table-only", database, partial(TableOnlySubject, url, table)),
        Implementation(
            "bare-cursor",
            BARE_LABEL,
            database,
            partial(ConnectionSubject, bare),
            scenarios=BARE_SCENARIOS,
        ),
    ]
    if database == "mariadb":
        found.append(
            Implementation(
                "get-lock",
                "GET_LOCK",
                database,
                partial(ConnectionSubject, partial(GetLockContender, url, f"bench:{run}:")),
            )
        )
        floor = mysql_floor
    elif database == "postgresql":
        base = int(run[:10], 16) << 16  # this run's advisory keys: 40 random bits, 16 for the index
        found.append(
            Implementation(
                "advisory",
                "pg_advisory_lock",
                database,
                partial(ConnectionSubject, partial(AdvisoryContender, url, base)),
            )
        )
        floor = postgresql_floor
    else:
        return found  # SQLite: no lock of its own, and no server to make a round trip to
    found.append(
        Implementation(
            "floor",
            FLOOR_LABEL,
            database,
            partial(ConnectionSubject, partial(floor, url)),
            excludes=False,
        )
    )
    return found


def redis_peers(url: str, peers: str) -> list[Implementation]:
    """redis-py's ``Lock``, python-redis-lock and the floor of two ``PING``."""
    return [
        Implementation(
            "redis",
            "redis-py Lock",
            "redis",
            partial(ConnectionSubject, partial(RedisContender, url, f"{peers}:redis-py:")),
        ),
        Implementation(
            "python-redis-lock",
            "python-redis-lock",
            "redis",
            partial(ConnectionSubject, partial(RedisLockContender, url, f"{peers}:redis-lock:")),
        ),
        Implementation(
            "floor",
            REDIS_FLOOR_LABEL,
            "redis",
            partial(ConnectionSubject, partial(redis_floor, url)),
            excludes=False,
        ),
    ]


def zookeeper_peers(url: str, peers: str) -> list[Implementation]:
    """kazoo's ``Lock`` recipe and the floor of two ``exists``."""
    return [
        Implementation(
            "kazoo",
            "kazoo Lock",
            "zookeeper",
            partial(KazooSubject, url, f"/{peers}/kazoo", KazooContender),
        ),
        Implementation(
            "floor",
            ZOOKEEPER_FLOOR_LABEL,
            "zookeeper",
            partial(KazooSubject, url, f"/{peers}", zookeeper_floor),
            excludes=False,
        ),
    ]


def file_peers(peers: str) -> list[Implementation]:
    """filelock's ``FileLock`` and the floor of two ``stat``, in the directory ``peers``."""
    return [
        Implementation(
            "filelock",
            "filelock FileLock",
            "file",
            partial(
                FileCallsSubject,
                partial(
                    ConnectionSubject, partial(FileLockContender, os.path.join(peers, "filelock"))
                ),
            ),
        ),
        Implementation(
            "floor",
            FILE_FLOOR_LABEL,
            "file",
            partial(FileCallsSubject, partial(ConnectionSubject, partial(file_floor, peers))),
            excludes=False,
        ),
    ]
