"""The transaction rule: a lock released inside ``transaction.atomic()`` stays held
until the thread's outermost atomic block ends, committed or rolled back.

A lock guards what its holder reads and writes; if it were released before the
transaction that wrote commits, the next holder would read the old values and
overwrite the new ones (lost updates), and ``ATOMIC_REQUESTS`` wraps every view in
such a transaction. So :class:`TransactionLock`, the handle the integration gives,
defers its release while any database connection of the calling thread is inside an
atomic block, and the deferred releases run, in reverse order, once the last of them
exits.

Django has ``transaction.on_commit`` but no hook for a rollback, and an on_commit
callback registered inside a savepoint is dropped when that savepoint rolls back. So
the integration wraps ``Atomic.__exit__``, which ends every atomic block, whatever
opened it (``ATOMIC_REQUESTS``, ``@atomic``, ``with atomic()``, a test case) and however
it ends (commit, rollback, a failed commit, a connection closed mid-transaction); when
nothing is deferred the wrapper costs one thread-local look-up. It is installed when
this module is first imported, so only blocks entered after that are watched: a
release inside a block entered earlier is not deferred, since nothing would end it.
The atomic blocks that ``TestCase`` wraps around each test never commit; they do not
count, as Django's own ``durable`` check ignores them.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from django.db import connections
from django.db.transaction import Atomic

from ...errors import LockError, NotHeldError
from ...lock import Lock

__all__ = ["TransactionLock", "in_transaction"]

logger = logging.getLogger(__name__)

# Set on every Atomic entered while the wrapper is installed.
WATCHED = "_tierlock_watched"


class _Deferred(threading.local):
    def __init__(self) -> None:
        self.locks: list[Lock] = []


_deferred = _Deferred()


def in_transaction() -> bool:
    """Whether a connection of the calling thread is inside a watched atomic block."""
    for connection in connections.all(initialized_only=True):
        for block in connection.atomic_blocks:
            if not getattr(block, "_from_testcase", False):
                if getattr(block, WATCHED, False):
                    return True
                break  # the outermost block that counts was entered unwatched
    return False


class TransactionLock(Lock):
    """A :class:`tierlock.Lock` whose release inside an atomic block takes effect when
    the thread's outermost atomic block ends (see the module's docstring)."""

    __slots__ = ()

    def release(self) -> None:
        if not in_transaction():
            super().release()
            return
        if self.token is None:  # fail now, as an immediate release would
            raise NotHeldError(f"cannot release {self.key!r}: not held by this thread")
        _deferred.locks.append(self)


def _release_deferred() -> None:
    if in_transaction():
        return
    locks, _deferred.locks = _deferred.locks, []
    for lock in reversed(locks):
        try:
            Lock.release(lock)
        except LockError as exc:
            # The transaction has ended already; raising here would only hide why.
            logger.error("releasing %r at the end of its transaction failed: %s", lock.key, exc)


def _watch_atomic_blocks() -> None:
    enter, exit_ = Atomic.__enter__, Atomic.__exit__
    if getattr(exit_, WATCHED, False):
        return

    def watched_enter(self: Any) -> Any:
        setattr(self, WATCHED, True)
        return enter(self)

    def watched_exit(self: Any, *exc_info: Any) -> Any:
        try:
            return exit_(self, *exc_info)
        finally:
            if _deferred.locks:
                _release_deferred()

    setattr(watched_exit, WATCHED, True)
    Atomic.__enter__ = watched_enter
    Atomic.__exit__ = watched_exit


def _forget_in_child() -> None:
    # A forked child holds none of its parent's locks (see LockManager).
    _deferred.locks = []


_watch_atomic_blocks()
os.register_at_fork(after_in_child=_forget_in_child)
