"""What a thread of a worker process takes and frees, by implementation, and the rows of
the report: each implementation under a scenario on a server."""

from __future__ import annotations

import abc
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import redis
from sqlalchemy.engine import make_url

import tierlock

from ..drivers import postgresql_connection
from ..interface import TTL, WAIT_LIMIT
from ..peers import CountingRedis
from ..subjects import manager, sent
from .scenarios import BACKOFF, PERMITS, READ_MOSTLY, SCENARIOS, SEMAPHORE


class Holder(abc.ABC):
    """One thread's way to take and free key ``index``, to write or to read (a
    semaphore ignores ``write``: every hold is a permit)."""

    sent = 0  # statements or commands sent, counted by holders that send their own

    def statements(self) -> int:
        return self.sent

    def retries(self) -> int:
        """Statements the database refused for contention and that were sent again, by
        this thread's process (only tierlock counts them)."""
        return 0

    @abc.abstractmethod
    def take(self, index: int, write: bool) -> None:
        """Take the key, waiting as long as it takes (up to ``WAIT_LIMIT``)."""

    @abc.abstractmethod
    def give(self, index: int, write: bool) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the holder opened."""


class Side:
    """One worker process's side of an implementation: a holder per thread."""

    def __init__(self, make: Callable[[], Holder]) -> None:
        self.make = make
        self.holders: list[Holder] = []
        self._mutex = threading.Lock()

    def holder(self) -> Holder:
        holder = self.make()
        with self._mutex:
            self.holders.append(holder)
        return holder

    def statements(self) -> int:
        with self._mutex:
            return sum(holder.statements() for holder in self.holders)

    def close(self) -> None:
        """Nothing: each thread closes its own holder."""


class Hold(Protocol):
    """What tierlock's handles (lock, read lock, semaphore) have in common here."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


# How tierlock's holders take keys.
READ_WRITE, EXCLUSIVE, PERMIT = "read-write", "exclusive", "permit"


class TierlockHolder(Holder):
    """A thread's handles on the process's manager, made once per key and mode."""

    def __init__(self, manager: tierlock.LockManager, mode: str) -> None:
        self.manager, self.mode = manager, mode
        self.handles: dict[tuple[int, bool], Hold] = {}

    def retries(self) -> int:
        return self.manager.stats().contention_retries

    def handle(self, index: int, write: bool) -> Hold:
        handle = self.handles.get((index, write))
        if handle is None:
            if self.mode == PERMIT:
                handle = self.manager.semaphore(f"sem{index}", permits=PERMITS)
            elif write or self.mode == EXCLUSIVE:
                handle = self.manager.lock(f"doc{index}")
            else:
                handle = self.manager.read_lock(f"doc{index}")
            self.handles[index, write] = handle
        return handle

    def take(self, index: int, write: bool) -> None:
        if not self.handle(index, write).acquire(timeout=WAIT_LIMIT):
            raise TimeoutError(f"key {index} not acquired within {WAIT_LIMIT} s")

    def give(self, index: int, write: bool) -> None:
        self.handle(index, write).release()

    def close(self) -> None:
        """Nothing: the manager is the side's."""


class TierlockSide(Side):
    """One manager per process, shared by its threads: tier 1 at work."""

    def __init__(self, url: str, table: str, mode: str) -> None:
        self.manager = manager(url, table)
        super().__init__(partial(TierlockHolder, self.manager, mode))

    def statements(self) -> int:
        return sent(self.manager)

    def close(self) -> None:
        self.manager.close()


class AdvisoryHolder(Holder):
    """PostgreSQL's session advisory locks on ``base + index`` on a connection of the
    thread's own: shared to read, exclusive to write, waiting on the server."""

    def __init__(self, url: str, base: int) -> None:
        self.connection = postgresql_connection(make_url(url))
        self.base = base

    def query(self, sql: str, index: int) -> Any:
        self.sent += 1
        row = self.connection.execute(sql, (self.base + index,)).fetchone()
        return None if row is None else row[0]

    def take(self, index: int, write: bool) -> None:
        shared = "" if write else "_shared"
        self.query(f"SELECT pg_advisory_lock{shared}(%s)", index)

    def give(self, index: int, write: bool) -> None:
        shared = "" if write else "_shared"
        if self.query(f"SELECT pg_advisory_unlock{shared}(%s)", index) is not True:
            raise RuntimeError(f"pg_advisory_unlock{shared} of key {index} found it not held")

    def close(self) -> None:
        self.connection.close()


def take_slot(slots: range, try_slot: Callable[[int], bool], choose: random.Random) -> int:
    """Try ``slots`` in turn until ``try_slot`` takes one, sleeping about ``BACKOFF``
    after each round that took none (up to ``WAIT_LIMIT``); the slot taken."""
    deadline = time.monotonic() + WAIT_LIMIT
    while True:
        for slot in slots:
            if try_slot(slot):
                return slot
        if time.monotonic() > deadline:
            raise TimeoutError(f"no slot of {slots} within {WAIT_LIMIT} s")
        time.sleep(BACKOFF * choose.uniform(0.5, 1.5))


