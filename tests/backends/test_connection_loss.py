"""Semantic 9 and ``database_timeout``: a connection that is lost or hangs around a
statement is resolved by owner id, not guessed, and never blocks a key past its lease.

A manager talks to a real server through ``Proxy``, which drops a statement before the
server sees it, or drops the server's reply after the statement took effect, cuts every
connection, turns new ones away, or holds all traffic as a hung server would. A second
manager, straight on the server, reads what really happened. SQLite has no network to
lose, so only MariaDB and PostgreSQL run here.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from proxy import Proxy
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
# Short enough for the tests that wait for a failing operation to give up, long enough
# that a loaded machine does not make a healthy try time out.
DATABASE_TIMEOUT = 2.0
# The lease of holds a test waits out.
SHORT_TTL = 1.0
# How a BackendError begins on every database when the server is out of reach.
CANNOT_REACH = "cannot reach the database: "


@pytest.fixture
def locks(proxied: MakeManager) -> tierlock.LockManager:
    # Fixed leases: a heartbeat's renewals would add to the statements counted here
    # (renewal through the proxy is tested in test_leases).
    return proxied(renew=False)


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
    lock = locks.lock(key, ttl=0.3, renew=False)
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


@pytest.mark.slow
def test_server_lost_for_good_raises_backend_error(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """No guessing either way: acquire fails loudly within ``database_timeout`` and writes
    nothing, and a release that cannot reach the server fails loudly and leaves the row
    to its lease, after which the key is free."""
    locks = proxied(database_timeout=DATABASE_TIMEOUT)
    held = locks.lock(key, ttl=SHORT_TTL)
    assert held.acquire(timeout=ACQUIRE_TIMEOUT)
    row = assert_held_by_this_thread(direct, held)
    other = locks.lock(f"key:{uuid.uuid4().hex}")
    proxy.refuse_all()

    started = time.monotonic()
    with pytest.raises(tierlock.BackendError) as acquire_error:
        other.acquire(timeout=ACQUIRE_TIMEOUT)
    # Reported, not treated as contention and waited out.
    assert time.monotonic() - started < 3 * DATABASE_TIMEOUT
    assert acquire_error.value.key == other.key
    assert str(acquire_error.value).startswith(CANNOT_REACH)
    assert isinstance(acquire_error.value.__cause__, DBAPIError)
    assert proxy.fired >= 1
    assert not other.owned()
    assert direct.info(other.key) is None

    started = time.monotonic()
    with pytest.raises(tierlock.BackendError) as release_error:
        held.release()
    assert time.monotonic() - started < 3 * DATABASE_TIMEOUT
    assert str(release_error.value).startswith(CANNOT_REACH)
    assert isinstance(release_error.value.__cause__, DBAPIError)
    assert not held.owned()  # released locally all the same
    left = direct.info(key)  # the row waits for its lease to end, which may have come
    assert left is not None
    assert (left.token, left.owner, left.expires_at) == (row.token, row.owner, row.expires_at)
    assert_free_after_lease(direct, row)


def assert_free_after_lease(direct: tierlock.LockManager, row: tierlock.LockInfo) -> None:
    """``row``, left behind, keeps its key until its lease ends, and then lets it go."""
    taker = direct.lock(row.key)
    assert taker.acquire(timeout=ACQUIRE_TIMEOUT)
    info = direct.info(row.key)
    assert info is not None
    assert info.acquired_at >= row.expires_at  # both by the database's clock
    assert info.token > row.token
    taker.release()


@pytest.mark.slow
def test_insert_committed_but_unconfirmed_blocks_only_until_its_lease_ends(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The insert took effect, its reply was lost and no retry gets through: the caller
    learns it does not hold the lock (BackendError), and the row it could not confirm
    frees the key at the end of its lease."""
    locks = proxied(database_timeout=DATABASE_TIMEOUT)
    assert locks.info(key) is None  # a pooled connection, so the insert needs no new one
    lock = locks.lock(key, ttl=SHORT_TTL)
    proxy.refuse_new()
    proxy.drop_reply(b"INSERT")
    with pytest.raises(tierlock.BackendError):
        lock.acquire(timeout=ACQUIRE_TIMEOUT)
    assert proxy.forwarded(b"INSERT") == 1
    assert not lock.owned()
    assert lock.token is None
    orphan = direct.info(key)
    assert orphan is not None
    assert (orphan.pid, orphan.thread_id) == (os.getpid(), threading.get_ident())
    assert [holder.key for holder in direct.holders()] == [key]
    assert_free_after_lease(direct, orphan)


