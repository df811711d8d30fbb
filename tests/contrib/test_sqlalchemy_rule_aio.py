"""``tierlock.contrib.sqlalchemy.hold_until_commit`` with ``AsyncSession`` and
``AsyncLockManager``: a release awaited in the task's transaction waits for its
commit or rollback, also when SQLAlchemy ends the transaction in a task of its own
(``async with session``, ``async with maker.begin()``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from aiohelpers import Opener, run
from conftest import SERVERS
from session_bank import async_url
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)

from tierlock import NotHeldError
from tierlock.aio import AsyncLockManager
from tierlock.contrib.sqlalchemy import hold_until_commit

pytestmark = SERVERS
RULE_LOGGER = "tierlock.contrib.sqlalchemy"
# Any statement begins a session's transaction.
BEGIN: TextClause = text("SELECT 1")


class Boom(Exception):
    pass


@dataclass
class Bench:
    locks: AsyncLockManager  # its releases follow the rule for ``maker``'s sessions
    other: AsyncLockManager  # another process, as far as the locks go
    maker: async_sessionmaker[AsyncSession]

    async def free(self, key: str) -> bool:
        """Whether ``other`` gets ``key`` at once (and lets go of it)."""
        lock = self.other.lock(key)
        if not await lock.acquire(blocking=False):
            return False
        await lock.release()
        return True


Check = Callable[[Callable[[Bench], Awaitable[None]]], None]


@pytest.fixture
def check(db_url: str, table: str) -> Check:
    """``check(test)`` runs ``await test(bench)`` in an event loop of its own."""
    opener = Opener(db_url, table)

    def check(test: Callable[[Bench], Awaitable[None]]) -> None:
        async def main() -> None:
            engine = create_async_engine(async_url(db_url))
            maker = async_sessionmaker(engine)
            try:
                async with opener() as locks, opener() as other:
                    hold_until_commit(maker, locks)
                    await test(Bench(locks, other, maker))
            finally:
                await engine.dispose()

        run(main)

    return check


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == RULE_LOGGER]


def test_a_release_outside_a_transaction_is_at_once(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        async with b.locks.lock(key) as lock:
            assert not await b.free(key)
        assert not lock.owned()
        assert await b.free(key)

    check(test)


@pytest.mark.parametrize("end", ["commit", "rollback", "close"])
def test_a_release_inside_waits_for_the_transaction_s_end(check: Check, key: str, end: str) -> None:
    async def test(b: Bench) -> None:
        session = b.maker()
        await session.execute(BEGIN)
        async with b.locks.lock(key) as lock:
            pass
        assert lock.owned()
        assert not await b.free(key)
        await getattr(session, end)()
        assert not lock.owned()
        assert await b.free(key)

    check(test)


@pytest.mark.parametrize("ends", ["begin-commits", "close-rolls-back"])
def test_a_transaction_that_sqlalchemy_ends_in_a_task_of_its_own(
    check: Check, key: str, ends: str
) -> None:
    async def test(b: Bench) -> None:
        lock = b.locks.lock(key)
        block = b.maker.begin() if ends == "begin-commits" else b.maker()
        async with block as session:
            await session.execute(BEGIN)
            async with lock:
                pass
            assert lock.owned()
            assert not await b.free(key)
        assert not lock.owned()  # (the exit waited for the release)
        assert await b.free(key)

    check(test)


def test_savepoints_do_not_end_it(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        async with b.maker() as session:
            await session.execute(BEGIN)
            async with session.begin_nested(), b.locks.lock(key) as lock:
                await session.execute(BEGIN)
            assert lock.owned()
            with pytest.raises(Boom):
                async with session.begin_nested(), b.locks.lock(key):
                    raise Boom
            assert lock.owned()
            assert not await b.free(key)
            await session.commit()
        assert await b.free(key)

    check(test)


def test_a_reentrant_hold_released_twice_inside_ends_with_it(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        lock = b.locks.lock(key)
        async with b.maker.begin() as session:
            await session.execute(BEGIN)
            async with lock, lock:
                pass
            assert lock.owned()
        assert await b.free(key)
        with pytest.raises(NotHeldError):  # both levels were released, no more
            await lock.release()

    check(test)


def test_releasing_what_is_not_held_fails_at_once(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        async with b.maker() as session:
            await session.execute(BEGIN)
            with pytest.raises(NotHeldError):
                await b.locks.lock(key).release()

    check(test)


def test_a_task_outside_a_transaction_releases_at_once(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        async def elsewhere() -> bool:
            async with b.locks.lock(key) as lock:
                pass
            return not lock.owned() and await b.free(key)

        async with b.maker() as session:
            await session.execute(BEGIN)
            assert await asyncio.create_task(elsewhere())

    check(test)


def test_a_failing_release_is_logged_and_the_outcome_stands(
    check: Check, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, RULE_LOGGER)
    first, second = f"{key}:1", f"{key}:2"

    async def test(b: Bench) -> None:
        with pytest.raises(Boom):  # the body's error is the one raised
            async with b.maker.begin() as session:
                await session.execute(BEGIN)
                async with b.locks.lock(first) as lost, b.locks.lock(second) as kept:
                    pass
                await b.other.force_release(first)
                raise Boom
        assert not lost.owned() and not kept.owned()
        assert await b.free(second)

    check(test)
    [message] = logged(caplog)
    assert message.startswith(f"releasing {first!r} at the end of its transaction failed")
    assert "was lost" in message


def test_a_read_under_the_write_stays_when_the_write_s_release_waited(
    check: Check, key: str
) -> None:
    async def test(b: Bench) -> None:
        writer, reader = b.locks.lock(key), b.locks.read_lock(key)
        async with b.maker.begin() as session:
            await session.execute(BEGIN)
            await writer.acquire()
            await reader.acquire()
            await writer.release()
            assert writer.owned()
        assert not writer.owned()
        assert reader.owned()
        assert not await b.other.lock(key).acquire(blocking=False)
        other_reader = b.other.read_lock(key)
        assert await other_reader.acquire(blocking=False)
        await other_reader.release()
        await reader.release()
        assert await b.free(key)

    check(test)


def test_a_transaction_ended_by_sync_code_releases_soon_after(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        session = b.maker()
        session.sync_session.begin()  # (no connection yet: sync code can end it)
        async with b.locks.lock(key) as lock:
            pass
        assert lock.owned()
        session.sync_session.rollback()  # outside SQLAlchemy's greenlet
        await b.locks._core.settle()  # the release runs as a task of the manager's
        assert not lock.owned()
        assert await b.free(key)

    check(test)


def test_only_the_sessions_watched_count(check: Check, key: str) -> None:
    async def test(b: Bench) -> None:
        engine = b.maker.kw["bind"]
        scoped = async_scoped_session(async_sessionmaker(engine), asyncio.current_task)
        single = AsyncSession(engine)
        hold_until_commit(scoped, b.locks)
        hold_until_commit(single, b.locks)
        for session in (scoped(), single):
            await session.execute(BEGIN)
            async with b.locks.lock(key) as lock:
                pass
            assert lock.owned()
            await session.commit()
            assert not lock.owned()
        await scoped.remove()
        await single.close()
        async with AsyncSession(engine) as unwatched:  # (another maker's sync class)
            await unwatched.execute(BEGIN)
            async with b.locks.lock(key) as lock:
                pass
            assert not lock.owned()

    check(test)
