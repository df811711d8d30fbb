"""``tierlock.contrib.sqlalchemy.hold_until_commit`` with sync sessions: a release made
in a session's transaction waits for its commit or rollback, and one made outside is
at once (the money it keeps whole: test_sqlalchemy_money.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import procs
import pytest
from conftest import SQL_DATABASES, MakeManager
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import tierlock
from tierlock import NotHeldError
from tierlock.aio import AsyncLockManager
from tierlock.contrib.sqlalchemy import hold_until_commit

pytestmark = SQL_DATABASES
RULE_LOGGER = "tierlock.contrib.sqlalchemy"


class Boom(Exception):
    pass


@pytest.fixture
def data_engine(db: str, db_url: str, tmp_path: Path) -> Iterator[Engine]:
    """The sessions' database: the locks' server, or a SQLite file of its own (a
    session's write would otherwise keep the lock table's file from other writers)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'data.db'}" if db == "sqlite" else db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def maker(data_engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(data_engine)


@pytest.fixture
def locks(make_manager: MakeManager, maker: sessionmaker[Session]) -> tierlock.LockManager:
    locks = make_manager()
    hold_until_commit(maker, locks)
    return locks


@pytest.fixture
def other(make_manager: MakeManager) -> tierlock.LockManager:
    """Another process, as far as the locks go: a manager of its own on the table."""
    return make_manager()


def free(other: tierlock.LockManager, key: str) -> bool:
    """Whether ``other`` gets ``key`` at once (and lets go of it)."""
    lock = other.lock(key)
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == RULE_LOGGER]


def begin(session: Session) -> None:
    session.execute(text("SELECT 1"))  # (any statement begins the transaction)


def test_a_release_outside_a_transaction_is_at_once(
    locks: tierlock.LockManager, other: tierlock.LockManager, key: str
) -> None:
    with locks.lock(key) as lock:
        assert not free(other, key)
    assert not lock.owned()
    assert free(other, key)


@pytest.mark.parametrize("end", ["commit", "rollback", "close"])
def test_a_release_inside_waits_for_the_transaction_s_end(
    locks: tierlock.LockManager,
    other: tierlock.LockManager,
    maker: sessionmaker[Session],
    key: str,
    end: str,
) -> None:
    session = maker()
    begin(session)
    with locks.lock(key) as lock:
        pass
    assert lock.owned()
    assert not free(other, key)
    getattr(session, end)()
    assert not lock.owned()
    assert free(other, key)


def test_savepoints_do_not_end_it(
    locks: tierlock.LockManager, other: tierlock.LockManager, maker: sessionmaker[Session], key: str
) -> None:
    with maker() as session:
        begin(session)
        with session.begin_nested(), locks.lock(key) as lock:
            begin(session)
        assert lock.owned()
        with pytest.raises(Boom), session.begin_nested(), locks.lock(key):
            raise Boom
        assert lock.owned()
        assert not free(other, key)
        session.commit()
    assert not lock.owned()
    assert free(other, key)


def test_a_reentrant_hold_released_twice_inside_ends_with_it(
    locks: tierlock.LockManager, other: tierlock.LockManager, maker: sessionmaker[Session], key: str
) -> None:
    lock = locks.lock(key)
    with maker() as session:
        begin(session)
        with lock, lock:
            pass
        assert lock.owned()
        session.commit()
    assert not lock.owned()
    assert free(other, key)
    with pytest.raises(NotHeldError):  # both levels were released, no more
        lock.release()


def test_releasing_what_is_not_held_fails_at_once(
    locks: tierlock.LockManager, maker: sessionmaker[Session], key: str
) -> None:
    with maker() as session:
        begin(session)
        with pytest.raises(NotHeldError):
            locks.lock(key).release()


def test_a_thread_outside_a_transaction_releases_at_once(
    locks: tierlock.LockManager, other: tierlock.LockManager, maker: sessionmaker[Session], key: str
) -> None:
    released: list[bool] = []

    def elsewhere() -> None:
        with locks.lock(key) as lock:
            pass
        released.append(not lock.owned() and free(other, key))

    with maker() as session:
        begin(session)
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(procs.WAIT_LIMIT)
        assert released == [True]


