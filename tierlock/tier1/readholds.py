"""The read holds of a process, one per key, that its reader threads share (``reading``
says how they join them), and those it keeps between readers.

A reader joins the process's hold with no statement only while the group is known
open: within ``JOIN_WINDOW`` of the last time it was. Joining without a statement could
otherwise keep a key read-held by the process for ever and starve a writer elsewhere,
who can only close the group in the database. Where the backend tells of every
writer's mark as it comes (``LockBackend.marks_heard_since``: PostgreSQL's listener),
a mark closes the hold at once, and the group stays known open for ``HEARD_WINDOW``
instead, as long as the backend has heard since before the database last said so.

A key the process reads again and again keeps its read hold between readers: when the
last reader of a hold leaves and the process's previous hold of the key ended less
than ``READ_AGAIN`` before this one began, the process keeps the hold (renewed, held by
no thread) while the group is known open, and the next reader joins it with no
statement. So keeping adds nothing to what a writer waits for. A kept hold goes back
to the backend, from a thread of the manager's, when the window ends with no reader
in it, or at once when the backend tells of a writer's mark on the key (PostgreSQL:
``LockBackend.watch_wanted``); a thread of the process that asks for the write hold
ends it first, rather than wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import LockError
from ..memories import remember
from ..records import Hold
from .later import Later
from .pollers import shared_holds, unlocked

if TYPE_CHECKING:
    from .tiers import Tiers

__all__ = ["HEARD_WINDOW", "JOIN_WINDOW", "READ_AGAIN", "KeyReads", "ProcessReads"]

logger = logging.getLogger(__name__)

# How long after the group was last known open a reader joins the process's read hold
# with no statement: this bounds how long readers of the process keep a waiting writer
# out, on top of the longest read critical section.
JOIN_WINDOW = 0.05
# The same where the backend has told of every writer's mark since the database said
# the group open (a mark then closes it at once): this bounds only what a listener that
# fails without a word could keep a writer out.
HEARD_WINDOW = 1.0
# How long after a writer's mark was last heard of or seen a reader asks again
# whether the group it closed takes readers: the writer may have given up.
REOPEN_AFTER = 0.25
# A read hold whose last reader leaves is kept for the next one when the process's
# previous hold of the key ended less than this long before it began.
READ_AGAIN = 0.1


class KeyReads:
    """One key's readers in this process, and its read hold."""

    __slots__ = (
        "asked_at",
        "changed",
        "closed",
        "closed_at",
        "group",
        "hold",
        "hot",
        "keep_due",
        "open_at",
        "polling",
        "readers",
        "tries",
        "waiting",
    )

    def __init__(self, mutex: threading.Lock) -> None:
        self.changed = threading.Condition(mutex)
        self.readers = 0  # threads inside, through ``hold``
        self.hold: Hold | None = None  # the process's read hold
        self.group = 0  # the backend's group of readers that ``hold`` joined
        self.open_at = 0.0  # time.monotonic() when the group was last known open
        self.asked_at = 0.0  # when the statement that said so was sent
        self.closed_at = 0.0  # when a writer's mark was last heard of, or seen
        self.closed = False  # a writer waits: no more joining
        self.polling = False  # a thread is asking the backend
        self.waiting = 0  # threads waiting here
        self.tries = 0  # questions to the backend answered so far
        self.hot = False  # the key was read again soon after the last hold: keep this one
        self.keep_due = False  # a call to end the kept hold is due

    def known_open(self, heard_since: Callable[[], float | None]) -> bool:
        """Whether a reader may join ``hold`` with no statement; ``heard_since``:
        ``ProcessReads.heard_since``, asked only once the join window has passed."""
        now = time.monotonic()
        return now - self.open_at < JOIN_WINDOW or now < self.open_until(heard_since())

    def open_until(self, heard_since: float | None) -> float:
        """Until when (``time.monotonic()``) the group is known open: ``HEARD_WINDOW``
        after the database last said so if every writer's mark since the statement that
        said so was heard, and none was; else ``JOIN_WINDOW`` (never less)."""
        asked = self.asked_at
        heard = heard_since is not None and heard_since <= asked and self.closed_at < asked
        return self.open_at + (max(HEARD_WINDOW, JOIN_WINDOW) if heard else JOIN_WINDOW)

    def opened(self, asked_at: float) -> None:
        """The database said the group open, to a statement sent at ``asked_at``."""
        self.open_at = time.monotonic()
        self.asked_at = asked_at
        self.closed = False

    def close_if_gone(self) -> None:
        """A hold lost, or out of lease, takes no more readers: those in it drain, and
        the next asks the backend."""
        hold = self.hold
        if hold is not None and (hold.lost or not hold.alive()):
            self.closed = True

    def shut(self) -> None:
        """A writer's mark keeps the group closed to new readers."""
        self.closed = True
        self.closed_at = time.monotonic()

    def reopen_in(self) -> float | None:
        """For a good hold closed to readers by a writer's mark, in how long to ask
        again whether the group takes readers (the writer may have given up, and its
        mark ended); ``None`` if not."""
        hold = self.hold
        if not self.closed or self.polling or hold is None or hold.lost or not hold.alive():
            return None
        return max(self.closed_at + REOPEN_AFTER - time.monotonic(), 0.0)

    @property
    def kept(self) -> bool:
        """The process keeps its hold for its next reader: none is in it or asking."""
        return self.hold is not None and not self.readers and not self.polling

    @property
    def unused(self) -> bool:
        return not (self.readers or self.waiting or self.polling or self.hold)


