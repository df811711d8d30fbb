"""The mistakes a user makes, as the admin commands meet them: ``tierlock``, Django's
``manage.py tierlock`` and ``flask tierlock`` run as programs on a venv without an
extra's library, on a misspelt scheme, an in-memory SQLite database, a wrong password
and a server that is not there, or does not answer. Each ends in one line on stderr
that says what to do, a non-zero exit code and no traceback; a server that does not
answer, within the connect timeout that the program's database timeout gives."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import procs
import pytest
from engines import ENGINES, require_server
from proxy import DeadAddress
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from uninstalled import ALL_SCHEMES, EXTRA_MODULES, without

from tierlock.backends.basics import connect_timeout
from tierlock.base import DEFAULT_DATABASE_TIMEOUT

TIERLOCK = "from tierlock.tools.cli import main\nmain(prog_name='tierlock')\n"
MANAGE_PY = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "lock_settings"
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[1:]])
"""
FLASK = "import sys\nfrom flask.cli import main\nsys.argv[0] = 'flask'\nmain()\n"
# A Django project and a Flask app whose locks live at the URL given.
DJANGO_SETTINGS = """
SECRET_KEY = "tierlock tests"
INSTALLED_APPS = ["tierlock.contrib.django"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {database!r}}}}}
USE_TZ = True
TIERLOCK = {settings!r}
"""
FLASK_APP = """
from flask import Flask
from tierlock.contrib.flask import TierLock

app = Flask(__name__)
app.config["TIERLOCK_URL"] = {url!r}
app.config["TIERLOCK_OPTIONS"] = {options!r}
TierLock(app)
"""
# Run first: when the program exits, it writes how long it ran to the file "elapsed",
# counted from after the imports of the programs' own modules (none imports a driver),
# which take most of a start and vary most with the machine's load.
TIMED = """
import atexit, time
import django.core.management, flask.cli, tierlock.tools.cli
_began = time.monotonic()
atexit.register(lambda: open("elapsed", "w").write(repr(time.monotonic() - _began)))
"""
# What a program's start takes on a loaded machine, on top of its work: Django's setup
# or the Flask app's (0.7-2 s measured against a refused port, imports included).
PROGRAM_START = 3.0
# The error comes within this much after the connect timeout (as test_connect_bound).
OVERRUN = 1.0
# How much a program's start may differ between two runs in a row on a loaded machine.
START_VARIES = 1.0


def timeout_option(timeout: float | None) -> list[str]:
    return [] if timeout is None else ["--timeout", f"{timeout:g}"]