def test_only_the_sessions_watched_count(
    make_manager: MakeManager, data_engine: Engine, other: tierlock.LockManager, key: str
) -> None:
    locks = make_manager()
    scoped = scoped_session(sessionmaker(data_engine))
    single = Session(data_engine)
    hold_until_commit(scoped, locks)
    hold_until_commit(single, locks)
    hold_until_commit(single, locks)  # (again: no second count)
    for session in (scoped(), single):
        begin(session)
        with locks.lock(key) as lock:
            pass
        assert lock.owned()
        session.commit()
        assert not lock.owned()
    with Session(data_engine) as unwatched:
        begin(unwatched)
        with locks.lock(key) as lock:
            pass
        assert not lock.owned()
    scoped.remove()
    single.close()


def test_a_failing_release_is_logged_and_the_outcome_stands(
    locks: tierlock.LockManager,
    other: tierlock.LockManager,
    maker: sessionmaker[Session],
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, RULE_LOGGER)
    first, second, third = f"{key}:1", f"{key}:2", f"{key}:3"
    with pytest.raises(Boom), maker() as session:  # the body's error is the one raised
        begin(session)
        with locks.lock(first), locks.lock(second) as kept, locks.lock(third):
            pass
        other.force_release(first)
        other.force_release(third)
        raise Boom
    assert not kept.owned()
    assert free(other, second)  # released all the same
    # The releases put off run last first: third, second, first were released.
    failed = [f"releasing {lost!r} at the end of its transaction failed" for lost in (first, third)]
    assert [message.split(": lock")[0] for message in logged(caplog)] == failed
    assert all("was lost" in message for message in logged(caplog))
    with maker() as session:  # and a commit returns as committed
        begin(session)
        with locks.lock(first):
            pass
        other.force_release(first)
        session.commit()
    assert len(logged(caplog)) == 3


def test_a_transaction_ended_by_another_thread_leaves_the_release_to_its_own(
    locks: tierlock.LockManager,
    other: tierlock.LockManager,
    maker: sessionmaker[Session],
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = maker()
    put_off, ended = threading.Event(), threading.Event()
    seen: list[bool] = []

    def holder() -> None:
        begin(session)
        with locks.lock(key) as lock:
            pass
        put_off.set()
        ended.wait(procs.WAIT_LIMIT)
        seen.append(lock.owned())
        with maker() as own:  # its next transaction's end releases it
            begin(own)
            own.commit()
        seen.append(lock.owned())

    thread = threading.Thread(target=holder, name="holder")
    thread.start()
    assert put_off.wait(procs.WAIT_LIMIT)
    session.commit()
    ended.set()
    thread.join(procs.WAIT_LIMIT)
    assert seen == [True, False]
    assert free(other, key)
    [message] = logged(caplog)
    assert "a transaction that thread 'holder' began ended in thread" in message
    assert repr([key]) in message


def _child_releases_at_once(
    locks: tierlock.LockManager, maker: sessionmaker[Session], key: str
) -> None:
    """In a forked child: the parent's transaction and the release it put off are not
    this process's; its own releases follow the rule."""
    engine = maker.kw["bind"]
    engine.dispose(close=False)  # (the parent's pooled connections stay the parent's)
    with locks.lock(f"{key}:child") as lock:
        pass
    assert not lock.owned(), "the child counted its parent's transaction as its own"
    with maker() as session:
        begin(session)
        with locks.lock(f"{key}:child") as lock:
            pass
        assert lock.owned()
        session.commit()
    assert not lock.owned()


def test_a_forked_child_forgets_what_its_parent_put_off(
    locks: tierlock.LockManager,
    other: tierlock.LockManager,
    maker: sessionmaker[Session],
    key: str,
    children: procs.Children,
) -> None:
    with maker() as session:
        begin(session)
        with locks.lock(key) as lock:
            pass
        children.start(_child_releases_at_once, locks=locks, maker=maker, key=key)
        children.join()
        assert lock.owned()
        assert not free(other, key)
        session.commit()
    assert free(other, key)


def test_what_it_takes_is_checked(
    locks: tierlock.LockManager, data_engine: Engine, db_url: str, table: str
) -> None:
    with pytest.raises(TypeError, match=r"takes a Session, sessionmaker or scoped_session"):
        hold_until_commit(data_engine, locks)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pass its \.manager"):
        hold_until_commit(Session(data_engine), object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"asyncio sessions go with .* got AsyncSession and Lo"):
        hold_until_commit(AsyncSession(), locks)
    async_locks = AsyncLockManager(db_url, table=table, reaper_interval=None)
    try:
        with pytest.raises(TypeError, match=r"got Session and AsyncLockManager$"):
            hold_until_commit(Session(data_engine), async_locks)
    finally:
        asyncio.run(async_locks.aclose())
