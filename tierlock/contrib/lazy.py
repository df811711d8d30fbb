"""A ``LockManager`` that a framework's integration makes on first use, not at import.

Making a manager connects to the database (and checks or creates the table), so an app
that made it at start-up would not start while its database is down, and a module that
decorates functions at import would connect at import. :class:`LazyLockManager` has
the manager's API and makes the manager at the first call that needs it; threads that
need it at once wait for one making. An integration says what to make
(:meth:`LazyLockManager._make`) and, if its settings can change while the process runs
(Django's test runner renames the database), what the manager is made for
(:meth:`LazyLockManager._wanted`): when that changes, a new manager is made and the
old one closed. A forked child starts afresh, as every manager does.
"""

from __future__ import annotations

import abc
import atexit
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar, cast

from ..errors import LockError
from ..handles import ReadLock, Semaphore
from ..keys import KeyLike
from ..lock import Lock
from ..manager import LockManager
from ..multi import MultiLock, multi_lock
from ..records import LockInfo
from ..stats import LockStats
from ..tier1.tiers import OnLost

__all__ = ["LazyLockManager"]

F = TypeVar("F", bound=Callable[..., Any])

_lazy_managers: weakref.WeakSet[LazyLockManager] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A thread of the parent may have been making a manager at the fork: its lock
    # would stay taken in the child, where that thread does not exist.
    for lazy in list(_lazy_managers):
        lazy._making = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class LazyLockManager(abc.ABC):
    """The manager's API over a manager made at first use; ``manager`` is the manager
    itself, for APIs that take one. Closed at interpreter exit."""

    def __init__(self) -> None:
        self._making = threading.Lock()
        self._made: tuple[Hashable, LockManager] | None = None  # (what for, the manager)
        self._closed = False
        _lazy_managers.add(self)
        atexit.register(self.close)

    @abc.abstractmethod
    def _make(self) -> LockManager:
        """A new manager for the settings as they are now (called under a lock)."""

    def _wanted(self) -> Hashable:
        """What the manager is made for, cheap to read at every use: when it changes,
        the manager is made again. By default the settings never change."""
        return None

    @property
    def manager(self) -> LockManager:
        """The manager, made now if need be.

        :raises BackendError: the database cannot be reached or the table not made.
        :raises LockError: closed.
        """
        wanted = self._wanted()
        made = self._made
        if made is not None and made[0] == wanted:
            return made[1]
        with self._making:
            if self._closed:
                raise LockError(f"{self!r} is closed")
            made = self._made
            if made is not None and made[0] == wanted:
                return made[1]
            manager = self._make()
            self._made = (wanted, manager)
        if made is not None and made[1] is not manager:
            made[1].close()
        return manager

    @property
    def made(self) -> LockManager | None:
        """The manager if one was made, without making one."""
        made = self._made
        return None if made is None else made[1]

    def reset(self) -> None:
        """Close the manager if one was made; the next use makes a new one."""
        with self._making:
            made, self._made = self._made, None
        if made is not None:
            made[1].close()

    def close(self) -> None:
        """Close the manager if one was made; from now on every use raises
        ``LockError``, as a closed manager's do. Closing again does nothing."""
        atexit.unregister(self.close)
        with self._making:
            self._closed = True
        self.reset()

    def __enter__(self) -> LazyLockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:  # (a repr neither reads settings nor connects)
        made = self.made
        state = "closed" if self._closed else repr(made) if made else "not made yet"
        return f"<{type(self).__module__}.{type(self).__qualname__}: {state}>"

    # -- LockManager's API, each call making the manager if need be ------------------

    def lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Lock:
        """``LockManager.lock``."""
        return self.manager.lock(key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def lock_all(
        self,
        keys: Iterable[KeyLike],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> MultiLock:
        """``LockManager.lock_all`` over this object's ``lock()``, so that the set's
        keys follow the integration's own release rule."""
        return multi_lock(self.lock, keys, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def write_lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Lock:
        """``LockManager.write_lock``: this object's ``lock()``."""
        return self.lock(key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def read_lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> ReadLock:
        """``LockManager.read_lock``."""
        return self.manager.read_lock(key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def semaphore(
        self,
        key: KeyLike,
        permits: int,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Semaphore:
        """``LockManager.semaphore``."""
        manager = self.manager
        return manager.semaphore(
            key, permits, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost
        )

    def synchronized(
        self,
        key: str,
        *keys: str,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Callable[[F], F]:
        """``LockManager.synchronized`` over this object's ``lock()``: decorating checks
        the templates and the function's parameters but makes nothing; each call does."""
        return synchronized_by(
            self, key, *keys, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost
        )

    def info(self, key: KeyLike) -> LockInfo | None:
        return self.manager.info(key)

    def holders(self) -> list[LockInfo]:
        return self.manager.holders()

    def force_release(self, key: KeyLike) -> bool:
        return self.manager.force_release(key)

    def reap(self) -> int:
        return self.manager.reap()

    def stats(self) -> LockStats:
        return self.manager.stats()

    def start_reaper(self, interval: float) -> None:
        self.manager.start_reaper(interval)

    def stop_reaper(self) -> None:
        self.manager.stop_reaper()

    @property
    def reaper_running(self) -> bool:
        return self.manager.reaper_running

    @property
    def url(self) -> str:
        return self.manager.url

    @property
    def table(self) -> str:
        return self.manager.table

    @property
    def ttl(self) -> float:
        return self.manager.ttl

    @property
    def renew(self) -> bool:
        return self.manager.renew

    @property
    def on_lost(self) -> OnLost | None:
        return self.manager.on_lost

    @property
    def poll_interval(self) -> float:
        return self.manager.poll_interval


def synchronized_by(owner: object, key: str, *keys: str, **options: Any) -> Callable[[F], F]:
    """``LockManager.synchronized`` over ``owner.lock``, which finds the manager at each
    call: the templates and the function are checked now, and nothing connects."""
    # The decorator touches its manager only through lock(), which ``owner`` has.
    return LockManager.synchronized(cast(LockManager, owner), key, *keys, **options)
