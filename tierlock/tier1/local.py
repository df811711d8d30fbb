"""Tier 1: the per-manager registry of keys held or awaited by threads of this process.

Only the thread that has *claimed* a key talks to the backend for it; every other
thread of the process that wants the key waits here in a first-come-first-served
queue and is woken alone, when the claim is handed to it. An entry exists only while
a key is claimed (held, or being acquired from the backend) so memory stays flat
however many keys a process touches, and no primitive is ever shared by two keys.

What the current thread holds lives in thread-local storage. Ownership is the
identity of that storage, not ``threading.get_ident()``, which the OS may hand to a
new thread once the old one has exited.

A waiter may leave at any moment: its wait times out, or a signal handler raises in
it. Every change of a waiter's state happens under the registry's mutex, so a hand-off
and a departure cannot cross unseen::

    releasing thread                          waiting thread
    successor(): chooses the waiter
    (the backend passes the row on)           interrupted: leave() marks it ABANDONED
    pass_on(): sees ABANDONED, takes the
    hold back and passes it on in turn        re-raises; it never held anything
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Generic, TypeVar

from ..errors import LockError, NotHeldError
from ..stats import Counters

__all__ = ["Registry", "Waiter"]

H = TypeVar("H")  # what a backend hold is
R = TypeVar("R")  # what a waiter asks for, for a hand-off to fill in

# The states of a waiter; each moves only forward, under the registry's mutex.
QUEUED = 0  # in its entry's queue
CHOSEN = 1  # taken from the queue by a releasing thread, whose hand-off is under way
WOKEN = 2  # the claim (and any hold made for it) is the waiter's
ABANDONED = 3  # it left the queue, or left once chosen: the releasing thread moves on
CLOSED = 4  # the registry was closed while it waited


class _Thread(Generic[H]):
    """One thread's view: the entries it has claimed."""

    __slots__ = ("claimed",)

    def __init__(self) -> None:
        self.claimed: dict[str, _Entry[H]] = {}


class Waiter(Generic[H, R]):
    """A parked thread; ``request`` is what a releasing thread may act on for it."""

    __slots__ = ("_gate", "request", "state", "thread")

    def __init__(self, thread: _Thread[H], request: R) -> None:
        self.thread = thread
        self.request = request
        self.state = QUEUED
        self._gate = threading.Lock()
        self._gate.acquire()

    def wait(self, timeout: float | None) -> bool:
        return self._gate.acquire(timeout=-1 if timeout is None else timeout)

    def wake(self) -> None:
        self._gate.release()


class _Entry(Generic[H]):
    """One claimed key: its reentrancy depth, backend hold and queue.

    A *kept* entry is claimed by no thread: its hold was released while threads of the
    process wanted the key, and waits a moment for the next of them (see ``keep``). A
    *releasing* entry is claimed by no thread either: its row is on its way back to the
    database, and a thread that claims the key meanwhile waits for that statement rather
    than meet the row and take the key for held elsewhere (see ``released``).
    """

    __slots__ = ("depth", "hold", "kept", "releasing", "turned_away", "waiters")

    def __init__(self) -> None:
        self.depth = 0  # 0 while the claimant is still acquiring from the backend
        self.hold: H | None = None
        self.waiters: collections.deque[Waiter[H, Any]] = collections.deque()
        self.kept = False
        self.releasing = False
        self.turned_away = False  # a try without waiting found it busy


