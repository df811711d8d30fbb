"""``AsyncMultiLock``: several keys of an ``AsyncLockManager`` held as one, all or
nothing, by a task (the order, the deadline and the errors as in ``tierlock.multi``).

A cancelled acquire releases the keys it had taken before the ``CancelledError``
leaves it; a release that is cancelled on one key still goes on to the others (an
``AsyncLock`` lets go of its hold before its first ``await``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from ..errors import LockError, LockTimeout
from ..keys import KeyLike
from ..multi import KeySet, deadline_of, remaining, sorted_keys, to_raise
from .handles import AsyncLock, AsyncOnLost, AsyncReleasing

__all__ = ["AsyncMultiLock", "async_multi_lock"]

logger = logging.getLogger(__name__)


async def _release_all(locks: Sequence[AsyncLock]) -> None:
    """Release one level of each of ``locks``, the last first; every one is released
    even when another's release fails or is cancelled, then the most telling error
    is raised."""
    errors: list[BaseException] = []
    for lock in reversed(locks):
        try:
            await lock.release()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise to_raise(errors)


async def _give_back(taken: Sequence[AsyncLock]) -> None:
    """Release what a failed acquire of a set had taken; a failure is only logged."""
    try:
        await _release_all(taken)
    except LockError as exc:
        logger.warning("releasing the keys taken before a set's acquire failed: %s", exc)


class AsyncMultiLock(KeySet[AsyncLock], AsyncReleasing):
    """Several keys of an :class:`AsyncLockManager` held as one by the calling task:
    made by ``locks.lock_all(keys)``, it takes every key or none::

        async with locks.lock_all([("user", source), ("user", target)], timeout=5):
            ...

    As :class:`tierlock.MultiLock`, with tasks instead of threads; cancelling an
    acquire leaves none of the keys held.
    """

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Take every key, with ``AsyncLock.acquire``'s arguments and rules; ``timeout``
        is for the whole set.

        :returns: whether the set is now held; if not, none of its keys was taken.
        """
        return await self._take(deadline_of(blocking, timeout)) is None

    async def _take(self, deadline: float | None) -> str | None:
        """Take every key by ``deadline``; return the key that could not be had in
        time (having released the others), or ``None``."""
        taken: list[AsyncLock] = []
        missed = None
        try:
            for lock in self._locks:
                if not await lock.acquire(timeout=remaining(deadline)):
                    missed = lock.key
                    break
                taken.append(lock)
        except BaseException:
            await _give_back(taken)
            raise
        if missed is not None:
            await _give_back(taken)
        return missed

    async def release(self) -> None:
        """Release one level of each key, the last taken first; as
        ``MultiLock.release``."""
        await _release_all(self._locks)

    async def locked(self) -> bool:
        """Whether any of the keys is held by anyone, anywhere."""
        for lock in self._locks:
            if await lock.locked():
                return True
        return False

    async def __aenter__(self) -> AsyncMultiLock:
        missed = await self._take(deadline_of(True, self._timeout))
        if missed is not None:
            raise LockTimeout(missed, self._timeout or 0.0)
        return self

    def __repr__(self) -> str:
        # From tier 1 alone: a repr must not query the database.
        held = all(lock._manager._exclusive.is_held(lock.key) for lock in self._locks)
        state = "locked" if held else "unlocked"
        return f"<{state} tierlock.aio.AsyncMultiLock object keys={self.keys!r} at {id(self):#x}>"


def async_multi_lock(
    lock: Callable[..., AsyncLock],
    keys: Iterable[KeyLike],
    *,
    ttl: float | None,
    timeout: float | None,
    renew: bool | None,
    on_lost: AsyncOnLost | None,
) -> AsyncMultiLock:
    """``lock_all`` over the handles that ``lock(key, ttl=..., ...)`` makes; see
    ``AsyncLockManager.lock_all``."""
    options = {"ttl": ttl, "timeout": timeout, "renew": renew, "on_lost": on_lost}
    locks = [lock(key, **options) for key in sorted_keys(keys)]
    return AsyncMultiLock(locks, None if timeout is None else float(timeout))
