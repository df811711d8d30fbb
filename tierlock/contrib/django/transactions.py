"""The transaction rule: a lock released inside ``transaction.atomic()`` stays held
until the thread's outermost atomic block ends, committed or rolled back.

A lock guards what its holder reads and writes; if it were released before the
transaction that wrote commits, the next holder would read the old values and
overwrite the new ones (lost updates), and ``ATOMIC_REQUESTS`` wraps every view in
such a transaction. So :class:`TransactionLock`, the handle the integration gives,
defers its release while any database connection of the calling thread is inside an
atomic block, and the deferred releases run, in reverse order, once the last of them
exits; a failure among them is logged. The bookkeeping is the SQLAlchemy session
rule's (``tierlock.contrib.sqlalchemy``), forked children forgetting it included.

Django has ``transaction.on_commit`` but no hook for a rollback, and an on_commit
callback registered inside a savepoint is dropped when that savepoint rolls back. So
the integration wraps ``Atomic.__exit__``, which ends every atomic block, whatever
opened it (``ATOMIC_REQUESTS``, ``@atomic``, ``with atomic()``, a test case) and however
it ends (commit, rollback, a failed commit, a connection closed mid-transaction); when
no thread has a release deferred the wrapper costs one emptiness check. It is installed
when this module is first imported, so only blocks entered after that are watched: a
release inside a block entered earlier is not deferred, since nothing would end it.
The atomic blocks that ``TestCase`` wraps around each test never commit; they do not
count, as Django's own ``durable`` check ignores them.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections
from django.db.transaction import Atomic

from ...lock import Lock
from ..sqlalchemy import Deferrals, release_in_turn

__all__ = ["TransactionLock", "in_transaction"]

# Set on every Atomic entered while the wrapper is installed.
WATCHED = "_tierlock_watched"

# The releases put off, kept (and forgotten in a forked child) as the SQLAlchemy
# session rule keeps its own.
_deferred: Deferrals[Lock] = Deferrals()


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
        if in_transaction():
            _deferred.put_off(threading.current_thread(), self)
        else:
            super().release()


def _release_deferred() -> None:
    if not in_transaction():
        release_in_turn(_deferred.take(threading.current_thread()))


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
            if _deferred:  # (some thread put a release off)
                _release_deferred()

    setattr(watched_exit, WATCHED, True)
    Atomic.__enter__ = watched_enter
    Atomic.__exit__ = watched_exit


_watch_atomic_blocks()