class ProcessReads:
    """The read holds of one manager, by key, under one mutex; see the module docstring."""

    def __init__(self, tiers: Tiers) -> None:
        self._tiers = tiers
        self.reset()

    def reset(self) -> None:
        """Forget every read hold; used in a forked child, which holds nothing."""
        self.mutex = threading.Lock()
        self.keys: dict[str, KeyReads] = {}
        self._left_at: dict[str, float] = {}  # when the process's last hold of a key ended
        self._later = Later("tierlock-reads")  # ends kept holds no reader joined in time
        self._watching = False  # the backend tells of marks of keys wanted

    def entry(self, key: str) -> KeyReads:
        """``key``'s entry, made if need be; with the mutex held."""
        entry = self.keys.get(key)
        if entry is None:
            entry = self.keys[key] = KeyReads(self.mutex)
        return entry

    def drop_if_unused(self, key: str, entry: KeyReads) -> None:
        if entry.unused and self.keys.get(key) is entry:
            del self.keys[key]

    def heard_since(self) -> float | None:
        """Since when the backend has told of every writer's mark (``None``: it does not
        now); see ``KeyReads.open_until``."""
        return self._tiers.backend.marks_heard_since() if self._watching else None

    def install(self, key: str, entry: KeyReads, hold: Hold, group: int) -> None:
        """``hold`` of ``group``, just got, is the process's, with one reader in it."""
        if not self._watching:
            self._watching = True
            self._tiers.backend.watch_wanted(self._wanted)
        entry.hold, entry.group = hold, group
        entry.opened(hold.confirmed)
        entry.hot = entry.open_at - self._left_at.get(key, -READ_AGAIN) < READ_AGAIN
        entry.readers += 1
        self._tiers.heartbeat.add(hold)

    def give_back(self, key: str, hold: Hold, group: int) -> bool:
        """Release the process's read hold ``hold`` in the backend; ``False`` if lost."""
        self._tiers.heartbeat.remove(hold)
        # (a hold out of lease is lost; its row, if still ours, goes too)
        believed = hold.alive()
        shared = shared_holds(self._tiers.backend, key)
        return shared.unshare(key, hold.owner_id, group, hold.live_until) and believed

    def end(self, key: str, entry: KeyReads, hold: Hold) -> bool:
        """Give back ``hold``, the process's read hold of ``key``, taken off ``entry``
        (which is marked ``polling`` meanwhile); ``False`` if it was lost."""
        released = False
        try:
            released = self.give_back(key, hold, entry.group)
        finally:
            with self.mutex:
                remember(self._left_at, key, time.monotonic())
                entry.polling = False
                entry.closed = False
                entry.changed.notify_all()
                self.drop_if_unused(key, entry)
        if not released and not hold.lost:
            self._tiers.heartbeat.lost(hold, "its row was gone before its release", sweep=False)
        return released

    # -- kept holds --------------------------------------------------------------------

    def keep(self, key: str, entry: KeyReads, hold: Hold) -> bool:
        """Whether the process keeps ``hold``, whose last reader leaves, for its next
        reader; with the mutex held."""
        until = entry.open_until(self.heard_since())
        if (
            not entry.hot
            or entry.closed
            or hold.lease is None  # (a fixed lease: the row is not renewed)
            or self._tiers.closed
            or until <= time.monotonic()
            or not hold.alive()
        ):
            return False
        if not entry.keep_due:
            if not self._later.at(until, lambda: self._kept_ended(key, entry)):
                return False  # (closing)
            entry.keep_due = True
        hold.on_lost = None  # (held by no thread: nobody to tell)
        return True

    def end_kept(self, key: str, entry: KeyReads) -> None:
        """Give back ``entry``'s kept hold; with the mutex held, let go meanwhile."""
        hold = entry.hold
        assert hold is not None
        entry.hold = None
        entry.polling = True  # (no other thread asks the backend until this is done)
        with unlocked(self.mutex):
            self.end(key, entry, hold)

    def end_kept_now(self, key: str) -> None:
        """Give back the hold of ``key`` the process keeps, if it keeps one."""
        if key not in self.keys:  # (the common case, asked on every write acquire)
            return
        with self.mutex:
            entry = self.keys.get(key)
            if entry is not None and entry.kept:
                self.end_kept(key, entry)

    def _wanted(self, key: str) -> None:
        """The backend heard a mark of ``key`` wanted elsewhere, or a writer's mark: no
        reader joins the process's hold any more, and a kept one goes back at once."""
        with self.mutex:
            entry = self.keys.get(key)
            if entry is None:
                return
            entry.closed_at = time.monotonic()  # (a hold being asked for is not known open)
            if entry.hold is None:
                return
            entry.shut()
            if entry.kept:
                self._later.at(0.0, lambda: self._kept_ended(key, entry))

    def _kept_ended(self, key: str, entry: KeyReads) -> None:
        """The time of ``entry``'s kept hold may be up: give it back unless a reader
        joined it, or the group was known open since (then its end is due later)."""
        with self.mutex:
            entry.keep_due = False
            hold = entry.hold
            if hold is None or not entry.kept:
                return
            until = entry.open_until(self.heard_since())
            if time.monotonic() < until and not entry.closed and not hold.lost:
                entry.keep_due = self._later.at(until, lambda: self._kept_ended(key, entry))
                return
            self.end_kept(key, entry)

    def close(self) -> None:
        """Give back the holds the process keeps, and wake every waiting thread, to
        find the manager closed."""
        self._later.stop()  # (a kept hold being given back is given back first)
        with self.mutex:
            for key, entry in list(self.keys.items()):
                entry.changed.notify_all()
                if entry.kept:
                    try:
                        self.end_kept(key, entry)
                    except LockError as exc:  # (its row expires with its lease)
                        logger.warning("giving back the kept read hold %r failed: %s", key, exc)