def test_delete_whose_reply_is_lost_with_the_server_gone_raises(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The delete took effect but nothing can confirm it: BackendError, not a guess."""
    locks = proxied(database_timeout=DATABASE_TIMEOUT)
    lock = locks.lock(key)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    proxy.refuse_new()
    proxy.drop_reply(b"DELETE")
    with pytest.raises(tierlock.BackendError):
        lock.release()
    assert proxy.forwarded(b"DELETE") == 1
    assert not lock.owned()
    assert direct.info(key) is None


def stall_past_the_lease(
    direct: tierlock.LockManager, proxy: Proxy, key: str, pattern: bytes, taken: list[int]
) -> threading.Thread:
    """Stall the proxy, and in a thread wait for the stalled ``pattern`` statement, take
    ``key`` over with ``direct`` once the lease ends, and resume; the token goes to
    ``taken``."""
    proxy.stall()

    def take_over() -> None:
        try:
            deadline = time.monotonic() + ACQUIRE_TIMEOUT
            while not proxy.held(pattern):
                assert time.monotonic() < deadline, "the statement never reached the proxy"
                time.sleep(0.01)
            taker = direct.lock(key)
            assert taker.acquire(timeout=ACQUIRE_TIMEOUT)
            assert taker.token is not None
            taken.append(taker.token)
        finally:
            proxy.resume()

    taker = threading.Thread(target=take_over)
    taker.start()
    return taker


@pytest.mark.slow
@pytest.mark.parametrize(
    ("operation", "statement"),
    [("release", b"DELETE"), ("extend", b"UPDATE")],
)
def test_stall_longer_than_the_lease_loses_the_lock(
    locks: tierlock.LockManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    operation: str,
    statement: bytes,
) -> None:
    """The server hangs while the holder releases or extends; its lease ends and another
    manager takes over. When the statement finally arrives it matches no row of ours:
    LockLostError, and the new holder's row is untouched."""
    lock = locks.lock(key, ttl=SHORT_TTL)
    assert lock.acquire(timeout=ACQUIRE_TIMEOUT)
    taken: list[int] = []
    taker = stall_past_the_lease(direct, proxy, key, statement, taken)
    try:
        with pytest.raises(tierlock.LockLostError):
            getattr(lock, operation)()
    finally:
        taker.join(2 * ACQUIRE_TIMEOUT)
    assert len(taken) == 1, "the other manager did not take over"
    assert proxy.forwarded(statement) == 1  # held by the stall, then delivered once
    info = direct.info(key)
    assert info is not None
    assert info.token == taken[0]
    assert not info.expired
    assert info.thread_id != threading.get_ident()  # the taker's, not the stalled holder's


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stall", "refuse"])
def test_database_timeout_bounds_an_operation(
    proxied: MakeManager, proxy: Proxy, key: str, fault: str
) -> None:
    """A hung or unreachable server turns into BackendError within about
    ``database_timeout``, not a hang; a hung one is waited for (the driver's read
    timeout is half of it), not given up on at once."""
    locks = proxied(database_timeout=DATABASE_TIMEOUT)
    assert locks.info(key) is None  # the pool has a live connection to hang on
    lock = locks.lock(key)
    if fault == "stall":
        proxy.stall()
    else:
        proxy.refuse_all()
    outcome: list[BaseException | bool] = []

    def acquire() -> None:
        try:
            outcome.append(lock.acquire(timeout=ACQUIRE_TIMEOUT))
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    caller = threading.Thread(target=acquire, daemon=True)
    caller.start()
    caller.join(3 * DATABASE_TIMEOUT)
    took = time.monotonic() - started
    proxy.resume()  # a caller that hangs anyway is let go before the test ends
    caller.join(ACQUIRE_TIMEOUT)
    assert took < 3 * DATABASE_TIMEOUT, f"acquire still ran after {took:.1f} s"
    assert len(outcome) == 1
    assert isinstance(outcome[0], tierlock.BackendError), outcome
    assert str(outcome[0]).startswith(CANNOT_REACH)
    if fault == "stall":
        assert took >= DATABASE_TIMEOUT / 2
