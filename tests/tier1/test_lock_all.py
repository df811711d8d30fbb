"""``LockManager.lock_all``: several keys held as one, all or nothing. Opposite
transfers in two processes neither deadlock nor lose money; a timeout, an error or an
interrupt part of the way leaves none of the keys held; a release that fails on one
key still releases the others; ``synchronized`` takes several templates."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import procs
import pytest
from conftest import SHARED_HOLDS, MakeManager
from counting import DriverStatements
from interrupts import Steps, interrupting
from polling import wait_until
from transfers import Bank, transfer_threads

import tierlock

T = TypeVar("T")

# A generous bound for what happens at once when lock_all works.
PROMPTLY = 5.0
# Opposite transfers: two processes of two threads, each way in each process.
PROCESSES = 2
THREADS = 2
TRANSFERS = 40
ONLY_SQLITE = pytest.mark.parametrize("db", ["sqlite"], indirect=True)


@pytest.fixture
def keys(key: str) -> list[str]:
    """Three keys, in the order a set takes them."""
    return [f"{key}:a", f"{key}:b", f"{key}:c"]


def assert_free(other: tierlock.LockManager, keys: list[str]) -> None:
    """Another manager takes each of ``keys`` at its first try, so nobody holds them."""
    for key in keys:
        lock = other.lock(key)
        assert lock.acquire(blocking=False), f"{key!r} is still held"
        lock.release()


def in_thread(function: Callable[[], T]) -> T:
    """``function()``'s result, called in another thread."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(function()))
    thread.start()
    thread.join(PROMPTLY)
    assert results, "the thread failed or hung"
    return results[0]


class Holder:
    """A thread of ``locks`` that holds ``keys`` until ``release_one()`` lets go of the
    first and ``release()`` of the rest."""

    def __init__(self, locks: tierlock.LockManager, *keys: str) -> None:
        self.locks = [locks.lock(key) for key in keys]
        self.held = threading.Event()
        self.first_go = threading.Event()
        self.go = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.held.wait(PROMPTLY)

    def _run(self) -> None:
        for lock in self.locks:
            assert lock.acquire(timeout=PROMPTLY)
        self.held.set()
        self.first_go.wait(60)
        self.locks[0].release()
        self.go.wait(60)
        for lock in self.locks[1:]:
            lock.release()

    def release_one(self) -> None:
        self.first_go.set()

    def release(self) -> None:
        self.first_go.set()
        self.go.set()
        self._thread.join(PROMPTLY)
        assert not self._thread.is_alive()


# -- many processes ------------------------------------------------------------------


@pytest.mark.multiprocess
def test_opposite_transfers_in_two_processes_never_deadlock_and_lose_nothing(
    db_url: str, table: str, key: str, children: procs.Children
) -> None:
    bank = Bank()
    start = procs.CTX.Barrier(PROCESSES * THREADS)
    for process in range(PROCESSES):
        children.start(
            transfer_threads,
            url=db_url,
            table=table,
            prefix=key,
            bank=bank,
            process=process,
            threads=THREADS,
            transfers=TRANSFERS,
            start=start,
        )
    children.join()
    assert bank.read() == bank.expected(TRANSFERS, PROCESSES * THREADS)


@pytest.mark.multiprocess
def test_a_timeout_leaves_none_of_the_keys_held(
    make_manager: MakeManager, db_url: str, table: str, keys: list[str], children: procs.Children
) -> None:
    locks, other = make_manager(), make_manager()
    first, middle, last = keys
    _, may_release = procs.start_holder(children, db_url, table, middle, ttl=30.0)
    held = locks.lock_all([last, middle, first], timeout=0.2)
    assert not held.acquire(timeout=0.2)
    assert not held.acquire(blocking=False)
    with pytest.raises(tierlock.LockTimeout) as raised, held:
        pytest.fail("entered without the keys")
    assert raised.value.key == middle
    assert not held.owned() and held.tokens == {}
    assert held.locked()  # (the middle key, by the other process)
    assert_free(other, [first, last])
    may_release.set()
    children.join()
    with held:
        assert held.owned() and held.tokens.keys() == set(keys)
    assert not held.locked()


