"""The ``tierlock`` admin commands, through click's runner and as a real program.

Every command is run on every database; errors a user can cause (a bad URL, a server
that does not answer, a missing table) must end in one line on stderr and exit code 1,
never a traceback, and must not create the table.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pexpect
import procs
import pytest
from click.testing import CliRunner, Result
from conftest import SHARED_HOLDS
from ddl import normalise, split
from sqlalchemy import inspect
from sqlalchemy.engine import Engine

import tierlock
from tierlock.tools.cli import main

SQL_DIR = procs.ROOT / "sql"
# Nothing listens on port 1, so a connection there is refused at once.
CLOSED_PORT_URLS = [
    "mysql+pymysql://root:secret@127.0.0.1:1/test",
    "postgresql+psycopg://postgres:secret@127.0.0.1:1/test",
]
# Wide enough that rich never folds a row of ``ls``.
WIDE = {"COLUMNS": "200"}
# The header of ``ls`` away from a terminal.
PLAIN_HEADER = [
    *("key", "mode", "token", "host", "pid", "age", "lease_left", "renewed_by", "state"),
    "thread",
]
DJANGO_PROJECT = procs.ROOT / "tests" / "django_project"
# Rich's bold and italic, which NO_COLOR leaves.
STYLES = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env={**WIDE, **(env or {})}).invoke(main, list(args))


def check_one_line_error(result: Result, *expected: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tierlock: ")
    for text in expected:
        assert text in lines[0]
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def has_table(engine: Engine, table: str) -> bool:
    return inspect(engine).has_table(table)


def expire(lock: tierlock.Lock) -> None:
    """Wait until the database's clock has ended ``lock``'s short lease."""
    deadline = time.monotonic() + procs.WAIT_LIMIT
    while lock.locked():
        assert time.monotonic() < deadline, "the lease never ended"
        time.sleep(0.01)


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout == f"tierlock {tierlock.__version__}\n"


def test_init_creates_the_table_and_ls_then_finds_it(
    db_url: str, table: str, engine: Engine
) -> None:
    target = ("--url", db_url, "--table", table)
    check_one_line_error(invoke(*target, "ls"), f"table {table} does not exist", "tierlock init")
    assert not has_table(engine, table), "ls must not create the table"

    for _ in range(2):  # the second init finds the table there
        result = invoke(*target, "init")
        assert result.exit_code == 0, result.output
        assert f"table {table} is ready" in result.stdout
    assert has_table(engine, table)
    result = invoke(*target, "ls")
    assert result.exit_code == 0, result.output
    assert f"no locks in table {table}" in result.stdout


def test_admin_commands_do_not_create_a_sqlite_file(tmp_path: Path) -> None:
    database = tmp_path / "absent.db"
    url = f"sqlite:///{database}"
    for command in (["ls"], ["reap"], ["release", "k", "--force"]):
        check_one_line_error(invoke("--url", url, *command), "tierlock_locks does not exist")
    assert not database.exists()


@pytest.mark.parametrize(
    ("url", "sql_file"),
    [
        ("sqlite:///{tmp_path}/never-opened.db", "sqlite.sql"),
        ("mariadb+pymysql://root:secret@127.0.0.1:1/test", "mysql.sql"),
        ("postgresql+psycopg://postgres:secret@127.0.0.1:1/test", "postgresql.sql"),
    ],
)
def test_init_print_sql_is_the_committed_ddl(url: str, sql_file: str, tmp_path: Path) -> None:
    # No server listens on port 1 and the SQLite file is never created: nothing is touched.
    result = invoke("--url", url.format(tmp_path=tmp_path), "init", "--print-sql")
    assert result.exit_code == 0, result.output
    expected = split((SQL_DIR / sql_file).read_text(encoding="utf-8"))
    assert [normalise(s) for s in split(result.stdout)] == [normalise(s) for s in expected]
    assert not (tmp_path / "never-opened.db").exists()


def test_init_print_sql_follows_the_table_name_and_gives_both_mysql_flavours() -> None:
    """A mysql:// URL serves MariaDB and MySQL 8, which name the binary collation
    differently; with no server to ask, both tables are printed, each under a comment."""
    url = CLOSED_PORT_URLS[0]
    result = invoke("--url", url, "init", "--print-sql", "--table", "jobs")
    assert result.exit_code == 0, result.output
    statements = split(result.stdout)
    assert len(statements) == 4
    for statement, collation in zip(statements[::2], ["nopad_bin", "0900_bin"], strict=True):
        assert statement.startswith("CREATE TABLE jobs (")
        assert "CONSTRAINT uq_jobs_lock_key UNIQUE (lock_key)" in statement
        assert f"COLLATE utf8mb4_{collation} NOT NULL" in statement
    assert statements[1] == statements[3] == "CREATE INDEX ix_jobs_expires_at ON jobs (expires_at)"
    # Each part under its comment: MariaDB's first, then MySQL's.
    out = result.stdout
    assert (
        out.index("-- For MariaDB:")
        < out.index("utf8mb4_nopad_bin")
        < out.index("-- For MySQL 8:")
        < out.index("utf8mb4_0900_bin")
    )
    assert "secret" not in out


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
def test_init_print_sql_asks_a_mysql_url_s_server(
    db_url: str, table: str, engine: Engine, key: str
) -> None:
    """README gives MariaDB a mysql+pymysql:// URL: the DDL printed for it must be what
    that server takes, MariaDB's collation and not MySQL 8's."""
    result = invoke("--url", db_url, "--table", table, "init", "--print-sql")
    assert result.exit_code == 0, result.output
    assert not has_table(engine, table), "--print-sql must not create the table"
    statements = split(result.stdout)
    assert len(statements) == 2
    with engine.begin() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)
    with (
        tierlock.LockManager(
            db_url, table=table, create_table=False, reaper_interval=None
        ) as locks,
        locks.lock(key) as lock,
    ):
        assert lock.token is not None


@pytest.mark.keeps_expired
def test_ls_shows_every_holder(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    live = locks.lock(key + ":live", ttl=30)  # under a minute: shown in seconds
    stale = locks.lock(key + ":stale", ttl=0.05, renew=False)
    assert live.acquire(timeout=procs.WAIT_LIMIT)
    assert stale.acquire(timeout=procs.WAIT_LIMIT)
    expire(stale)
    # The URL and table from the environment this time; the runner's output is no
    # terminal, so the rows come as plain lines.
    result = invoke("ls", env={"TIERLOCK_URL": db_url, "TIERLOCK_TABLE": table})
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    assert header.split() == PLAIN_HEADER
    host, pid, thread = socket.gethostname(), os.getpid(), threading.current_thread().name
    shown = (
        (live, r"\d+\.\ds", "30.0s", "held"),
        (stale, "expired", "fixed", "expired"),
    )
    for line, (lock, lease, renewal, state) in zip(lines, shown, strict=True):
        cells = (lock.key, "exclusive", str(lock.token), host, str(pid))
        pattern = [*map(re.escape, cells), r"[\d.]+s", lease, renewal, state, re.escape(thread)]
        assert re.fullmatch(" +".join(pattern), line), result.stdout
    live.release()
    with pytest.raises(tierlock.LockLostError):  # its lease ran out: reported as lost,
        stale.release()
    assert locks.holders() == []  # and the row, which nobody took over, deleted


@SHARED_HOLDS
def test_ls_shows_each_hold_with_its_mode(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    with locks.read_lock(key), locks.semaphore(key + ":quota", 2), locks.lock(key + ":x"):
        result = invoke("ls", "--url", db_url, "--table", table, "--json")
    assert result.exit_code == 0, result.output
    modes = sorted((entry["key"], entry["mode"]) for entry in json.loads(result.stdout))
    assert modes == [(key, "shared"), (key + ":quota", "permit"), (key + ":x", "exclusive")]


def test_release_needs_force(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    lock = locks.lock(key)
    assert lock.acquire(timeout=procs.WAIT_LIMIT)
    target = ("--url", db_url, "--table", table)

    refused = invoke(*target, "release", key)
    assert refused.exit_code == 2
    assert "without --force" in refused.stderr
    assert "LockLostError" in refused.stderr  # says what forcing would do to the holder
    assert locks.info(key) is not None

    forced = invoke(*target, "release", key, "--force")
    assert forced.exit_code == 0, forced.output
    assert f"released {key!r}" in forced.stdout
    assert locks.info(key) is None
    with pytest.raises(tierlock.LockLostError):
        lock.release()

    again = invoke(*target, "release", key, "--force")
    assert again.exit_code == 0, again.output
    assert f"{key!r} was not held" in again.stdout


@pytest.mark.keeps_expired
def test_reap_deletes_only_expired_rows(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    live = locks.lock(key + ":live", ttl=60)
    stale = locks.lock(key + ":stale", ttl=0.05, renew=False)
    assert live.acquire(timeout=procs.WAIT_LIMIT)
    assert stale.acquire(timeout=procs.WAIT_LIMIT)
    expire(stale)

    result = invoke("reap", "--url", db_url, "--table", table)  # options after the command
    assert result.exit_code == 0, result.output
    assert f"reaped 1 expired lock(s) from {table}" in result.stdout
    assert [info.key for info in locks.holders()] == [live.key]
    live.release()
    with pytest.raises(tierlock.LockLostError):
        stale.release()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        *((url, "Connection refused") for url in CLOSED_PORT_URLS),
        ("sqlite:///{tmp_path}/missing/locks.db", "unable to open database file"),
    ],
    ids=["mariadb", "postgresql", "sqlite"],
)
@pytest.mark.parametrize(
    "command",
    [["ls"], ["ls", "--json"], ["top", "--once"], ["reap"], ["release", "k", "--force"], ["init"]],
    ids=["ls", "ls-json", "top", "reap", "release", "init"],
)
def test_unreachable_database_is_one_line(
    url: str, reason: str, command: list[str], tmp_path: Path
) -> None:
    """The same words on every database, then the driver's reason."""
    url = url.format(tmp_path=tmp_path)
    result = invoke("--url", url, *command)
    shown = url.replace(":secret@", ":***@")
    check_one_line_error(result, f"{shown}: cannot reach the database: ", reason)
    assert "secret" not in result.stderr
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nonsense", "not a database URL: nonsense"),
        (
            "mysql+pymysql://root:secret@127.0.0.1:port/test",
            "not a database URL: mysql+pymysql://root:***@",
        ),
        ("oracle://scott:secret@127.0.0.1/db", "unsupported database 'oracle'"),
    ],
)
@pytest.mark.parametrize("command", [["ls"], ["init"], ["init", "--print-sql"], ["demo"]])
def test_bad_url_is_one_line(url: str, message: str, command: list[str]) -> None:
    result = invoke("--url", url, *command)
    check_one_line_error(result, message)
    assert "secret" not in result.stderr


