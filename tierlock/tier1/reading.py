"""``Readers``: tier 1 for read holds (whose handle, ``ReadLock``, is in ``handles``).

Reader threads of one manager share one read hold of a key in the backend while they
overlap: the first asks the backend, and the others join it with no statement. One
thread at a time asks the backend for a key; readers that arrive meanwhile wait for
its answer and join the hold it gets. A reader joins freely only while the group is
known open (``readholds``, which also keeps holds between readers); after that, one
reader asks once whether a writer waits (and the window starts again). If one does, no
reader joins any more: the process's readers drain, its read hold is released, and new
readers ask the backend, which makes them wait for the writer.

A thread that holds the key exclusively takes a read hold with no statement (it is
*covered* by the write hold); when it releases the write hold first, the hold becomes
a read hold of the process in the database without a moment in which the key is free
(a downgrade). A thread that holds only a read hold cannot take the write hold: it
would wait for itself.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..backends import SharedHolds
from ..errors import LockError, LockLostError, NotHeldError
from ..keys import reader_key
from ..records import Hold, Owner
from .pollers import poll, reporting, shared_holds, unlocked
from .readholds import KeyReads, ProcessReads

if TYPE_CHECKING:
    from .tiers import OnLost, Tiers

__all__ = ["Readers"]


class _Read:
    """One thread's read hold of a key: how deep, and whether its write hold covers it
    (then with the options for the read hold it becomes if the write hold ends)."""

    __slots__ = ("covered", "depth", "lost", "on_lost", "renew", "ttl")

    def __init__(
        self, covered: bool, ttl: float = 0.0, renew: bool = True, on_lost: OnLost | None = None
    ) -> None:
        self.depth = 1
        self.covered = covered
        self.lost = False
        self.ttl, self.renew, self.on_lost = ttl, renew, on_lost


class Readers:
    """Read holds of one manager's threads; see the module docstring."""

    def __init__(self, tiers: Tiers) -> None:
        self._tiers = tiers
        self._holds = ProcessReads(tiers)
        self.reset()

    def reset(self) -> None:
        """Forget every read hold; used in a forked child, which holds nothing."""
        self._holds.reset()
        self._mutex = self._holds.mutex
        self._local = threading.local()
        self._used = False  # no thread took a read hold yet: writers need not look

    def _reads(self) -> dict[str, _Read]:
        try:
            reads: dict[str, _Read] = self._local.reads
        except AttributeError:
            reads = self._local.reads = {}
        return reads

    def _shared(self, key: str) -> SharedHolds:
        return shared_holds(self._tiers.backend, key)

    # -- acquire -------------------------------------------------------------------

    def acquire(
        self, key: str, ttl: float, renew: bool, on_lost: OnLost | None, wait: float | None
    ) -> bool:
        tiers = self._tiers
        tiers.check_thread(key)
        self._used = True
        reads = self._reads()
        read = reads.get(key)
        if read is not None:
            read.depth += 1
            tiers.counters.acquired(key, 0.0, reentrant=True)
            return True
        if tiers.registry.hold(key) is not None:
            reads[key] = _Read(True, ttl, renew, on_lost)
            tiers.counters.acquired(key, 0.0)
            return True
        shared = self._shared(key)
        started = time.monotonic()
        deadline = None if wait is None else started + wait
        with self._mutex:
            entry = self._holds.entry(key)
            entry.waiting += 1
            try:
                options = (ttl, renew, on_lost)
                if not self._enter(key, entry, shared, options, started, deadline):
                    return False
            finally:
                entry.waiting -= 1
                self._holds.drop_if_unused(key, entry)
        reads[key] = _Read(False)
        tiers.counters.acquired(key, 0.0)
        return True

    def _enter(
        self,
        key: str,
        entry: KeyReads,
        shared: SharedHolds,
        options: tuple[float, bool, OnLost | None],
        started: float,
        deadline: float | None,
    ) -> bool:
        """Join ``entry``'s hold, or get one; called and returns with the mutex held.

        A try without waiting that finds another thread asking the backend waits for
        that one answer, as its own try would have."""
        tries = entry.tries
        while True:
            self._tiers.check_open(key)
            hold = entry.hold
            entry.close_if_gone()
            if entry.kept and entry.closed:
                self._holds.end_kept(key, entry)
                continue
            if hold is not None and not entry.closed:
                if entry.known_open(self._holds.heard_since):
                    self._join(key, entry, hold, options[2])
                    return True
                if not entry.polling:
                    self._recheck(key, entry, shared)
                    continue
            elif hold is None and not entry.polling:
                entry.polling = True
                try:
                    with unlocked(self._mutex):
                        got = self._take(key, entry, shared, options, deadline)
                finally:
                    entry.polling = False
                    entry.changed.notify_all()
                if got is None:
                    return False
                if entry.hold is not None:  # (a downgrade made one meanwhile)
                    with unlocked(self._mutex):
                        self._holds.give_back(key, *got)
                    continue
                self._holds.install(key, entry, *got)
                return True
            reopen_in = entry.reopen_in()
            if reopen_in == 0.0:
                self._recheck(key, entry, shared)  # (whether the writer gave up)
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if not (entry.polling and entry.tries == tries and deadline == started):
                    return False
                remaining = None  # (one answer: the backend's timeout bounds it)
            entry.changed.wait(_sooner(remaining, reopen_in))

    @staticmethod
    def _join(key: str, entry: KeyReads, hold: Hold, on_lost: OnLost | None) -> None:
        if not entry.readers:  # (a kept hold: this reader is the one told of its loss)
            hold.on_lost = reporting(key, on_lost)
        entry.readers += 1

    def _recheck(self, key: str, entry: KeyReads, shared: SharedHolds) -> None:
        """Ask whether ``entry``'s group still takes readers (called with the mutex
        held, which it lets go meanwhile)."""
        entry.polling = True
        asked = time.monotonic()
        try:
            with unlocked(self._mutex):
                still_open = shared.still_open(key, entry.group)
        finally:
            entry.polling = False
            entry.tries += 1
            entry.changed.notify_all()
        if still_open:
            entry.opened(asked)
        else:
            entry.shut()

    def _take(
        self,
        key: str,
        entry: KeyReads,
        shared: SharedHolds,
        options: tuple[float, bool, OnLost | None],
        deadline: float | None,
    ) -> tuple[Hold, int] | None:
        """Poll the backend for a read hold of ``key``: the hold and its group."""
        ttl, renew, on_lost = options
        tiers = self._tiers
        owner = Owner.current()
        lease = ttl if renew else None
        sent = 0.0

        def try_once(limit: float | None) -> tuple[Hold, int] | None:
            nonlocal sent
            sent = time.monotonic()
            share = shared.try_share(key, owner, ttl, lease, limit)
            if share is None:
                with self._mutex:
                    entry.tries += 1
                    entry.changed.notify_all()
                return None
            hold = Hold(reader_key(key, owner.owner_id), owner, share.token, ttl, renew, sent)
            hold.on_lost = reporting(key, on_lost)
            return hold, share.group

        try:
            return poll(
                tiers.backend,
                key,
                try_once,
                deadline,
                tiers.poll_interval,
                lambda: tiers.check_open(key),
            )
        except BaseException as exc:
            # A row may have been written whose reply never came.
            row = reader_key(key, owner.owner_id)
            tiers.backend.discard(row, owner.owner_id, certain=not isinstance(exc, LockError))
            raise

    # -- release -------------------------------------------------------------------

    def release(self, key: str) -> None:
        reads = self._reads()
        read = reads.get(key)
        if read is None:
            raise NotHeldError(key)
        self._tiers.counters.add("releases")
        read.depth -= 1
        if read.depth:
            return
        del reads[key]
        if read.covered:
            if read.lost:
                raise LockLostError(key)
            return
        with self._mutex:
            entry = self._holds.keys[key]
            hold = entry.hold
            assert hold is not None
            entry.readers -= 1
            if entry.readers:
                if hold.lost:
                    raise LockLostError(key, hold.token)
                return
            if self._holds.keep(key, entry, hold):
                return
            entry.hold = None
            entry.polling = True  # (no other thread asks the backend until this is done)
        if not self._holds.end(key, entry, hold):
            raise LockLostError(key, hold.token)

    # -- with the write hold -------------------------------------------------------

    def refuse_upgrade(self, key: str) -> None:
        """Raise if the calling thread holds only a read hold of ``key``."""
        if not self._used:
            return
        read = self._reads().get(key)
        if read is not None and not read.covered:
            raise LockError(
                f"this thread holds a read hold of {key!r} and asks for the write hold, which "
                "would wait for itself: release the read hold first",
                key,
            )
        self._holds.end_kept_now(key)  # (else it would keep this thread out)

    def downgrade(self, key: str) -> bool:
        """If the calling thread's last level of its write hold of ``key`` is released
        while it reads under it, turn the hold into a read hold; ``True`` if done."""
        if not self._used:
            return False
        read = self._reads().get(key)
        tiers = self._tiers
        registry = tiers.registry
        if read is None or not read.covered or registry.depth(key) != 1:
            return False
        hold = registry.exit(key)
        assert hold is not None
        tiers.heartbeat.remove(hold)
        reader = Owner.current()
        lease = read.ttl if read.renew else None
        sent = time.monotonic()
        try:
            share = None
            if not hold.lost:
                shared = self._shared(key)
                share = shared.downgrade(key, hold.owner_id, reader, read.ttl, lease)
        finally:
            # The next local writer asks the backend, where readers hold the key now.
            registry.unclaim(key)
            if hold.ring is not None:
                hold.ring()
        if share is None:
            read.lost = True
            tiers.heartbeat.lost(hold, "its row was gone before it became a read hold")
            raise LockLostError(key, hold.token)
        row = reader_key(key, reader.owner_id)
        mine = Hold(row, reader, share.token, read.ttl, read.renew, sent)
        mine.on_lost = reporting(key, read.on_lost)
        with self._mutex:
            self._holds.install(key, self._holds.entry(key), mine, share.group)
        read.covered = False
        return True

    # -- what a thread holds -------------------------------------------------------

    def _hold(self, key: str) -> tuple[_Read, Hold | None] | None:
        read = self._reads().get(key)
        if read is None:
            return None
        if read.covered:
            return read, None
        return read, self._holds.keys[key].hold

    def owned(self, key: str) -> bool:
        held = self._hold(key)
        if held is None or held[0].lost:
            return False
        hold = held[1]
        if hold is None:
            return self._tiers.owned(key)
        return hold.alive()

    def token(self, key: str) -> int | None:
        held = self._hold(key)
        if held is None:
            return None
        hold = held[1]
        return self._tiers.token(key) if hold is None else hold.token

    def extend(self, key: str, ttl: float) -> None:
        held = self._hold(key)
        if held is None:
            raise NotHeldError(key)
        read, hold = held
        if hold is None:
            self._tiers.extend(key, ttl)  # (the write hold covers the read hold)
            return
        if read.lost:
            raise LockLostError(key, hold.token)
        self._tiers.heartbeat.ensure_alive(hold, key, "it could be extended")
        lease = None if hold.lease is None else ttl
        sent = time.monotonic()
        if not self._shared(key).extend(key, hold.owner_id, ttl, lease):
            self._tiers.heartbeat.lost(hold, "its row was gone before it could be extended")
            raise LockLostError(key, hold.token)
        if not self._tiers.heartbeat.extended(hold, sent, ttl):
            raise LockLostError(key, hold.token)

    def close(self) -> None:
        self._holds.close()

    def is_held(self, key: str) -> bool:
        entry = self._holds.keys.get(key)
        return entry is not None and entry.readers > 0


def _sooner(wait: float | None, other: float | None) -> float | None:
    """The shorter of two waits (``None``: no limit)."""
    if other is None:
        return wait
    return other if wait is None else min(wait, other)
