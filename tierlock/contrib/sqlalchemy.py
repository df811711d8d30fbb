"""The transaction rule for SQLAlchemy sessions: a lock released while the releasing
thread's session transaction is in progress stays held until that transaction commits
or rolls back.

::

    Session = sessionmaker(engine)
    locks = tierlock.LockManager(url)
    hold_until_commit(Session, locks)

    with Session() as session:
        teller = session.get(Teller, teller_id)     # the transaction begins here
        with locks.lock(("account", 7)):
            account = session.get(Account, 7)
            account.balance -= 5
        session.commit()                            # account:7 is released here

A lock guards what its holder reads and writes; released before the transaction that
wrote commits, it lets the next holder read the old values and overwrite the new::

    thread A                               thread B
    reads balance 100, writes 95
    releases account:7  ---------------->  takes account:7, reads 100 (A has not committed)
    commits 95                             writes 100 - 3 = 97 and commits: A's 5 are lost

How: a session's root transaction (not a savepoint) that begins in a thread counts for
that thread until it ends: commit, rollback or close (the ``after_transaction_create``
and ``after_transaction_end`` session events). While one counts, a release through the
manager's :class:`tierlock.Lock` handles is put off; when the thread's last one ends,
the releases put off are made, last first, and a failure among them is logged: the
transaction has ended already, and raising would only hide how. A lock is released
only by its holder, so a transaction must end in the thread that began it; and one in
progress when the rule is set up does not count.

asyncio: the same with tasks, for ``AsyncSession`` and ``tierlock.aio.AsyncLockManager``.
Its events fire in the sync session, inside SQLAlchemy's greenlet, where nothing can be
awaited but through the greenlet; and ``async with session`` (or ``async with
maker.begin()``) ends the transaction in a task of SQLAlchemy's own. So the releases
run in a task of the manager's that releases for the holding task, and the commit,
rollback or close waits for them through the greenlet. A transaction ended from plain
sync code instead (``session.sync_session.close()``) has its releases made in that
task, soon after.

A forked child forgets the releases its parent put off: it holds none of its locks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from typing import Any, Generic, Protocol, TypeVar, cast

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker
from sqlalchemy.orm import Session, SessionTransaction, scoped_session, sessionmaker
from sqlalchemy.util.concurrency import in_greenlet

from ..aio.handles import AsyncLock
from ..aio.manager import AsyncLockManager
from ..aio.waiters import releasing_for
from ..errors import LockError, NotHeldError
from ..lock import Lock
from ..manager import LockManager

try:
    from sqlalchemy.util.concurrency import await_
except ImportError:  # SQLAlchemy 2.0 names it await_only
    from sqlalchemy.util.concurrency import await_only as await_

__all__ = ["Deferrals", "TransactionRule", "hold_until_commit", "release_in_turn"]

logger = logging.getLogger(__name__)

SyncSessions = Session | sessionmaker[Any] | scoped_session[Any]
AsyncSessions = AsyncSession | async_sessionmaker[Any] | async_scoped_session[Any]
SYNC_SESSIONS = (Session, sessionmaker, scoped_session)
ASYNC_SESSIONS = (AsyncSession, async_sessionmaker, async_scoped_session)
# Set on the sync session class that hold_until_commit gives an async_sessionmaker.
WATCHED = "_tierlock_watched"


class Releasable(Protocol):
    """A handle whose release may be put off."""

    @property
    def key(self) -> str: ...

    @property
    def token(self) -> int | None: ...


H = TypeVar("H", bound=Releasable)

_forgotten_in_child: weakref.WeakSet[Deferrals[Any] | TransactionRule] = weakref.WeakSet()


class Deferrals(Generic[H]):
    """The releases each holder (a thread, or a task) put off until its transaction
    ends; this rule's and Django's (``tierlock.contrib.django.transactions``)."""

    def __init__(self) -> None:
        self._put_off: weakref.WeakKeyDictionary[object, list[H]] = weakref.WeakKeyDictionary()
        _forgotten_in_child.add(self)

    def put_off(self, holder: object, handle: H) -> None:
        """Keep ``handle``'s release for later.

        :raises NotHeldError: the caller does not hold it (now, as a release would).
        """
        if handle.token is None:
            raise NotHeldError(handle.key)
        self._put_off.setdefault(holder, []).append(handle)

    def take(self, holder: object) -> list[H]:
        """The releases ``holder`` put off, in the order it made them; now none."""
        return self._put_off.pop(holder, [])

    def give_back(self, holder: object, handles: list[H]) -> None:
        self._put_off.setdefault(holder, [])[:0] = handles

    def __bool__(self) -> bool:
        """Whether any holder put a release off (a check that costs next to nothing)."""
        return bool(self._put_off)

    def forget(self) -> None:
        self._put_off.clear()


def _failed(handle: Releasable, exc: LockError) -> None:
    # The transaction has ended already; raising here would only hide how.
    logger.error("releasing %r at the end of its transaction failed: %s", handle.key, exc)


def release_in_turn(handles: list[Lock]) -> None:
    """Make the calling thread's releases put off, the last first; log failures."""
    for handle in reversed(handles):
        try:
            handle.release()
        except LockError as exc:
            _failed(handle, exc)


