"""``lock_all`` and ``synchronized`` with several templates in the integrations: Flask's
extension and app manager, and Django's, whose sets keep the transaction rule."""

from __future__ import annotations

from pathlib import Path

import procs
import pytest
from conftest import MakeManager
from flask import Flask

import tierlock
from tierlock.contrib.flask import TierLock


def test_flask_synchronized_and_the_app_manager_take_several_keys(
    db_url: str, table: str, make_manager: MakeManager, key: str
) -> None:
    app = Flask(__name__)
    app.config.update(
        TIERLOCK_URL=db_url,
        TIERLOCK_TABLE=table,
        TIERLOCK_OPTIONS={"reaper_interval": None, "poll_interval": 0.02},
    )
    ext = TierLock(app)
    observer = make_manager()
    pair = [f"{key}:1", f"{key}:2"]
    seen: list[bool] = []

    @ext.synchronized(f"{key}:{{source}}", f"{key}:{{target}}")
    def move(source: int, target: int) -> None:
        seen.extend(observer.lock(k).locked() for k in pair)

    try:
        with app.app_context():
            move(2, 1)
        assert seen == [True, True]
        assert not any(observer.lock(k).locked() for k in pair)
        with app.extensions["tierlock"].lock_all([(key, 2), (key, 1)]) as held:
            assert isinstance(held, tierlock.MultiLock)
            assert held.keys == tuple(pair) and held.owned()
            assert all(observer.lock(k).locked() for k in pair)
        assert not any(observer.lock(k).locked() for k in pair)
    finally:
        ext.close()


DJANGO = """
import sys

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["tierlock.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "app.sqlite3"}},
)
django.setup()
from django.core.management import call_command
from django.db import transaction

import tierlock
from tierlock.contrib.django import locks, synchronized

call_command("migrate", verbosity=0)
observer = tierlock.LockManager(locks.url, table=locks.table, reaper_interval=None)
pair = ["account:1", "account:2"]


def taken():
    return [observer.lock(key).locked() for key in pair]


@synchronized("account:{source}", "account:{target}")
def move(source, target):
    print("in the call:", taken())


held = locks.lock_all(["account:2", ("account", 1)])
print("handles:", sorted({type(lock).__name__ for lock in held.locks}))
with transaction.atomic():
    with held:
        pass
    print("released in a transaction:", taken())
print("after it:", taken())
move(2, 1)
print("after the call:", taken())
with transaction.atomic():
    move(2, 1)
    print("after the call, in a transaction:", taken())
print("after it:", taken())
observer.close()
"""


@pytest.mark.multiprocess
def test_django_sets_keep_the_transaction_rule(tmp_path: Path) -> None:
    result = procs.run_python("-c", DJANGO, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "handles: ['TransactionLock']",
        "released in a transaction: [True, True]",
        "after it: [False, False]",
        "in the call: [True, True]",
        "after the call: [False, False]",
        "in the call: [True, True]",
        "after the call, in a transaction: [True, True]",
        "after it: [False, False]",
    ]
