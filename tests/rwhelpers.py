"""What the read/write lock and semaphore tests share: holder threads, bounded waits and
what the lock table holds of a key.

Threads are synchronised with events and barriers; ``acquire(timeout=SHORT)`` returning
False is how a test sees that something is excluded, and every other wait is bounded by
``LONG``, so that a hang becomes a failure instead of a stuck run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeAlias, TypeVar, Union

import pytest
from conftest import MakeManager

import tierlock

T = TypeVar("T")
Handle: TypeAlias = Union["tierlock.Lock", "tierlock.ReadLock", "tierlock.Semaphore"]

# A wait no test should ever reach: bounds every blocking call, so a hang is a failure.
LONG = 30.0
# How long an excluded acquire waits before it gives up.
SHORT = 0.2

# Every thread on one manager (tier 1), or each on a manager of its own (tier 2).
SPREAD = pytest.mark.parametrize(
    "spread",
    ["one-manager", "manager-per-thread"],
    ids=["tier1", "tier2"],
)


def in_thread(func: Callable[[], T]) -> T:
    """``func()`` run in a new thread: its result returned, or its exception raised here."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(func())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LONG)
    assert not thread.is_alive(), f"still running after {LONG:g} s"
    if errors:
        raise errors[0]
    return results[0]


class Holder:
    """A thread that acquires ``handle`` and holds it until ``finish()``."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.held = threading.Event()
        self.token: int | None = None
        self.owned: bool | None = None
        self._done = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            assert self.handle.acquire(timeout=LONG), "not acquired in time"
            self.token = self.handle.token
            self.owned = self.handle.owned()
            self.held.set()
            assert self._done.wait(LONG), "never told to finish"
            self.handle.release()
        except BaseException as exc:
            self._errors.append(exc)
            self.held.set()  # (so that nobody waits for a hold that will not come)

    def start(self, *, wait: bool = True) -> Holder:
        self._thread.start()
        if wait:
            self.wait_held()
        return self

    def wait_held(self) -> None:
        assert self.held.wait(LONG), f"no hold after {LONG:g} s"
        if self._errors:
            raise self._errors[0]

    def finish(self) -> None:
        """Release, and raise what went wrong in the thread."""
        self._done.set()
        self._thread.join(LONG)
        assert not self._thread.is_alive(), f"still holding after {LONG:g} s"
        if self._errors:
            raise self._errors[0]


@pytest.fixture(name="hold")
def hold_fixture() -> Iterator[Callable[[Handle], Holder]]:
    """The fixture ``hold``: start holder threads; any left are told to finish when the
    test ends. (A test module imports it as ``hold_fixture``, which the parameter
    ``hold`` of its tests does not shadow.)"""
    started: list[Holder] = []

    def start(handle: Handle) -> Holder:
        holder = Holder(handle)
        started.append(holder)
        return holder

    yield start
    for holder in started:
        holder._done.set()


def rows(manager: tierlock.LockManager, key: str) -> list[tuple[str, str]]:
    """(key, mode) of every live row of ``key``, sorted (``holders()`` also lists rows
    whose lease has ended until they are reaped or taken over)."""
    return sorted(
        (info.key, info.mode) for info in manager.holders() if info.key == key and not info.expired
    )


def rows_of(make_manager: MakeManager, key: str) -> list[tierlock.LockInfo]:
    """Every row of ``key`` (expired ones too), as a fresh manager on the table sees them."""
    return [info for info in make_manager().holders() if info.key == key]


def times_out(handle: Handle, timeout: float = SHORT) -> bool:
    """Whether ``handle.acquire(timeout=timeout)`` waited out its timeout and failed."""
    started = time.monotonic()
    acquired = handle.acquire(timeout=timeout)
    elapsed = time.monotonic() - started
    if acquired:
        handle.release()
        return False
    assert timeout * 0.9 <= elapsed < timeout + 10, f"gave up after {elapsed:.3f} s"
    return True


def takes(handle: Handle, timeout: float = 5.0) -> bool:
    """Whether ``handle`` could be acquired (within ``timeout``); released again."""
    if not handle.acquire(timeout=timeout):
        return False
    handle.release()
    return True
