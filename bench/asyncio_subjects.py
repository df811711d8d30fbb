"""The subjects of the asyncio scenarios: tierlock's ``AsyncLockManager`` and redis-py's
asyncio ``Lock``, each shared by the tasks of one event loop, beside the sync
``LockManager`` shared by threads doing the same work (see :mod:`bench.asyncio_cells`)."""

from __future__ import annotations

from functools import partial
from typing import Any

import redis.asyncio
import redis.asyncio.lock

from tierlock.aio import AsyncLock, AsyncLockManager

from .interface import TTL, WAIT_LIMIT, AsyncContender, AsyncSubject, Implementation
from .subjects import TierlockSubject

# The rows that tasks drive; the others, threads.
TASK_ROWS = ("tierlock-aio", "redis-aio")
# The asyncio client's pool: a blocking one, in which a task waits for a free connection.
# The default pool raises MaxConnectionsError past 100 tasks sending at once, and a
# connection per task (1000) opened at once overflows the server's listen backlog (511)
# and times out on a busy machine.
REDIS_CONNECTIONS = 64


class AsyncTierlockContender(AsyncContender):
    """Takes keys through the manager's handles, made once per key."""

    def __init__(self, manager: AsyncLockManager) -> None:
        self.manager = manager
        self.handles: dict[int, AsyncLock] = {}

    def lock(self, index: int) -> AsyncLock:
        handle = self.handles.get(index)
        if handle is None:
            handle = self.handles[index] = self.manager.lock(f"k{index}", timeout=WAIT_LIMIT)
        return handle


class AsyncTierlockSubject(AsyncSubject):
    """One manager per process, shared by its tasks: tier 1 in the event loop. Its
    options are the sync rows': renewed leases, reaper off, on a table made."""

    def __init__(self, url: str, table: str) -> None:
        self.manager = AsyncLockManager(
            url, table=table, ttl=TTL, create_table=False, reaper_interval=None
        )

    def contender(self) -> AsyncContender:
        return AsyncTierlockContender(self.manager)

    def statements(self) -> int:
        stats = self.manager.stats()
        return stats.statements + stats.doorbell_queries

    async def aclose(self) -> None:
        await self.manager.aclose()


class CountingAsyncRedis(redis.asyncio.Redis):
    """An asyncio client that counts the commands it sends (scripts included)."""

    commands = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands += 1
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


class AsyncRedisContender(AsyncContender):
    """redis-py's asyncio ``Lock``, a lock object per key for this task alone (its token
    lives in thread-local storage, which the tasks of a loop share). It blocks with its
    default sleep between tries, 0.1 s, as the threads' redis-py ``Lock`` does."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.locks: dict[int, redis.asyncio.lock.Lock] = {}

    def lock(self, index: int) -> redis.asyncio.lock.Lock:
        lock = self.locks.get(index)
        if lock is None:
            lock = self.locks[index] = self.client.lock(
                f"{self.prefix}{index}", timeout=TTL, blocking_timeout=WAIT_LIMIT
            )
        return lock


class AsyncRedisSubject(AsyncSubject):
    """One client per process, its pool of connections shared by the tasks."""

    def __init__(self, url: str, prefix: str) -> None:
        self.pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=REDIS_CONNECTIONS, timeout=None
        )
        self.client = CountingAsyncRedis(connection_pool=self.pool)
        self.prefix = prefix

    def contender(self) -> AsyncContender:
        return AsyncRedisContender(self.client, self.prefix)

    def statements(self) -> int:
        return self.client.commands

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.pool.disconnect()


def async_implementations(
    urls: dict[str, str], table: str, run: str, redis_url: str | None
) -> list[Implementation]:
    """The rows of the asyncio scenarios on the given engines (name to URL) and Redis
    server: tierlock's async manager and its sync manager driven by threads on each,
    redis-py's asyncio Lock on Redis. ``run`` and ``table`` as for
    :func:`bench.subjects.implementations`."""
    found: list[Implementation] = []
    for database, url in urls.items():
        found += [
            Implementation(
                "tierlock-aio", "tierlock.aio", database, partial(AsyncTierlockSubject, url, table)
            ),
            Implementation(
                "tierlock", "tierlock, threads", database, partial(TierlockSubject, url, table)
            ),
        ]
    if redis_url is not None:
        found.append(
            Implementation(
                "redis-aio",
                "redis.asyncio Lock",
                "redis",
                partial(AsyncRedisSubject, redis_url, f"bench:{run}:"),
            )
        )
    return found