def test_missing_table_is_one_line(db_url: str, table: str, engine: Engine) -> None:
    if db_url.startswith("sqlite"):  # a file without the table, so that SQLite says it
        assert invoke("--url", db_url, "--table", f"other_{table}", "init").exit_code == 0
    target = ("--url", db_url, "--table", table)
    for command in (
        ["ls"],
        ["ls", "--json"],
        ["top", "--once"],
        ["top"],
        ["reap"],
        ["reap", "--every", "1"],
        ["release", "k", "--force"],
    ):
        check_one_line_error(
            invoke(*target, *command), f"table {table} does not exist in", "run `tierlock init`"
        )
    assert not has_table(engine, table)


def test_bad_table_name_is_one_line() -> None:
    check_one_line_error(invoke("--table", "no such", "ls"), "table must be a plain identifier")


# -- what the command line needs from the library ------------------------------------


def test_library_names_a_url_it_cannot_parse_without_its_password() -> None:
    # A port that is not a number, or text that is no URL at all, is refused without
    # quoting what may hold a password.
    for url in ("mysql+pymysql://root:secret@127.0.0.1:port/test", "root:secret@db"):
        with pytest.raises(ValueError, match="not a database URL") as caught:
            tierlock.LockManager(url, create_table=False, reaper_interval=None)
        assert "secret" not in str(caught.value)


