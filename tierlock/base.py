"""What every manager has, sync or async: its checked options, counters, backend and
reaper; the managers themselves are ``LockManager`` and ``tierlock.aio.AsyncLockManager``."""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING

from .backends import LockBackend
from .backends.opening import open_backend
from .errors import LockError
from .lock import ReleaseRule, callback, flag, seconds
from .reaper import Reaper
from .stats import Counters, LockStats
from .tier1.cohorts import released

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from .tier1.tiers import OnLost

__all__ = [
    "DEFAULT_DATABASE_TIMEOUT",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_REAPER_INTERVAL",
    "DEFAULT_TABLE",
    "DEFAULT_TTL",
    "DEFAULT_URL",
    "ManagerBase",
]

logger = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///tierlock.db"
DEFAULT_TABLE = "tierlock_locks"
DEFAULT_TTL = 30.0
# Waiters take expired rows over themselves, so the reaper only sweeps rows nobody
# asks for again; once a minute keeps the table small at negligible cost.
DEFAULT_REAPER_INTERVAL = 60.0
# The longest pause between two tries at a key held elsewhere (see tiers.FIRST_POLL).
DEFAULT_POLL_INTERVAL = 0.1
# How long one operation may keep failing to reach the database before BackendError.
DEFAULT_DATABASE_TIMEOUT = 20.0


_managers: weakref.WeakSet[ManagerBase] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child holds nothing its parent held: every manager forgets its holds
    (one that fails to must not leave the others with their parent's)."""
    for manager in list(_managers):
        try:
            manager._after_fork()
        except Exception:
            logger.exception("resetting %r in a forked child failed", manager)


os.register_at_fork(after_in_child=_after_fork_in_child)


class ManagerBase:
    """Options (see ``LockManager``), counters, the backend and the reaper."""

    #: What puts off releases of the manager's locks (``tierlock.contrib.sqlalchemy``).
    _release_rule: ReleaseRule | None = None

    def __init__(
        self,
        url: str | None,
        *,
        engine: Engine | None,
        table: str,
        ttl: float,
        renew: bool,
        on_lost: OnLost | None,
        create_table: bool,
        reaper_interval: float | None,
        poll_interval: float,
        database_timeout: float,
    ) -> None:
        self.ttl: float = seconds("ttl", ttl)
        self.renew: bool = flag("renew", renew)
        self.on_lost: OnLost | None = callback("on_lost", on_lost)
        self.poll_interval: float = seconds("poll_interval", poll_interval)
        self._reaper_interval = seconds("reaper_interval", reaper_interval, none_ok=True)
        if url is None and engine is None:
            url = DEFAULT_URL
        self._counters = Counters()
        self.table: str = table
        self._backend: LockBackend = open_backend(
            url,
            engine,
            table=table,
            create_table=create_table,
            ttl=self.ttl,
            counters=self._counters,
            timeout=seconds("database_timeout", database_timeout),
        )
        #: The database's URL, with any password hidden.
        self.url: str = self._backend.location
        self._reaper = Reaper(self._reap)
        _managers.add(self)

    def _after_fork(self) -> None:
        """Start afresh in a forked child (see ``_after_fork_in_child``)."""
        raise NotImplementedError

    def _start_reaper(self) -> None:
        """Start the reaper if the manager was made with an interval for it."""
        if self._reaper_interval is not None:
            self._reaper.start(self._reaper_interval)

    def _check_shared(self, what: str) -> None:
        """Refuse a read lock or semaphore handle where the engine has no shared holds."""
        if self._backend.shared is None:
            raise LockError(f"{what} are on the SQL engines only, not on {self.url}")

    def _reap(self) -> int:
        count = self._backend.reap()
        if count:
            logger.warning("reaped %d expired lock row(s)", count)
        return count

    def _force_release(self, key: str) -> bool:
        removed = self._backend.force_release(key)
        released(key)
        if removed:
            logger.warning("lock %r force-released", key)
        return removed

    def stats(self) -> LockStats:
        """What this manager has done so far, as counters; see :class:`LockStats`."""
        return self._counters.snapshot()

    def __repr__(self) -> str:
        name = f"{type(self).__module__.rsplit('.', 1)[0]}.{type(self).__name__}"
        return f"<{name} url={self.url!r} table={self.table!r}>"
