"""The Django integration under Django's own test runner: money transfers conserved
across threads and a second process, the transaction rule, the test database, the
migration's DDL and ``manage.py tierlock``. tests/test_django.py runs it on each
database."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Sum
from django.test import Client, TestCase, TransactionTestCase
from sqlalchemy.engine import make_url

from tierlock import NotHeldError
from tierlock.contrib.django import LockTableError, locks
from tierlock.contrib.django.conf import resolve

from .models import Account, Transfer
from .services import hold
from .tests_schema import drop_table

PROJECT = Path(__file__).resolve().parent.parent
ACCOUNTS = 5
OPENING = 1000
THREADS, PER_THREAD = 4, 30  # through ATOMIC_REQUESTS views, in this process
CHILD_THREADS, PER_CHILD_THREAD = 2, 30  # in transaction.atomic(), in a second process


class Boom(Exception):
    pass


def manage(*args: str, **env: str) -> subprocess.Popen[str]:
    """``manage.py`` in another process, on this test database."""
    return subprocess.Popen(
        [sys.executable, str(PROJECT / "manage.py"), *args],
        cwd=PROJECT,
        env={**os.environ, "BANK_DB_NAME": str(settings.DATABASES["default"]["NAME"]), **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    process = manage(*args, **env)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def try_elsewhere(key: str) -> bool:
    """Whether another thread gets ``key`` without waiting (it lets go at once)."""
    got: list[bool] = []

    def attempt() -> None:
        lock = locks.lock(key)
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return got[0]


class MoneyTests(TransactionTestCase):  # type: ignore[misc]
    def test_transfers_conserve_money(self) -> None:
        ids = [Account.objects.create(balance=OPENING).pk for _ in range(ACCOUNTS)]
        child = manage(
            "bank_transfers",
            "--threads", str(CHILD_THREADS),
            "--count", str(PER_CHILD_THREAD),
            "--seed", "1000",
            *map(str, ids),
        )  # fmt: skip
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n", child.stderr
        errors: list[BaseException] = []

        def post_transfers(seed: int) -> None:
            chance, client = random.Random(seed), Client()
            try:
                for _ in range(PER_THREAD):
                    src, dst = chance.sample(ids, 2)
                    data = {"src": src, "dst": dst, "amount": chance.randint(1, 50)}
                    response = client.post("/transfer", data)
                    assert response.status_code == 200, response
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=post_transfers, args=(n,)) for n in range(THREADS)]
        child.stdin.write("go\n")
        child.stdin.flush()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out, err = child.communicate(timeout=120)
        assert errors == []
        assert child.returncode == 0, err
        assert out == "done\n"

        transfers = THREADS * PER_THREAD + CHILD_THREADS * PER_CHILD_THREAD
        assert Transfer.objects.count() == transfers
        total = Account.objects.aggregate(total=Sum("balance"))["total"]
        for account in Account.objects.all():
            sent = Transfer.objects.filter(src=account.pk).aggregate(s=Sum("amount"))["s"]
            got = Transfer.objects.filter(dst=account.pk).aggregate(s=Sum("amount"))["s"]
            assert account.balance == OPENING - (sent or 0) + (got or 0), account.pk
        assert total == ACCOUNTS * OPENING
        sys.stderr.write(
            f"\nbank: {transfers} transfers ({THREADS * PER_THREAD} by {THREADS} threads "
            f"through ATOMIC_REQUESTS views, {CHILD_THREADS * PER_CHILD_THREAD} by a second "
            f"process), total {total} of {ACCOUNTS * OPENING}, every balance matches its "
            "transfers\n"
        )


class TransactionRuleTests(TransactionTestCase):  # type: ignore[misc]
    def test_without_a_transaction_the_release_is_at_once(self) -> None:
        with locks.lock("rule:none") as lock:
            assert lock.owned()
        assert not lock.owned()
        assert locks.info("rule:none") is None

    def test_held_until_commit(self) -> None:
        lock = locks.lock("rule:commit")
        with transaction.atomic():
            with lock:
                Account.objects.create(balance=1)
            assert lock.owned()
            assert not try_elsewhere("rule:commit")
            assert locks.info("rule:commit") is not None
        assert not lock.owned()
        assert try_elsewhere("rule:commit")
        assert Account.objects.count() == 1

    def test_held_until_rollback(self) -> None:
        lock = locks.lock("rule:rollback")
        with suppress(Boom), transaction.atomic():
            with lock:
                Account.objects.create(balance=1)
            assert lock.owned()
            raise Boom
        assert not lock.owned()
        assert try_elsewhere("rule:rollback")
        assert Account.objects.count() == 0

    def test_held_until_a_rollback_asked_for(self) -> None:
        lock = locks.lock("rule:set_rollback")
        with transaction.atomic():
            with lock:
                pass
            transaction.set_rollback(True)
            assert lock.owned()
        assert not lock.owned()

    def test_nested_blocks_wait_for_the_outermost(self) -> None:
        lock = locks.lock("rule:nested")
        with transaction.atomic():
            with transaction.atomic(), lock:
                pass
            assert lock.owned()
            # A savepoint rolled back does not end the transaction either.
            with suppress(Boom), transaction.atomic(), lock:
                raise Boom
            assert lock.owned()
            assert not try_elsewhere("rule:nested")
        assert not lock.owned()
        assert try_elsewhere("rule:nested")

    def test_reentrant_holds_all_end_with_the_transaction(self) -> None:
        lock = locks.lock("rule:again")
        with transaction.atomic():
            hold("again")
            hold("again")
            with lock:
                assert lock.owned()
            assert lock.owned()
        assert not lock.owned()
        assert try_elsewhere("rule:again")

    def test_releasing_what_is_not_held_fails_at_once(self) -> None:
        with transaction.atomic(), pytest.raises(NotHeldError):
            locks.lock("rule:never").release()

    def test_atomic_requests_hold_until_the_response(self) -> None:
        client = Client(raise_request_exception=False)
        response = client.get("/hold/request")
        assert response.json() == {"owned": True}  # after the service returned
        assert not locks.lock("hold:request").owned()
        assert try_elsewhere("hold:request")
        assert client.get("/fail/request").status_code == 500
        assert not locks.lock("hold:request").owned()
        assert try_elsewhere("hold:request")


class TestCaseBlocksTests(TestCase):  # type: ignore[misc]
    """TestCase runs each test in atomic blocks that never commit: they do not count."""

    def test_blocks_of_the_test_case_do_not_count(self) -> None:
        with locks.lock("rule:testcase") as lock:
            pass
        assert not lock.owned()
        with transaction.atomic():
            with lock:
                pass
            assert lock.owned()
        assert not lock.owned()


class DatabaseTests(TransactionTestCase):  # type: ignore[misc]
    def test_manager_uses_the_test_database(self) -> None:
        name = str(settings.DATABASES["default"]["NAME"])
        locked = make_url(resolve().url).database
        if connection.vendor == "sqlite":
            assert Path(name).name == "test_bank.sqlite3"
            assert locked == str(Path(name).with_name("test_bank-tierlock.sqlite3"))
            assert make_url(locks.url).database == locked
            return
        assert name == os.environ["BANK_TEST_NAME"]
        assert make_url(locks.url).database == name
        with locks.lock("db:test"), connection.cursor() as cursor:
            cursor.execute(f"SELECT lock_key FROM {locks.table}")
            assert [tuple(row) for row in cursor.fetchall()] == [("db:test",)]

    def test_manager_follows_the_settings(self) -> None:
        first = locks.manager
        with self.settings(TIERLOCK={"TABLE": "bank_other_locks", "CREATE_TABLE": True}):
            with locks.lock("db:other"):
                assert locks.table == "bank_other_locks"
                assert [info.key for info in locks.holders()] == ["db:other"]
            assert locks.manager is not first
            drop_table(resolve().url, "bank_other_locks")
        assert locks.table == "tierlock_locks"

    def test_a_missing_table_says_to_migrate(self) -> None:
        with (
            self.settings(TIERLOCK={"TABLE": "bank_missing"}),
            pytest.raises(LockTableError, match=r"run `python manage\.py migrate tierlock`"),
        ):
            locks.holders()