@dataclasses.dataclass(frozen=True)
class Program:
    """A command as a user runs it on the locks at a URL, with a database timeout
    (``None``: the default; the demo always runs with it)."""

    code: str  # what ``python -c`` runs
    arguments: Callable[[str, float | None], list[str]]  # given the lock URL and timeout
    prefix: str  # how its one line of error starts
    takes_timeout: bool = True

    def run(
        self,
        url: str,
        cwd: Path,
        *,
        lacking: tuple[str, ...] = (),
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run it in ``cwd`` (where the Django project and the Flask app are written)
        on a venv without the modules ``lacking``; how long it ran goes to
        ``cwd / "elapsed"``."""
        database = str(cwd / "app.sqlite3")
        settings: dict[str, object] = {"URL": url}
        options = {}
        if timeout is not None:
            settings["DATABASE_TIMEOUT"] = options["database_timeout"] = timeout
        (cwd / "lock_settings.py").write_text(
            DJANGO_SETTINGS.format(database=database, settings=settings)
        )
        (cwd / "lock_app.py").write_text(FLASK_APP.format(url=url, options=options))
        code = TIMED + without(*lacking) + self.code
        arguments = self.arguments(url, timeout)
        return procs.run_python("-c", code, *arguments, cwd=cwd, timeout=60)


PROGRAMS = {
    "tierlock ls": Program(
        TIERLOCK, lambda url, timeout: ["--url", url, *timeout_option(timeout), "ls"], "tierlock: "
    ),
    "tierlock init": Program(
        TIERLOCK,
        lambda url, timeout: ["--url", url, *timeout_option(timeout), "init"],
        "tierlock: ",
    ),
    "tierlock demo": Program(
        TIERLOCK, lambda url, timeout: ["demo", "--url", url], "tierlock: ", takes_timeout=False
    ),
    "manage.py tierlock ls": Program(
        MANAGE_PY, lambda url, timeout: ["tierlock", "ls"], "CommandError: "
    ),
    "flask tierlock ls": Program(
        FLASK, lambda url, timeout: ["--app", "lock_app", "tierlock", "ls"], "tierlock: "
    ),
}
each_program = pytest.mark.parametrize("program", list(PROGRAMS.values()), ids=list(PROGRAMS))
# Each server engine at a port where nothing answers.
DEAD_URLS = {
    "mariadb": pytest.param("mysql://root:s3cret@127.0.0.1:{port}/test", marks=pytest.mark.mariadb),
    "postgresql": pytest.param(
        "postgresql://postgres:s3cret@127.0.0.1:{port}/test", marks=pytest.mark.postgresql
    ),
    "redis": pytest.param("redis://:s3cret@127.0.0.1:{port}/0", marks=pytest.mark.redis),
    "zookeeper": pytest.param(
        "zookeeper://alice:s3cret@127.0.0.1:{port}", marks=pytest.mark.zookeeper
    ),
}


def one_line(result: subprocess.CompletedProcess[str], program: Program, *expected: str) -> str:
    """The one line of error ``result`` ended with, checked to contain ``expected``."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    assert result.stdout == "", output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, output
    line = lines[0]
    assert line.startswith(program.prefix), line
    for words in expected:
        assert words in line
    return line


@each_program
@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("redis://127.0.0.1:1/0", 'pip install "tierlock[redis]"'),
        ("zookeeper://127.0.0.1:1", 'pip install "tierlock[zookeeper]"'),
        ("mysql://root@127.0.0.1:1/test", 'pip install "tierlock[mysql]"'),
        ("mariadb://root@127.0.0.1:1/test", 'pip install "tierlock[mysql]"'),
        ("postgresql://postgres@127.0.0.1:1/test", 'pip install "tierlock[postgres]"'),
    ],
)
def test_a_library_not_installed_names_its_extra(
    program: Program, url: str, fix: str, tmp_path: Path
) -> None:
    """``pip install -e .`` alone: every engine but SQLite and lock files lacks its
    library, and each command says which extra brings it."""
    result = program.run(url, tmp_path, lacking=EXTRA_MODULES)
    one_line(result, program, "which is not installed", fix)


@each_program
def test_an_unknown_scheme_lists_every_engine(program: Program, tmp_path: Path) -> None:
    result = program.run("zookeper://127.0.0.1:2181", tmp_path)
    line = one_line(result, program, "unsupported database 'zookeper'")
    assert set(re.split(r", | or ", line.rpartition(": use ")[2])) == ALL_SCHEMES


@each_program
def test_in_memory_sqlite_is_refused_for_what_it_is(program: Program, tmp_path: Path) -> None:
    """Not a missing table to make with ``tierlock init``, which would refuse it too."""
    result = program.run("sqlite:///:memory:", tmp_path)
    line = one_line(result, program, "in-memory SQLite", "coordinates nothing")
    assert "init" not in line


@each_program
@pytest.mark.parametrize(
    "url", ["redis://:s3cret@127.0.0.1:1/0", "mysql://root:s3cret@127.0.0.1:1/test"]
)
def test_a_server_out_of_reach_is_one_line(program: Program, url: str, tmp_path: Path) -> None:
    """Nothing listens on port 1: the connection is refused at once."""
    result = program.run(url, tmp_path)
    one_line(result, program, "cannot reach the database", "127.0.0.1:1")
    assert "s3cret" not in result.stderr


@pytest.mark.slow
@each_program
@pytest.mark.parametrize("template", list(DEAD_URLS.values()), ids=list(DEAD_URLS))
def test_a_silent_server_is_one_line_within_the_connect_timeout(
    program: Program, template: str, tmp_path: Path
) -> None:
    """A server that takes the connection and never answers: each program tries once
    and gives up after the connect timeout of its database timeout (``tierlock
    --timeout``, the Django setting, the Flask option), which with 1 s is 0.5 s (on
    PostgreSQL 2 s, libpq's least), well before the default's 5 s."""
    timeout = 1.0 if program.takes_timeout else DEFAULT_DATABASE_TIMEOUT
    # The program's start, under the machine's load now: the same program against a
    # refused port, which fails at once (ZooKeeper's client tries until the timeout).
    refused = DeadAddress("refused")
    try:
        program.run(template.format(port=refused.port), tmp_path, timeout=timeout)
    finally:
        refused.close()
    baseline = float((tmp_path / "elapsed").read_text())
    silent = DeadAddress("silent")
    try:
        result = program.run(template.format(port=silent.port), tmp_path, timeout=timeout)
        tries = silent.taken()
    finally:
        silent.close()
    one_line(result, program, "cannot reach the database", f"127.0.0.1:{silent.port}")
    assert "s3cret" not in result.stderr
    # (ZooKeeper's client connects again after a handshake it abandoned: see ``wire``.)
    assert tries >= 1 if template.startswith("zookeeper") else tries == 1, f"{tries} connections"
    seconds = connect_timeout(timeout)
    if template.startswith("postgresql"):
        seconds = max(2, math.ceil(seconds))
    took = float((tmp_path / "elapsed").read_text())
    if template.startswith("zookeeper"):
        seconds = 0.0  # (the baseline waited for it already)
    assert took - baseline < seconds + OVERRUN + START_VARIES, (
        f"gave up after {took:.2f} s, where the program's start took {baseline:.2f} s"
    )


