"""``MultiLock``: several keys of a ``LockManager`` held as one, all or nothing.

The keys are taken one by one in a single global order (sorted by key string), so
two callers that want overlapping sets never each hold a key the other waits for:
the idea of Redisson's ``RedissonMultiLock`` and Curator's ``InterProcessMultiLock``.
A timeline of what the order prevents::

    thread 1: lock_all(["user:1", "user:2"])   takes user:1, waits for user:2
    thread 2: lock_all(["user:2", "user:1"])   waits for user:1 (sorted first), holds nothing

What the set needs of its keys it gets through their handles' ``acquire`` and
``release``, so a handle with a release rule of its own (Django's ``TransactionLock``,
or a manager's ``hold_until_commit`` rule) keeps it. The helpers here serve
``tierlock.aio.multi`` too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from .errors import LockError, LockLostError, LockTimeout
from .keys import KeyLike, make_key
from .lock import Lock, Releasing, _wait_time

if TYPE_CHECKING:
    from .tier1.tiers import OnLost

__all__ = [
    "KeySet",
    "MultiLock",
    "deadline_of",
    "multi_lock",
    "remaining",
    "sorted_keys",
    "to_raise",
]

logger = logging.getLogger(__name__)


def sorted_keys(keys: Iterable[KeyLike]) -> list[str]:
    """``keys`` checked as ``lock()`` checks a key, duplicates folded, in the order
    every set takes them.

    :raises TypeError: ``keys`` is one key, not an iterable of them, or a key is bad.
    :raises ValueError: there are no keys, or a key is bad.
    """
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"lock_all() takes an iterable of keys, not one key {keys!r}: "
            "write lock_all([key, ...]), or lock(key) for one key"
        )
    try:
        given = list(keys)
    except TypeError:
        raise TypeError(
            f"lock_all() takes an iterable of keys, not {type(keys).__name__}"
        ) from None
    if not given:
        raise ValueError("lock_all() needs at least one key")
    return sorted({make_key(key) for key in given})


def deadline_of(blocking: bool, timeout: float | None) -> float | None:
    """The ``time.monotonic()`` by which a set's acquire gives up (``None``: never),
    from ``Lock.acquire``'s arguments, checked by its rules."""
    wait = _wait_time(blocking, timeout)
    return None if wait is None else time.monotonic() + wait


def remaining(deadline: float | None) -> float:
    """The ``timeout`` argument for the next key's acquire: what is left of the set's
    one deadline (``-1``: no limit; ``0``: one try without waiting)."""
    return -1 if deadline is None else max(0.0, deadline - time.monotonic())


def to_raise(errors: Sequence[BaseException]) -> BaseException:
    """Of the errors a set's keys raised on release, the one to raise; the others are
    logged. An interrupt (KeyboardInterrupt, cancellation) first, then a lost hold."""
    chosen = next(
        (error for error in errors if not isinstance(error, Exception)),
        next((error for error in errors if isinstance(error, LockLostError)), errors[0]),
    )
    for error in errors:
        if error is not chosen:
            logger.warning("releasing %r of a set of keys failed: %s", _key_of(error), error)
    return chosen


def _key_of(error: BaseException) -> str | None:
    return error.key if isinstance(error, LockError) else None


def _release_all(locks: Sequence[Lock]) -> None:
    """Release one level of each of ``locks``, the last first; every one is released
    even when another's release fails, and then the most telling error is raised."""
    errors: list[BaseException] = []
    for lock in reversed(locks):
        try:
            lock.release()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise to_raise(errors)


def _give_back(taken: Sequence[Lock]) -> None:
    """Release what a failed acquire of a set had taken; a failure is only logged, as
    the caller learns of the acquire's own outcome."""
    try:
        _release_all(taken)
    except LockError as exc:
        logger.warning("releasing the keys taken before a set's acquire failed: %s", exc)


class KeyHandle(Protocol):
    """What a set needs of the handle of each of its keys, sync or async."""

    @property
    def key(self) -> str: ...

    @property
    def token(self) -> int | None: ...

    def owned(self) -> bool: ...


K = TypeVar("K", bound=KeyHandle)


