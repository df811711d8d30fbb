"""The handles on shared holds: ``ReadLock`` (tier 1 in ``reading``) and ``Semaphore``
(tier 1 in ``permits``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .keys import KeyLike
from .lock import Handle, Parts, seconds
from .tier1.pollers import shared_holds

if TYPE_CHECKING:
    from .tier1.tiers import OnLost

__all__ = ["MOST_PERMITS", "ReadLock", "Semaphore", "permit_count"]

# The most permits a semaphore may have.
MOST_PERMITS = 10_000


def permit_count(permits: object) -> int:
    """``permits`` checked as a semaphore's number of permits."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if not 1 <= permits <= MOST_PERMITS:
        raise ValueError(f"permits must be between 1 and {MOST_PERMITS}, got {permits}")
    return permits


class ReadLock(Handle):
    """A read hold of a key, shared with every other reader of it in any thread, process
    or host, and excluded by the write hold (``locks.lock(key)``)::

        with locks.read_lock("doc:9"):
            ...                         # no writer of doc:9 anywhere meanwhile

    Reentrant per thread. A writer that waits keeps out readers that come after it.
    A thread that holds the write hold may also take the read hold (each released
    separately, in either order); one that holds only the read hold cannot take the
    write hold (``LockError``).
    """

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """As :meth:`Lock.acquire`, for a read hold."""
        on_lost, wait = self._options(blocking, timeout)
        readers = self._manager._reads
        return readers.acquire(self._key, self.ttl, self.renew, on_lost, wait)

    def release(self) -> None:
        """As :meth:`Lock.release`; the last reader of the process releases its hold."""
        self._manager._reads.release(self._key)

    def extend(self, ttl: float | None = None) -> None:
        """As :meth:`Lock.extend`, for the process's read hold."""
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        self._manager._reads.extend(self._key, lease)

    def locked(self) -> bool:
        """Whether a read hold would have to wait now: a writer holds the key or waits
        for it."""
        return shared_holds(self._manager._backend, self._key).read_blocked(self._key)

    def owned(self) -> bool:
        """Whether the calling thread holds a read hold whose lease surely still runs."""
        return self._manager._reads.owned(self._key)

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's read hold (its process's), or of its
        write hold if that covers it; ``None`` without one."""
        return self._manager._reads.token(self._key)

    def __repr__(self) -> str:
        return self._repr(self._manager._reads.is_held(self._key))


class Semaphore(Handle):
    """At most ``permits`` holds of a key at once, across every thread, process and
    host::

        with locks.semaphore("quota:payments", permits=5):
            ...                         # at most 5 of these run anywhere at once

    Each ``acquire`` takes one more permit, also in a thread that holds some already;
    ``release`` returns the latest permit the calling thread took (like
    ``threading.BoundedSemaphore``, but a thread cannot release another's permit).
    Every handle on one key must agree on ``permits``.
    """

    __slots__ = ("_permits",)

    def __init__(
        self,
        manager: Parts,
        key: KeyLike,
        permits: int,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> None:
        super().__init__(manager, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)
        self._permits = permit_count(permits)

    @property
    def permits(self) -> int:
        return self._permits

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Take one more permit, with ``threading.Semaphore.acquire``'s arguments and
        rules (``timeout=None`` also means no limit).

        :raises ValueError: holders of the key count another number of permits.
        """
        on_lost, wait = self._options(blocking, timeout)
        permits = self._manager._permits
        return permits.acquire(self._key, self._permits, self.ttl, self.renew, on_lost, wait)

    def release(self) -> None:
        """Return the latest permit the calling thread took.

        :raises NotHeldError: the calling thread holds no permit of the key.
        :raises LockLostError: that permit was lost (it is returned all the same).
        """
        self._manager._permits.release(self._key)

    def extend(self, ttl: float | None = None) -> None:
        """Push the lease of every permit the calling thread holds to now + ``ttl``."""
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        self._manager._permits.extend(self._key, lease)

    def locked(self) -> bool:
        """Whether an acquire would have to wait now: every permit is held."""
        shared = shared_holds(self._manager._backend, self._key)
        return shared.permits_taken(self._key) >= self._permits

    def owned(self) -> bool:
        """Whether the calling thread holds a permit whose lease surely still runs."""
        hold = self._manager._permits.latest(self._key)
        return hold is not None and hold.alive()

    @property
    def token(self) -> int | None:
        """The fencing token of the latest permit the calling thread took, or ``None``."""
        hold = self._manager._permits.latest(self._key)
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        held = self._manager._permits.count(self._key)
        return self._repr(held > 0)[:-1] + f" permits={self._permits}>"
