"""The scripts in examples/ run as documented, on every engine they can, and say what they
show."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import procs
import pytest
from conftest import SHARED_HOLDS

import tierlock

QUICKSTART = procs.ROOT / "examples" / "quickstart.py"
KEEPS_ACCOUNTS_IN_SQL = pytest.mark.sql_only("the example keeps its accounts in the same database")


def run_example(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return procs.run_python(str(script), *args, cwd=cwd, timeout=60)


def check_quickstart_output(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"holding 'user:42', fencing token \d+", out)
    assert "another thread trying it without waiting gets it: False" in out
    assert "released; locked now: False" in out
    # The counter survives the contention only because of the lock.
    assert re.search(r"with the lock: +100 of 100", out)
    assert "rising with every hold: True" in out
    assert "user 42: 100 - 5 x 10 = 50" in out
    assert "user 7: 100 - 5 x 10 = 50" in out
    assert re.search(r"order:7 +token \d+ +MainThread .*lease 30 s", out)
    assert re.search(r"user:42:pay +token \d+ +MainThread .*lease 10 s", out)
    assert "Traceback" not in result.stderr


@pytest.mark.multiprocess
def test_quickstart(db_url: str, tmp_path: Path) -> None:
    check_quickstart_output(run_example(QUICKSTART, db_url, cwd=tmp_path))


@pytest.mark.multiprocess
def test_quickstart_defaults_to_a_sqlite_file(tmp_path: Path) -> None:
    check_quickstart_output(run_example(QUICKSTART, cwd=tmp_path))
    assert (tmp_path / "tierlock.db").is_file()


EXAMPLES = procs.ROOT / "examples"


def run_ok(script: str, *args: str, cwd: Path) -> str:
    """Run ``examples/<script>``; it must exit 0 without a traceback. Returns its output."""
    result = run_example(EXAMPLES / script, *args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.mark.multiprocess
@KEEPS_ACCOUNTS_IN_SQL
def test_flask_app_balances_add_up(db_url: str, table: str, tmp_path: Path) -> None:
    out = run_ok("flask_app.py", "--url", db_url, "--table", table, cwd=tmp_path)
    assert "200 transfers from 8 client threads" in out
    rows = re.findall(r"user \d: balance +(-?\d+), expected +(-?\d+)", out)
    assert len(rows) == 5
    assert all(balance == expected for balance, expected in rows)
    assert "total 5000 of 5000" in out
    assert "every balance adds up" in out


@pytest.mark.multiprocess
@KEEPS_ACCOUNTS_IN_SQL
def test_django_service_pays_out_exactly_the_balance(
    db_url: str, table: str, tmp_path: Path
) -> None:
    out = run_ok("django_service.py", "--url", db_url, "--table", table, cwd=tmp_path)
    for user in range(3):
        assert f"user {user}: 20 of 30 withdrawals of 5 paid out, balance 0 " in out
    assert "every balance is right" in out


@pytest.mark.multiprocess
def test_cron_job_skips_while_another_run_holds_it(
    db_url: str, table: str, make_manager: Callable[..., tierlock.LockManager], tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex}"
    args = ("--url", db_url, "--table", table, "--job", job, "--seconds", "0")
    locks = make_manager()
    with locks.lock(("cron", job)):  # a run on another host, still at work
        skipped = run_ok("cron_job.py", *args, cwd=tmp_path)
        assert locks.info(("cron", job)) is not None
    ran = run_ok("cron_job.py", *args, cwd=tmp_path)

    here = f"on {socket.gethostname()} (pid {os.getpid()})"
    assert f"skipped {job}: already running {here}" in skipped
    assert f"running {job}" not in skipped
    assert re.search(rf"running {job} \(fencing token \d+\)", ran)
    assert f"finished {job}" in ran
    assert "skipped" not in ran
    assert locks.info(("cron", job)) is None, "the run released the lock"


@pytest.mark.multiprocess
def test_fencing_refuses_the_stalled_holder(db_url: str, table: str, tmp_path: Path) -> None:
    out = run_ok("fencing.py", "--url", db_url, "--table", table, cwd=tmp_path)
    stalled = re.search(r"A holds 'report:42' with token (\d+) and a 1 s lease", out)
    taken = re.search(r"takes the lock over with token (\d+)", out)
    assert stalled is not None and taken is not None, out
    old, new = int(stalled[1]), int(taken[1])
    assert new > old
    assert f"B writes with token {new}: accepted" in out
    assert f"A wakes up and writes with token {old}: refused" in out
    assert "A releases: LockLostError" in out
    assert f"the store keeps 'written by B' (token {new})" in out
    # The order is the point: B's write, then A's refused one, then A's lost release.
    assert out.index("B writes") < out.index("A wakes up") < out.index("A releases")


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "script", ["flask_app.py", "django_service.py", "fencing.py", "fastapi_transfers.py"]
)
def test_examples_default_to_sqlite_in_a_temporary_directory(script: str, tmp_path: Path) -> None:
    run_ok(script, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == [], "nothing is left in the working directory"


@pytest.mark.multiprocess
@SHARED_HOLDS
def test_read_write_readers_share_and_the_writer_is_alone(
    db_url: str, table: str, tmp_path: Path
) -> None:
    out = run_ok("read_write.py", "--url", db_url, "--table", table, cwd=tmp_path)
    assert "two readers inside; the lock table shows 'doc:readme' held in mode shared\n" in out
    assert "a writer trying without waiting meanwhile gets it: False" in out
    tokens = [
        int(token) for token in re.findall(r"wrote version \d alone, fencing token (\d+)", out)
    ]
    assert len(tokens) == 5 and tokens == sorted(set(tokens)), out
    assert "8 readers made 120 reads; torn reads: 0" in out
    most = re.search(r"most readers inside at once: (\d+)", out)
    assert most is not None and 2 <= int(most[1]) <= 8, "readers share the document"
    assert "writes while a reader was inside: 0" in out
    assert "final version 5: 'text of version 5'" in out


@pytest.mark.multiprocess
@SHARED_HOLDS
def test_semaphore_keeps_the_provider_within_its_limit(
    db_url: str, table: str, tmp_path: Path
) -> None:
    out = run_ok("semaphore.py", "--url", db_url, "--table", table, cwd=tmp_path)
    assert "one thread holds 3 of 3 permits" in out
    assert "one more without waiting: False" in out
    assert "all returned" in out
    assert "40 payments from 10 threads" in out
    most = re.search(r"most calls in flight at once: (\d+) \(limit 3\)", out)
    assert most is not None and 2 <= int(most[1]) <= 3, out
    assert "refused by the provider: 0" in out
    assert "charged 200 of 200" in out


@pytest.mark.multiprocess
@KEEPS_ACCOUNTS_IN_SQL
def test_fastapi_transfers_keep_the_total_only_with_the_locks(
    db_url: str, table: str, tmp_path: Path
) -> None:
    out = run_ok("fastapi_transfers.py", "--url", db_url, "--table", table, cwd=tmp_path)
    counts = re.search(r"200 concurrent transfers in [\d.]+ s: (\d+) made, (\d+) refused", out)
    assert counts is not None, out
    made, refused = int(counts[1]), int(counts[2])
    assert made + refused == 200 and made > 0 and refused > 0
    rows = re.findall(r"user \d: balance +(-?\d+), expected +(-?\d+)", out)
    assert len(rows) == 5
    assert all(balance == expected and int(balance) >= 0 for balance, expected in rows)
    assert "total 500 of 500" in out
    unguarded = re.search(r"without the locks: total (\d+) of 500", out)
    assert unguarded is not None and int(unguarded[1]) != 500, out
    assert "every balance adds up" in out


@pytest.mark.multiprocess
@pytest.mark.parametrize("script", ["read_write.py", "semaphore.py"])
def test_shared_examples_default_to_sqlite_in_a_temporary_directory(
    script: str, tmp_path: Path
) -> None:
    run_ok(script, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == [], "nothing is left in the working directory"
