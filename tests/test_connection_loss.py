"""Semantic 9: a connection lost around a statement is resolved by owner id, not guessed.

A manager talks to a real server through ``Proxy``, which drops a statement before the
server sees it, or drops the server's reply after the statement took effect, or cuts
every connection. A second manager, straight on the server, reads what really happened.
SQLite has no network to lose, so only MariaDB and PostgreSQL run here.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from proxy import Proxy
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

import tierlock

MakeManager = Callable[..., tierlock.LockManager]

pytestmark = pytest.mark.parametrize(
    "db",
    [
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
    ],
    indirect=True,
)

# Generous bounds: a resolved failure takes a few retries of 50-150 ms each. An acquire
# that guessed wrong (inserted again beside its own row) would wait out ACQUIRE_TIMEOUT
# and return False.
ACQUIRE_TIMEOUT = 5.0


@pytest.fixture
def direct(make_manager: MakeManager) -> tierlock.LockManager:
    """A manager straight on the server: it creates the table and tells the truth."""
    return make_manager()


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    url = make_url(db_url)
    assert url.host is not None and url.port is not None
    proxy = Proxy((url.host, url.port))
    yield proxy
    proxy.close()


@pytest.fixture
def locks(
    direct: tierlock.LockManager, proxy: Proxy, db_url: str, table: str
) -> Iterator[tierlock.LockManager]:
    """A manager whose every connection goes through ``proxy``."""
    url = make_url(db_url).set(host="127.0.0.1", port=proxy.port)
    if url.get_backend_name() == "postgresql":
        # Keep the bytes readable: TLS would hide the statements from the proxy.
        url = url.update_query_dict({"sslmode": "disable"})
    manager = tierlock.LockManager(
        url.render_as_string(hide_password=False),
        table=table,
        reaper_interval=None,
        poll_interval=0.02,
    )
    yield manager
    manager.close()


def assert_held_by_this_thread(
    direct: tierlock.LockManager, lock: tierlock.Lock
) -> tierlock.LockInfo:
    """The table has exactly one row, this thread's hold of ``lock`` with its token."""
    info = direct.info(lock.key)
    assert info is not None
    assert info.token == lock.token
    assert (info.pid, info.thread_id) == (os.getpid(), threading.get_ident())
    assert not info.expired
    assert [holder.token for holder in direct.holders()] == [lock.token]
    return info


def release_and_check_gone(direct: tierlock.LockManager, lock: tierlock.Lock) -> None:
    """A clean release deletes only a row with this hold's owner id, so it succeeding
    shows that the row was the hold's own."""
    lock.release()
    assert direct.info(lock.key) is None


def test_insert_whose_reply_is_lost_is_found_by_owner_id(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The insert committed but the client never heard: the retry must find the row by
    owner id and keep it, not insert again (which would wait on its own row)."""
    lock = locks.lock(key)
    proxy.drop_reply(b"INSERT")
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    assert proxy.fired == 1
    assert proxy.forwarded(b"INSERT") == 1  # resolved by reading, not by a second insert
    assert_held_by_this_thread(direct, lock)
    release_and_check_gone(direct, lock)


def test_insert_lost_before_the_server_is_retried(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    lock = locks.lock(key)
    proxy.drop_request(b"INSERT")
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    assert proxy.fired == 1
    assert proxy.forwarded(b"INSERT") == 1  # only the retry reached the server
    assert_held_by_this_thread(direct, lock)
    release_and_check_gone(direct, lock)


def test_delete_whose_reply_is_lost_counts_as_released(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The retry finds no row of ours; after a lost reply that is our own delete, not a
    lost lock, so no LockLostError."""
    lock = locks.lock(key)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    proxy.drop_reply(b"DELETE")
    lock.release()
    assert proxy.fired == 1
    assert proxy.forwarded(b"DELETE") == 2  # the lost one and the retry
    assert not lock.owned()
    assert direct.info(key) is None


def test_delete_lost_before_the_server_is_retried(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    lock = locks.lock(key)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    proxy.drop_request(b"DELETE")
    lock.release()
    assert proxy.fired == 1
    assert proxy.forwarded(b"DELETE") == 1  # only the retry, which deleted the row
    assert not lock.owned()
    assert direct.info(key) is None


def test_extend_whose_reply_is_lost_still_extends(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    lock = locks.lock(key, ttl=30)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    before = assert_held_by_this_thread(direct, lock).expires_at
    proxy.drop_reply(b"UPDATE")
    lock.extend(ttl=300)
    assert proxy.fired == 1
    assert proxy.forwarded(b"UPDATE") == 2
    after = assert_held_by_this_thread(direct, lock).expires_at
    # 270 s later by the database's clock, less the time this test took.
    assert after - before > timedelta(seconds=240)
    release_and_check_gone(direct, lock)


def test_release_after_every_connection_was_cut(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The pool's idle connection is dead; release must get through on a fresh one."""
    lock = locks.lock(key)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    assert proxy.cut_all() >= 1
    release_and_check_gone(direct, lock)
    assert not lock.owned()


def test_release_after_a_cut_and_a_takeover_reports_the_loss(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """A row found gone after a dropped connection counts as released only while the
    lease surely ran; past it, the row may have been taken, and the loss is reported."""
    lock = locks.lock(key, ttl=0.3)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    taker = direct.lock(key)
    assert taker.acquire(timeout=ACQUIRE_TIMEOUT)  # once the lease ended
    assert proxy.cut_all() >= 1
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    assert not lock.owned()
    info = direct.info(key)
    assert info is not None
    assert info.token == taker.token
    taker.release()


def test_server_lost_for_good_raises_backend_error(
    locks: tierlock.LockManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """No guessing either way: acquire fails loudly and writes nothing, and a release
    that cannot reach the server fails loudly and leaves the row to its lease."""
    held = locks.lock(key)
    assert held.acquire(timeout=ACQUIRE_TIMEOUT)
    row = assert_held_by_this_thread(direct, held)
    other = locks.lock(f"key:{uuid.uuid4().hex}")
    proxy.refuse_all()

    started = time.monotonic()
    with pytest.raises(tierlock.BackendError) as acquire_error:
        other.acquire(timeout=ACQUIRE_TIMEOUT)
    # Reported, not treated as contention and waited out.
    assert time.monotonic() - started < ACQUIRE_TIMEOUT
    assert acquire_error.value.key == other.key
    assert isinstance(acquire_error.value.__cause__, DBAPIError)
    assert proxy.fired >= 1
    assert not other.owned()
    assert direct.info(other.key) is None

    with pytest.raises(tierlock.BackendError) as release_error:
        held.release()
    assert isinstance(release_error.value.__cause__, DBAPIError)
    assert not held.owned()  # released locally all the same
    assert direct.info(key) == row  # the row waits for its lease to end
