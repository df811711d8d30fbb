"""The Flask app under test: money moves between accounts kept in the lock database.

``POST /transfer {"from": 1, "to": 2, "amount": 5}`` reads both balances, pauses, and
writes both back, statement by statement in autocommit: two transfers that share an
account would overwrite each other's writes, so the view holds both accounts' locks,
taken in sorted order. ``POST /deposit`` goes through a service function under
``@locks.synchronized``, decorated at import, before any app exists.

Settings come from ``FLASK_*`` variables (``FLASK_TIERLOCK_URL``, ...) or from
``create_app(config)``; gunicorn serves ``flask_bank:create_app()``. With
``BANK_OPEN_IN_MASTER`` the manager is opened as the app is made, which under
``--preload`` is in gunicorn's master, before the workers are forked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from flask import Flask, current_app, request
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, select, update
from sqlalchemy.engine import Engine

from tierlock.contrib.flask import TierLock

OPENING_BALANCE = 1000
# Between a section's read and its write: wide enough that overlapping sections lose
# updates, short enough to run fast. It synchronises nothing.
PAUSE = 0.001

locks = TierLock()


def accounts_table(lock_table: str) -> Table:
    """The accounts of the bank beside lock table ``lock_table``."""
    return Table(
        f"{lock_table}_accounts",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("balance", Integer, nullable=False),
    )


def bank_engine(url: str) -> Engine:
    # Autocommit: each statement commits alone, so only the locks keep a transfer whole.
    connect_args = {"timeout": 30} if url.startswith("sqlite") else {}
    return create_engine(url, isolation_level="AUTOCOMMIT", connect_args=connect_args)


def open_accounts(url: str, lock_table: str, count: int) -> None:
    """Create the accounts table with ``count`` accounts of ``OPENING_BALANCE``."""
    accounts = accounts_table(lock_table)
    engine = bank_engine(url)
    try:
        with engine.connect() as db:
            accounts.create(db)
            rows = [{"id": n, "balance": OPENING_BALANCE} for n in range(count)]
            db.execute(accounts.insert(), rows)
    finally:
        engine.dispose()


def _bank() -> tuple[Engine, Table]:
    engine, accounts = current_app.extensions["bank"]
    return engine, accounts


def _move(db: Any, accounts: Table, changes: Mapping[int, int]) -> None:
    """Add ``changes`` to the balances: a read, a pause, a write of what was read."""
    query = select(accounts.c.id, accounts.c.balance).where(accounts.c.id.in_(list(changes)))
    balances = {account: balance for account, balance in db.execute(query)}
    time.sleep(PAUSE)  # another section for these accounts would read stale balances now
    for account, change in changes.items():
        new = balances[account] + change
        db.execute(update(accounts).where(accounts.c.id == account).values(balance=new))


@locks.synchronized("account:{account_id}")
def deposit(account_id: int, amount: int) -> None:
    engine, accounts = _bank()
    with engine.connect() as db:
        _move(db, accounts, {account_id: amount})


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()
    app.config.update(config or {})
    locks.init_app(app)
    app.extensions["bank"] = (
        bank_engine(app.config.get("BANK_URL", app.config["TIERLOCK_URL"])),
        accounts_table(app.config["TIERLOCK_TABLE"]),
    )
    if os.environ.get("BANK_OPEN_IN_MASTER"):
        app.extensions["tierlock"].manager  # noqa: B018 (opens it now)

    @app.post("/transfer")
    def transfer() -> dict[str, int]:
        body = request.get_json()
        source, target, amount = int(body["from"]), int(body["to"]), int(body["amount"])
        first, second = sorted((source, target))
        engine, accounts = _bank()
        with (
            locks.lock(("account", first)),
            locks.lock(("account", second)),
            engine.connect() as db,
        ):
            _move(db, accounts, {source: -amount, target: amount})
        return {"pid": os.getpid()}

    @app.post("/deposit")
    def deposit_view() -> dict[str, int]:
        body = request.get_json()
        deposit(int(body["to"]), int(body["amount"]))
        return {"pid": os.getpid()}

    @app.get("/balances")
    def balances() -> dict[str, int]:
        engine, accounts = _bank()
        with engine.connect() as db:
            rows = db.execute(select(accounts.c.id, accounts.c.balance))
            return {str(account): balance for account, balance in rows}

    return app
