"""tierlock's peers on Redis and ZooKeeper, and their floors.

On Redis each thread has a client of its own, with a pool of its own: redis-py's
``Lock`` sleeps between tries, but python-redis-lock waits in ``BLPOP`` on its signal
list, which holds a connection. On ZooKeeper each process has one ``KazooClient``, one
session, shared by its threads, as kazoo's users run it (and as tierlock runs one
manager per process): a client per thread would be a session per thread, with a
connection and two threads of its own each. Each thread has a ``Lock`` of its own per
key, kept for the run (kazoo's and python-redis-lock's locks are not reentrant, and a
lock object serves one thread at a time; the workload never takes a key it holds).

Commands (Redis) and requests (ZooKeeper) are counted where the client sends them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
import redis.lock
import redis_lock
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock as KazooLock

from .engines import CountingKazooClient, kazoo_client, stop
from .interface import TTL, WAIT_LIMIT, Contender, Subject
from .peers import CountingRedis, FloorContender

REDIS_FLOOR_LABEL = "floor: 2x PING"
ZOOKEEPER_FLOOR_LABEL = "floor: 2x exists"


def counting_client(url: str) -> CountingRedis:
    """A client with a connection pool of its own."""
    return CountingRedis(connection_pool=redis.ConnectionPool.from_url(url))


class _RedisClientContender(Contender):
    """A lock object per key on a counting client of this contender's own; a try is
    ``acquire(blocking=False)``."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = counting_client(url)
        self.prefix = prefix
        self.locks: dict[int, Any] = {}

    def statements(self) -> int:
        return self.client.commands

    def make(self, name: str) -> Any:
        raise NotImplementedError

    def lock(self, index: int) -> Any:
        lock = self.locks.get(index)
        if lock is None:
            lock = self.locks[index] = self.make(f"{self.prefix}{index}")
        return lock

    def try_acquire(self, index: int) -> bool:
        return bool(self.lock(index).acquire(blocking=False))

    def release(self, index: int) -> None:
        self.lock(index).release()

    def close(self) -> None:
        self.client.close()


class RedisContender(_RedisClientContender):
    """redis-py's ``Lock``, blocking with its default sleep between tries; a try is one
    ``SET NX``."""

    def make(self, name: str) -> redis.lock.Lock:
        lock: redis.lock.Lock = self.client.lock(name, timeout=TTL)
        return lock

    def acquire(self, index: int) -> None:
        if not self.lock(index).acquire(blocking_timeout=WAIT_LIMIT):
            raise TimeoutError(f"redis lock of key {index} not acquired within {WAIT_LIMIT} s")


class RedisLockContender(_RedisClientContender):
    """python-redis-lock's ``Lock`` with ``expire=TTL``: an acquire asks whether this
    lock holds the key already (``GET``), then ``SET NX``, and while that fails waits
    in ``BLPOP`` on the key's signal list, which a release pushes to."""

    def __init__(self, url: str, prefix: str) -> None:
        # Each failed try logs a warning, which unconfigured logging prints: the
        # benchmark would time the printing.
        logging.getLogger("redis_lock.acquire").setLevel(logging.ERROR)
        super().__init__(url, prefix)

    def make(self, name: str) -> redis_lock.Lock:
        return redis_lock.Lock(self.client, name, expire=TTL)

    def acquire(self, index: int) -> None:
        if not self.lock(index).acquire(timeout=WAIT_LIMIT):
            raise TimeoutError(f"redis_lock of key {index} not acquired within {WAIT_LIMIT} s")


def redis_floor(url: str) -> Contender:
    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(url))
    return FloorContender(client.ping, client.close)


class KazooContender(Contender):
    """kazoo's ``Lock`` recipe on node ``<root>/k<index>``: an acquire adds a sequential
    ephemeral node and, until it is the lowest, watches the one before it; a try is
    ``acquire(blocking=False)``, which removes its node again if it lost."""

    def __init__(self, client: CountingKazooClient, root: str) -> None:
        self.client = client
        self.root = root
        self.locks: dict[int, KazooLock] = {}

    def lock(self, index: int) -> KazooLock:
        lock = self.locks.get(index)
        if lock is None:
            lock = self.locks[index] = KazooLock(self.client, f"{self.root}/k{index}")
        return lock

    def acquire(self, index: int) -> None:
        try:
            acquired = self.lock(index).acquire(timeout=WAIT_LIMIT)
        except LockTimeout:
            acquired = False
        if not acquired:
            raise TimeoutError(f"kazoo lock of key {index} not acquired within {WAIT_LIMIT} s")

    def try_acquire(self, index: int) -> bool:
        return bool(self.lock(index).acquire(blocking=False))

    def release(self, index: int) -> None:
        if not self.lock(index).release():
            raise RuntimeError(f"kazoo lock of key {index} found it not held")

    def close(self) -> None:
        """Nothing: the client is the subject's."""


def zookeeper_floor(client: CountingKazooClient, root: str) -> Contender:
    """Two requests, ``exists`` of the chroot, per section."""
    return FloorContender(lambda: client.exists("/"), lambda: None)


class KazooSubject(Subject):
    """One client per process, shared by its threads' contenders, made by
    ``contender(client, root)``; ``root``: the node the peers' nodes go under."""

    def __init__(
        self,
        url: str,
        root: str,
        contender: Callable[[CountingKazooClient, str], Contender],
    ) -> None:
        super().__init__()
        self.client = kazoo_client(url)
        self.root, self.make = root, contender

    def make_contender(self) -> Contender:
        return self.make(self.client, self.root)

    def statements(self) -> int:
        return self.client.requests

    def close(self) -> None:
        stop(self.client)
