"""A bank whose transfers run in SQLAlchemy sessions, for the transaction rule's tests
(tests/contrib/test_sqlalchemy_money.py, and the Flask-SQLAlchemy app in
tests/flask_sqla_bank.py).

A transfer opens its session's transaction before it takes the accounts' locks (it
reads its teller, as a view loads the current user), reads and writes the two
balances holding the locks, and commits after releasing them. Only the rule keeps
the money whole: without it, the next holder of an account reads its balance before
this transfer has committed, and overwrites what it wrote.

The accounts are read only once their locks are held, and MariaDB's sessions run at
READ COMMITTED: at its default REPEATABLE READ, the teller's read would fix the
snapshot that the balances are read from, before the locks were taken, and no lock
held until commit could make those balances current (docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from sqlalchemy import Column, Integer, MetaData, Table, create_engine, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from tierlock.keys import KeyLike

ACCOUNTS = 6
OPENING_BALANCE = 1000
# Between a transfer's read and its write, and between its release and its commit:
# wide enough that overlapping transfers lose updates every run, short enough to run
# fast. It synchronises nothing.
PAUSE = 0.002


class Locks(Protocol):
    def lock(self, key: KeyLike) -> AbstractContextManager[Any]: ...


class AsyncLocks(Protocol):
    def lock(self, key: KeyLike) -> AbstractAsyncContextManager[Any]: ...


class Bank:
    """The accounts and tellers tables beside lock table ``prefix``; with
    ``for_update``, transfers read the balances with ``SELECT ... FOR UPDATE``."""

    def __init__(self, prefix: str, *, for_update: bool = False) -> None:
        self.for_update = for_update
        metadata = MetaData()
        self.metadata = metadata
        self.accounts = Table(
            f"{prefix}_accounts",
            metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("balance", Integer, nullable=False),
        )
        self.tellers = Table(
            f"{prefix}_tellers",
            metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
        )

    def open(self, url: str) -> None:
        """Create the tables with ``ACCOUNTS`` accounts and a teller."""
        engine = create_engine(url)
        try:
            with engine.begin() as db:
                self.metadata.create_all(db)
                rows = [{"id": n, "balance": OPENING_BALANCE} for n in range(ACCOUNTS)]
                db.execute(self.accounts.insert(), rows)
                db.execute(self.tellers.insert(), [{"id": 1}])
        finally:
            engine.dispose()

    def close(self, url: str) -> None:
        engine = create_engine(url)
        try:
            with engine.begin() as db:
                self.metadata.drop_all(db, checkfirst=True)
        finally:
            engine.dispose()

    def balances(self, url: str) -> dict[int, int]:
        engine = create_engine(url)
        try:
            with engine.connect() as db:
                rows = db.execute(select(self.accounts.c.id, self.accounts.c.balance))
                return {account: balance for account, balance in rows}
        finally:
            engine.dispose()

    def _read(self, changes: Mapping[int, int]) -> Any:
        query = select(self.accounts.c.id, self.accounts.c.balance)
        query = query.where(self.accounts.c.id.in_(list(changes)))
        return query.with_for_update() if self.for_update else query

    def _write(self, account: int, balance: int) -> Any:
        return update(self.accounts).where(self.accounts.c.id == account).values(balance=balance)

    def transfer(self, session: Session, locks: Locks, source: int, target: int) -> None:
        """Move 7 from ``source`` to ``target`` (see the module's docstring)."""
        session.execute(select(self.tellers.c.id))  # the transaction begins here
        changes = {source: -7, target: 7}
        first, second = sorted(changes)
        with locks.lock(("account", first)), locks.lock(("account", second)):
            balances = {
                account: balance for account, balance in session.execute(self._read(changes))
            }
            time.sleep(PAUSE)
            for account, change in changes.items():
                session.execute(self._write(account, balances[account] + change))
        time.sleep(PAUSE)  # released, not yet committed
        session.commit()

    async def atransfer(
        self, session: AsyncSession, locks: AsyncLocks, source: int, target: int
    ) -> None:
        """``transfer`` in a task, with an ``AsyncSession``; the caller commits."""
        await session.execute(select(self.tellers.c.id))
        changes = {source: -7, target: 7}
        first, second = sorted(changes)
        async with locks.lock(("account", first)), locks.lock(("account", second)):
            read = await session.execute(self._read(changes))
            balances = {account: balance for account, balance in read}
            await asyncio.sleep(PAUSE)
            for account, change in changes.items():
                await session.execute(self._write(account, balances[account] + change))
        await asyncio.sleep(PAUSE)


def engine_options(url: str) -> dict[str, Any]:
    """The sessions' engine options: READ COMMITTED on MariaDB (see the docstring)."""
    if make_url(url).get_backend_name() == "mysql":
        return {"isolation_level": "READ COMMITTED"}
    return {}


def async_url(url: str) -> str:
    """``url`` with an asyncio driver: aiomysql on MariaDB, psycopg's own on PostgreSQL."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "mysql":
        parsed = parsed.set(drivername="mysql+aiomysql")
    return parsed.render_as_string(hide_password=False)


def expected(transfers: list[tuple[int, int]]) -> dict[int, int]:
    """The balances after ``transfers``, were no update lost."""
    balances = dict.fromkeys(range(ACCOUNTS), OPENING_BALANCE)
    for source, target in transfers:
        balances[source] -= 7
        balances[target] += 7
    return balances


def plan(count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` transfers between two different accounts."""
    choose = random.Random(seed)
    return [
        (source, target)
        for source, target in (choose.sample(range(ACCOUNTS), 2) for _ in range(count))
    ]
