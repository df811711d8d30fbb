"""What every kind of handle does alike on every database: a write lock
(``locks.lock(key)``), a read lock (``locks.read_lock(key)``) and a semaphore
(``locks.semaphore(key, permits)``) carry their settings, refuse keys with the row
mark, show under the user's key in ``holders()``, are ``owned()`` only by the thread
that holds them, and refuse a release without a hold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
from conftest import SHARED_HOLDS, MakeManager
from rwhelpers import (
    Handle,
    Holder,
    hold_fixture,  # noqa: F401 (the fixture hold)
    in_thread,
)

import tierlock

pytestmark = SHARED_HOLDS

# -- handles -------------------------------------------------------------------------


def test_handles_carry_their_settings(manager: tierlock.LockManager, key: str) -> None:
    reader = manager.read_lock(("doc", 9), ttl=5, renew=False)
    assert isinstance(reader, tierlock.ReadLock)
    assert (reader.key, reader.ttl, reader.renew) == ("doc:9", 5.0, False)
    assert reader.token is None
    writer = manager.write_lock(key)
    assert isinstance(writer, tierlock.Lock)
    with manager.lock(key):  # the same lock as lock(key)
        assert writer.owned()
        assert writer.acquire(blocking=False)  # (reentrant)
        writer.release()
    assert not writer.owned()
    sem = manager.semaphore(key, 5)
    assert isinstance(sem, tierlock.Semaphore)
    assert (sem.key, sem.permits) == (key, 5)
    assert manager.semaphore(key, permits=2).permits == 2
    assert manager.holders() == []


@pytest.mark.parametrize("kind", ["read", "semaphore"])
def test_release_without_hold_raises_not_held(
    manager: tierlock.LockManager, key: str, kind: str
) -> None:
    handle: Handle = manager.read_lock(key) if kind == "read" else manager.semaphore(key, 2)
    with pytest.raises(tierlock.NotHeldError) as caught:
        handle.release()
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.key == key
    with pytest.raises(tierlock.NotHeldError):
        handle.extend()
    # Nor may a thread release or extend another thread's hold.
    assert handle.acquire()

    def intrude() -> int:
        refused = 0
        for action in (handle.release, handle.extend):
            try:
                action()
            except tierlock.NotHeldError:
                refused += 1
        return refused

    assert in_thread(intrude) == 2
    assert handle.owned()
    assert len(manager.holders()) == 1
    handle.release()
    assert manager.holders() == []


# -- keys and holders ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\x01b", "\x01", "doc:9\x01shared", ("doc\x01", 9)], ids=repr)
def test_keys_with_the_row_mark_are_rejected(manager: tierlock.LockManager, bad: object) -> None:
    makers: list[Callable[[], object]] = [
        lambda: manager.lock(bad),  # type: ignore[arg-type]
        lambda: manager.write_lock(bad),  # type: ignore[arg-type]
        lambda: manager.read_lock(bad),  # type: ignore[arg-type]
        lambda: manager.semaphore(bad, 2),  # type: ignore[arg-type]
        lambda: manager.info(bad),  # type: ignore[arg-type]
        lambda: manager.force_release(bad),  # type: ignore[arg-type]
    ]
    for make in makers:
        with pytest.raises(ValueError, match="U\\+0001"):
            make()
    assert manager.holders() == []


def test_holders_name_each_mode_under_the_users_key(make_manager: MakeManager, key: str) -> None:
    manager, admin = make_manager(), make_manager()
    exclusive, shared, permit = f"{key}:x", f"{key}:s", f"{key}:p"
    sem = manager.semaphore(permit, 3)
    with manager.lock(exclusive), manager.read_lock(shared), sem:
        assert sem.acquire()
        infos = admin.holders()
        assert sorted((info.key, info.mode) for info in infos) == sorted(
            [
                (exclusive, "exclusive"),
                (shared, "shared"),
                (permit, "permit"),
                (permit, "permit"),
            ]
        )
        for info in infos:
            assert "\x01" not in info.key
            assert isinstance(info.token, int)
            assert (info.pid, info.thread_id) == (os.getpid(), threading.get_ident())
            assert not info.expired
        exclusive_info = admin.info(exclusive)
        assert exclusive_info is not None and exclusive_info.mode == "exclusive"
        sem.release()
    assert admin.holders() == []


# -- owned() -------------------------------------------------------------------------


def test_owned_means_the_calling_thread_holds(
    make_manager: MakeManager, key: str, hold: Callable[[Handle], Holder]
) -> None:
    manager = make_manager()
    handles: list[Handle] = [manager.read_lock(key), manager.semaphore(f"{key}:p", 2)]
    for handle in handles:
        assert not handle.owned()
        holder = hold(handle).start()
        assert holder.owned is True
        assert not handle.owned()  # held, by another thread
        assert handle.acquire(timeout=5)  # (a read hold shares; a permit is left)
        assert handle.owned()
        handle.release()
        assert not handle.owned()
        holder.finish()
    lock = manager.lock(key)
    holder = hold(lock).start()
    assert holder.owned is True
    assert not lock.owned()
    holder.finish()
    assert manager.holders() == []
