"""``LockManager``: one process's locks on one table, and the admin calls on it; the
two tiers themselves are in ``tiers``."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .base import (
    DEFAULT_DATABASE_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REAPER_INTERVAL,
    DEFAULT_TABLE,
    DEFAULT_TTL,
    ManagerBase,
)
from .handles import ReadLock, Semaphore
from .keys import KeyLike, KeyTemplate, make_key
from .lock import Lock, seconds
from .multi import MultiLock, multi_lock
from .records import LockInfo
from .tier1.permits import Permits
from .tier1.reading import Readers
from .tier1.tiers import OnLost, Tiers

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["LockManager"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class LockManager(ManagerBase):
    """Distributed locks kept in a database table (or on Redis, or ZooKeeper), with a
    per-process first tier.

    ::

        locks = tierlock.LockManager("postgresql+psycopg://postgres@127.0.0.1/test")
        with locks.lock(("user", 42)):          # blocks until held
            ...
        with locks.lock("order:7", ttl=10, timeout=5):
            ...                                 # LockTimeout after 5 s of waiting

        with locks.lock_all([("user", 1), ("user", 2)], timeout=5):
            ...                                 # both keys, or LockTimeout and neither

        @locks.synchronized("user:{source}", "user:{target}")
        def transfer(source: int, target: int, amount: int) -> None: ...

    :param url: a SQLAlchemy database URL, ``redis://``/``rediss://host:port/db`` or
        ``zookeeper://host:port[,host:port]/chroot``; ``sqlite:///tierlock.db`` if neither
        it nor ``engine`` is given. Engines made from a URL run in autocommit mode.
    :param engine: a ready SQLAlchemy ``Engine`` to use instead of ``url`` (for an
        ``AsyncEngine``, its ``sync_engine``); not an in-memory SQLite one.
    :param table: the lock table's name, a plain identifier (on Redis, the key
        prefix; on ZooKeeper, the node under the chroot).
    :param ttl: the default lease of a hold, in seconds (see ``renew``; on ZooKeeper,
        the session's timeout, which the server keeps within its own bounds).
    :param renew: keep every hold's lease alive for as long as the hold lasts: one
        heartbeat renews all of the manager's holds at least every ``ttl / 3`` seconds,
        so a hold is lost only if its process dies, stops, or cannot reach the database
        for about ``ttl``; holds pass between the manager's threads with no statement.
        ``False``: a hold's lease ends ``ttl`` after its acquire unless ``extend()``-ed.
    :param on_lost: ``on_lost(key, token)``, called once, in a tierlock thread, when
        the manager learns that a hold was lost: at the moment its lease runs out with
        no renewal, hand-off or extend having confirmed it (fixed leases too), or when
        one of those finds its row gone; it must not block, and what it raises is logged.
    :param create_table: create the table if it does not exist.
    :param reaper_interval: seconds between passes of the background job that deletes
        expired rows (default 60); ``None`` does not start it.
    :param poll_interval: the longest pause between two tries at a key held by
        another process.
    :param database_timeout: seconds one operation may spend failing to reach the
        database (refused, dropped or silent connections, retried) before it raises
        ``BackendError``; it also sets the driver's connect and read timeouts on
        engines made from a URL. A try already under way when it runs out may take
        up to half as long again.
    Its ``url`` (any password hidden) and ``table`` say where its locks live.

    :raises ValueError: a bad option; the message names it.
    :raises TypeError: an option of the wrong type; the message names it.
    :raises BackendError: the table could not be created within ``database_timeout``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        table: str = DEFAULT_TABLE,
        ttl: float = DEFAULT_TTL,
        renew: bool = True,
        on_lost: OnLost | None = None,
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
            on_lost=on_lost,
            create_table=create_table,
            reaper_interval=reaper_interval,
            poll_interval=poll_interval,
            database_timeout=database_timeout,
        )
        self._tiers = Tiers(
            self._backend, self._counters, poll_interval=self.poll_interval, idle=self.ttl / 3
        )
        self._reads = Readers(self._tiers)
        self._permits = Permits(self._tiers)
        self._start_reaper()

    # -- handles ---------------------------------------------------------------

    def lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Lock:
        """A handle on ``key``; see :class:`Lock`.

        :param ttl: this handle's lease in seconds (default: the manager's).
        :param timeout: how long ``with`` waits before raising ``LockTimeout``
            (default: no limit). ``acquire()`` keeps threading's defaults.
        :param renew: whether its holds' leases are renewed (default: the manager's).
        :param on_lost: called instead of the manager's ``on_lost`` for its holds.
        :raises LockError: the manager is closed.
        """
        self._tiers.check_open()
        return Lock(self, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def lock_all(
        self,
        keys: Iterable[KeyLike],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> MultiLock:
        """One handle on several keys, taken all or none; see :class:`MultiLock`.

        The keys are checked as :meth:`lock` checks one, duplicates folded, and taken in
        one order (sorted by key string) that every caller shares, so two sets never
        deadlock. ``timeout`` is one deadline for the whole set: ``with`` raises
        ``LockTimeout`` naming the key it could not get, having released the others.
        The other options are :meth:`lock`'s, for every key.

        :param keys: an iterable of keys (a list, a set, a tuple of keys).
        :raises ValueError: no keys.
        :raises TypeError: one key given alone instead of an iterable of keys.
        :raises LockError: the manager is closed.
        """
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
        """The same as :meth:`lock`: the write hold of ``key`` excludes every other hold."""
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
        """A handle on the read hold of ``key``, shared with every other reader of it and
        excluded by its write hold; see :class:`ReadLock`. Options as for :meth:`lock`."""
        self._tiers.check_open()
        self._check_shared("read locks")
        return ReadLock(self, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

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
        """A handle on semaphore ``key``: at most ``permits`` holds of it at once, anywhere;
        see :class:`Semaphore`. Options as for :meth:`lock`.

        :raises ValueError: ``permits`` is not between 1 and 10,000.
        """
        self._tiers.check_open()
        self._check_shared("semaphores")
        return Semaphore(self, key, permits, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def synchronized(
        self,
        key: str,
        *keys: str,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Callable[[F], F]:
        """Decorate a function so that each call runs holding a lock.

        ``key`` is a ``str.format`` template filled from the call's bound arguments,
        defaults included: ``"user:{user_id}"`` or ``"order:{order.id}"``. With more
        templates (``"user:{source}", "user:{target}"``) each call holds all their keys,
        taken through :meth:`lock_all`: in one order, within one ``timeout``, all or none.
        """
        templates = [KeyTemplate(template) for template in (key, *keys)]
        options: dict[str, Any] = {
            "ttl": ttl,
            "timeout": timeout,
            "renew": renew,
            "on_lost": on_lost,
        }

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
                # The lock would be held only while the coroutine object is made.
                raise TypeError(
                    f"synchronized() cannot guard {function.__qualname__}(), an async "
                    "function: tierlock's LockManager locks belong to threads; use "
                    "tierlock.aio.AsyncLockManager's synchronized() for coroutines"
                )
            keys_of = [template.for_function(function) for template in templates]

            @functools.wraps(function)
            def synchronized_call(*args: Any, **kwargs: Any) -> Any:
                # Through lock() only, which every integration's manager has.
                lock = (
                    self.lock(keys_of[0](*args, **kwargs), **options)
                    if len(keys_of) == 1
                    else multi_lock(self.lock, [k(*args, **kwargs) for k in keys_of], **options)
                )
                with lock:
                    return function(*args, **kwargs)

            return synchronized_call  # type: ignore[return-value]

        return decorate

    # -- admin -------------------------------------------------------------------

    def info(self, key: KeyLike) -> LockInfo | None:
        """The row holding ``key``, expired or not, or ``None`` if it is free."""
        return self._backend.info(make_key(key))

    def holders(self) -> list[LockInfo]:
        """Every row in the table, expired or not, ordered by key."""
        return self._backend.holders()

    def force_release(self, key: KeyLike) -> bool:
        """Delete whatever row holds ``key``, whoever's it is; ``False`` if none did.

        The old holder's next ``release()`` or ``extend()`` raises ``LockLostError``.
        """
        return self._force_release(make_key(key))

    def reap(self) -> int:
        """Delete every row whose lease has ended, now; return how many."""
        return self._reap()

    def start_reaper(self, interval: float) -> None:
        """Reap every ``interval`` seconds in a background thread (restart if running)."""
        interval = seconds("interval", interval)
        self._tiers.check_open()
        self._reaper.start(interval)

    def stop_reaper(self) -> None:
        self._reaper.stop()

    @property
    def reaper_running(self) -> bool:
        return self._reaper.running

    def close(self) -> None:
        """Stop the reaper, send waiting threads away and close every connection the
        manager opened; closing again does nothing.

        Threads waiting for a lock get ``LockError`` at once (a try already sent is
        finished first, and a row it won is deleted), and so does every later call
        that would reach the database. Holds still open are not released: their rows
        expire with their leases, and their ``release()`` raises ``LockError``.
        """
        self._tiers.close()
        self._reads.close()
        self._permits.close()
        self._reaper.stop()
        self._backend.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        self._counters.reset()
        self._tiers.after_fork()
        self._reads.reset()
        self._permits.reset()
        self._reaper.forget()
        self._backend.after_fork()