# -- ls in pipes and scripts, and holders gone ----------------------------------------


def long_key(prefix: str) -> str:
    """A key longer than the 80 columns that rich lays a table out in away from a terminal."""
    key = f"{prefix}:invoice:2026-11-27:customer-123456:{'x' * 20}"
    assert len(key) > 80
    return key


def check_piped_ls(result: subprocess.CompletedProcess[str], keys: list[str]) -> None:
    """A header, then exactly one line per hold, each starting with its whole key, which
    a ``grep -c`` of the output then counts once."""
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == PLAIN_HEADER
    assert [line.split()[0] for line in lines] == sorted(keys), result.stdout
    for key in keys:
        assert sum(key in line for line in result.stdout.splitlines()) == 1, result.stdout


@pytest.mark.multiprocess
def test_piped_ls_gives_each_hold_one_whole_line(
    make_manager: Callable[..., tierlock.LockManager],
    db_url: str,
    table: str,
    key: str,
    tmp_path: Path,
) -> None:
    """``tierlock ls | grep -c KEY`` found nothing: rich folded long keys to fit 80
    columns. A pipe gets plain lines, whatever the width."""
    locks = make_manager()
    keys = [long_key(key), f"{key}:user:42"]
    with locks.lock(keys[0]), locks.lock(keys[1]):
        target = ("--url", db_url, "--table", table)
        result = procs.run_python("-m", "tierlock", *target, "ls", cwd=tmp_path)
    check_piped_ls(result, keys)