async def _release_for(holder: asyncio.Task[Any], handles: list[AsyncLock]) -> None:
    """``release_in_turn`` for ``holder``'s async locks, in a task of the manager's."""
    releasing_for.set(holder)  # (this task's own context)
    for handle in reversed(handles):
        try:
            await handle.release()
        except LockError as exc:
            _failed(handle, exc)


class TransactionRule:
    """A manager's release rule: which holders are in a watched session's transaction,
    and the releases they put off (see the module's docstring)."""

    # Held while a rule is set up: two threads setting up one manager get one rule,
    # and listen once.
    installing = threading.Lock()

    def __init__(self, *, tasks: bool) -> None:
        self._tasks = tasks  # (holders are tasks, else threads)
        # Holder -> its sessions whose root transaction is in progress; and back.
        self._open: weakref.WeakKeyDictionary[object, weakref.WeakSet[Session]] = (
            weakref.WeakKeyDictionary()
        )
        self._began_in: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()
        self._deferrals: Deferrals[Lock | AsyncLock] = Deferrals()
        _forgotten_in_child.add(self)

    def watch(self, sessions: SyncSessions | AsyncSessions) -> None:
        """Count the transactions of ``sessions`` from now on."""
        with self.installing:
            target = _event_target(sessions)
            if not event.contains(target, "after_transaction_end", self._ended):
                event.listen(target, "after_transaction_create", self._began)
                event.listen(target, "after_transaction_end", self._ended)

    def _holder(self) -> object | None:
        if not self._tasks:
            return threading.current_thread()
        try:
            return asyncio.current_task()
        except RuntimeError:  # no event loop runs in this thread
            return None

    def defers(self, handle: Lock | AsyncLock) -> bool:
        holder = self._holder()
        if holder is None or not self._open.get(holder):
            return False
        self._deferrals.put_off(holder, handle)
        return True

    def _began(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is not None:  # a savepoint, or a flush's subtransaction
            return
        holder = self._holder()
        if holder is not None:
            self._open.setdefault(holder, weakref.WeakSet()).add(session)
            self._began_in[session] = holder

    def _ended(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is not None:
            return
        holder = self._began_in.pop(session, None)
        if holder is None:
            return
        sessions = self._open.get(holder)
        if sessions is not None:
            sessions.discard(session)
            if sessions:  # another of its sessions is in a transaction still
                return
        handles = self._deferrals.take(holder)
        if not handles:
            return
        if isinstance(holder, asyncio.Task):
            self._release_for_task(holder, cast("list[AsyncLock]", handles))
        elif holder is threading.current_thread():
            release_in_turn(cast("list[Lock]", handles))
        else:
            logger.error(
                "a transaction that thread %r began ended in thread %r, which cannot "
                "release the locks %s of the first: they wait for that thread's next "
                "transaction to end; end a session's transaction in its own thread",
                getattr(holder, "name", holder),
                threading.current_thread().name,
                sorted({handle.key for handle in handles}),
            )
            self._deferrals.give_back(holder, handles)

    def _release_for_task(self, holder: asyncio.Task[Any], handles: list[AsyncLock]) -> None:
        core = handles[0]._manager._core
        if in_greenlet():  # (the commit, rollback or close returns once they are made)
            await_(asyncio.shield(core.spawn(_release_for(holder, handles))))
            return
        releases = _release_for(holder, handles)
        try:
            holder.get_loop().call_soon_threadsafe(core.spawn, releases)
        except RuntimeError as exc:  # its event loop is closed
            releases.close()
            for handle in handles:
                _failed(handle, LockError(str(exc), handle.key))

    def forget(self) -> None:
        self._open.clear()
        self._began_in.clear()


def _event_target(sessions: SyncSessions | AsyncSessions) -> object:
    """What SQLAlchemy's session events listen on for ``sessions``."""
    if isinstance(sessions, SYNC_SESSIONS):
        return sessions
    if isinstance(sessions, AsyncSession):
        return sessions.sync_session
    maker = sessions.session_factory if isinstance(sessions, async_scoped_session) else sessions
    # An async_sessionmaker's sessions share plain Session as their sync class: give
    # them a class of their own, so that only they are watched.
    base = maker.kw.get("sync_session_class") or maker.class_.sync_session_class
    if not getattr(base, WATCHED, False):
        base = type(base.__name__, (base,), {WATCHED: True, "__module__": base.__module__})
        maker.configure(sync_session_class=base)
    return base


def hold_until_commit(
    sessions: SyncSessions | AsyncSessions, locks: LockManager | AsyncLockManager
) -> None:
    """Put off every release made through ``locks``' handles while the releasing thread
    (task, for an ``AsyncLockManager``) has a transaction of ``sessions`` in progress,
    until that transaction commits or rolls back (see the module's docstring).

    :param sessions: a ``Session``, or a ``sessionmaker`` or ``scoped_session`` whose
        sessions all count (Flask-SQLAlchemy's ``db.session``); with an
        ``AsyncLockManager``, their asyncio twins (an ``async_sessionmaker``'s sessions
        made from now on). Calling again with other sessions adds them.
    :param locks: the manager whose exclusive locks (``lock()``, ``lock_all()``,
        ``synchronized()``) follow the rule; its read locks and semaphores do not.
    :raises TypeError: ``sessions`` or ``locks`` is of another kind, or an async one is
        paired with a sync one.
    """
    if not isinstance(locks, (LockManager, AsyncLockManager)):
        raise TypeError(
            f"hold_until_commit() takes a LockManager or AsyncLockManager, not "
            f"{type(locks).__name__} (for an integration's lazy manager, pass its .manager)"
        )
    sync = isinstance(sessions, SYNC_SESSIONS)
    if not sync and not isinstance(sessions, ASYNC_SESSIONS):
        raise TypeError(
            "hold_until_commit() takes a Session, sessionmaker or scoped_session, or their "
            f"asyncio twins, not {type(sessions).__name__}"
        )
    if sync == isinstance(locks, AsyncLockManager):
        raise TypeError(
            "hold_until_commit(): asyncio sessions go with tierlock.aio.AsyncLockManager "
            "(their transactions belong to tasks), the others with LockManager (theirs "
            f"belong to threads); got {type(sessions).__name__} and {type(locks).__name__}"
        )
    with TransactionRule.installing:
        rule = locks._release_rule
        if not isinstance(rule, TransactionRule):
            rule = TransactionRule(tasks=isinstance(locks, AsyncLockManager))
            locks._release_rule = rule
    rule.watch(sessions)


def _forget_in_child() -> None:
    # A forked child holds none of its parent's locks (see LockManager), nor the lock
    # another thread of the parent may have been setting a rule up under.
    TransactionRule.installing = threading.Lock()
    for forgetful in list(_forgotten_in_child):
        forgetful.forget()


os.register_at_fork(after_in_child=_forget_in_child)