@ONLY_SQLITE
def test_the_timeout_is_one_deadline_for_the_whole_set(
    make_manager: MakeManager, keys: list[str]
) -> None:
    """The first key comes free halfway through the timeout and the next never does:
    the set gives up when the timeout ends, not a whole timeout after the first key."""
    locks, other = make_manager(), make_manager()
    first, middle, _ = keys
    whole, half = 1.6, 0.8
    holder = Holder(other, first, middle)
    timer = threading.Timer(half, holder.release_one)  # the scene, not a synchronisation
    started = time.monotonic()
    timer.start()
    try:
        got = locks.lock_all(keys).acquire(timeout=whole)
        elapsed = time.monotonic() - started
        assert not got
        # Per-key timeouts would give up after half + whole = 2.4 s.
        assert whole - 0.1 <= elapsed < whole + 0.4, elapsed
        assert_free(other, [first])
    finally:
        timer.cancel()
        holder.release()


# -- all or nothing ------------------------------------------------------------------


@pytest.fixture
def interrupt_main() -> Iterator[Callable[[Steps], None]]:
    """``interrupt_main(steps)``: see ``interrupts.interrupting``."""
    yield from interrupting(KeyboardInterrupt)


def acquiring(locks: tierlock.LockManager, key: str) -> Callable[[], bool]:
    """Whether a thread of ``locks`` is inside an acquire of ``key``: queued in tier 1
    behind a holder of its own manager, or, having claimed the key, asking the store."""

    def check() -> bool:
        entry = locks._tiers.registry._entries.get(key)
        return entry is not None and (entry.hold is None or len(entry.waiters) == 1)

    return check


@pytest.mark.parametrize("holder_of_the_middle", ["same-manager", "other-manager"])
def test_an_interrupt_while_waiting_for_a_later_key_releases_the_earlier(
    make_manager: MakeManager,
    keys: list[str],
    interrupt_main: Callable[[Callable[[], object]], None],
    holder_of_the_middle: str,
) -> None:
    """Waiting in tier 1 behind a thread of its own manager, or at the store behind
    another manager: the interrupt leaves the first key free."""
    locks, other = make_manager(), make_manager()
    first, middle, last = keys
    same = holder_of_the_middle == "same-manager"
    holder = Holder(locks if same else other, middle)

    interrupt_main(lambda: wait_until(acquiring(locks, middle), "the wait for the middle key"))
    held = locks.lock_all(keys)
    with pytest.raises(KeyboardInterrupt):
        held.acquire()
    assert not held.tokens
    assert_free(other, [first, last])
    holder.release()
    assert_free(other, keys)
    assert held.acquire(blocking=False)
    held.release()


@SHARED_HOLDS
def test_an_error_on_a_later_key_releases_the_earlier(
    make_manager: MakeManager, keys: list[str]
) -> None:
    """The thread holds the middle key's read hold, so its write hold is refused."""
    locks, other = make_manager(), make_manager()
    first, middle, last = keys
    with locks.read_lock(middle) as reading:
        with pytest.raises(tierlock.LockError, match="read hold"):
            locks.lock_all(keys).acquire()
        assert_free(other, [first, last])
        assert reading.owned()


def test_a_release_that_fails_on_one_key_still_releases_the_others(
    make_manager: MakeManager, keys: list[str]
) -> None:
    locks, admin = make_manager(), make_manager()
    held = locks.lock_all(keys)
    assert held.acquire()
    assert admin.force_release(keys[-1])  # the first one released
    with pytest.raises(tierlock.LockLostError) as raised:
        held.release()
    assert raised.value.key == keys[-1]
    assert not any(lock.owned() for lock in held.locks)
    assert_free(admin, keys)
    with pytest.raises(tierlock.NotHeldError):
        held.release()


def test_the_body_s_error_goes_through_and_the_keys_are_released(
    make_manager: MakeManager, keys: list[str]
) -> None:
    locks, other = make_manager(), make_manager()
    with pytest.raises(ZeroDivisionError), locks.lock_all(keys) as held:
        assert held.owned()
        _ = 1 / 0
    assert_free(other, keys)


# -- the handle ----------------------------------------------------------------------


