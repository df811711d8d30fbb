"""The mistakes a user makes, as the admin commands meet them: ``tierlock``, Django's
``manage.py tierlock`` and ``flask tierlock`` run as programs on a venv without an
extra's library, on a misspelt scheme, an in-memory SQLite database, a wrong password
and a server that is not there. Each ends in one line on stderr that says what to do,
a non-zero exit code and no traceback."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import procs
import pytest
from engines import ENGINES, require_server
from uninstalled import ALL_SCHEMES, EXTRA_MODULES, without

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
TIERLOCK = {{"URL": {url!r}}}
"""
FLASK_APP = """
from flask import Flask
from tierlock.contrib.flask import TierLock

app = Flask(__name__)
app.config["TIERLOCK_URL"] = {url!r}
TierLock(app)
"""


@dataclasses.dataclass(frozen=True)
class Program:
    """A command as a user runs it on the locks at a URL."""

    code: str  # what ``python -c`` runs
    arguments: Callable[[str], list[str]]  # its arguments, given the lock URL
    prefix: str  # how its one line of error starts

    def run(
        self, url: str, cwd: Path, *, lacking: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        """Run it in ``cwd`` (where the Django project and the Flask app are written)
        on a venv without the modules ``lacking``."""
        database = str(cwd / "app.sqlite3")
        (cwd / "lock_settings.py").write_text(DJANGO_SETTINGS.format(database=database, url=url))
        (cwd / "lock_app.py").write_text(FLASK_APP.format(url=url))
        return procs.run_python(
            "-c", without(*lacking) + self.code, *self.arguments(url), cwd=cwd, timeout=60
        )


PROGRAMS = {
    "tierlock ls": Program(TIERLOCK, lambda url: ["--url", url, "ls"], "tierlock: "),
    "tierlock init": Program(TIERLOCK, lambda url: ["--url", url, "init"], "tierlock: "),
    "tierlock demo": Program(TIERLOCK, lambda url: ["demo", "--url", url], "tierlock: "),
    "manage.py tierlock ls": Program(MANAGE_PY, lambda url: ["tierlock", "ls"], "CommandError: "),
    "flask tierlock ls": Program(
        FLASK, lambda url: ["--app", "lock_app", "tierlock", "ls"], "tierlock: "
    ),
}
each_program = pytest.mark.parametrize("program", list(PROGRAMS.values()), ids=list(PROGRAMS))


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
    for text in expected:
        assert text in line
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


def test_print_sql_needs_no_driver(tmp_path: Path) -> None:
    """Without PyMySQL the server cannot be asked which flavour it is: both are printed."""
    url = "mysql://root@127.0.0.1:3306/test"
    result = procs.run_python(
        "-c", without("pymysql") + TIERLOCK, "--url", url, "init", "--print-sql", cwd=tmp_path
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "-- For MariaDB:" in result.stdout and "-- For MySQL 8:" in result.stdout


@pytest.mark.mariadb
def test_print_sql_asks_a_mysql_url_s_server_through_pymysql(tmp_path: Path) -> None:
    server = ENGINES["mariadb"]
    assert server is not None
    require_server(server)
    url = server.replace("mysql+pymysql://", "mysql://", 1)
    result = procs.run_python("-c", TIERLOCK, "--url", url, "init", "--print-sql", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.startswith("-- tierlock lock table tierlock_locks for mariadb\n")
