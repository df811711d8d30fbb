"""The async handles: ``AsyncLock``, ``AsyncReadLock`` and ``AsyncSemaphore``, owned by
asyncio tasks (tier 1 in ``exclusive`` and ``shared``)."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from ..errors import LockError, LockTimeout
from ..handles import permit_count
from ..keys import KeyLike
from ..lock import Defaults, Options, ReleaseRule, release_failed, seconds
from ..tier1.pollers import shared_holds

if TYPE_CHECKING:
    from ..records import Hold
    from ..tier1.tiers import OnLost
    from .core import Core
    from .exclusive import Exclusive
    from .shared import Shares

__all__ = [
    "AsyncHandle",
    "AsyncLock",
    "AsyncOnLost",
    "AsyncParts",
    "AsyncReadLock",
    "AsyncReleasing",
    "AsyncSemaphore",
]

#: ``on_lost(key, token)``: a plain function, called in a tierlock thread, or a
#: coroutine function, run as a task in the manager's event loop.
AsyncOnLost = Callable[[str, int], Awaitable[None] | None]

H = TypeVar("H", bound="AsyncHandle")


class AsyncParts(Defaults, Protocol):
    """What an async handle reaches in its ``AsyncLockManager`` (typed here, so that the
    handles need not import the manager)."""

    _release_rule: ReleaseRule | None
    _core: Core
    _exclusive: Exclusive
    _shares: Shares

    def _reporter(self, on_lost: Any) -> OnLost | None: ...


class AsyncReleasing(abc.ABC):
    """The end of an ``async with`` block over one key or several, as
    ``tierlock.lock.Releasing``; and a plain ``with``, refused."""

    __slots__ = ()

    @abc.abstractmethod
    async def release(self) -> None: ...

    @abc.abstractmethod
    def _what(self) -> object:
        """What a failed release is logged as: the key, or the keys."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.release()
            return
        try:
            await self.release()
        except LockError as release_error:
            release_failed(self._what(), release_error)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"use 'async with' with tierlock.{type(self).__name__}, not 'with'")

    def __exit__(self, *exc_info: object) -> None:
        return None  # (never reached: __enter__ raises)


class AsyncHandle(Options, AsyncReleasing):
    """What every async handle has: its options and ``async with``."""

    __slots__ = ()
    _manager: AsyncParts

    @abc.abstractmethod
    async def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool: ...

    def _what(self) -> object:
        return self._key

    def _hold_options(self, blocking: bool, timeout: float | None) -> tuple[Any, float | None]:
        """``on_lost`` as tier 1 calls it (in a thread), and the seconds to wait."""
        on_lost, wait = self._options(blocking, timeout)
        self._manager._core.check_process(self._key)
        return self._manager._reporter(on_lost), wait

    async def __aenter__(self: H) -> H:
        if not await self.acquire(timeout=self._timeout):
            raise LockTimeout(self._key, self._timeout or 0.0)
        return self


def _live(hold: Hold | None) -> bool:
    return hold is not None and hold.alive()


class AsyncLock(AsyncHandle):
    """A handle on one key of an :class:`AsyncLockManager`, owned by the asyncio task
    that acquires it::

        async with locks.lock("user:42", timeout=5):
            ...

    Reentrant within a task; another task's ``release()`` raises ``NotHeldError``, and
    child tasks do not inherit holds. Sync and async managers on one table exclude
    each other.
    """

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Acquire the lock, with ``threading.RLock.acquire``'s arguments and rules
        (``timeout=None`` also means no limit); cancelling it leaves nothing held.

        :raises LockError: the manager is closed, or the task holds only the read lock.
        :raises BackendError: the database failed.
        """
        on_lost, wait = self._hold_options(blocking, timeout)
        manager = self._manager
        manager._shares.refuse_upgrade(self._key)
        return await manager._exclusive.acquire(self._key, self.ttl, self.renew, on_lost, wait)

    async def release(self) -> None:
        """Release one level of the calling task's hold; the last passes it on.

        Under a release rule (``tierlock.contrib.sqlalchemy.hold_until_commit``), a
        release made while the task's transaction is in progress takes effect when
        that transaction ends.

        :raises NotHeldError: the calling task does not hold the lock.
        :raises LockLostError: the hold was already gone.
        """
        manager = self._manager
        rule = manager._release_rule
        if rule is not None and rule.defers(self):
            return
        if manager._shares.covered(self._key) and manager._exclusive.depth(self._key) == 1:
            manager._core.counters.add("releases")
            await manager._shares.downgrade(self._key)
            return
        await manager._exclusive.release(self._key)

    async def extend(self, ttl: float | None = None) -> None:
        """Push the calling task's lease to now + ``ttl`` (default: the handle's)."""
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        await self._manager._exclusive.extend(self._key, lease)

    async def locked(self) -> bool:
        """Whether anyone, in any task, thread, process or host, holds the lock."""
        manager = self._manager
        return await manager._core.call(manager._core.backend.is_locked, self._key)

    def owned(self) -> bool:
        """Whether the calling task holds the lock with a lease that surely still runs."""
        return self._manager._exclusive.owned(self._key)

    @property
    def token(self) -> int | None:
        """The fencing token of the calling task's hold, or ``None``."""
        hold = self._manager._exclusive.hold(self._key)
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        return self._repr(self._manager._exclusive.is_held(self._key))


