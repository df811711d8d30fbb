"""The Flask-SQLAlchemy app under test: ``POST /transfer {"from": 1, "to": 2}`` moves 7
between two accounts through ``db.session`` as tests/session_bank.py does: the view
reads its teller (the transaction begins), takes both accounts' locks, reads and
writes the balances, releases the locks and then commits. Only the transaction rule
(on unless ``TIERLOCK_HOLD_UNTIL_COMMIT`` is false) keeps the money whole.

Settings come from ``FLASK_*`` variables (``FLASK_TIERLOCK_URL``,
``FLASK_TIERLOCK_TABLE``, ``FLASK_TIERLOCK_HOLD_UNTIL_COMMIT=false``) or from
``create_app(config)``; the accounts live beside the locks unless
``SQLALCHEMY_DATABASE_URI`` says otherwise. gunicorn serves
``flask_sqla_bank:create_app()``. ``BANK_TIERLOCK_FIRST`` sets tierlock up before
Flask-SQLAlchemy (the default is after).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from session_bank import Bank, engine_options
from sqlalchemy import select

from tierlock.contrib.flask import TierLock

db = SQLAlchemy()
locks = TierLock()


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()
    app.config.update(config or {})
    url = app.config.setdefault("SQLALCHEMY_DATABASE_URI", app.config["TIERLOCK_URL"])
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", engine_options(url))
    if app.config.get("BANK_TIERLOCK_FIRST"):
        locks.init_app(app)
        db.init_app(app)
    else:
        db.init_app(app)
        locks.init_app(app)
    bank = Bank(app.config["TIERLOCK_TABLE"])

    @app.post("/transfer")
    def transfer() -> dict[str, int]:
        body = request.get_json()
        bank.transfer(db.session(), locks, int(body["from"]), int(body["to"]))
        return {"pid": os.getpid()}

    @app.get("/balances")
    def balances() -> dict[str, int]:
        rows = db.session.execute(select(bank.accounts.c.id, bank.accounts.c.balance))
        return {str(account): balance for account, balance in rows}

    return app
