"""tierlock's peers on Redis, ZooKeeper and a lock directory, and their floors.

On Redis each thread has a client of its own, with a pool of its own: redis-py's
``Lock`` sleeps between tries, but python-redis-lock waits in ``BLPOP`` on its signal
list, which holds a connection. On ZooKeeper each process has one ``KazooClient``, one
session, shared by its threads, as kazoo's users run it (and as tierlock runs one
manager per process): a client per thread would be a session per thread, with a
connection and two threads of its own each. Each thread has a ``Lock`` of its own per
key, kept for the run (kazoo's and python-redis-lock's locks are not reentrant, and a
lock object serves one thread at a time; the workload never takes a key it holds).

On a lock directory each thread has a filelock ``FileLock`` of its own per key, kept
for the run as the other peers' lock objects are, with filelock's defaults
(``thread_local=True``, ``is_singleton=False``, ``poll_interval=0.05``; each acquire
passes ``timeout``). On Linux it is ``UnixFileLock``. An acquire resolves the lock
file's directory (``realpath``: an ``lstat`` per component), makes sure it exists
(``mkdir``, then ``stat``), looks for the file (``lstat``), opens it (made on first use,
kept on release, so waiters share its inode) and tries ``flock(LOCK_EX | LOCK_NB)``; a
won try checks the file is still linked and whose it is (``fstat``, ``stat`` of the
directory), a lost one closes it and sleeps ``poll_interval`` before the next: nothing
wakes a waiter when the holder lets go. A release is ``flock(LOCK_UN)`` and ``close``.

Commands (Redis) and requests (ZooKeeper) are counted where the client sends them;
file-system calls (lock directory) where Python issues them, for all the process's
threads at once (see :class:`FileCallsSubject`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import filelock
import redis
import redis.lock
import redis_lock
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock as KazooLock

from .drivers import count_file_calls
from .engines import CountingKazooClient, kazoo_client, stop
from .interface import TTL, WAIT_LIMIT, Contender, Subject
from .peers import CountingRedis, FloorContender

REDIS_FLOOR_LABEL = "floor: 2x PING"
ZOOKEEPER_FLOOR_LABEL = "floor: 2x exists"
FILE_FLOOR_LABEL = "floor: 2x stat"


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


class FileLockContender(Contender):
    """filelock's ``FileLock`` on ``<directory>/k<index>.lock``, one per key for this
    thread; a try is ``acquire(blocking=False)``, which raises ``Timeout`` if it lost."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.locks: dict[int, filelock.BaseFileLock] = {}

    def lock(self, index: int) -> filelock.BaseFileLock:
        lock = self.locks.get(index)
        if lock is None:
            path = os.path.join(self.directory, f"k{index}.lock")
            lock = self.locks[index] = filelock.FileLock(path)
        return lock

    def acquire(self, index: int) -> None:
        try:
            self.lock(index).acquire(timeout=WAIT_LIMIT)
        except filelock.Timeout as exc:
            raise TimeoutError(
                f"filelock of key {index} not acquired within {WAIT_LIMIT} s"
            ) from exc

    def try_acquire(self, index: int) -> bool:
        try:
            self.lock(index).acquire(blocking=False)
        except filelock.Timeout:
            return False
        return True

    def release(self, index: int) -> None:
        self.lock(index).release()

    def close(self) -> None:
        """Nothing: a ``FileLock`` keeps no file open between holds."""


def file_floor(directory: str) -> Contender:
    """Two ``stat`` calls of a file in ``directory`` per section."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "floor")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
    return FloorContender(lambda: os.stat(path), lambda: None)


class FileCallsSubject(Subject):
    """The subject ``open_subject`` makes, whose statements are the file-system calls
    of its whole process from its opening on (see
    :func:`bench.drivers.count_file_calls`): every implementation on a lock directory is
    counted so, tierlock's too, whatever it counts itself."""

    def __init__(self, open_subject: Callable[[], Subject]) -> None:
        super().__init__()
        self.calls = count_file_calls()
        self.subject = open_subject()

    def make_contender(self) -> Contender:
        return self.subject.contender()

    def statements(self) -> int:
        return self.calls()

    def close(self) -> None:
        self.subject.close()