class AsyncReadLock(AsyncHandle):
    """A read hold of a key, shared with every other reader anywhere and excluded by
    its write hold, owned by the asyncio task that acquires it (see ``ReadLock``)."""

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """As :meth:`AsyncLock.acquire`, for a read hold."""
        on_lost, wait = self._hold_options(blocking, timeout)
        return await self._manager._shares.read(self._key, self.ttl, self.renew, on_lost, wait)

    async def release(self) -> None:
        """As :meth:`AsyncLock.release`, for a read hold."""
        await self._manager._shares.unread(self._key)

    async def extend(self, ttl: float | None = None) -> None:
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        await self._manager._shares.extend(self._key, lease)

    async def locked(self) -> bool:
        """Whether a read hold would have to wait now: a writer holds the key or waits."""
        core = self._manager._core
        return await core.call(shared_holds(core.backend, self._key).read_blocked, self._key)

    def owned(self) -> bool:
        shares = self._manager._shares
        if shares.covered(self._key):
            return self._manager._exclusive.owned(self._key)
        return shares.reading(self._key) and _live(shares.latest(self._key))

    @property
    def token(self) -> int | None:
        """The fencing token of the task's read hold, or of the write hold covering it."""
        shares = self._manager._shares
        if shares.covered(self._key):
            hold = self._manager._exclusive.hold(self._key)
        else:
            hold = shares.latest(self._key)
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        return self._repr(self._manager._shares.reading(self._key))


class AsyncSemaphore(AsyncHandle):
    """At most ``permits`` holds of a key at once, anywhere; each task's permits are
    its own (see ``Semaphore``)."""

    __slots__ = ("_permits",)

    def __init__(
        self,
        manager: AsyncParts,
        key: KeyLike,
        permits: int,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> None:
        super().__init__(manager, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)
        self._permits = permit_count(permits)

    @property
    def permits(self) -> int:
        return self._permits

    async def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Take one more permit (``threading.Semaphore.acquire``'s rules).

        :raises ValueError: holders of the key count another number of permits.
        """
        on_lost, wait = self._hold_options(blocking, timeout)
        shares = self._manager._shares
        return await shares.take_permit(
            self._key, self._permits, self.ttl, self.renew, on_lost, wait
        )

    async def release(self) -> None:
        """Return the latest permit the calling task took."""
        await self._manager._shares.give_permit(self._key)

    async def extend(self, ttl: float | None = None) -> None:
        """Push the lease of every permit the calling task holds to now + ``ttl``."""
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        await self._manager._shares.extend(self._key, lease, permits=True)

    async def locked(self) -> bool:
        """Whether an acquire would have to wait now: every permit is held."""
        core = self._manager._core
        shared = shared_holds(core.backend, self._key)
        return await core.call(shared.permits_taken, self._key) >= self._permits

    def owned(self) -> bool:
        return _live(self._manager._shares.latest(self._key, permits=True))

    @property
    def token(self) -> int | None:
        hold = self._manager._shares.latest(self._key, permits=True)
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        held = self._manager._shares.latest(self._key, permits=True) is not None
        return self._repr(held)[:-1] + f" permits={self._permits}>"