@ONLY_SQLITE
def test_keys_are_checked_folded_and_sorted(manager: tierlock.LockManager, key: str) -> None:
    held = manager.lock_all([f"{key}:b", (key, "a"), f"{key}:a", f"{key}:b"])
    assert held.keys == (f"{key}:a", f"{key}:b")
    assert [lock.key for lock in held.locks] == list(held.keys)
    one = manager.lock_all(iter([key]))
    with one:
        assert one.owned() and list(one.tokens) == [key]
    cases: list[tuple[object, type[Exception], str]] = [
        (key, TypeError, "not one key"),
        ([], ValueError, "at least one key"),
        (7, TypeError, "iterable of keys, not int"),
        ([""], ValueError, "empty"),
        ([key, 1.5], TypeError, "float"),
    ]
    for bad, error, match in cases:
        with pytest.raises(error, match=match):
            manager.lock_all(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        manager.lock_all([key], timeout=-1)
    with pytest.raises(ValueError, match="ttl"):
        manager.lock_all([key], ttl=0)
    with pytest.raises(OverflowError):
        manager.lock_all([key], timeout=float("inf"))
    assert manager.holders() == []


@ONLY_SQLITE
def test_reentrant_per_thread_as_a_lock_is(manager: tierlock.LockManager, keys: list[str]) -> None:
    held = manager.lock_all(keys)
    with held:
        assert held.acquire(blocking=False)  # again, at once: each key one level deeper
        held.release()
        assert held.owned()
        assert not in_thread(held.owned)
        assert not in_thread(lambda: held.acquire(blocking=False))

        def release_elsewhere() -> type[BaseException] | None:
            try:
                held.release()
            except tierlock.LockError as exc:
                return type(exc)
            return None

        assert in_thread(release_elsewhere) is tierlock.NotHeldError
        assert held.owned()
    assert not held.owned()
    assert not held.locked()  # (a row kept for the thread turned away does not count)


@pytest.mark.sql_only("counts the driver's statements")
def test_repr_tokens_and_owned_ask_nothing_of_the_database(
    manager: tierlock.LockManager, keys: list[str], driver_statements: DriverStatements
) -> None:
    held = manager.lock_all(keys)
    here = threading.current_thread().name
    with held:
        before = driver_statements.count(thread=here)
        shown, tokens, owned = repr(held), held.tokens, held.owned()
        assert driver_statements.count(thread=here) == before
        stored = {key: info.token for key in keys if (info := manager.info(key)) is not None}
    assert shown.startswith(f"<locked tierlock.MultiLock object keys={tuple(keys)!r} at 0x")
    assert tokens == stored and owned
    assert repr(held).startswith("<unlocked tierlock.MultiLock object")


# -- synchronized with several templates ------------------------------------------------


def test_synchronized_with_several_templates_holds_every_key_for_the_call(
    make_manager: MakeManager, key: str
) -> None:
    locks, other = make_manager(), make_manager()
    seen: dict[str, Any] = {}

    @locks.synchronized(f"{key}:{{source}}", f"{key}:{{target}}", timeout=0.2)
    def move(source: int, target: int) -> None:
        pair = [f"{key}:{source}", f"{key}:{target}"]
        seen["mine"] = locks.lock_all(pair).owned()
        seen["theirs"] = [other.lock(k).acquire(blocking=False) for k in pair]

    move(2, 1)
    assert seen == {"mine": True, "theirs": [False, False]}
    assert_free(other, [f"{key}:1", f"{key}:2"])
    move(3, 3)  # one account: its key once
    assert seen["mine"]
    holder = Holder(other, f"{key}:2")
    try:
        with pytest.raises(tierlock.LockTimeout) as raised:
            move(1, 2)
        assert raised.value.key == f"{key}:2"
        assert_free(other, [f"{key}:1"])
    finally:
        holder.release()


@ONLY_SQLITE
def test_synchronized_checks_every_template_when_it_decorates(
    manager: tierlock.LockManager,
) -> None:
    def move(source: int, target: int) -> None: ...

    with pytest.raises(ValueError, match="'amount'"):
        manager.synchronized("user:{source}", "user:{amount}")(move)
    with pytest.raises(TypeError, match="key template str"):
        manager.synchronized("user:{source}", 7)  # type: ignore[arg-type]
