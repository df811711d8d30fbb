"""When a key stays with the process and when it goes to the others: lock cohorting,
courtesy, the memory of keys held elsewhere, and keeping released holds.

A process passes a hot key between its own threads with no statement, so left alone it
would keep the key for as long as its threads want it. These rules bound that:

* a cohort of hand-offs in a row ends after ``COHORT_LIMIT`` hand-offs or
  ``COHORT_TIME`` seconds while other processes may be waiting, and the next local
  waiter then lets them try first (``COURTESY_PAUSE``);
* a hold released while a try without waiting of the process was turned away from it
  is kept for ``KEEP_TIME`` for the next such try (see ``keeping``), within a cohort of
  ``KEPT_COHORT_TIME``; then the row goes back to the database;
* a try without waiting at a key that the process found held elsewhere twice lately
  fails at once, with no statement, for ``HOT_MEMORY``, unless a manager of this
  process released the key since: a release elsewhere may go unseen for that long, one
  in this process never does.
"""

from __future__ import annotations

import time

from ..backends import LockBackend
from ..memories import remember
from ..records import Hold

__all__ = ["COURTESY_PAUSE", "KEEP_TIME", "WANTED_FOR", "Cohorts", "released"]

# A cohort of hand-offs in a row within the process ends after this many, or this many
# seconds, when other processes may be waiting for the key; then the key goes back to
# the database. Chosen from the benchmark's hot-key runs: long enough that a hot key
# costs a small fraction of a statement per critical section, short enough that the
# other processes' threads are served about as often as this one's.
COHORT_LIMIT = 64
COHORT_TIME = 0.005
# When a cohort ends because other processes wait, the next local waiter lets them try
# first for this many seconds: long enough for a woken poller's insert to arrive on a
# busy machine. (With 5 ms, in 4 x 4 threads on one key with both cores loaded, a
# process often took the key back before the woken one had run: least/most served
# thread 0.41-0.66; with 20 ms, 0.68-0.95.) It costs nothing while they are active:
# the key is theirs meanwhile.
COURTESY_PAUSE = 0.02
# A key that a try of this process found held elsewhere counts as wanted elsewhere for
# this long: a cohort that ends then lets the other processes try first even if its own
# hold was won at the first try (which, on a loaded machine, the same process would
# otherwise keep doing while the others' woken pollers wait to be scheduled).
CONTENTION_MEMORY = 0.1
# A try without waiting fails at once, with no statement, for this long after one that
# found its key held elsewhere for the second time within CONTENTION_MEMORY: a key that
# other processes fight over is not asked for again and again in vain (a release in
# this process ends the memory at once; see ``released``). Chosen with KEPT_COHORT_TIME
# from the flash-sale runs (4 x 8 threads trying one key): with 5 ms, 0.05-0.08
# statements per try; with 10 ms, 0.03-0.05 and as many sales; with 20 ms, no fewer.
HOT_MEMORY = 0.01
# A try without waiting that found its key held elsewhere marks it wanted for this long
# (``LockBackend.want``), and again at most every half of it: longer than the pause
# between a patient process's tries, so that the holder's cohort ends while it tries.
WANTED_FOR = 0.1
# A hold released while a try without waiting of this process was turned away from it
# stays with the process this long, for the next such try, within a cohort of at most
# COHORT_LIMIT holds or KEPT_COHORT_TIME seconds. Other processes' tries fail from
# HOT_MEMORY meanwhile, so the cohort outlasts it: with 5 ms, about 510 sales/s in the
# flash-sale runs; with 20 ms, 560-610 (GET_LOCK: 410-450).
KEEP_TIME = 0.002
KEPT_COHORT_TIME = 0.02

# When a manager of this process last released each key in the database.
_released_at: dict[str, float] = {}


def released(key: str) -> None:
    """A manager of this process released ``key`` in the database: no memory of it
    being held elsewhere that is older holds any longer."""
    remember(_released_at, key, time.monotonic())


