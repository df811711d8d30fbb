"""The money the transaction rule keeps whole (tests/session_bank.py): transfers that
begin their session's transaction before taking the accounts' locks and commit after
releasing them, from threads of two processes with sync sessions and from tasks with
``AsyncSession``. Without the rule the same load loses updates every run, which shows
that the load can tell."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier

import procs
import pytest
from aiohelpers import run
from conftest import SERVERS
from flask_load import run_threads
from session_bank import Bank, async_url, engine_options, expected, plan
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from tierlock.aio import AsyncLockManager
from tierlock.contrib.sqlalchemy import hold_until_commit

RULE = pytest.mark.parametrize("hold", [True, False], ids=["rule", "no-rule"])

PROCESSES, THREADS, PER_THREAD = 2, 4, 20
TASKS, PER_TASK = 12, 16


@pytest.fixture
def bank(db_url: str, table: str) -> Iterator[Bank]:
    bank = Bank(table)
    bank.open(db_url)
    yield bank
    bank.close(db_url)


def check(bank: Bank, url: str, transfers: list[tuple[int, int]], *, whole: bool, how: str) -> None:
    """Every balance as the transfers left it if ``whole``, else some not (which shows
    that the load can tell)."""
    balances = bank.balances(url)
    wrong = sum(balances[account] != balance for account, balance in expected(transfers).items())
    print(
        f"{make_url(url).get_backend_name()}, {how}: {len(transfers)} transfers, total "
        f"{sum(balances.values())} of {sum(expected(transfers).values())}, {wrong} accounts wrong"
    )
    if whole:
        assert balances == expected(transfers)
    else:
        assert wrong, "the load lost no update: it cannot tell what keeps the money whole"


def _transfer_in_threads(
    url: str, table: str, transfers: list[tuple[int, int]], hold: bool, start: Barrier
) -> None:
    """In a forked child: ``THREADS`` threads share ``transfers``, each in sessions of
    its own, through this process's manager."""
    bank, locks = Bank(table), procs.open_manager(url, table)
    engine = create_engine(url, **engine_options(url))
    maker = sessionmaker(engine)
    if hold:
        hold_until_commit(maker, locks)
    failures: list[BaseException] = []

    def work(number: int) -> None:
        try:
            start.wait(procs.WAIT_LIMIT)
            for source, target in transfers[number::THREADS]:
                with maker() as session:
                    bank.transfer(session, locks, source, target)
        except BaseException as exc:
            start.abort()
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(procs.WAIT_LIMIT * 2)
    finally:
        locks.close()
        engine.dispose()
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if failures:
        raise failures[0]


@SERVERS
@RULE
@pytest.mark.multiprocess
def test_sync_sessions_in_threads_of_two_processes(
    db_url: str, table: str, bank: Bank, hold: bool, children: procs.Children
) -> None:
    transfers = plan(PROCESSES * THREADS * PER_THREAD, seed=5)
    start = procs.CTX.Barrier(PROCESSES)
    share = len(transfers) // PROCESSES
    for number in range(PROCESSES):
        mine = transfers[number * share : (number + 1) * share]
        children.start(
            _transfer_in_threads, url=db_url, table=table, transfers=mine, hold=hold, start=start
        )
    started = time.perf_counter()
    children.join()
    elapsed = time.perf_counter() - started
    how = f"{PROCESSES}x{THREADS} threads in {elapsed:.2f} s, rule {'on' if hold else 'off'}"
    check(bank, db_url, transfers, whole=hold, how=how)


@SERVERS
@RULE
def test_async_sessions_in_tasks(db_url: str, table: str, bank: Bank, hold: bool) -> None:
    transfers = plan(TASKS * PER_TASK, seed=9)

    async def main() -> None:
        engine = create_async_engine(async_url(db_url), pool_size=TASKS, **engine_options(db_url))
        maker = async_sessionmaker(engine)
        try:
            async with AsyncLockManager(
                db_url, table=table, reaper_interval=None, poll_interval=0.01
            ) as locks:
                if hold:
                    hold_until_commit(maker, locks)

                async def work(number: int) -> None:
                    for source, target in transfers[number::TASKS]:
                        if number % 2:  # committed by SQLAlchemy's task, at the block's end
                            async with maker.begin() as session:
                                await bank.atransfer(session, locks, source, target)
                        else:
                            async with maker() as session:
                                await bank.atransfer(session, locks, source, target)
                                await session.commit()

                await asyncio.gather(*(work(number) for number in range(TASKS)))
        finally:
            await engine.dispose()

    started = time.perf_counter()
    run(main)
    elapsed = time.perf_counter() - started
    how = f"{TASKS} tasks in {elapsed:.2f} s, rule {'on' if hold else 'off'}"
    check(bank, db_url, transfers, whole=hold, how=how)


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
@pytest.mark.parametrize("for_update", [False, True], ids=["plain-read", "for-update"])
def test_at_repeatable_read_a_read_before_the_lock_fixes_a_stale_snapshot(
    db_url: str, table: str, for_update: bool
) -> None:
    """MariaDB's default isolation: the teller's read fixes the snapshot the balances
    are read from, before the locks are taken; even under the rule the money goes
    wrong, unless the balances are read with ``SELECT ... FOR UPDATE``, which reads
    the latest committed rows (docs/transactions.md)."""
    bank = Bank(table, for_update=for_update)
    bank.open(db_url)
    transfers = plan(THREADS * PER_THREAD * 2, seed=3)
    locks = procs.open_manager(db_url, table)
    engine = create_engine(db_url)  # REPEATABLE READ
    maker = sessionmaker(engine)
    hold_until_commit(maker, locks)

    def work(number: int) -> None:
        for source, target in transfers[number::THREADS]:
            with maker() as session:
                bank.transfer(session, locks, source, target)

    try:
        started = time.perf_counter()
        run_threads(THREADS, work)
        elapsed = time.perf_counter() - started
    finally:
        locks.close()
        engine.dispose()
    try:
        how = f"REPEATABLE READ, {THREADS} threads in {elapsed:.2f} s, FOR UPDATE {for_update}"
        check(bank, db_url, transfers, whole=for_update, how=how)
    finally:
        bank.close(db_url)
