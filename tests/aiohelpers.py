"""What the asyncio tests share: managers made inside the test's event loop, and gates
that stop a backend call where a test wants to cancel or look."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tierlock.aio import AsyncLockManager
from tierlock.aio.core import DOORBELL_THREADS, STATEMENT_THREADS

T = TypeVar("T")

# The longest any step of a test may take on a slow, busy machine.
LONG = 30.0
# The threads an async manager may add to a process, whatever its number of tasks:
# statement and doorbell threads, and a few more (the heartbeat and lease clock, a
# listener on PostgreSQL, a marks thread on MariaDB).
FEW_THREADS = STATEMENT_THREADS + DOORBELL_THREADS + 4


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` in a new event loop, as an application would."""

    async def guarded() -> T:
        return await asyncio.wait_for(main(), 4 * LONG)

    return asyncio.run(guarded())


def run_with_one_worker(main: Callable[[], Awaitable[T]]) -> T:
    """``run``, with one worker thread for ``asyncio.to_thread``: a sync hold taken in
    one call is then released by the same thread in the next."""

    async def single() -> T:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        return await main()

    return run(single)


class Opener:
    """Makes async managers on the test's database and table."""

    def __init__(self, url: str, table: str) -> None:
        self.url = url
        self.table = table

    def options(self, **options: Any) -> dict[str, Any]:
        options.setdefault("table", self.table)
        options.setdefault("reaper_interval", None)
        options.setdefault("poll_interval", 0.02)
        options.setdefault("url", self.url)
        return options

    @contextlib.asynccontextmanager
    async def __call__(self, **options: Any) -> AsyncIterator[AsyncLockManager]:
        locks = AsyncLockManager(**self.options(**options))
        try:
            yield locks
        finally:
            await locks.aclose()


class Gate:
    """Stops calls of one backend method: ``entered`` is set when a call arrives (before
    or after the real call, as ``after``), which then waits until ``opened``."""

    def __init__(self, target: Any, name: str, *, after: bool = False) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self._target = target
        self._name = name
        real = getattr(target, name)

        def gated(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if not after:
                self._stop()
            result = real(*args, **kwargs)
            if after:
                self._stop()
            return result

        setattr(target, name, gated)

    def _stop(self) -> None:
        self.entered.set()
        if not self.opened.wait(LONG):
            raise AssertionError("a gated call was never let through")

    async def reached(self) -> None:
        """Wait, without blocking the loop, until a call has arrived."""
        if not await asyncio.to_thread(self.entered.wait, LONG):
            raise AssertionError(f"no call of {self._name} arrived")

    def open(self) -> None:
        """Let every call through from now on, and take the gate away."""
        self.opened.set()
        delattr(self._target, self._name)


async def rows(locks: AsyncLockManager) -> list[str]:
    """The keys of the table's rows."""
    return [info.key for info in await locks.holders()]


async def settled(locks: AsyncLockManager) -> None:
    """Wait until the manager's own tasks (pollers, releases under way) are done."""
    await locks._core.settle()


class Holder:
    """A task that acquires ``lock``, holds it until ``release()`` is awaited, then
    releases it: tasks own their holds, so a test keeps each holder alive this way."""

    def __init__(self, lock: Any, *, timeout: float | None = LONG, name: str | None = None):
        self.lock = lock
        self.token: int | None = None
        self._got: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self.task = asyncio.create_task(self._run(timeout), name=name)

    async def _run(self, timeout: float | None) -> None:
        try:
            got = await self.lock.acquire(timeout=timeout)
        except BaseException as exc:
            self._got.set_exception(exc)
            raise
        self.token = self.lock.token
        self._got.set_result(got)
        if got:
            await self._done.wait()
            await self.lock.release()

    async def holds(self) -> bool:
        """Whether it got the lock (waiting until it knows)."""
        return await asyncio.wait_for(asyncio.shield(self._got), LONG)

    async def release(self) -> None:
        self._done.set()
        await self.task


async def swept(locks: AsyncLockManager) -> None:
    """Wait until the table is empty: rows of cancelled statements are swept by the
    backend's own thread, once the database says no statement for them still runs."""
    deadline = asyncio.get_running_loop().time() + LONG
    while await rows(locks):
        assert asyncio.get_running_loop().time() < deadline, await rows(locks)
        await asyncio.sleep(0.02)