@pytest.mark.multiprocess
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_piped_flask_ls_gives_each_hold_one_whole_line(
    make_manager: Callable[..., tierlock.LockManager],
    db_url: str,
    table: str,
    key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``flask tierlock ls`` prints the rows as ``tierlock ls`` does, pipes included."""
    locks = make_manager()
    monkeypatch.setenv("FLASK_TIERLOCK_URL", db_url)
    monkeypatch.setenv("FLASK_TIERLOCK_TABLE", table)
    # The bank's accounts want a SQL database, which ``ls`` never opens.
    monkeypatch.setenv("FLASK_BANK_URL", f"sqlite:///{tmp_path / 'bank.db'}")
    keys = [long_key(key), f"{key}:user:42"]
    with locks.lock(keys[0]), locks.lock(keys[1]):
        command = ("-m", "flask", "--app", "flask_bank:create_app", "tierlock", "ls")
        result = procs.run_python(*command, cwd=tmp_path)
    check_piped_ls(result, keys)


@pytest.mark.multiprocess
def test_piped_django_ls_gives_each_hold_one_whole_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manage.py tierlock ls`` too, though it writes through Django's own stdout."""
    # On SQLite the test project keeps its locks in a file beside the application's.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "bankproject.settings")
    monkeypatch.setenv("BANK_DB_URL", "sqlite://")
    monkeypatch.setenv("BANK_DIR", str(tmp_path))
    lock_file = tmp_path / "bank-tierlock.sqlite3"
    keys = [long_key(f"bank:{uuid.uuid4().hex}"), "bank:user:42"]
    with (
        tierlock.LockManager(f"sqlite:///{lock_file}", reaper_interval=None) as locks,
        locks.lock(keys[0]),
        locks.lock(keys[1]),
    ):
        result = procs.run_python("manage.py", "tierlock", "ls", cwd=DJANGO_PROJECT)
    check_piped_ls(result, keys)


@pytest.mark.multiprocess
def test_ls_marks_a_killed_holder_on_this_host_gone(
    make_manager: Callable[..., tierlock.LockManager],
    children: procs.Children,
    db_url: str,
    table: str,
    key: str,
) -> None:
    """A worker killed on this host leaves its row with most of its lease to run,
    though a waiter here would take it over at once: ``ls`` says so, and not of a
    holder that lives."""
    dead_key, live_key = f"{key}:dead", f"{key}:live"
    holder, _ = procs.start_holder(children, db_url, table, dead_key, ttl=60)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(procs.WAIT_LIMIT)
    assert holder.exitcode == -signal.SIGKILL

    locks = make_manager()
    with locks.lock(live_key, ttl=60):
        target = ("--url", db_url, "--table", table)
        listed, as_json = invoke(*target, "ls"), invoke(*target, "ls", "--json")
    assert listed.exit_code == 0, listed.output
    states = {line.split()[0]: line.split()[8] for line in listed.stdout.splitlines()[1:]}
    assert states == {dead_key: "gone", live_key: "held"}, listed.stdout
    assert as_json.exit_code == 0, as_json.output
    gone = {record["key"]: record["holder_gone"] for record in json.loads(as_json.stdout)}
    assert gone == {dead_key: True, live_key: False}


@pytest.mark.multiprocess
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_ls_on_a_terminal_draws_the_table(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str
) -> None:
    """What a person sees is the table as before, with the title and the state."""
    locks = make_manager()
    path = os.pathsep.join(filter(None, [str(procs.ROOT), os.environ.get("PYTHONPATH")]))
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    # No colours: the cells' text only.
    env.update(PYTHONPATH=path, TERM="xterm", NO_COLOR="1")
    with locks.lock("user:42") as lock:
        token = lock.token
        child = pexpect.spawn(
            sys.executable,
            ["-m", "tierlock", "--url", db_url, "--table", table, "ls"],
            env=env,
            dimensions=(50, 250),  # (wide enough that no row folds)
            encoding="utf-8",
            timeout=procs.WAIT_LIMIT,
        )
        child.expect(pexpect.EOF)
        child.close()
    out = STYLES.sub("", child.before)
    assert (child.exitstatus, child.signalstatus) == (0, None), out
    assert f"1 lock(s) in {table}" in out
    assert re.search(rf"│ user:42 +│ exclusive │ +{token} │ .* │ held +│", out), out
