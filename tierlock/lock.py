"""``Lock``, the handle on one key, and the checks of the times it is given."""

from __future__ import annotations

import abc
import logging
import math
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import LockError, LockTimeout
from .keys import KeyLike, make_key

if TYPE_CHECKING:
    from .backends import LockBackend
    from .tier1.permits import Permits
    from .tier1.reading import Readers
    from .tier1.tiers import OnLost, Tiers

__all__ = [
    "Defaults",
    "Handle",
    "Lock",
    "Options",
    "Parts",
    "ReleaseRule",
    "Releasing",
    "callback",
    "flag",
    "release_failed",
    "seconds",
]

logger = logging.getLogger(__name__)

H = TypeVar("H", bound="Handle")


def seconds(name: str, value: object, *, none_ok: bool = False, zero_ok: bool = False) -> Any:
    """``value`` checked as a number of seconds, for option ``name``."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if math.isnan(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "non-negative" if zero_ok else "positive"
        raise ValueError(f"{name} must be a {bound} number of seconds, got {value!r}")
    return float(value)


def flag(name: str, value: object, *, none_ok: bool = False) -> Any:
    """``value`` checked as a switch, for option ``name``."""
    if (value is None and none_ok) or isinstance(value, bool):
        return value
    allowed = "True, False or None" if none_ok else "True or False"
    raise TypeError(f"{name} must be {allowed}, not {type(value).__name__}")


def callback(name: str, value: object) -> Any:
    """``value`` checked as a callable or ``None``, for option ``name``."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable or None, not {type(value).__name__}")
    return value


def _wait_time(blocking: bool, timeout: float | None) -> float | None:
    """threading.RLock.acquire's rules, with ``None`` also meaning "forever".

    Returns the seconds to wait: ``None`` for no limit, ``0.0`` for no wait. Checked
    before anything happens, as threading does.
    """
    if timeout is None or (blocking and timeout == -1):
        return None if blocking else 0.0
    _check_representable(timeout)
    if not blocking:
        if timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return 0.0
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout < 0:
        raise ValueError("timeout value must be a non-negative number (or -1 for no limit)")
    limit: float = seconds("timeout", timeout, zero_ok=True)
    return limit


def _check_representable(timeout: object) -> None:
    """threading refuses a timeout above ``threading.TIMEOUT_MAX`` (infinity included)."""
    if (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and timeout > threading.TIMEOUT_MAX
    ):
        raise OverflowError("timeout value is too large")


#: ``on_lost`` as handles take it: a function, or (async handles) a coroutine function.
Reporter = Callable[[str, int], object]


class Defaults(Protocol):
    """What a handle takes from its manager when it does not say."""

    ttl: float
    renew: bool
    on_lost: OnLost | None


class ReleaseRule(Protocol):
    """What may put off the release of a manager's locks: its ``_release_rule``, set by
    ``tierlock.contrib.sqlalchemy.hold_until_commit`` (``None``: releases are at once)."""

    def defers(self, handle: Any) -> bool:
        """Whether ``handle``'s release, asked for now by its holder, waits: if so, the
        rule has kept it, to release it again when the holder's transaction ends."""


class Parts(Defaults, Protocol):
    """What a handle reaches in its ``LockManager``: tier 1 of each kind of hold, the
    backend and the release rule (typed here, so that the handles need not import the
    manager)."""

    _release_rule: ReleaseRule | None
    _tiers: Tiers
    _reads: Readers
    _permits: Permits
    _backend: LockBackend


class Options:
    """What every handle on a key has, sync or async: its options, and the checks of
    the arguments of ``acquire``."""

    __slots__ = ("__weakref__", "_key", "_manager", "_on_lost", "_renew", "_timeout", "_ttl")

    def __init__(
        self,
        manager: Defaults,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: Reporter | None = None,
    ) -> None:
        self._manager = manager
        self._key = make_key(key)
        self._ttl: float | None = seconds("ttl", ttl, none_ok=True)
        _check_representable(timeout)
        self._timeout: float | None = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        self._renew: bool | None = flag("renew", renew, none_ok=True)
        self._on_lost: OnLost | None = callback("on_lost", on_lost)

    @property
    def key(self) -> str:
        return self._key

    @property
    def ttl(self) -> float:
        """The lease of each hold taken through this handle, in seconds."""
        return self._manager.ttl if self._ttl is None else self._ttl

    @property
    def renew(self) -> bool:
        """Whether the holds taken through this handle have their leases renewed."""
        return self._manager.renew if self._renew is None else self._renew

    def _options(self, blocking: bool, timeout: float | None) -> tuple[OnLost | None, float | None]:
        """``on_lost`` for a hold taken now, and the seconds ``acquire`` may wait."""
        wait = _wait_time(blocking, timeout)
        return self._manager.on_lost if self._on_lost is None else self._on_lost, wait

    def _repr(self, held: bool) -> str:
        # From tier 1 alone: a repr must not query the database.
        state = "locked" if held else "unlocked"
        name = type(self).__name__
        return f"<{state} tierlock.{name} object key={self._key!r} at {id(self):#x}>"


