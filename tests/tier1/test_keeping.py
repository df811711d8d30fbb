"""A hold released while a try without waiting of its process was turned away from it
is kept for a moment for the next such try, which gets it with no statement; tries at a
key found held elsewhere twice lately fail from memory, unless a manager of this
process released it since."""

from __future__ import annotations

import threading
from collections.abc import Callable

import procs
import pytest
from conftest import MakeManager
from counting import HEARTBEAT, DriverStatements
from polling import wait_until

import tierlock
from tierlock.tier1 import cohorts


def in_a_thread(call: Callable[[], bool]) -> bool:
    """``call()`` in a thread of its own, which ends before this returns."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(procs.WAIT_LIMIT)
    assert result, "the thread did not finish"
    return result[0]


def take_and_let_go(lock: tierlock.Lock) -> tuple[bool, int | None]:
    """In a thread of its own: try ``lock`` without waiting; release it if won."""
    outcome: list[tuple[bool, int | None]] = []

    def attempt() -> bool:
        won = lock.acquire(blocking=False)
        outcome.append((won, lock.token))
        if won:
            lock.release()
        return won

    in_a_thread(attempt)
    return outcome[0]


def test_a_try_turned_away_gets_the_kept_hold_with_no_statement(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cohorts, "KEEP_TIME", procs.WAIT_LIMIT)  # kept until close()
    monkeypatch.setattr(cohorts, "KEPT_COHORT_TIME", procs.WAIT_LIMIT)
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    first = lock.token
    assert first is not None
    assert take_and_let_go(lock) == (False, None)  # turned away in tier 1
    lock.release()
    assert not lock.locked()  # any thread of the process may take it at once
    assert other.lock(key).locked()  # the row is still the process's
    before = driver_statements.count(but=HEARTBEAT)
    assert take_and_let_go(lock) == (True, first + 1)
    assert take_and_let_go(lock) == (True, first + 2)  # kept again: the cohort goes on
    assert driver_statements.count(but=HEARTBEAT) == before
    assert manager.stats().local_handoffs == 2
    manager.close()  # releases what it keeps
    assert driver_statements.count(but=HEARTBEAT) == before + 1  # the DELETE
    assert other.info(key) is None


def test_a_kept_hold_goes_back_to_the_database_when_its_time_is_up(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    assert take_and_let_go(lock) == (False, None)
    lock.release()
    wait_until(lambda: other.info(key) is None, "the kept row to be released")
    rival = other.lock(key)
    assert in_a_thread(lambda: rival.acquire(blocking=False))


def test_a_release_nobody_was_turned_away_from_deletes_at_once(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    lock.release()
    assert other.info(key) is None


def test_a_kept_cohort_ends_at_its_bound(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark other processes' tries leave may come late, so keeping stops at the
    bound anyway."""
    monkeypatch.setattr(cohorts, "KEEP_TIME", procs.WAIT_LIMIT)
    monkeypatch.setattr(cohorts, "COHORT_LIMIT", 2)
    manager, other = make_manager(), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    assert take_and_let_go(lock) == (False, None)
    lock.release()  # kept
    assert take_and_let_go(lock)[0]  # cohort 1, kept again
    assert take_and_let_go(lock)[0]  # cohort 2: the bound; released in the database
    assert other.info(key) is None


def test_a_key_hot_elsewhere_fails_tries_from_memory_until_released_here(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (Milliseconds each, which a thread's start may take on a busy machine.)
    monkeypatch.setattr(cohorts, "CONTENTION_MEMORY", procs.WAIT_LIMIT)
    monkeypatch.setattr(cohorts, "HOT_MEMORY", procs.WAIT_LIMIT)
    holder, trier = make_manager(), make_manager()
    held = holder.lock(key)
    assert held.acquire()
    tried = trier.lock(key)
    for _ in range(2):
        assert not in_a_thread(lambda: tried.acquire(blocking=False))
    before = driver_statements.count(but=HEARTBEAT)
    assert not in_a_thread(lambda: tried.acquire(blocking=False))  # from memory
    assert driver_statements.count(but=HEARTBEAT) == before
    held.release()
    assert take_and_let_go(tried)[0]


def test_a_single_miss_is_not_remembered(make_manager: MakeManager, key: str) -> None:
    holder, trier = make_manager(), make_manager()
    assert holder.lock(key).acquire()
    tried = trier.lock(key)
    assert not in_a_thread(lambda: tried.acquire(blocking=False))
    assert trier.stats().statements > 0
    before = trier.stats().statements
    assert not in_a_thread(lambda: tried.acquire(blocking=False))
    assert trier.stats().statements > before  # asked again
