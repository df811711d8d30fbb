"""Hand-offs between threads of one process, and wake-ups between processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from polling import wait_until
from sqlalchemy import text
from sqlalchemy.engine import Engine

import tierlock

MakeManager = Callable[..., tierlock.LockManager]


def test_lost_hold_is_not_handed_to_a_local_waiter(make_manager: MakeManager, key: str) -> None:
    """A hold whose lease ran out and was taken elsewhere is lost for its holder, and
    the local waiter queued behind it gets the key only from the database."""
    manager, other = make_manager(ttl=0.5, renew=False), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    queued = threading.Event()
    waiter_token: list[int | None] = []

    def wait_in_line() -> None:
        queued.set()
        assert lock.acquire(timeout=20)
        waiter_token.append(lock.token)
        lock.release()

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    assert queued.wait(10)
    taker = other.lock(key)
    assert taker.acquire(timeout=10)  # after the 0.5 s lease, by takeover
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    assert not waiter_token  # the waiter must not hold the key beside `taker`
    assert other.info(key) is not None
    assert other.info(key).token == taker.token  # type: ignore[union-attr]
    taker_token = taker.token
    taker.release()
    waiter.join(20)
    assert waiter_token and waiter_token[0] is not None and taker_token is not None
    assert waiter_token[0] > taker_token
    assert manager.stats().handoffs == 0


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_release_rings_the_doorbell_of_another_process(make_manager: MakeManager, key: str) -> None:
    """On PostgreSQL a release is announced, so a poller of another manager is woken
    at once instead of sleeping out its pause."""
    holder, poller = make_manager(), make_manager()
    lock = holder.lock(key)
    assert lock.acquire()
    doorbell = poller._backend.doorbell(key)
    try:
        # The listener rings every bell once it listens, in case a release came first.
        assert doorbell.wait(30)
        doorbell.arm()
        assert not doorbell.wait(0.05)  # nothing released yet: a plain pause
        lock.release()
        assert doorbell.wait(10)
    finally:
        doorbell.close()


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_an_insert_stalled_in_the_server_cannot_win_with_a_lower_token(
    make_manager: MakeManager, engine: Engine, table: str, key: str
) -> None:
    """The token is drawn before the unique key is checked. A trigger stalls one
    insert right there; another manager's acquire and release must not slip in
    between, or the stalled insert would then win the key with the lower token."""
    stalled_manager, other = make_manager(), make_manager()
    function = f"{table}_stall"
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE FUNCTION {function}() RETURNS trigger AS $$ BEGIN "
                "IF NEW.thread_name = 'stalled' THEN PERFORM pg_sleep(1.5); END IF; "
                f"RETURN NEW; END $$ LANGUAGE plpgsql"
            )
        )
        connection.execute(
            text(
                f"CREATE TRIGGER {function} BEFORE INSERT ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {function}()"
            )
        )
    holds: list[tuple[float, int]] = []

    def hold(manager: tierlock.LockManager) -> None:
        lock = manager.lock(key)
        assert lock.acquire(timeout=20)
        assert lock.token is not None
        holds.append((time.monotonic(), lock.token))
        lock.release()

    try:
        stalled = threading.Thread(target=hold, args=(stalled_manager,), name="stalled")
        stalled.start()
        wait_until(lambda: _sleeping_insert(engine, table), "the stalled insert")
        hold(other)
        stalled.join(20)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TRIGGER IF EXISTS {function} ON {table}"))
            connection.execute(text(f"DROP FUNCTION IF EXISTS {function}()"))
    assert len(holds) == 2
    assert [token for _, token in sorted(holds)] == sorted(token for _, token in holds)


def _sleeping_insert(engine: Engine, table: str) -> bool:
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE :pattern"
    )
    with engine.connect() as connection:
        return bool(connection.execute(query, {"pattern": f"%INSERT INTO {table}%"}).scalar())


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
def test_a_release_on_mariadb_wakes_a_poller_blocked_on_the_doorbell(
    make_manager: MakeManager, engine: Engine, key: str
) -> None:
    """A holder that won its key against other pollers keeps the key's named lock
    (GET_LOCK) until its process releases the row; a poller of another manager blocks on
    the named lock in the server and wakes as soon as that happens."""
    first, holder, poller = make_manager(), make_manager(), make_manager()
    plain = first.lock(key)
    assert plain.acquire()
    won, release = threading.Event(), threading.Event()

    def contend_then_hold() -> None:
        lock = holder.lock(key)
        assert lock.acquire(timeout=20)  # misses first: takes the doorbell, then the row
        won.set()
        assert release.wait(20)
        lock.release()

    contender = threading.Thread(target=contend_then_hold)
    contender.start()
    # (Released only once the contender polls under the key's named lock: released any
    # earlier, between its first miss and its taking the named lock, it would win
    # without ever taking it.)
    wait_until(lambda: poller._backend.others_waiting(key, ringing=False), "the contender to poll")
    plain.release()
    assert won.wait(20)
    assert poller._backend.others_waiting(key, ringing=False)  # the holder keeps the doorbell
    doorbell = poller._backend.doorbell(key)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(doorbell.wait(30)))
    waiter.start()
    wait_until(lambda: _blocked_on_a_user_lock(engine), "a poller blocked on GET_LOCK")
    release.set()
    waiter.join(30)
    contender.join(20)
    doorbell.close()
    assert woken == [True]


def _blocked_on_a_user_lock(engine: Engine) -> bool:
    query = text(
        "SELECT count(*) FROM information_schema.PROCESSLIST "
        "WHERE STATE = 'User lock' AND INFO LIKE 'SELECT GET_LOCK%%'"
    )
    with engine.connect() as connection:
        return bool(connection.execute(query).scalar())