@pytest.fixture
def no_login_url() -> Iterator[str]:
    """The test database as a PostgreSQL role that may not log in, with a password: the
    shared server trusts every login from 127.0.0.1 whatever its password, but refuses
    this one."""
    server = ENGINES["postgresql"]
    assert server is not None
    require_server(server)
    role = f"tl_nologin_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f"CREATE ROLE {role} NOLOGIN"))
        url = make_url(server).set(
            drivername="postgresql", username=role, password="not-the-password"
        )
        yield url.render_as_string(hide_password=False)
        with engine.connect() as connection:
            connection.execute(text(f"DROP ROLE {role}"))
    finally:
        engine.dispose()


@pytest.mark.mariadb
@each_program
def test_a_wrong_password_is_one_line(program: Program, tmp_path: Path) -> None:
    server = ENGINES["mariadb"]
    assert server is not None
    require_server(server)
    url = server.replace("mysql+pymysql://root@", "mysql://root:not-the-password@", 1)
    result = program.run(url, tmp_path)
    one_line(result, program, "cannot reach the database", "Access denied")
    assert "not-the-password" not in result.stderr


@pytest.mark.postgresql
@each_program
def test_a_login_refused_is_one_line(program: Program, no_login_url: str, tmp_path: Path) -> None:
    """PostgreSQL refuses the login at once, and says why."""
    result = program.run(no_login_url, tmp_path)
    one_line(result, program, "cannot reach the database", "is not permitted to log in")
    assert "not-the-password" not in result.stderr


def test_timeout_is_for_the_admin_commands(tmp_path: Path) -> None:
    """The demo's workers run with the default: ``--timeout`` is refused, not ignored."""
    result = procs.run_python(
        "-c", TIERLOCK, "--timeout", "1", "demo", "--url", "sqlite:///x.db", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert "--timeout is for the admin commands" in result.stderr
    assert not (tmp_path / "x.db").exists()


def test_print_sql_needs_no_driver(tmp_path: Path) -> None:
    """Without PyMySQL the server cannot be asked which flavour it is: both are printed."""
    url = "mysql://root@127.0.0.1:3306/test"
    result = procs.run_python(
        "-c", without("pymysql") + TIERLOCK, "--url", url, "init", "--print-sql", cwd=tmp_path
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "-- For MariaDB:" in result.stdout and "-- For MySQL 8:" in result.stdout


def test_print_sql_asks_a_silent_server_within_the_connect_timeout(tmp_path: Path) -> None:
    """Asking the server which flavour it is gives up as connecting does, after 0.5 s
    with ``--timeout 1``, and both are printed."""
    silent = DeadAddress("silent")
    try:
        url = f"mysql://root@127.0.0.1:{silent.port}/test"
        result = procs.run_python(
            "-c",
            TIMED + TIERLOCK,
            "--timeout",
            "1",
            "--url",
            url,
            "init",
            "--print-sql",
            cwd=tmp_path,
        )
        tries = silent.taken()
    finally:
        silent.close()
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "-- For MariaDB:" in result.stdout and "-- For MySQL 8:" in result.stdout
    assert tries == 1
    took = float((tmp_path / "elapsed").read_text())
    assert took < connect_timeout(1.0) + OVERRUN + PROGRAM_START, f"took {took:.2f} s"


@pytest.mark.mariadb
def test_print_sql_asks_a_mysql_url_s_server_through_pymysql(tmp_path: Path) -> None:
    server = ENGINES["mariadb"]
    assert server is not None
    require_server(server)
    url = server.replace("mysql+pymysql://", "mysql://", 1)
    result = procs.run_python("-c", TIERLOCK, "--url", url, "init", "--print-sql", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.startswith("-- tierlock lock table tierlock_locks for mariadb\n")
