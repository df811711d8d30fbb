"""A Django service-layer function that runs one call per user at a time.

``withdraw()`` reads an account, refuses an overdraft and saves the new balance: two
calls for one user that overlap would both pass the check on the same old balance. With
``@synchronized("user:{user_id}")`` from ``tierlock.contrib.django`` each call holds
that user's lock, across threads here and across processes and hosts in production,
while calls for other users run side by side. Each call runs in ``transaction.atomic()``,
as ``ATOMIC_REQUESTS`` runs a view: the lock is held until that transaction commits, so
the next call for the user reads the new balance.

Standalone: Django is configured in this file, with its database in a SQLite file in a
temporary directory; ``manage.py migrate`` (here ``call_command``) creates the lock
table in a file beside it, or at --url::

    python examples/django_service.py
    python examples/django_service.py --url mysql+pymysql://root@127.0.0.1:3306/test
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connection, models, transaction

from tierlock.contrib.django import locks, synchronized

USERS = 3
OPENING_BALANCE = 100
AMOUNT = 5
ATTEMPTS = 30  # withdrawals tried per user: more than the balance allows
THREADS = 8

parser = argparse.ArgumentParser(description="A Django service function under a lock.")
parser.add_argument("--url", help="lock database (default: SQLite beside Django's)")
parser.add_argument("--table", default="tierlock_locks", help="lock table")
args = parser.parse_args()
scratch = Path(tempfile.mkdtemp(prefix="tierlock-django-"))

# What a settings module would say.
tierlock_settings: dict[str, Any] = {"TABLE": args.table}
if args.url:
    tierlock_settings["URL"] = args.url
settings.configure(
    INSTALLED_APPS=["tierlock.contrib.django"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": scratch / "bank.sqlite3",
            # Writers take turns from BEGIN on, which SQLite needs for concurrent writes.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    },
    TIERLOCK=tierlock_settings,
    USE_TZ=True,
)
django.setup()


class Account(models.Model):  # type: ignore[misc]
    balance = models.IntegerField()

    class Meta:
        app_label = "bank"


class InsufficientFunds(Exception):
    pass


@synchronized("user:{user_id}")
def withdraw(user_id: int, amount: int) -> int:
    """Take ``amount`` from the user's account and return the new balance."""
    account = Account.objects.get(pk=user_id)
    if account.balance < amount:
        raise InsufficientFunds(f"user {user_id} has {account.balance}, not {amount}")
    time.sleep(0.001)  # another call for this user would pass the check above meanwhile
    account.balance -= amount
    account.save(update_fields=["balance"])
    balance: int = account.balance
    return balance


def try_withdraw(user_id: int) -> bool:
    """One request's worth of work in a worker thread: True if the money was paid out."""
    try:
        with transaction.atomic():
            withdraw(user_id, AMOUNT)
    except InsufficientFunds:
        return False
    finally:
        connection.close()  # Django opens one connection per thread
    return True


def main() -> int:
    call_command("migrate", verbosity=0)
    with connection.schema_editor() as editor:
        editor.create_model(Account)
    Account.objects.bulk_create(Account(pk=user, balance=OPENING_BALANCE) for user in range(USERS))
    calls = [user for _ in range(ATTEMPTS) for user in range(USERS)]
    with ThreadPoolExecutor(THREADS) as pool:
        paid = list(pool.map(try_withdraw, calls))

    allowed = OPENING_BALANCE // AMOUNT
    ok = True
    print(f"locks in table {locks.table} at {locks.url}")
    for user in range(USERS):
        payouts = sum(p for p, u in zip(paid, calls, strict=True) if u == user)
        balance = Account.objects.get(pk=user).balance
        print(
            f"user {user}: {payouts} of {ATTEMPTS} withdrawals of {AMOUNT} paid out, "
            f"balance {balance} (expected {allowed} paid out, balance 0)"
        )
        ok = ok and payouts == allowed and balance == 0
    print("every balance is right" if ok else "WRONG: overlapping calls paid out too much")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    finally:
        locks.close()
        connection.close()
        shutil.rmtree(scratch)
