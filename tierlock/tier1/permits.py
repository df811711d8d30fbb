"""Semaphores: ``Semaphore``, the handle, and ``Permits``, tier 1 for permits.

Each permit is a hold of its own in the backend (one of the key's slots), with a lease,
renewal and ``on_lost`` like any hold. In a process, threads that want permits of a key
queue first come, first served; only the thread at the head asks the backend (the one
poller of the key), and the next one asks once it has a permit or gives up. A try
without waiting takes no place in the queue: it asks the backend once, at once.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING

from ..errors import LockError, LockLostError, NotHeldError
from ..keys import permit_key
from ..records import Hold, Owner
from .pollers import poll, reporting, shared_holds

if TYPE_CHECKING:
    from .tiers import OnLost, Tiers

__all__ = ["Permits"]


class _Line:
    """Threads of the process waiting for permits of one key, in arrival order."""

    __slots__ = ("changed", "permits", "queue")

    def __init__(self, mutex: threading.Lock, permits: int) -> None:
        self.changed = threading.Condition(mutex)
        self.queue: collections.deque[object] = collections.deque()
        self.permits = permits  # the count its threads agree on


class Permits:
    """Permits of one manager's threads; see the module docstring."""

    def __init__(self, tiers: Tiers) -> None:
        self._tiers = tiers
        self.reset()

    def reset(self) -> None:
        """Forget every permit; used in a forked child, which holds nothing."""
        self._mutex = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self._held: dict[str, int] = {}  # permits held in the process, by key
        self._local = threading.local()

    def _holds(self, key: str) -> list[Hold]:
        """The calling thread's permits of ``key``, the latest last."""
        try:
            holds: dict[str, list[Hold]] = self._local.holds
        except AttributeError:
            holds = self._local.holds = {}
        return holds.setdefault(key, [])

    def acquire(
        self,
        key: str,
        permits: int,
        ttl: float,
        renew: bool,
        on_lost: OnLost | None,
        wait: float | None,
    ) -> bool:
        tiers = self._tiers
        tiers.check_thread(key)
        deadline = None if wait is None else time.monotonic() + wait
        ticket = object() if wait != 0 else None  # (a try without waiting takes no turn)
        line = self._line_up(key, permits, ticket)
        try:
            if ticket is not None and not self._turn(key, line, ticket, deadline):
                return False
            hold = self._take(key, permits, (ttl, renew, on_lost), deadline)
            if hold is None:
                return False
            self._holds(key).append(hold)
            with self._mutex:
                self._held[key] = self._held.get(key, 0) + 1
            tiers.heartbeat.add(hold)
            tiers.counters.acquired(key, 0.0)
            return True
        finally:
            with self._mutex:
                if ticket is not None:
                    line.queue.remove(ticket)
                    line.changed.notify_all()
                if not line.queue and not self._held.get(key) and self._lines.get(key) is line:
                    del self._lines[key]

    def _line_up(self, key: str, permits: int, ticket: object | None) -> _Line:
        """The key's line, joined with ``ticket`` if given; refuses another count."""
        with self._mutex:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = _Line(self._mutex, permits)
            elif line.permits != permits:
                raise ValueError(
                    f"semaphore {key!r} asked for with permits={permits}, but this "
                    f"process uses it with permits={line.permits}"
                )
            if ticket is not None:
                line.queue.append(ticket)
            return line

    def _turn(self, key: str, line: _Line, ticket: object, deadline: float | None) -> bool:
        """Wait until ``ticket`` heads ``line``; ``False`` if ``deadline`` came first."""
        with self._mutex:
            while line.queue[0] is not ticket:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                line.changed.wait(remaining)
                self._tiers.check_open(key)
        return True

    def _take(
        self,
        key: str,
        permits: int,
        options: tuple[float, bool, OnLost | None],
        deadline: float | None,
    ) -> Hold | None:
        """Poll the backend for a permit of ``key`` until ``deadline``."""
        tiers = self._tiers
        shared = shared_holds(tiers.backend, key)
        ttl, renew, on_lost = options
        owner = Owner.current()
        lease = ttl if renew else None
        sent = 0.0

        def try_once(limit: float | None) -> tuple[str, int] | None:
            nonlocal sent
            sent = time.monotonic()
            return shared.try_permit(key, permits, owner, ttl, lease, limit)

        try:
            check = lambda: tiers.check_open(key)  # noqa: E731
            taken = poll(tiers.backend, key, try_once, deadline, tiers.poll_interval, check)
        except BaseException as exc:
            self._discard(key, permits, owner.owner_id, certain=not isinstance(exc, LockError))
            raise
        if taken is None:
            return None
        row, token = taken
        return Hold(row, owner, token, ttl, renew, sent, reporting(key, on_lost))

    def _discard(self, key: str, permits: int, owner_id: str, *, certain: bool) -> None:
        """An interrupted try may have taken any slot: sweep each for ``owner_id``."""
        for slot in range(permits):
            self._tiers.backend.discard(permit_key(key, slot), owner_id, certain=certain)

    def release(self, key: str) -> None:
        holds = self._holds(key)
        if not holds:
            raise NotHeldError(key)
        hold = holds.pop()
        tiers = self._tiers
        tiers.counters.add("releases")
        tiers.heartbeat.remove(hold)
        try:
            # (a hold out of lease is lost; its row, if still ours, goes too)
            believed = hold.alive()
            released = tiers.backend.release(hold.key, hold.owner_id, hold.live_until) and believed
        finally:
            with self._mutex:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]
                line = self._lines.get(key)
                if line is not None:
                    if line.queue:
                        line.changed.notify_all()
                    elif key not in self._held:
                        del self._lines[key]
        if not released:
            if not hold.lost:
                tiers.heartbeat.lost(hold, "its row was gone before its release", sweep=False)
            raise LockLostError(key, hold.token)

    def latest(self, key: str) -> Hold | None:
        holds = self._holds(key)
        return holds[-1] if holds else None

    def extend(self, key: str, ttl: float) -> None:
        hold = self.latest(key)
        if hold is None:
            raise NotHeldError(key)
        tiers = self._tiers
        for each in self._holds(key):
            tiers.heartbeat.ensure_alive(each, key, "it could be extended")
            lease = None if each.lease is None else ttl
            sent = time.monotonic()
            if not tiers.backend.extend(each.key, each.owner_id, ttl, lease):
                tiers.heartbeat.lost(each, "its row was gone before it could be extended")
                raise LockLostError(key, each.token)
            if not tiers.heartbeat.extended(each, sent, ttl):
                raise LockLostError(key, each.token)

    def close(self) -> None:
        """Wake every waiting thread, to find the manager closed."""
        with self._mutex:
            for line in self._lines.values():
                line.changed.notify_all()

    def count(self, key: str) -> int:
        """Permits of ``key`` held in this process."""
        return self._held.get(key, 0)