class KeySet(Generic[K]):
    """The handles of a set's keys, in the order they are taken, and what is read
    from them alone; ``MultiLock`` and ``tierlock.aio.AsyncMultiLock`` take and
    release them."""

    __slots__ = ("__weakref__", "_locks", "_timeout")

    def __init__(self, locks: Sequence[K], timeout: float | None) -> None:
        self._locks = tuple(locks)
        self._timeout = timeout

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys, in the order they are taken."""
        return tuple(lock.key for lock in self._locks)

    @property
    def locks(self) -> tuple[K, ...]:
        """The handle of each key, in the order they are taken (to ``extend()`` one)."""
        return self._locks

    def owned(self) -> bool:
        """Whether the caller (thread, or task) holds every key (see ``Lock.owned``)."""
        return all(lock.owned() for lock in self._locks)

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each key the caller holds, by key."""
        tokens = {lock.key: lock.token for lock in self._locks}
        return {key: token for key, token in tokens.items() if token is not None}

    def _what(self) -> object:
        return self.keys


class MultiLock(KeySet[Lock], Releasing):
    """Several keys of a :class:`LockManager` held as one: made by
    ``locks.lock_all(keys)``, it takes every key or none::

        with locks.lock_all([("user", source), ("user", target)], timeout=5) as held:
            ...                          # held.tokens fence writes made here

    The keys are taken in one global order (sorted by key string), so two sets never
    deadlock, within one deadline for the whole set. If an acquire fails part of the
    way (the deadline, an error, an interrupt), the keys already taken are released
    before it returns or raises. What a thread holds is tracked per key, as for
    :class:`Lock`: a thread that holds the set may acquire it again, and each of its
    keys is then held one level deeper and must be released as many times.

    A thread that holds some other key while it takes a set takes keys out of that
    order; only sets taken with nothing else held are safe from deadlock.
    """

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Take every key, with ``Lock.acquire``'s arguments and rules; ``timeout`` is
        for the whole set.

        :returns: whether the set is now held; if not, none of its keys was taken.
        :raises LockError: as ``Lock.acquire``; what was taken is released first.
        """
        return self._take(deadline_of(blocking, timeout)) is None

    def _take(self, deadline: float | None) -> str | None:
        """Take every key by ``deadline``; return the key that could not be had in
        time (having released the others), or ``None``."""
        taken: list[Lock] = []
        missed = None
        try:
            for lock in self._locks:
                held_before = lock.token is not None
                try:
                    got = lock.acquire(timeout=remaining(deadline))
                except BaseException:
                    # An interrupt can land just after the acquire took the key.
                    if not held_before and lock.token is not None:
                        taken.append(lock)
                    raise
                if not got:
                    missed = lock.key
                    break
                taken.append(lock)
        except BaseException:
            _give_back(taken)
            raise
        if missed is not None:
            _give_back(taken)
        return missed

    def release(self) -> None:
        """Release one level of each key, the last taken first.

        Every key is released even if the release of another fails; then the error is
        raised: ``LockLostError`` if any hold was lost, else the first one.

        :raises NotHeldError: the calling thread does not hold the keys.
        :raises LockLostError: a key's hold was already gone.
        """
        _release_all(self._locks)

    def locked(self) -> bool:
        """Whether any of the keys is held by anyone, anywhere (one query per key, up to
        the first that is held)."""
        return any(lock.locked() for lock in self._locks)

    def __enter__(self) -> MultiLock:
        missed = self._take(deadline_of(True, self._timeout))
        if missed is not None:
            raise LockTimeout(missed, self._timeout or 0.0)
        return self

    def __repr__(self) -> str:
        # From tier 1 alone, as Lock's: a repr must not query the database.
        held = all(lock._manager._tiers.registry.is_held(lock.key) for lock in self._locks)
        state = "locked" if held else "unlocked"
        return f"<{state} tierlock.MultiLock object keys={self.keys!r} at {id(self):#x}>"


def multi_lock(
    lock: Callable[..., Lock],
    keys: Iterable[KeyLike],
    *,
    ttl: float | None,
    timeout: float | None,
    renew: bool | None,
    on_lost: OnLost | None,
) -> MultiLock:
    """``lock_all`` over the handles that ``lock(key, ttl=..., ...)`` makes (a manager's
    ``lock``, or an integration's); see ``LockManager.lock_all``."""
    options = {"ttl": ttl, "timeout": timeout, "renew": renew, "on_lost": on_lost}
    # Each handle checks the options, timeout included, as lock() does.
    locks = [lock(key, **options) for key in sorted_keys(keys)]
    return MultiLock(locks, None if timeout is None else float(timeout))
