"""The Django integration: tests/django_project's suite under Django's own test runner
(``manage.py test``, which makes its own test database) on every database, and imports
that never connect.

The suite (bank/tests*.py) moves money between accounts from threads posting to an
``ATOMIC_REQUESTS`` view and from a second process, checks the transaction rule on
commit, rollback, nested blocks and requests, that the manager follows the test
database, that the migration makes the table ``create_table=True`` makes, and
``manage.py tierlock``'s output and exit codes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import procs
import pytest
from engines import ENGINES, require_server

PROJECT = procs.ROOT / "tests" / "django_project"
SUITE_TESTS = 28
# SQLite keeps its locks in a file of their own: nothing to adopt or refuse there.
SKIPPED = {"sqlite": 1}
MONEY = (
    "bank: 180 transfers (120 by 4 threads through ATOMIC_REQUESTS views, 60 by a second "
    "process), total 5000 of 5000, every balance matches its transfers"
)
CLOSED_PORT_URLS = [
    "mysql+pymysql://root:secret@127.0.0.1:1/test",
    "postgresql+psycopg://postgres:secret@127.0.0.1:1/test",
]


def run_in_project(
    *args: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in the test project, with this checkout importable."""
    path = os.pathsep.join(filter(None, [str(procs.ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT,
        env={
            **os.environ,
            "PYTHONPATH": path,
            "DJANGO_SETTINGS_MODULE": "bankproject.settings",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.sql_only("Django's database is the lock store")
def test_django_suite(db: str, tmp_path: Path) -> None:
    url = ENGINES[db]
    if url is not None:
        require_server(url)
    env = {
        "BANK_DB_URL": url or "sqlite://",
        "BANK_DIR": str(tmp_path),
        # Its own test database, so that runs side by side never meet.
        "BANK_TEST_NAME": f"test_tierlock_{uuid.uuid4().hex[:12]}",
    }
    result = run_in_project("manage.py", "test", "bank", "--noinput", env=env, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    ran = re.search(r"^Ran (\d+) tests? in ", result.stderr, re.MULTILINE)
    assert ran is not None and int(ran[1]) == SUITE_TESTS, output
    skipped = SKIPPED.get(db)
    assert re.search(rf"^OK{f' [(]skipped={skipped}[)]' if skipped else ''}$", result.stderr, re.M)
    assert MONEY in result.stderr


FORKS = """
import os
import django
from django.core.management import call_command

django.setup()
call_command("migrate", verbosity=0)
from tierlock.contrib.django import locks

with locks.lock("fork:parent"):  # made before the fork, as a preloading server would
    pid = os.fork()
    if pid == 0:
        code = 1
        try:  # the child holds nothing of its parent's, and its manager works
            if not locks.lock("fork:parent").acquire(blocking=False):
                with locks.lock("fork:child"):
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
print("child exited with", os.waitstatus_to_exitcode(status))
print("parent holds nothing:", locks.holders() == [])
"""


@pytest.mark.multiprocess
def test_a_forked_worker_starts_afresh(tmp_path: Path) -> None:
    env = {"BANK_DB_URL": "sqlite://", "BANK_DIR": str(tmp_path)}
    result = run_in_project("-c", FORKS, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "child exited with 0\nparent holds nothing: True\n"


@pytest.mark.parametrize("url", CLOSED_PORT_URLS)
def test_importing_code_that_uses_the_decorator_never_connects(url: str, tmp_path: Path) -> None:
    script = "\n".join(
        [
            "import django",
            "django.setup()",
            "from bank import services, views",
            "from tierlock.contrib.django import locks",
            "print(repr(locks))",
            "try:",
            "    services.transfer(1, 2, 5)",
            "except Exception as exc:",
            "    print(type(exc).__name__, exc)",
        ]
    )
    env = {"BANK_DB_URL": url, "BANK_DIR": str(tmp_path)}
    result = run_in_project("-c", script, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    made, failed = result.stdout.splitlines()[:2]  # (libpq's reason takes two lines)
    assert made == "<tierlock.contrib.django.proxy.SettingsLockManager: not made yet>"
    assert failed.startswith("BackendError cannot reach the database: "), failed
    assert "secret" not in result.stdout