class AdvisorySlotsHolder(AdvisoryHolder):
    """A semaphore of ``PERMITS`` advisory keys on PostgreSQL, on a connection of the
    thread's own: ``pg_try_advisory_lock`` on slots 0.. in turn until one is taken; when
    none is, a sleep of about ``BACKOFF`` and the round again. Freed with
    ``pg_advisory_unlock``."""

    def __init__(self, url: str, base: int) -> None:
        super().__init__(url, base)
        self.held: dict[int, list[int]] = {}  # slots held, by index
        self.choose = random.Random()

    def take(self, index: int, write: bool) -> None:
        def try_slot(slot: int) -> bool:
            return self.query("SELECT pg_try_advisory_lock(%s)", slot) is True

        slots = range(index * PERMITS, (index + 1) * PERMITS)
        self.held.setdefault(index, []).append(take_slot(slots, try_slot, self.choose))

    def give(self, index: int, write: bool) -> None:
        slot = self.held[index].pop()
        if self.query("SELECT pg_advisory_unlock(%s)", slot) is not True:
            raise RuntimeError(f"pg_advisory_unlock of slot {slot} found it not held")


# KEYS[1]: a slot; ARGV[1]: the holder's token. Deletes the slot only if it is still ours.
COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class RedisSlotsHolder(Holder):
    """A semaphore of ``PERMITS`` slot keys: ``SET <key>:<slot> token NX PX ttl`` for
    slots 0.. in turn until one is set; when none is, a sleep of about ``BACKOFF`` and
    the round again. Freed with a Lua compare-and-delete."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = CountingRedis(connection_pool=redis.ConnectionPool.from_url(url))
        self.release_script = self.client.register_script(COMPARE_AND_DELETE)
        self.prefix = prefix
        self.token = uuid.uuid4().hex
        self.held: dict[int, list[str]] = {}  # slot keys held, by index
        self.choose = random.Random()

    def statements(self) -> int:
        return self.client.commands

    def take(self, index: int, write: bool) -> None:
        ttl_ms = int(TTL * 1000)

        def try_slot(slot: int) -> bool:
            key = f"{self.prefix}{index}:{slot}"
            return bool(self.client.set(key, self.token, nx=True, px=ttl_ms))

        slot = take_slot(range(PERMITS), try_slot, self.choose)
        self.held.setdefault(index, []).append(f"{self.prefix}{index}:{slot}")

    def give(self, index: int, write: bool) -> None:
        key = self.held[index].pop()
        if self.release_script(keys=[key], args=[self.token]) != 1:
            raise RuntimeError(f"slot {key} was no longer ours")

    def close(self) -> None:
        self.client.close()


class NoLockHolder(Holder):
    """Takes nothing: the check must catch the overlaps."""

    def take(self, index: int, write: bool) -> None:
        pass

    def give(self, index: int, write: bool) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Entry:
    """An implementation under one scenario on one server: a row of the report."""

    name: str  # for --impl
    label: str
    scenario: str
    database: str | None  # None: needs no database, shown in every database's table
    open: Callable[[], Side]  # called in each worker process
    excludes: bool = True  # False for the run without a lock, whose violations are expected


def entries(urls: dict[str, str], table: str, run: str, redis_url: str | None) -> list[Entry]:
    """Every row on the given databases and Redis server; ``run`` keeps this run's
    advisory keys and Redis keys apart from any other run's."""
    prefix = f"bench-shared:{run}:"
    base = int(run[:10], 16) << 16  # 40 random bits, 16 for the index
    found: list[Entry] = []
    for database, url in urls.items():
        found += [
            Entry(
                "tierlock",
                "tierlock read_lock/lock",
                READ_MOSTLY,
                database,
                partial(TierlockSide, url, table, READ_WRITE),
            ),
            Entry(
                "tierlock-exclusive",
                "tierlock lock only",
                READ_MOSTLY,
                database,
                partial(TierlockSide, url, table, EXCLUSIVE),
            ),
        ]
        if database == "postgresql":
            found.append(
                Entry(
                    "advisory",
                    "pg_advisory_lock_shared/pg_advisory_lock",
                    READ_MOSTLY,
                    database,
                    partial(Side, partial(AdvisoryHolder, url, base)),
                )
            )
        found.append(
            Entry(
                "tierlock",
                "tierlock semaphore",
                SEMAPHORE,
                database,
                partial(TierlockSide, url, table, PERMIT),
            )
        )
        if database == "postgresql":
            found.append(
                Entry(
                    "advisory",
                    "pg_try_advisory_lock slots",
                    SEMAPHORE,
                    database,
                    partial(Side, partial(AdvisorySlotsHolder, url, base)),
                )
            )
    if redis_url is not None:
        found.append(
            Entry(
                "redis-slots",
                "Redis SET NX PX slots",
                SEMAPHORE,
                None,
                partial(Side, partial(RedisSlotsHolder, redis_url, prefix)),
            )
        )
    found += [
        Entry("none", "no lock", name, None, partial(Side, NoLockHolder), excludes=False)
        for name in SCENARIOS
    ]
    return found
