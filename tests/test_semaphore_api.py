"""Semaphores on every database: ``locks.semaphore(key, permits)`` lets at most
``permits`` holds of a key in at once, a thread may hold several of them, and every
holder must agree on ``permits``. What a semaphore does like every other kind of handle
is tested in ``test_handle_api``; CPython's own semaphore tests, in
``test_semaphore_conformance``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import SHARED_HOLDS, MakeManager
from rwhelpers import (
    Handle,
    Holder,
    hold_fixture,  # noqa: F401 (the fixture hold)
    in_thread,
    rows,
    takes,
    times_out,
)

import tierlock

pytestmark = SHARED_HOLDS


def test_a_thread_holds_several_permits(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    sem = manager.semaphore(key, 3)
    for _ in range(3):
        assert sem.acquire(timeout=5)
        assert isinstance(sem.token, int)
    assert sem.owned()
    assert sem.locked()
    assert rows(other, key) == [(key, "permit")] * 3
    # Not reentrant: the holder of every permit waits for a fourth like anyone else.
    assert not sem.acquire(blocking=False)
    assert times_out(sem)
    assert not other.semaphore(key, 3).acquire(blocking=False)
    assert in_thread(lambda: times_out(manager.semaphore(key, 3)))
    sem.release()
    assert sem.owned()
    assert not sem.locked()
    assert rows(other, key) == [(key, "permit")] * 2
    assert takes(other.semaphore(key, 3))
    sem.release()
    sem.release()
    assert not sem.owned()
    with pytest.raises(tierlock.NotHeldError):
        sem.release()
    assert other.holders() == []


def test_permits_of_threads_and_managers_add_up(
    make_manager: MakeManager, key: str, hold: Callable[[Handle], Holder]
) -> None:
    first, second = make_manager(), make_manager()
    holders = [
        hold(first.semaphore(key, 3)).start(),
        hold(second.semaphore(key, 3)).start(),
        hold(second.semaphore(key, 3)).start(),
    ]
    for manager in (first, second):
        sem = manager.semaphore(key, 3)
        assert sem.locked()
        assert not sem.owned()
        assert times_out(sem)
    assert rows(first, key) == [(key, "permit")] * 3
    assert all(holder.owned for holder in holders)
    holders[0].finish()
    sem = first.semaphore(key, 3)
    assert not sem.locked()
    assert sem.acquire(timeout=5)
    assert sem.owned()
    sem.release()
    for holder in holders[1:]:
        holder.finish()
    assert first.holders() == []


def test_permits_mismatch_is_refused_and_writes_nothing(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    sem = manager.semaphore(key, 2)
    assert sem.acquire()

    def snapshot() -> list[tuple[str, str, int, str]]:
        return sorted((info.key, info.mode, info.token, info.owner) for info in other.holders())

    before = snapshot()
    assert len(before) == 1
    for mismatched in (other, manager):
        for blocking, timeout in [(False, -1), (True, 5.0)]:
            with pytest.raises(ValueError, match="permits"):
                mismatched.semaphore(key, 3).acquire(blocking, timeout)
            assert snapshot() == before
    assert in_thread(lambda: _refused(manager.semaphore(key, 1)))
    assert snapshot() == before
    assert sem.owned()
    sem.release()
    assert other.holders() == []
    # With no holders left, the key may be used with another count.
    assert takes(other.semaphore(key, 3))
    assert other.holders() == []


def _refused(sem: tierlock.Semaphore) -> bool:
    try:
        sem.acquire(timeout=5)
    except ValueError as exc:
        return "permits" in str(exc)
    return False


@pytest.mark.parametrize(
    ("permits", "error"),
    [
        (0, ValueError),
        (-3, ValueError),
        (1.5, TypeError),
        (2.0, TypeError),
        ("3", TypeError),
        (None, TypeError),
        (True, TypeError),
        ([3], TypeError),
    ],
    ids=repr,
)
def test_bad_permits_are_rejected_and_nothing_is_written(
    manager: tierlock.LockManager, key: str, permits: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="permits"):
        manager.semaphore(key, permits)  # type: ignore[arg-type]
    with pytest.raises(error, match="permits"):
        manager.semaphore(key, permits=permits)  # type: ignore[arg-type]
    assert manager.holders() == []


# -- locked() ------------------------------------------------------------------------


def test_semaphore_is_locked_when_every_permit_is_taken(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    sem, theirs = manager.semaphore(key, 2), other.semaphore(key, 2)
    assert not sem.locked()
    assert theirs.acquire()
    assert not sem.locked()
    assert theirs.acquire()
    assert sem.locked()
    assert theirs.locked()
    theirs.release()
    assert not sem.locked()
    theirs.release()
    assert not sem.locked()
    assert other.holders() == []
