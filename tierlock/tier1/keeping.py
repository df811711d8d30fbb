"""Released holds that a process keeps for a moment, for its own threads.

A try without waiting that finds its key held or asked for by another thread of the
process is turned away at once, in tier 1. When that hold is released with no thread
waiting, the next such try is likely a moment away: the process keeps the row, still
renewed but held by no thread, for ``cohorts.KEEP_TIME``, and a thread of the process
that asks for the key meanwhile gets it with no statement, a local hand-off. Keeping
counts against the cohort's bound (``cohorts.COHORT_LIMIT`` / ``KEPT_COHORT_TIME``) whether
other processes are known to wait or not (the mark a try of theirs leaves may come a
moment late): once it is reached, the row goes back to the database, for them to win.

This module's thread releases each kept row in the database once its time is up,
unless a thread took it meanwhile (``tiers.Tiers`` hands a kept hold to a thread); until
that DELETE has committed, a thread of the process that asks for the key waits for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..backends import LockBackend
from ..errors import LockError
from ..records import Hold
from . import cohorts
from .later import Later
from .leases import Heartbeat
from .local import Registry

__all__ = ["Keeper"]

logger = logging.getLogger(__name__)


class Keeper:
    """Keeps released holds of one manager, and releases them when their time is up."""

    def __init__(
        self, registry: Registry[Hold, Any], heartbeat: Heartbeat, backend: LockBackend
    ) -> None:
        self._registry = registry
        self._heartbeat = heartbeat
        self._backend = backend
        self._later = Later("tierlock-keeper")

    def forget(self) -> None:
        """Start afresh: a forked child keeps nothing, and the parent's thread is gone."""
        self._later.forget()

    def keep(self, hold: Hold) -> bool:
        """Keep the calling thread's released ``hold`` for the next thread of the process
        that claims its key, for ``cohorts.KEEP_TIME``; ``False`` if a thread waits already."""
        on_lost, hold.on_lost = hold.on_lost, None  # (released: nobody to tell)
        until = hold.keep_until = time.monotonic() + cohorts.KEEP_TIME
        if not self._registry.keep(hold.key):
            hold.on_lost, hold.keep_until = on_lost, 0.0
            return False
        # (Once stopped, the registry's close gives the hold to close().)
        self._later.at(until, lambda: self._time_up(hold))
        return True

    def close(self, kept: list[Hold]) -> None:
        """Stop, and release ``kept``: the holds still kept, which the registry gave up."""
        self._later.stop()
        for hold in kept:
            self._release_row(hold)

    def _time_up(self, hold: Hold) -> None:
        if not self._registry.drop_kept(hold.key, hold):
            return  # a thread took it
        try:
            self._release_row(hold)
        except Exception:
            logger.exception("releasing the kept lock %r failed", hold.key)
        finally:
            self._registry.released(hold.key)  # (threads that came meanwhile go on)

    def _release_row(self, hold: Hold) -> None:
        """Release ``hold``'s row, which no thread holds, in the database."""
        self._heartbeat.remove(hold)
        try:
            self._backend.release(hold.key, hold.owner_id, hold.live_until)
            cohorts.released(hold.key)
        except LockError as exc:
            logger.debug("releasing the kept lock %r failed: %s", hold.key, exc)
            self._backend.discard(hold.key, hold.owner_id, certain=True)
        finally:
            if hold.ring is not None:
                hold.ring()
