"""Semaphores: ``Permits``, tier 1 for permits.

Each permit is a hold of its own in the backend (one of the key's slots), with a lease,
renewal and ``on_lost`` like any hold. In a process, threads that want permits of a key
queue first come, first served; only the thread at the head asks the backend (the one
poller of the key). A try without waiting takes no place in the queue: it asks the
backend once, at once.

The process holds its permits: a thread that releases one while another thread of the
process waits in the line passes it on in memory, with no statement (its fencing token
one higher, the heartbeat writing the new holder into the row, as for an exclusive
hold's hand-off), within a cohort bounded as the exclusive hold's while other processes
may be waiting (``cohorts``). Only then does the slot go back to the database, and the
next local waiter lets the other processes try first. So statements follow only the net
change of the process's permits.

A pass reaches a waiter that waits on its own condition in the line: any thread behind
the head, and the head between its tries while the process holds permits of the key (a
release of one wakes it). With none held, the head pauses on the backend's doorbell
instead, which only a release in the database rings, so nothing is passed to it then.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from typing import TYPE_CHECKING

from ..backends import Doorbell, LockBackend
from ..errors import LockError, LockLostError, NotHeldError
from ..keys import permit_key
from ..records import Hold, Owner
from .cohorts import COURTESY_PAUSE
from .passing import Request, pass_locally, passes_locally
from .pollers import reporting, shared_holds, unlocked
from .tiers import FIRST_POLL

if TYPE_CHECKING:
    from .tiers import OnLost, Tiers

__all__ = ["Permits"]

logger = logging.getLogger(__name__)


class _Want:
    """A thread in a line: what it asks for, the permit passed to it, if any, and the
    condition it waits on, which wakes it alone."""

    __slots__ = ("listening", "passed", "request", "woken")

    def __init__(self, request: Request, mutex: threading.Lock) -> None:
        self.request = request
        self.passed: Hold | None = None
        self.listening = True  # it waits on ``woken``, where a pass reaches it
        self.woken = threading.Condition(mutex)


class _Line:
    """Threads of the process waiting for permits of one key, in arrival order."""

    __slots__ = ("courteous_until", "permits", "queue")

    def __init__(self, permits: int) -> None:
        self.queue: collections.deque[_Want] = collections.deque()
        self.permits = permits  # the count its threads agree on
        self.courteous_until = 0.0  # the head lets other processes try first until then


class _Tries:
    """When the head of a line may ask the backend again, and the doorbell it pauses on
    while the process has no permit of the key to pass."""

    __slots__ = ("_backend", "_doorbell", "_key", "_pause", "_poll_interval", "next_try")

    def __init__(self, backend: LockBackend, key: str, poll_interval: float) -> None:
        self._backend, self._key, self._poll_interval = backend, key, poll_interval
        self._doorbell: Doorbell | None = None
        self._pause = FIRST_POLL
        self.next_try = 0.0

    def arm(self) -> None:
        if self._doorbell is not None:
            self._doorbell.arm()

    def missed(self) -> None:
        """A try found every permit taken: the next waits a jittered, doubling pause."""
        pause = self._pause
        self.next_try = time.monotonic() + random.uniform(pause / 2, pause)
        self._pause = min(pause * 2, self._poll_interval)

    def pause(self, seconds: float) -> None:
        """Wait on the doorbell up to ``seconds``; try at once if it rings."""
        if self._doorbell is None:
            self._doorbell = self._backend.doorbell(self._key)
        if self._doorbell.wait(seconds):
            self.next_try = 0.0

    def close(self) -> None:
        if self._doorbell is not None:
            self._doorbell.close()


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

    # -- acquire -------------------------------------------------------------------

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
        request = Request(Owner.current(), ttl, renew, reporting(key, on_lost))
        # (a try without waiting takes no turn)
        want = _Want(request, self._mutex) if wait != 0 else None
        line = self._line_up(key, permits, want)
        hold: Hold | None = None
        try:
            if want is None:
                hold = self._try(key, permits, request, deadline)
            else:
                hold = self._wait(key, line, want, deadline)
            if hold is None:
                return False
            self._holds(key).append(hold)
        except BaseException:
            if hold is None and want is not None:
                hold = want.passed  # (passed just as the wait was cut short)
            if hold is not None and hold not in self._holds(key):
                self._give_back_quietly(key, hold)
            raise
        finally:
            self._leave(key, line)
        tiers.counters.acquired(key, 0.0)
        return True

    def _line_up(self, key: str, permits: int, want: _Want | None) -> _Line:
        """The key's line, joined with ``want`` if given; refuses another count."""
        with self._mutex:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = _Line(permits)
            elif line.permits != permits:
                raise ValueError(
                    f"semaphore {key!r} asked for with permits={permits}, but this "
                    f"process uses it with permits={line.permits}"
                )
            if want is not None:
                line.queue.append(want)
            return line

    def _leave(self, key: str, line: _Line) -> None:
        """Drop ``line`` once nobody waits in it and the process holds no permit."""
        with self._mutex:
            if not line.queue and not self._held.get(key) and self._lines.get(key) is line:
                del self._lines[key]

    def _wait(self, key: str, line: _Line, want: _Want, deadline: float | None) -> Hold | None:
        """Wait in ``line`` until a permit is passed to ``want`` or, at the head, the
        backend grants one; ``None`` once ``deadline`` has passed. ``want`` leaves the
        line however this ends."""
        tries = _Tries(self._tiers.backend, key, self._tiers.poll_interval)
        try:
            with self._mutex:
                try:
                    return self._wait_in_line(key, line, want, deadline, tries)
                finally:
                    line.queue.remove(want)
                    want.listening = False
                    if line.queue:
                        line.queue[0].woken.notify()  # (it may head the line now)
        finally:
            tries.close()

    def _wait_in_line(
        self, key: str, line: _Line, want: _Want, deadline: float | None, tries: _Tries
    ) -> Hold | None:
        """``_wait``'s loop, under the mutex but while it asks the backend or sleeps."""
        while want.passed is None:
            now = time.monotonic()
            expired = deadline is not None and now >= deadline
            head = line.queue[0] is want
            ready = max(tries.next_try, line.courteous_until)
            if head and (now >= ready or expired):
                want.listening = False
                with unlocked(self._mutex):
                    tries.arm()
                    hold = self._try(key, line.permits, want.request, deadline)
                want.listening = True
                if hold is not None or expired:
                    return hold
                tries.missed()
                continue
            if expired:
                return None
            until = ready if head else None
            if deadline is not None:
                until = deadline if until is None else min(until, deadline)
            seconds = None if until is None else until - now
            if (
                seconds is not None
                and head
                and not self._held.get(key)
                and now >= line.courteous_until
            ):
                # Nothing of this process's to pass: only a release in the database
                # frees a permit, and its doorbell says when.
                want.listening = False
                with unlocked(self._mutex):
                    tries.pause(seconds)
                want.listening = True
            else:
                want.woken.wait(seconds)
            self._tiers.check_open(key)
        return want.passed

    def _try(self, key: str, permits: int, request: Request, deadline: float | None) -> Hold | None:
        """Ask the backend once for a permit of ``key``; the new hold is the process's."""
        tiers = self._tiers
        owner = request.owner
        sent = time.monotonic()
        limit = None if deadline is None else max(0.0, deadline - sent)
        lease = request.ttl if request.renew else None
        try:
            taken = shared_holds(tiers.backend, key).try_permit(
                key, permits, owner, request.ttl, lease, limit
            )
        except BaseException as exc:
            # An interrupted try may have taken any slot: sweep each for its owner.
            certain = not isinstance(exc, LockError)
            for slot in range(permits):
                tiers.backend.discard(permit_key(key, slot), owner.owner_id, certain=certain)
            raise
        if taken is None:
            return None
        row, token = taken
        hold = Hold(row, owner, token, request.ttl, request.renew, sent, request.on_lost)
        with self._mutex:
            self._held[key] = self._held.get(key, 0) + 1
        tiers.heartbeat.add(hold)
        return hold

    # -- release ---------------------------------------------------------------------

    def release(self, key: str) -> None:
        holds = self._holds(key)
        if not holds:
            raise NotHeldError(key)
        hold = holds.pop()
        self._tiers.counters.add("releases")
        self._let_go(key, hold)

    def _let_go(self, key: str, hold: Hold) -> None:
        """Pass ``hold``, a permit of ``key``, to the first thread of the process that
        waits for one and can take it, or give it back to the database."""
        tiers = self._tiers
        line = self._lines.get(key)
        if line is not None and line.queue and not hold.lost:
            if not tiers.cohorts.goes_on(hold, key):
                # The cohort ended while other processes may wait: they try first.
                line.courteous_until = time.monotonic() + COURTESY_PAUSE
            elif self._pass(line, hold):
                tiers.counters.add("local_handoffs")
                return
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
                        line.queue[0].woken.notify()  # (its poller may try now)
                    elif key not in self._held:
                        del self._lines[key]
        if not released:
            if not hold.lost:
                tiers.heartbeat.lost(hold, "its row was gone before its release", sweep=False)
            raise LockLostError(key, hold.token)

    def _pass(self, line: _Line, hold: Hold) -> bool:
        """Pass ``hold`` to the first thread of ``line`` that listens for a pass, if it
        may go to it in memory."""
        with self._mutex:
            for want in line.queue:
                if want.listening and want.passed is None:
                    if not passes_locally(hold, want.request):
                        return False
                    pass_locally(hold, want.request)
                    want.passed = hold
                    want.woken.notify()
                    return True
        return False

    def _give_back_quietly(self, key: str, hold: Hold) -> None:
        """Pass on or give back ``hold``, which an interrupted acquire got."""
        try:
            self._let_go(key, hold)
        except LockError as exc:
            logger.warning(
                "passing on a permit of %r after an interrupted acquire failed: %s", key, exc
            )

    # -- what a thread holds -----------------------------------------------------------

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
                for want in line.queue:
                    want.woken.notify()

    def count(self, key: str) -> int:
        """Permits of ``key`` held in this process."""
        return self._held.get(key, 0)