class Registry(Generic[H, R]):
    """Claims, holds and hand-offs for one manager's keys.

    A thread moves through ``claim`` (wait in line, then own the right to ask the
    backend), ``settle`` (the backend said yes) or ``unclaim`` (it said no), then
    ``exit`` and ``unclaim`` on its last release. Instead of ``unclaim``, a releasing
    thread may take the next waiter with ``successor`` and hand it the claim, with
    a hold obtained on its behalf or none, with ``pass_on``.
    """

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self.reset()

    def reset(self) -> None:
        """Forget every claim; used in a forked child, which holds nothing."""
        self._mutex = threading.Lock()
        self._entries: dict[str, _Entry[H]] = {}
        self._local = threading.local()
        self._closed = False

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

    def claims(self, key: str) -> bool:
        """Whether the calling thread has claimed ``key`` (held or being acquired)."""
        return key in self._thread().claimed

    def turn_away(self, key: str) -> bool:
        """Whether some thread of this registry holds or asks for ``key``: a cheap check
        before a try without waiting, which could only fail. The entry remembers that
        it turned a thread away."""
        entry = self._entries.get(key)
        if entry is None or entry.kept or entry.releasing:
            return False
        entry.turned_away = True
        return True

    def turned_away(self, key: str) -> bool:
        """Whether a try without waiting found the calling thread's claim of ``key`` busy."""
        return self._thread().claimed[key].turned_away

    def is_held(self, key: str) -> bool:
        """Whether some thread of this registry holds ``key``."""
        entry = self._entries.get(key)
        return entry is not None and entry.depth > 0

    def is_kept(self, key: str) -> bool:
        """Whether ``key``'s hold is kept for the next thread that claims it."""
        entry = self._entries.get(key)
        return entry is not None and entry.kept

    def depth(self, key: str) -> int:
        """How many times the calling thread holds ``key`` (0: not at all)."""
        entry = self._thread().claimed.get(key)
        return 0 if entry is None else entry.depth

    def reenter(self, key: str) -> bool:
        """Count one more acquisition if the calling thread already holds ``key``."""
        entry = self._thread().claimed.get(key)
        if entry is None or not entry.depth:
            return False
        entry.depth += 1
        return True

    def claim(self, key: str, timeout: float | None, request: R) -> bool:
        """Become the one thread that may acquire ``key`` from the backend.

        Waits in line up to ``timeout`` seconds (``None``: no limit, ``0``: no wait, but
        for the release statement of a releasing entry, which the key is free after);
        ``request`` is what a thread handing over the claim may act on. The claim may
        arrive with a hold already made for the caller: see ``hold``. Whatever ends
        the wait (a timeout, an exception raised in it), the queue stays consistent;
        only a waiter that was woken leaves with the claim, which its caller must then
        pass on if it does not return it.

        :raises LockError: the registry was closed while the caller waited.
        """
        thread = self._thread()
        waiter: Waiter[H, R] | None = None
        entry: _Entry[H] | None = None
        try:
            with self._mutex:
                if self._closed:
                    raise LockError("this LockManager is closed", key)
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = _Entry()
                    thread.claimed[key] = entry
                    return True
                if entry.kept:  # the claim arrives with the kept hold
                    entry.kept = False
                    entry.depth = 1
                    thread.claimed[key] = entry
                    return True
                if timeout == 0:
                    if not entry.releasing or entry.waiters:
                        return False
                    timeout = None  # (one statement's wait; the backend bounds it)
                waiter = Waiter(thread, request)
                entry.waiters.append(waiter)
            self._counters.add("local_waits")
            woken = waiter.wait(timeout)
        except BaseException:
            if waiter is not None and entry is not None:
                self._leave(entry, waiter)
            raise
        if not woken or waiter.state != WOKEN:
            with self._mutex:
                if waiter.state == CLOSED:
                    raise LockError("this LockManager was closed while waiting", key)
            return self._leave(entry, waiter)
        return True

    def _leave(self, entry: _Entry[H], waiter: Waiter[H, Any]) -> bool:
        """End ``waiter``'s wait; ``True`` if the claim reached it all the same."""
        with self._mutex:
            if waiter.state == WOKEN:
                return True
            if waiter.state == QUEUED and waiter in entry.waiters:
                entry.waiters.remove(waiter)
            if waiter.state != CLOSED:
                waiter.state = ABANDONED
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

    def drop_hold(self, key: str) -> None:
        """The calling thread keeps its claim of ``key`` but not the hold it came with."""
        entry = self._thread().claimed[key]
        entry.hold = None
        entry.depth = 0

    def keep(self, key: str) -> bool:
        """Give up the claim on ``key`` (released) but keep its hold in the entry for the
        next thread of the process that claims it; ``False`` if a thread waits already,
        which must get it from ``successor`` instead."""
        thread = self._thread()
        entry = thread.claimed[key]
        with self._mutex:
            if entry.waiters or self._closed:
                return False
            del thread.claimed[key]
            entry.kept = True
            return True

    def drop_kept(self, key: str, hold: H) -> bool:
        """Start releasing ``hold``, kept for ``key``, unless a thread has claimed it
        meanwhile; ``released`` must follow once its row is released."""
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None or not entry.kept or entry.hold is not hold:
                return False
            entry.kept, entry.hold, entry.releasing = False, None, True
            return True

    def released(self, key: str) -> None:
        """The row of releasing ``key`` left the database (or failed to): give the claim
        to the first thread that came meanwhile, or drop the entry."""
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None or not entry.releasing:
                return  # (closed, or forgotten in a forked child)
            entry.releasing = entry.turned_away = False  # (as a new entry would be)
            waiter = self._choose(key, entry)
        if waiter is not None:
            self.pass_on(key, waiter, None)

    def unclaim(self, key: str) -> None:
        """Give up the claim on ``key``: hand it to the next waiter, or drop the entry."""
        waiter = self.successor(key)
        if waiter is not None:
            self.pass_on(key, waiter, None)

    def successor(self, key: str, *, releasing: bool = False) -> Waiter[H, R] | None:
        """Give up the claim on ``key`` (held by the caller, released): choose the next
        waiter, who must then get it with ``pass_on``, or, if none waits, drop the entry,
        or with ``releasing`` leave it releasing until ``released``."""
        entry = self._thread().claimed.pop(key)
        entry.hold = None
        entry.depth = 0
        with self._mutex:
            if releasing and not entry.waiters and not self._closed:
                entry.releasing = True
                return None
            return self._choose(key, entry)

    def _choose(self, key: str, entry: _Entry[H]) -> Waiter[H, R] | None:
        if not entry.waiters:
            del self._entries[key]
            return None
        waiter = entry.waiters.popleft()
        waiter.state = CHOSEN
        return waiter

    def pass_on(self, key: str, waiter: Waiter[H, R], hold: H | None) -> bool:
        """Wake ``waiter``, chosen by ``successor``, with the claim and, if given, ``hold``.

        Never raises. If the waiter left meanwhile, the claim goes to the next waiter
        (or the entry is dropped) when there is no hold; a hold made for it comes back
        to the caller, who holds the claim again and returns ``False``: it must pass
        the hold on in turn.
        """
        with self._mutex:
            entry = self._entries[key]
            while waiter.state == ABANDONED:
                if hold is not None:
                    self._thread().claimed[key] = entry
                    entry.hold = hold
                    return False
                chosen = self._choose(key, entry)
                if chosen is None:
                    return True
                waiter = chosen
            if hold is not None:
                entry.hold = hold
                entry.depth = 1
            waiter.thread.claimed[key] = entry
            waiter.state = WOKEN
            waiter.wake()
            return True

    def close(self) -> list[H]:
        """Refuse new claims and send every waiter away with ``LockError``; holders
        keep their holds. Returns the kept holds, which are forgotten."""
        kept: list[H] = []
        with self._mutex:
            self._closed = True
            for key, entry in list(self._entries.items()):
                if entry.kept and entry.hold is not None:
                    kept.append(entry.hold)
                    del self._entries[key]
                while entry.waiters:
                    waiter = entry.waiters.popleft()
                    waiter.state = CLOSED
                    waiter.wake()
        return kept

    def __len__(self) -> int:
        """How many keys are claimed now."""
        return len(self._entries)
