"""Every way out of acquire and release is safe: a signal handler that raises in the
middle of a wait, a hand-off or a statement leaves no ghost holder, no stranded
waiter and no orphan row; neither does a hand-off whose outcome nobody could confirm.

Signals are delivered with ``signal.pthread_kill`` to the main thread (where Python
runs signal handlers) at a moment the test controls: once the main thread is parked
in tier 1, or once the fault proxy holds a given statement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import SERVERS, MakeManager
from interrupts import Interrupted, Steps, interrupting
from polling import wait_until
from proxy import Proxy

import tierlock
from tierlock.tier1 import cohorts

# Generous bounds for things that happen at once when the lock works; a ghost holder,
# a stranded waiter or an orphan row would keep them waiting for a 30 s lease.
PROMPTLY = 5.0
# Short enough for the tests that wait for a failing operation to give up.
DATABASE_TIMEOUT = 2.0


@pytest.fixture
def interrupt() -> Iterator[Callable[[Steps], None]]:
    """``interrupt(steps)``: see ``interrupts.interrupting``."""
    yield from interrupting(Interrupted)


def queued(locks: tierlock.LockManager, key: str, count: int) -> Callable[[], bool]:
    """Whether ``count`` threads wait in ``locks``'s tier 1 for ``key``."""

    def check() -> bool:
        entry = locks._tiers.registry._entries.get(key)
        return entry is not None and len(entry.waiters) == count

    return check


class Holder:
    """A thread of ``locks`` that holds ``key`` until told to release it."""

    def __init__(self, locks: tierlock.LockManager, key: str) -> None:
        self.lock = locks.lock(key)
        self.held = threading.Event()
        self.go = threading.Event()
        self.error: BaseException | None = None
        self.token: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.held.wait(PROMPTLY)

    def _run(self) -> None:
        assert self.lock.acquire(timeout=PROMPTLY)
        self.token = self.lock.token
        self.held.set()
        self.go.wait(60)
        try:
            self.lock.release()
        except BaseException as exc:
            self.error = exc

    def release(self) -> None:
        self.go.set()
        self.join()

    def join(self) -> None:
        self._thread.join(PROMPTLY + DATABASE_TIMEOUT * 3)
        assert not self._thread.is_alive()


class Waiter:
    """A thread of ``locks`` that waits for ``key``, holds it briefly and reports."""

    def __init__(self, locks: tierlock.LockManager, key: str) -> None:
        self.lock = locks.lock(key)
        self.got: bool | None = None
        self.token: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.got = self.lock.acquire(timeout=PROMPTLY)
            if self.got:
                self.token = self.lock.token
                self.lock.release()
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(PROMPTLY + DATABASE_TIMEOUT * 3)
        assert not self._thread.is_alive()


def assert_free_and_unhaunted(
    locks: tierlock.LockManager, other: tierlock.LockManager, key: str
) -> None:
    """No thread of ``locks`` holds ``key`` in secret: another manager takes it at once,
    and meanwhile the interrupted thread cannot get it, not even through reentrancy."""
    mine = locks.lock(key)
    assert not mine.owned()
    theirs = other.lock(key)
    assert theirs.acquire(timeout=PROMPTLY), "the key is still held"
    try:
        assert not mine.acquire(blocking=False), "two holders at once"
    finally:
        theirs.release()
    assert mine.acquire(timeout=PROMPTLY)
    mine.release()
    assert len(locks._tiers.registry) == 0


def test_waiter_interrupted_in_tier_1_holds_nothing(
    make_manager: MakeManager, key: str, interrupt: Callable[[Callable[[], Any]], None]
) -> None:
    locks, other = make_manager(), make_manager()
    holder = Holder(locks, key)
    interrupt(lambda: wait_until(queued(locks, key, 1), "the main thread to queue"))
    with pytest.raises(Interrupted):
        locks.lock(key).acquire()
    assert not queued(locks, key, 1)()
    holder.release()
    assert holder.error is None
    assert_free_and_unhaunted(locks, other, key)


def test_timeout_too_large_is_refused_before_queueing(make_manager: MakeManager, key: str) -> None:
    locks, other = make_manager(), make_manager()
    holder = Holder(locks, key)
    lock = locks.lock(key)
    for timeout in (threading.TIMEOUT_MAX + 1, float("inf")):
        with pytest.raises(OverflowError):
            lock.acquire(timeout=timeout)
    with pytest.raises(OverflowError):
        locks.lock(key, timeout=float("inf"))
    assert not queued(locks, key, 1)()
    holder.release()
    assert_free_and_unhaunted(locks, other, key)
    assert lock.acquire(timeout=threading.TIMEOUT_MAX)  # the largest is fine, as in threading
    lock.release()


