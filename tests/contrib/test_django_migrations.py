"""``manage.py migrate`` and the lock table, in tests/django_project on a database of
each test's own: a new ``TABLE`` or a dropped table is made by the command the error
names, ``migrate tierlock zero`` drops what is there and says when nothing is, another
engine's locks are left alone, and bad settings fail with one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import ENGINES, drop_namespace, require_server
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from test_django import run_in_project

from tierlock.urls import shown_url

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

DEFAULT_TABLE = "tierlock_locks"
# The fix that a missing table's error names, as a command line.
FIX = re.compile(r"; run `python (manage\.py [^`]+)`$")
# ``manage.py tierlock ls``, then a lock taken, in one process.
USE = """
import django

django.setup()
from django.core.management import call_command
from tierlock.contrib.django import locks

call_command("tierlock", "ls")
with locks.lock("migrated:taken"):
    print("held:", [info.key for info in locks.holders()])
"""


@dataclasses.dataclass
class Project:
    """tests/django_project on one database; ``lock_url`` is where its locks live."""

    env: dict[str, str]
    lock_url: str

    @property
    def where(self) -> str:
        return shown_url(self.lock_url)

    def manage(self, *args: str, **tierlock: object) -> subprocess.CompletedProcess[str]:
        """``manage.py *args`` with ``tierlock`` added to ``settings.TIERLOCK``."""
        return self.python("manage.py", *args, **tierlock)

    def python(self, *args: str, **tierlock: object) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "BANK_TIERLOCK": json.dumps(tierlock)}
        return run_in_project(*args, env=env, timeout=120)

    def has_table(self, name: str) -> bool:
        engine = create_engine(self.lock_url, poolclass=NullPool)
        try:
            return inspect(engine).has_table(name)
        finally:
            engine.dispose()

    def drop_table(self, name: str) -> None:
        engine = create_engine(self.lock_url, poolclass=NullPool)
        try:
            with engine.begin() as sql:
                sql.execute(text(f"DROP TABLE {name}"))
        finally:
            engine.dispose()


@contextlib.contextmanager
def database_of_its_own(server_url: str) -> Iterator[str]:
    """The URL of a new database on ``server_url``'s server, dropped afterwards."""
    name = f"test_tlmig_{uuid.uuid4().hex[:12]}"
    server = create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    force = " WITH (FORCE)" if server.dialect.name == "postgresql" else ""
    try:
        with server.connect() as sql:
            sql.exec_driver_sql(f"CREATE DATABASE {name}")
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with server.connect() as sql:
                sql.exec_driver_sql(f"DROP DATABASE {name}{force}")
    finally:
        server.dispose()


@pytest.fixture
def project(db: str, tmp_path: Path) -> Iterator[Project]:
    """The test project on ``db``, migrated."""
    env = {"BANK_DIR": str(tmp_path)}
    url = ENGINES[db]
    with contextlib.ExitStack() as stack:
        if url is None:
            env["BANK_DB_URL"] = "sqlite://"
            lock_url = f"sqlite:///{tmp_path / 'bank-tierlock.sqlite3'}"
        else:
            require_server(url)
            env["BANK_DB_URL"] = lock_url = stack.enter_context(database_of_its_own(url))
        made = Project(env, lock_url)
        assert_ok(made.manage("migrate"))
        assert made.has_table(DEFAULT_TABLE)
        yield made


@pytest.fixture
def sqlite_project(tmp_path: Path) -> Project:
    """The test project on SQLite, not migrated."""
    env = {"BANK_DIR": str(tmp_path), "BANK_DB_URL": "sqlite://"}
    return Project(env, f"sqlite:///{tmp_path / 'bank-tierlock.sqlite3'}")


def assert_ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that succeeded."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The message of a command that failed with one line, not a traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    line, _, rest = result.stderr.partition("\n")
    assert rest == "", result.stderr
    assert line.startswith("CommandError: "), result.stderr
    return line.removeprefix("CommandError: ")


def assert_usable(project: Project, table: str, **tierlock: object) -> None:
    """``manage.py tierlock ls`` works on ``table``, and a lock can be taken in it."""
    used = assert_ok(project.python("-c", USE, **tierlock))
    assert used == f"no locks in table {table} at {project.where}\nheld: ['migrated:taken']\n"


