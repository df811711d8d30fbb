"""Tier 1: the per-manager registry of keys held or awaited by threads of this process.

Only the thread that has *claimed* a key talks to the backend for it; every other
thread of the process that wants the key waits here in a first-come-first-served
queue and is woken alone, when the claim is handed to it. An entry exists only while
a key is claimed (held, or being acquired from the backend) so memory stays flat
however many keys a process touches, and no primitive is ever shared by two keys.

What the current thread holds lives in thread-local storage. Ownership is the
identity of that storage, not ``threading.get_ident()``, which the OS may hand to a
new thread once the old one has exited.
"""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

from .errors import NotHeldError
from .stats import Counters

__all__ = ["Registry"]

H = TypeVar("H")


class _Thread(Generic[H]):
    """One thread's view: the entries it has claimed."""

    __slots__ = ("claimed",)

    def __init__(self) -> None:
        self.claimed: dict[str, _Entry[H]] = {}


class _Waiter(Generic[H]):
    """A parked thread; ``wake`` hands it the claim."""

    __slots__ = ("_gate", "thread")

    def __init__(self, thread: _Thread[H]) -> None:
        self.thread = thread
        self._gate = threading.Lock()
        self._gate.acquire()

    def wait(self, timeout: float | None) -> bool:
        return self._gate.acquire(timeout=-1 if timeout is None else timeout)

    def wake(self) -> None:
        self._gate.release()


class _Entry(Generic[H]):
    """One claimed key: its claimant, reentrancy depth, backend hold and queue."""

    __slots__ = ("claimant", "depth", "hold", "waiters")

    def __init__(self, claimant: _Thread[H]) -> None:
        self.claimant = claimant
        self.depth = 0  # 0 while the claimant is still acquiring from the backend
        self.hold: H | None = None
        self.waiters: collections.deque[_Waiter[H]] = collections.deque()


class Registry(Generic[H]):
    """Claims, holds and hand-offs for one manager's keys.

    A thread moves through ``claim`` (wait in line, then own the right to ask the
    backend), ``settle`` (the backend said yes) or ``unclaim`` (it said no), then
    ``exit`` and ``unclaim`` on its last release.
    """

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self.reset()

    def reset(self) -> None:
        """Forget every claim; used in a forked child, which holds nothing."""
        self._mutex = threading.Lock()
        self._entries: dict[str, _Entry[H]] = {}
        self._local = threading.local()

    def _thread(self) -> _Thread[H]:
        try:
            thread: _Thread[H] = self._local.thread
        except AttributeError:
            thread = self._local.thread = _Thread()
        return thread

    def hold(self, key: str) -> H | None:
        """The calling thread's hold of ``key``, if it has one."""
        entry = self._thread().claimed.get(key)
        return entry.hold if entry is not None and entry.depth else None

    def is_held(self, key: str) -> bool:
        """Whether some thread of this registry holds ``key``."""
        entry = self._entries.get(key)
        return entry is not None and entry.depth > 0

    def reenter(self, key: str) -> bool:
        """Count one more acquisition if the calling thread already holds ``key``."""
        entry = self._thread().claimed.get(key)
        if entry is None or not entry.depth:
            return False
        entry.depth += 1
        return True

    def claim(self, key: str, timeout: float | None) -> bool:
        """Become the one thread that may acquire ``key`` from the backend.

        Waits in line up to ``timeout`` seconds (``None``: no limit, ``0``: no wait).
        """
        thread = self._thread()
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(thread)
                thread.claimed[key] = entry
                return True
            if timeout == 0:
                return False
            waiter: _Waiter[H] = _Waiter(thread)
            entry.waiters.append(waiter)
        self._counters.add("local_waits")
        if waiter.wait(timeout):
            return True
        with self._mutex:
            if entry.claimant is thread:
                return True  # handed over just as the wait ran out
            entry.waiters.remove(waiter)
            return False

    def settle(self, key: str, hold: H) -> None:
        """Record that the claimant now holds ``key``."""
        entry = self._thread().claimed[key]
        entry.hold = hold
        entry.depth = 1

    def exit(self, key: str) -> H | None:
        """Count one release; return the hold when it was the last one.

        :raises NotHeldError: the calling thread does not hold ``key``.
        """
        entry = self._thread().claimed.get(key)
        if entry is None or not entry.depth:
            raise NotHeldError(key)
        entry.depth -= 1
        return None if entry.depth else entry.hold

    def unclaim(self, key: str) -> None:
        """Give up the claim on ``key``: hand it to the next waiter, or drop the entry."""
        entry = self._thread().claimed.pop(key)
        entry.hold = None
        entry.depth = 0
        with self._mutex:
            if entry.waiters:
                waiter = entry.waiters.popleft()
                entry.claimant = waiter.thread
                waiter.thread.claimed[key] = entry
                waiter.wake()
            else:
                del self._entries[key]

    def __len__(self) -> int:
        """How many keys are claimed now."""
        return len(self._entries)
