"""``LockManager``: tier 1 (``local.Registry``) in front of a backend, and the
manager's side of each ``Lock``."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import random
import re
import string
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from .backends import LockBackend, open_backend
from .errors import LockError, LockLostError, NotHeldError
from .keys import KeyLike, make_key
from .local import Registry
from .lock import Lock, seconds
from .reaper import Reaper
from .records import Hold, LockInfo, Owner
from .stats import Counters, LockStats

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["LockManager"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "sqlite:///tierlock.db"
DEFAULT_TABLE = "tierlock_locks"
DEFAULT_TTL = 30.0
# Waiters take expired rows over themselves, so the reaper only sweeps rows nobody
# asks for again; once a minute keeps the table small at negligible cost.
DEFAULT_REAPER_INTERVAL = 60.0
# The longest pause between two tries at a key held elsewhere. Pauses start at
# FIRST_POLL and double, with jitter so that waiting processes do not try in step.
DEFAULT_POLL_INTERVAL = 0.1
FIRST_POLL = 0.002
# How long one operation may keep failing to reach the database before BackendError.
DEFAULT_DATABASE_TIMEOUT = 20.0
# A released hold goes straight to the next local waiter, with one UPDATE instead of a
# DELETE and an INSERT, at most this many times in a row; then it is released, so
# that other processes get their turn (lock cohorting).
COHORT_LIMIT = 8
# When a key other processes want ends a cohort, the next local waiter lets them try
# first for this many seconds: long enough for a woken poller's insert to arrive.
COURTESY_PAUSE = 0.005


@dataclasses.dataclass
class _Request:
    """What a waiting thread asks for, for a releasing thread to act on."""

    owner: Owner
    ttl: float
    courteous: bool = False  # let other processes try first


_managers: weakref.WeakSet[LockManager] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for manager in list(_managers):
        manager._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class LockManager:
    """Distributed locks kept in a database table, with a per-process first tier.

    ::

        locks = tierlock.LockManager("postgresql+psycopg://postgres@127.0.0.1/test")
        with locks.lock(("user", 42)):          # blocks until held
            ...
        with locks.lock("order:7", ttl=10, timeout=5):
            ...                                 # LockTimeout after 5 s of waiting

        @locks.synchronized("user:{user_id}")
        def transfer(user_id: int, amount: int) -> None: ...

    :param url: a SQLAlchemy database URL; ``sqlite:///tierlock.db`` if neither it
        nor ``engine`` is given. Engines made from a URL run in autocommit mode.
    :param engine: a ready SQLAlchemy ``Engine`` to use instead of ``url`` (for an
        ``AsyncEngine``, its ``sync_engine``); not an in-memory SQLite one.
    :param table: the lock table's name, a plain identifier.
    :param ttl: the default lease of a hold, in seconds. A holder that neither
        releases nor extends within it loses the hold.
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
    :raises ValueError, TypeError: a bad option; the message names it.
    :raises BackendError: the table could not be created.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        table: str = DEFAULT_TABLE,
        ttl: float = DEFAULT_TTL,
        create_table: bool = True,
        reaper_interval: float | None = DEFAULT_REAPER_INTERVAL,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        database_timeout: float = DEFAULT_DATABASE_TIMEOUT,
    ) -> None:
        self.ttl: float = seconds("ttl", ttl)
        self.poll_interval: float = seconds("poll_interval", poll_interval)
        reaper_interval = seconds("reaper_interval", reaper_interval, none_ok=True)
        if url is None and engine is None:
            url = DEFAULT_URL
        self._counters = Counters()
        self._backend: LockBackend = open_backend(
            url,
            engine,
            table=table,
            create_table=create_table,
            counters=self._counters,
            timeout=seconds("database_timeout", database_timeout),
        )
        # A waiter's request: who it is and the lease it wants, for a hand-off.
        self._registry: Registry[Hold, _Request] = Registry(self._counters)
        self._reaper = Reaper(self.reap)
        self._closed = False
        _managers.add(self)
        if reaper_interval is not None:
            self._reaper.start(reaper_interval)

    # -- handles ---------------------------------------------------------------

    def lock(self, key: KeyLike, *, ttl: float | None = None, timeout: float | None = None) -> Lock:
        """A handle on ``key``; see :class:`Lock`.

        :param ttl: this handle's lease in seconds (default: the manager's).
        :param timeout: how long ``with`` waits before raising ``LockTimeout``
            (default: no limit). ``acquire()`` keeps threading's defaults.
        :raises LockError: the manager is closed.
        """
        self._check_open()
        return Lock(self, key, ttl=ttl, timeout=timeout)

    def synchronized(
        self, key: str, *, ttl: float | None = None, timeout: float | None = None
    ) -> Callable[[F], F]:
        """Decorate a function so that each call runs holding a lock.

        ``key`` is a ``str.format`` template filled from the call's bound arguments,
        defaults included: ``"user:{user_id}"`` or ``"order:{order.id}"``.
        """
        if not isinstance(key, str):
            raise TypeError(f"synchronized() takes a key template str, not {type(key).__name__}")
        fields = {field for _, field, _, _ in string.Formatter().parse(key) if field is not None}
        roots = {re.split(r"[.\[]", field, maxsplit=1)[0] for field in fields}
        if not fields:
            make_key(key)

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
                # The lock would be held only while the coroutine object is made.
                raise TypeError(
                    f"synchronized() cannot guard {function.__qualname__}(), an async "
                    "function: tierlock's locks belong to threads, and an asyncio API "
                    "(tierlock.aio) is planned; until then, hold the lock in a thread"
                )
            signature = inspect.signature(function)
            unknown = sorted(roots - signature.parameters.keys())
            if unknown:
                raise ValueError(
                    f"key template {key!r} names {', '.join(map(repr, unknown))}, which "
                    f"{function.__qualname__}() has no parameter for"
                )

            @functools.wraps(function)
            def synchronized_call(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                with self.lock(key.format(**bound.arguments), ttl=ttl, timeout=timeout):
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
        key = make_key(key)
        removed = self._backend.force_release(key)
        if removed:
            logger.warning("lock %r force-released", key)
        return removed

    def reap(self) -> int:
        """Delete every row whose lease has ended, now; return how many."""
        count = self._backend.reap()
        if count:
            logger.warning("reaped %d expired lock row(s)", count)
        return count

    def stats(self) -> LockStats:
        """What this manager has done so far, as counters; see :class:`LockStats`."""
        return self._counters.snapshot()

    def start_reaper(self, interval: float) -> None:
        """Reap every ``interval`` seconds in a background thread (restart if running)."""
        interval = seconds("interval", interval)
        self._check_open()
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
        self._closed = True
        self._registry.close()
        self._reaper.stop()
        self._backend.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        self._counters.reset()
        self._registry.reset()
        self._reaper.forget()
        self._backend.after_fork()

    # -- the two tiers -----------------------------------------------------------

    def _check_open(self, key: str | None = None) -> None:
        if self._closed:
            raise LockError("this LockManager is closed", key)

    def _acquire(self, key: str, ttl: float, wait: float | None) -> bool:
        self._check_open(key)
        if asyncio._get_running_loop() is not None:
            # Coroutines of one loop share its thread, so a thread-owned lock would
            # let them all in at once, and a wait would stall the loop.
            raise LockError(
                "tierlock.Lock belongs to threads and cannot be acquired in a thread that "
                "runs an asyncio event loop; call it from a worker thread "
                "(asyncio.to_thread) until tierlock's asyncio API is available",
                key,
            )
        registry = self._registry
        if registry.reenter(key):
            self._counters.add("reentrant_acquisitions")
            self._counters.add("acquisitions")
            return True
        deadline = None if wait is None else time.monotonic() + wait
        request = _Request(Owner.current(), ttl)
        owner_id = request.owner.owner_id
        try:
            if not registry.claim(key, wait, request):
                return False
            self._check_open(key)
            if registry.hold(key) is None:  # (else handed over by a local holder)
                hold = self._acquire_remote(key, request, deadline)
                if hold is None:
                    self._backend.discard(key, owner_id, certain=False)
                    registry.unclaim(key)
                    return False
                registry.settle(key, hold)
                logger.debug("acquired %r (token %d, owner %s)", key, hold.token, owner_id)
        except BaseException as exc:
            # An interrupt may have come at any point: after a statement was sent, or
            # once a hand-off gave this thread the claim; pass on whatever it got.
            self._abandon(key, owner_id, certain=not isinstance(exc, LockError))
            raise
        self._counters.add("acquisitions")
        return True

    def _abandon(self, key: str, owner_id: str, *, certain: bool) -> None:
        """Undo the calling thread's acquire of ``key`` that will not return a hold.

        ``certain``: the acquire was cut short by an exception that is not tierlock's,
        so a row of ``owner_id`` may exist that nothing confirmed.
        """
        registry = self._registry
        if not registry.claims(key):
            return  # it never left the queue, so it never talked to the database
        hold = registry.hold(key)
        if hold is None:
            registry.unclaim(key)
            self._backend.discard(key, owner_id, certain=certain)
            return
        registry.exit(key)
        try:
            self._let_go(key, hold)
        except LockError as exc:
            logger.warning("passing on %r after an interrupted acquire failed: %s", key, exc)

    def _acquire_remote(self, key: str, request: _Request, deadline: float | None) -> Hold | None:
        """Try the backend until it grants ``key`` or ``deadline`` passes.

        No connection is held between tries: each takes one from the pool and returns it.
        """
        owner, ttl = request.owner, request.ttl
        backend = self._backend
        doorbell = backend.doorbell(key) if request.courteous else None
        pause = FIRST_POLL
        missed = False  # whether another process held the key at some try
        try:
            if doorbell is not None:
                doorbell.wait(COURTESY_PAUSE)
            while True:
                self._check_open(key)
                if doorbell is not None:
                    doorbell.arm()
                sent = time.monotonic()
                limit = None if deadline is None else deadline - sent
                token = backend.try_acquire(key, owner, ttl, limit)
                if token is not None:
                    ring = None if doorbell is None else doorbell.keep()
                    return Hold(token, owner.owner_id, sent + ttl, contended=missed, ring=ring)
                missed = True
                if doorbell is None:
                    doorbell = backend.doorbell(key)
                delay = random.uniform(pause / 2, pause)
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    delay = min(delay, remaining)
                doorbell.wait(delay)
                pause = min(pause * 2, self.poll_interval)
        finally:
            if doorbell is not None:
                doorbell.close()

    def _release(self, key: str) -> None:
        hold = self._registry.exit(key)
        if hold is None:
            self._counters.add("releases")
            return  # an inner reentrant release
        self._let_go(key, hold)
        self._counters.add("releases")
        logger.debug("released %r (token %d, owner %s)", key, hold.token, hold.owner_id)

    def _let_go(self, key: str, hold: Hold) -> None:
        """Pass the calling thread's last hold of ``key`` to the next local waiter, or
        release it in the database. The waiter is woken whatever happens here."""
        registry = self._registry
        while True:
            successor = registry.successor(key)
            handed: Hold | None = None
            try:
                if successor is not None and hold.handoffs < COHORT_LIMIT:
                    handed = self._handoff(key, hold, successor.request)
                    released = handed is not None
                else:
                    if successor is not None and (
                        hold.contended or (hold.ring is None and self._backend.others_waiting(key))
                    ):
                        successor.request.courteous = True
                    released = self._backend.release(key, hold.owner_id, hold.live_until)
            except LockError:
                # Whether the row is still ours is unknown: make sure it goes.
                self._backend.discard(key, hold.owner_id, certain=True)
                raise
            finally:
                # Waking the successor comes first and cannot raise; ringing can.
                passed = successor is None or registry.pass_on(key, successor, handed)
                if handed is None and hold.ring is not None:
                    hold.ring()  # the row left this process: wake pollers elsewhere
            if passed:
                break
            # The successor left just as the hold was handed to it: pass it on in turn.
            assert handed is not None
            hold = handed
        if not released:
            self._lost(key, hold, "its release")

    def _handoff(self, key: str, hold: Hold, request: _Request) -> Hold | None:
        """Pass ``hold`` to a waiting thread of this process; ``None`` if it was lost."""
        sent = time.monotonic()
        token = self._backend.handoff(key, hold.owner_id, hold.token, request.owner, request.ttl)
        if token is None:
            return None
        self._counters.add("handoffs")
        return Hold(
            token,
            request.owner.owner_id,
            sent + request.ttl,
            hold.handoffs + 1,
            hold.contended,
            hold.ring,
        )

    def _extend(self, key: str, ttl: float) -> None:
        hold = self._registry.hold(key)
        if hold is None:
            raise NotHeldError(key)
        sent = time.monotonic()
        if not self._backend.extend(key, hold.owner_id, ttl):
            self._lost(key, hold, "it could be extended")
        hold.live_until = sent + ttl
        logger.debug("extended %r by %g s (token %d)", key, ttl, hold.token)

    def _lost(self, key: str, hold: Hold, before: str) -> NoReturn:
        self._counters.add("lost_holds")
        logger.warning("lock %r (token %d) was lost before %s", key, hold.token, before)
        raise LockLostError(key, hold.token)
