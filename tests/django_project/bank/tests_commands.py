"""``manage.py tierlock``: the ``tierlock`` command's output and exit codes."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from django.test import TransactionTestCase
from sqlalchemy.engine import make_url

from tierlock import LockLostError
from tierlock.contrib.django import locks
from tierlock.contrib.django.conf import resolve
from tierlock.tools import admin

from .tests import run_manage

MIGRATE = "run `python manage.py migrate tierlock`"


class CommandTests(TransactionTestCase):  # type: ignore[misc]
    def setUp(self) -> None:
        self.where = make_url(resolve().url).render_as_string(hide_password=True)

    def test_ls_with_nothing_held(self) -> None:
        result = run_manage("tierlock", "ls")
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == admin.nothing_held("tierlock_locks", self.where) + "\n", (
            result.stdout
        )

    def test_ls_release_and_reap(self) -> None:
        lock = locks.lock("cmd:held")
        lock.acquire()
        self.addCleanup(locks.force_release, "cmd:held")  # (should an assertion fail)
        listed = run_manage("tierlock", "ls")  # through a pipe: a header and a line per hold
        assert listed.returncode == 0, listed.stderr
        header, line = listed.stdout.splitlines()
        assert header.startswith("key ")
        row = rf"cmd:held +exclusive +\d+ +\S+ +{os.getpid()} .* held +MainThread"
        assert re.fullmatch(row, line), listed.stdout
        as_json = run_manage("tierlock", "ls", "--json")
        assert as_json.returncode == 0, as_json.stderr
        [record] = json.loads(as_json.stdout)
        assert (record["key"], record["pid"]) == ("cmd:held", os.getpid())
        fresh = admin.holder_record(locks.holders()[0])
        del record["expires_at"], fresh["expires_at"]  # (the heartbeat may renew it meanwhile)
        assert record == fresh

        refused = run_manage("tierlock", "release", "cmd:held")
        assert refused.returncode == 2
        assert admin.FORCE_NEEDED.format(key="cmd:held") in refused.stderr
        assert locks.info("cmd:held") is not None

        forced = run_manage("tierlock", "release", "cmd:held", "--force")
        assert (forced.returncode, forced.stderr) == (0, "")
        assert forced.stdout == admin.released("cmd:held", True) + "\n"
        assert locks.info("cmd:held") is None
        with pytest.raises(LockLostError):
            lock.release()
        again = run_manage("tierlock", "release", "cmd:held", "--force")
        assert again.stdout == admin.released("cmd:held", False) + "\n"

        short = locks.lock("cmd:expired", ttl=0.2, renew=False)
        short.acquire()
        deadline = time.monotonic() + 20
        while not getattr(locks.info("cmd:expired"), "expired", False):
            assert time.monotonic() < deadline, "the lease did not end"
            time.sleep(0.05)  # until the database's clock ends the lease
        reaped = run_manage("tierlock", "reap")
        assert (reaped.returncode, reaped.stderr) == (0, "")
        assert reaped.stdout == admin.reaped(1, "tierlock_locks") + "\n"
        assert locks.holders() == []
        with pytest.raises(LockLostError):
            short.release()

    def test_a_missing_table_fails_with_one_line(self) -> None:
        result = run_manage("tierlock", "ls", BANK_TIERLOCK='{"TABLE": "bank_nowhere"}')
        assert (result.returncode, result.stdout) == (1, "")
        assert (
            result.stderr
            == f"CommandError: lock table bank_nowhere does not exist in {self.where}; {MIGRATE}\n"
        )

    def test_usage_errors_exit_2(self) -> None:
        assert run_manage("tierlock").returncode == 2
        assert run_manage("tierlock", "unlock").returncode == 2