class Cohorts:
    """The rules above, for one manager, with its memories of keys held elsewhere."""

    def __init__(self, backend: LockBackend) -> None:
        self._backend = backend
        self.forget()

    def forget(self) -> None:
        """Start afresh (in a forked child)."""
        self._missed_at: dict[str, float] = {}  # when a try last found a key held elsewhere
        self._hot_until: dict[str, float] = {}  # until when tries without waiting fail
        self._wanted_at: dict[str, float] = {}  # when a try last marked a key wanted

    # -- keys held elsewhere ---------------------------------------------------------

    def hot(self, key: str) -> bool:
        """Whether a try without waiting at ``key`` fails at once."""
        if not self._hot_until:
            return False
        until = self._hot_until.get(key, 0.0)
        return time.monotonic() < until and _released_at.get(key, 0.0) < until - HOT_MEMORY

    def last_missed(self, key: str) -> float | None:
        return self._missed_at.get(key)

    def missed(self, key: str) -> None:
        """A try found ``key`` held elsewhere."""
        remember(self._missed_at, key, time.monotonic())

    def missed_without_waiting(self, key: str, missed_before: float | None) -> bool:
        """A try without waiting found ``key`` held elsewhere, as an earlier one did at
        ``missed_before``: if that was lately, the next tries fail at once for a while.
        Returns whether to mark the key wanted now (``LockBackend.want``, ``WANTED_FOR``),
        for its holder to see."""
        if missed_before is not None:
            missed = self._missed_at.get(key, missed_before)
            if missed - missed_before < CONTENTION_MEMORY:
                remember(self._hot_until, key, missed + HOT_MEMORY)
        now = time.monotonic()
        if now - self._wanted_at.get(key, -WANTED_FOR) < WANTED_FOR / 2:
            return False
        remember(self._wanted_at, key, now)
        return True

    def won(self, key: str) -> None:
        self._hot_until.pop(key, None)

    # -- cohorts -----------------------------------------------------------------------

    def goes_on(self, hold: Hold, key: str | None = None) -> bool:
        """Whether one more hand-off in a row keeps within the cohort's bound, or other
        processes surely do not wait for ``key`` (the hold's own by default; then a new
        cohort begins)."""
        if self.within(hold):
            return True
        if hold.handoffs >= self._backend.MAX_HANDOFFS:
            return False
        waited_for = hold.key if key is None else key
        if self._backend.others_waiting(waited_for, hold.ring is not None) is False:
            hold.cohort, hold.cohort_began = 0, time.monotonic()
            return True
        return False

    def within(self, hold: Hold) -> bool:
        """``goes_on`` without asking the backend: one more hand-off in a row keeps
        within the cohort's bound."""
        if hold.handoffs >= self._backend.MAX_HANDOFFS:
            return False
        now = time.monotonic()
        if not hold.cohort:
            hold.cohort_began = now
        return hold.cohort < COHORT_LIMIT and now - hold.cohort_began < COHORT_TIME

    def courteous(self, hold: Hold, wanted_here: bool) -> bool:
        """Before ``hold`` goes back to the database: whether the next local waiter (if
        ``wanted_here``) should let other processes try first, as they may want it."""
        key = hold.key
        if not wanted_here:
            self._missed_at.pop(key, None)  # nobody here wants it any more
            return False
        missed = self._missed_at.get(key, -CONTENTION_MEMORY)
        return (
            hold.contended
            or time.monotonic() - missed < CONTENTION_MEMORY
            or bool(self._backend.others_waiting(key, hold.ring is not None))
        )

    def may_keep(self, hold: Hold) -> bool:
        """Whether released ``hold``, which a try without waiting was turned away from,
        may stay with the process for the next of its threads: its lease is renewed and
        surely runs, and the kept cohort's bound is not reached."""
        now = time.monotonic()
        if (
            not hold.lost
            and hold.lease is not None
            and now < hold.live_until
            and hold.handoffs < self._backend.MAX_HANDOFFS
        ):
            if not hold.cohort:
                hold.cohort_began = now
            return hold.cohort < COHORT_LIMIT and now - hold.cohort_began < KEPT_COHORT_TIME
        return False