@pytest.mark.sql_only("Django's database is the lock store")
@pytest.mark.parametrize("change", ["TABLE changed", "table dropped"])
def test_a_missing_table_is_made_by_the_command_its_error_names(
    project: Project, change: str
) -> None:
    settings: dict[str, object] = {}
    table = DEFAULT_TABLE
    if change == "TABLE changed":
        table = settings["TABLE"] = f"bank_{uuid.uuid4().hex[:8]}"
    else:
        project.drop_table(table)
    message = one_line_error(project.manage("tierlock", "ls", **settings))
    assert message == (
        f"lock table {table} does not exist in {project.where}; "
        "run `python manage.py migrate tierlock`"
    )
    fix = FIX.search(message)
    assert fix is not None
    fixed = assert_ok(project.manage(*fix[1].split()[1:], **settings))
    assert f"  tierlock: created lock table {table} in {project.where}\n" in fixed
    assert_usable(project, table, **settings)
    again = assert_ok(project.manage("migrate", **settings))  # now there: nothing to do
    assert "tierlock:" not in again
    assert "No migrations to apply." in again


@pytest.mark.sql_only("Django's database is the lock store")
def test_migrate_tierlock_zero_drops_what_is_there(project: Project) -> None:
    other = f"bank_{uuid.uuid4().hex[:8]}"
    absent = assert_ok(project.manage("migrate", "tierlock", "zero", TABLE=other))
    assert f"  tierlock: lock table {other} is not in {project.where}: nothing to drop\n" in (
        absent
    )
    assert "Unapplying tierlock.0001_initial... OK" in absent
    assert project.has_table(DEFAULT_TABLE)  # not the table that the settings name
    assert_ok(project.manage("migrate", "tierlock"))

    dropped = assert_ok(project.manage("migrate", "tierlock", "zero"))
    assert "Unapplying tierlock.0001_initial... OK" in dropped
    assert "nothing to drop" not in dropped
    assert not project.has_table(DEFAULT_TABLE)
    twice = assert_ok(project.manage("migrate", "tierlock", "zero"))
    assert "No migrations to apply." in twice
    assert not project.has_table(DEFAULT_TABLE)

    assert "Applying tierlock.0001_initial... OK" in assert_ok(project.manage("migrate"))
    assert_usable(project, DEFAULT_TABLE)


@pytest.mark.parametrize("engine", ["file", pytest.param("redis", marks=pytest.mark.redis)])
def test_another_engine_keeps_its_locks_through_migrate_and_zero(
    sqlite_project: Project, engine: str, tmp_path: Path
) -> None:
    namespace = f"bank_{uuid.uuid4().hex[:8]}"
    url = ENGINES[engine] or f"file://{tmp_path / 'locks'}"
    if engine == "redis":
        require_server(url)
    settings = {"URL": url, "TABLE": namespace}
    project = dataclasses.replace(sqlite_project, lock_url=url)
    try:
        assert_ok(project.manage("migrate", **settings))
        assert_usable(project, namespace, **settings)
        if engine == "file":  # a lock directory removed (a tmpfs after a reboot, say)
            shutil.rmtree(tmp_path / "locks" / namespace)
            one_line_error(project.manage("tierlock", "ls", **settings))
            assert_ok(project.manage("migrate", **settings))
            assert (tmp_path / "locks" / namespace).is_dir()
            assert_usable(project, namespace, **settings)

        unapplied = assert_ok(project.manage("migrate", "tierlock", "zero", **settings))
        assert (
            f"  tierlock: {shown_url(url)} keeps no lock table: nothing to drop "
            f"(namespace {namespace} is left)\n"
        ) in unapplied
        assert "Unapplying tierlock.0001_initial... OK" in unapplied
        twice = assert_ok(project.manage("migrate", "tierlock", "zero", **settings))
        assert "No migrations to apply." in twice
        assert_ok(project.manage("migrate", "tierlock", **settings))
        assert_usable(project, namespace, **settings)
    finally:
        drop_namespace(url, namespace)


CLOSED_PORT = "mysql+pymysql://root@127.0.0.1:1/test"
BAD_SETTINGS = {
    "bad table name": (
        {"TABLE": "bank locks"},
        "TIERLOCK['TABLE']: table must be a plain identifier",
    ),
    "unknown key": ({"TABEL": "bank_locks"}, "TIERLOCK has unknown key(s) TABEL; known keys: "),
    "unreachable": ({"URL": CLOSED_PORT}, f"{CLOSED_PORT}: cannot reach the database: "),
}


@pytest.mark.parametrize("setting", list(BAD_SETTINGS))
def test_bad_settings_fail_with_one_line(sqlite_project: Project, setting: str) -> None:
    settings, message = BAD_SETTINGS[setting]
    assert_ok(sqlite_project.manage("migrate", "-v", "0"))
    for command in [
        ("tierlock", "ls"),
        ("migrate",),
        ("migrate", "tierlock", "zero"),
    ]:
        failed = one_line_error(sqlite_project.manage(*command, **settings))
        assert failed.removeprefix("tierlock: ").startswith(message), (command, failed)
    assert sqlite_project.has_table(DEFAULT_TABLE)  # the zero above stopped before it
