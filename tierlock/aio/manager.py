"""``AsyncLockManager``: one process's locks on one table, for asyncio tasks."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..base import (
    DEFAULT_DATABASE_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REAPER_INTERVAL,
    DEFAULT_TABLE,
    DEFAULT_TTL,
    ManagerBase,
)
from ..keys import KeyLike, KeyTemplate, make_key
from ..records import LockInfo
from ..tier1.tiers import OnLost
from .core import Core
from .exclusive import Exclusive
from .handles import AsyncLock, AsyncOnLost, AsyncReadLock, AsyncSemaphore
from .multi import AsyncMultiLock, async_multi_lock
from .shared import Shares

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["AsyncLockManager", "AsyncOnLost"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class AsyncLockManager(ManagerBase):
    """Distributed locks kept in a database table, for asyncio tasks::

        async with AsyncLockManager("postgresql+psycopg://postgres@127.0.0.1/test") as locks:
            async with locks.lock(("user", 42), timeout=5):
                ...
            async with locks.lock_all([("user", 1), ("user", 2)], timeout=5):
                ...                             # both keys, or LockTimeout and neither

    A hold belongs to the task that acquired it. Tasks of one manager that want a key
    wait in the event loop, first come first served, with no thread each; one poller
    per key asks the database, in a few threads of the manager's own (see
    ``tierlock.aio.core``). Holds pass between the manager's tasks with no statement,
    and one heartbeat renews them all, as in ``LockManager``, whose options and table
    it shares: sync and async managers on one table exclude each other.

    Making one opens the database (and creates the table) at once, so make it once,
    at start-up; close it with ``await locks.aclose()`` or ``async with``.

    A manager belongs to the process that made it, as its event loop does: a forked
    child makes its own. In a child, every call of an inherited manager and of its
    handles raises ``LockError`` at once and sends nothing, whether the child's own
    code, ``asyncio.run``'s teardown or a garbage collection calls it: the parent's
    holds stay the parent's, and a release in the child never gives them away. Only
    ``aclose()`` returns quietly there, having done nothing (the parent closes what it
    opened), so that ``async with`` and shutdown code still let the child exit.

    :param on_lost: as ``LockManager``'s, and may also be a coroutine function, which
        then runs as a task of the event loop the hold was taken in.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        table: str = DEFAULT_TABLE,
        ttl: float = DEFAULT_TTL,
        renew: bool = True,
        on_lost: AsyncOnLost | None = None,
        create_table: bool = True,
        reaper_interval: float | None = DEFAULT_REAPER_INTERVAL,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        database_timeout: float = DEFAULT_DATABASE_TIMEOUT,
    ) -> None:
        super().__init__(
            url,
            engine=engine,
            table=table,
            ttl=ttl,
            renew=renew,
            on_lost=cast("OnLost | None", on_lost),
            create_table=create_table,
            reaper_interval=reaper_interval,
            poll_interval=poll_interval,
            database_timeout=database_timeout,
        )
        self._core = Core(self._backend, self._counters, self.poll_interval, self.ttl / 3)
        self._exclusive = Exclusive(self._core)
        self._shares = Shares(self._core, self._exclusive)
        self._start_reaper()

    # -- handles ---------------------------------------------------------------------

    def lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncLock:
        """A handle on ``key``; see :class:`AsyncLock` and ``LockManager.lock``."""
        self._core.check_open()
        return AsyncLock(self, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def lock_all(
        self,
        keys: Iterable[KeyLike],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncMultiLock:
        """One handle on several keys, taken all or none by the calling task, in one
        order and within one ``timeout``; see :class:`AsyncMultiLock` and
        ``LockManager.lock_all``."""
        return async_multi_lock(
            self.lock, keys, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost
        )

    def write_lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncLock:
        """The same as :meth:`lock`."""
        return self.lock(key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def read_lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncReadLock:
        """A handle on the read hold of ``key``; see :class:`AsyncReadLock`."""
        self._core.check_open()
        self._check_shared("read locks")
        return AsyncReadLock(self, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def semaphore(
        self,
        key: KeyLike,
        permits: int,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncSemaphore:
        """A handle on semaphore ``key`` with ``permits``; see :class:`AsyncSemaphore`."""
        self._core.check_open()
        self._check_shared("semaphores")
        return AsyncSemaphore(
            self, key, permits, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost
        )

    def synchronized(
        self,
        key: str,
        *keys: str,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> Callable[[F], F]:
        """Decorate an ``async def`` function so that each call runs holding a lock,
        its key formatted from the call's arguments; with several templates, holding
        all their keys, taken through :meth:`lock_all` (see ``LockManager.synchronized``)."""
        templates = [KeyTemplate(template) for template in (key, *keys)]
        options: dict[str, Any] = {
            "ttl": ttl,
            "timeout": timeout,
            "renew": renew,
            "on_lost": on_lost,
        }

        def decorate(function: F) -> F:
            if not inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"AsyncLockManager.synchronized() guards async def functions, and "
                    f"{function.__qualname__}() is not one; use LockManager's for threads"
                )
            keys_of = [template.for_function(function) for template in templates]

            @functools.wraps(function)
            async def synchronized_call(*args: Any, **kwargs: Any) -> Any:
                lock = (
                    self.lock(keys_of[0](*args, **kwargs), **options)
                    if len(keys_of) == 1
                    else self.lock_all([k(*args, **kwargs) for k in keys_of], **options)
                )
                async with lock:
                    return await function(*args, **kwargs)

            return cast(F, synchronized_call)

        return decorate

    def _reporter(self, on_lost: Any) -> OnLost | None:
        """``on_lost`` as the lease clock's thread calls it: a coroutine function's runs
        as a task of the calling task's event loop."""
        if on_lost is None or not inspect.iscoroutinefunction(on_lost):
            return cast("OnLost | None", on_lost)
        loop = asyncio.get_running_loop()
        spawn = self._core.spawn

        def report(key: str, token: int) -> None:
            loop.call_soon_threadsafe(lambda: spawn(on_lost(key, token)))

        return report

    # -- admin -------------------------------------------------------------------------

    async def info(self, key: KeyLike) -> LockInfo | None:
        """The row holding ``key``, expired or not, or ``None`` if it is free."""
        return await self._core.call(self._backend.info, make_key(key))

    async def holders(self) -> list[LockInfo]:
        """Every row in the table, expired or not, ordered by key."""
        return await self._core.call(self._backend.holders)

    async def force_release(self, key: KeyLike) -> bool:
        """Delete whatever row holds ``key``, whoever's it is; ``False`` if none did."""
        return await self._core.call(self._force_release, make_key(key))

    async def reap(self) -> int:
        """Delete every row whose lease has ended, now; return how many."""
        return await self._core.call(self._reap)

    async def aclose(self) -> None:
        """Send waiting tasks away with ``LockError``, finish the manager's own tasks,
        stop the reaper and close every connection; closing again does nothing.

        Holds still open are not released: their rows expire with their leases. In a
        forked child, closing an inherited manager does nothing.
        """
        core = self._core
        if core.closed or core.inherited:
            return
        core.closed = True
        self._exclusive.close()
        self._shares.close()
        await core.settle()
        await asyncio.to_thread(self._shut_down)

    def _shut_down(self) -> None:
        self._reaper.stop()
        self._core.shutdown()
        self._backend.close()

    async def __aenter__(self) -> AsyncLockManager:
        self._core.check_process()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _after_fork(self) -> None:
        """In a forked child, which may not use the manager: count afresh, and drop the
        parent's heartbeat, reaper and connections without joining or closing them
        (the backend's ``after_fork`` also gives SQLite a fork gate of the child's)."""
        self._counters.reset()
        self._core.after_fork()
        self._reaper.forget()
        self._backend.after_fork()