def release_failed(what: object, error: LockError) -> None:
    """Log the failed release at the end of a ``with`` block whose body raised: the
    body's exception, not the release's, is the one to see."""
    logger.warning("releasing %r after an exception failed: %s", what, error)


class Releasing(abc.ABC):
    """The end of a ``with`` block over one key or several (see ``release_failed``)."""

    __slots__ = ()

    @abc.abstractmethod
    def release(self) -> None: ...

    @abc.abstractmethod
    def _what(self) -> object:
        """What a failed release is logged as: the key, or the keys."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except LockError as release_error:
            release_failed(self._what(), release_error)


class Handle(Options, Releasing):
    """A handle of a ``LockManager``: ``with``, and the kinds of hold as subclasses."""

    __slots__ = ()
    _manager: Parts

    @abc.abstractmethod
    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool: ...

    def _what(self) -> object:
        return self._key

    def __enter__(self: H) -> H:
        if not self.acquire(timeout=self._timeout):
            raise LockTimeout(self._key, self._timeout or 0.0)
        return self


class Lock(Handle):
    """A handle on one key of a :class:`LockManager`; cheap, and may be shared by threads.

    It behaves like ``threading.RLock`` across threads, processes and hosts::

        lock = locks.lock("user:42")
        if lock.acquire(timeout=2):
            try:
                ...                      # lock.token fences writes made here
            finally:
                lock.release()

    What a thread holds is tracked per manager and key, not per handle: two handles
    on the same key are one lock.
    """

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Acquire the lock, with ``threading.RLock.acquire``'s arguments and rules.

        ``timeout=None`` also means no limit. Reentrant: a thread that holds the lock
        gets it again at once, and must release it as many times.

        :returns: whether the lock is now held.
        :raises OverflowError: ``timeout`` is above ``threading.TIMEOUT_MAX``.
        :raises LockError: the manager is closed, or the calling thread runs an asyncio
            event loop (whose coroutines would all share its hold).
        :raises BackendError: the database failed.
        """
        on_lost, wait = self._options(blocking, timeout)
        manager = self._manager
        manager._reads.refuse_upgrade(self._key)
        return manager._tiers.acquire(self._key, self.ttl, self.renew, on_lost, wait)

    def release(self) -> None:
        """Release one level of the calling thread's hold; the last deletes the row.

        Under a release rule (``tierlock.contrib.sqlalchemy.hold_until_commit``), a
        release made while the thread's transaction is in progress takes effect when
        that transaction ends.

        :raises NotHeldError: the calling thread does not hold the lock.
        :raises LockLostError: the hold was already gone (its lease ran out and it was
            reaped or taken over, or it was force-released). The lock is released
            locally all the same.
        """
        manager = self._manager
        rule = manager._release_rule
        if rule is not None and rule.defers(self):
            return
        if not manager._reads.downgrade(self._key):
            manager._tiers.release(self._key)

    def extend(self, ttl: float | None = None) -> None:
        """Push the calling thread's lease to now + ``ttl`` by the database's clock.

        :param ttl: seconds; default the handle's ttl.
        :raises NotHeldError: the calling thread does not hold the lock.
        :raises LockLostError: the hold was already gone.
        """
        lease = self.ttl if ttl is None else seconds("ttl", ttl)
        self._manager._tiers.extend(self._key, lease)

    def locked(self) -> bool:
        """Whether anyone, in any thread, process or host, holds an unexpired lease.

        A row this process keeps for a moment after a release, for its own threads,
        does not count: any of them may take it at once."""
        if self._manager._tiers.registry.is_kept(self._key):
            return False
        return self._manager._backend.is_locked(self._key)

    def owned(self) -> bool:
        """Whether the calling thread holds the lock with a lease that surely still runs:
        ``False`` once the hold is lost, and while the manager cannot confirm that its
        lease was renewed in time (a process stopped, or a database out of reach)."""
        return self._manager._tiers.owned(self._key)

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's hold, or ``None``.

        Tokens strictly increase across successive holds of a key; storage that
        remembers the highest token it accepted can reject a stale holder's writes.
        """
        return self._manager._tiers.token(self._key)

    def __repr__(self) -> str:
        return self._repr(self._manager._tiers.registry.is_held(self._key))