@SERVERS
def test_waiter_interrupted_while_a_handoff_to_it_runs(
    proxied: MakeManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    """The holder has chosen the main thread and is passing it the row (fixed leases:
    with one UPDATE) when the main thread is interrupted: the hold goes on to the next
    waiter."""
    locks = proxied(renew=False)
    holder = Holder(locks, key)
    waiters: list[Waiter] = []

    def steps() -> None:
        wait_until(queued(locks, key, 1), "the main thread to queue")
        waiters.append(Waiter(locks, key))
        wait_until(queued(locks, key, 2), "a second waiter to queue")
        proxy.stall_at(b"UPDATE")
        holder.go.set()  # its hand-off UPDATE to the main thread stalls in the proxy
        wait_until(lambda: proxy.held(b"UPDATE"), "the hand-off to stall")

    interrupt(steps)
    with pytest.raises(Interrupted):
        locks.lock(key).acquire()
    proxy.resume()
    holder.join()
    assert holder.error is None
    (waiter,) = waiters
    waiter.join()
    assert waiter.error is None and waiter.got, "the next waiter was stranded"
    assert holder.token is not None and waiter.token is not None
    assert waiter.token > holder.token
    assert_free_and_unhaunted(locks, direct, key)


@pytest.mark.parametrize("db", [pytest.param("mariadb", marks=pytest.mark.mariadb)], indirect=True)
def test_interrupt_while_the_doorbell_rings_still_wakes_the_successor(
    proxied: MakeManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    interrupt: Callable[[Callable[[], Any]], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The main thread won the row through its doorbell, so its release rings
    (RELEASE_LOCK) after the DELETE; an interrupt in the ring must not strand the
    local thread chosen to go next."""
    monkeypatch.setattr(cohorts, "COHORT_LIMIT", 0)  # release, do not hand off
    locks = proxied()
    other = Holder(direct, key)
    bells = locks._backend._wakeups._bells  # type: ignore[attr-defined]

    def release_once_polled() -> None:
        wait_until(lambda: bells.waiting(key), "the main thread to ring the doorbell")
        other.go.set()

    releaser = threading.Thread(target=release_once_polled, daemon=True)
    releaser.start()
    lock = locks.lock(key)
    assert lock.acquire(timeout=PROMPTLY)
    releaser.join(PROMPTLY)
    other.join()
    hold = locks._tiers.registry.hold(key)
    assert hold is not None and hold.ring is not None
    waiter = Waiter(locks, key)
    wait_until(queued(locks, key, 1), "a waiter to queue")
    proxy.stall_at(b"RELEASE_LOCK")  # the DELETE goes first, then the ring stalls
    interrupt(lambda: wait_until(lambda: proxy.held(b"RELEASE_LOCK"), "the ring to stall"))
    with pytest.raises(Interrupted):
        lock.release()
    proxy.resume()
    waiter.join()
    assert waiter.error is None and waiter.got, "the successor was stranded"
    assert_free_and_unhaunted(locks, direct, key)


@SERVERS
def test_insert_interrupted_on_its_way_leaves_no_orphan_row(
    proxied: MakeManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    """The INSERT is still on its way to the server when the caller is interrupted,
    and lands after the caller has gone: its row must not block the key for the lease."""
    locks = proxied(ttl=30)
    assert locks.info(key) is None  # a pooled connection, so the insert needs no new one
    proxy.stall_at(b"INSERT")
    interrupt(lambda: wait_until(lambda: proxy.held(b"INSERT"), "the insert to stall"))
    with pytest.raises(Interrupted):
        locks.lock(key).acquire()
    proxy.resume()  # the insert now reaches the server, from a connection given up on
    wait_until(lambda: proxy.forwarded(b"INSERT"), "the insert to land", limit=PROMPTLY)
    assert_free_and_unhaunted(locks, direct, key)
    assert direct.holders() == []


@SERVERS
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_handoff_that_nobody_confirmed_strands_no_one(
    proxied: MakeManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    committed: bool,
) -> None:
    """The hand-off UPDATE that gives the waiter its own fixed lease took effect (or
    not), and the holder never learned which: the row is the process's either way, so
    the hold passes all the same, with the lease it surely has, and the holder's
    release does not fail."""
    locks = proxied(database_timeout=DATABASE_TIMEOUT, ttl=30, renew=False)
    holder = Holder(locks, key)
    waiter = Waiter(locks, key)
    wait_until(queued(locks, key, 1), "the waiter to queue")
    if committed:
        proxy.drop_reply(b"UPDATE", then_stall=True)
    else:
        proxy.drop_request(b"UPDATE", then_stall=True)
    holder.go.set()
    holder.join()
    assert holder.error is None, holder.error
    proxy.resume()
    waiter.join()
    assert waiter.error is None and waiter.got, "the waiter was stranded"
    assert holder.token is not None and waiter.token is not None
    assert waiter.token > holder.token
    assert_free_and_unhaunted(locks, direct, key)
