"""``tierlock.contrib.flask``: the app's lazy manager, transfers through Flask's test
client and under gunicorn's workers, and ``flask tierlock ls|release|reap``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flask_bank
import procs
import pytest
from conftest import SERVERS, MakeManager
from engines import SQL
from flask import Flask
from flask.testing import FlaskCliRunner
from flask_load import ACCOUNTS, deposited, get_balances, plan, post, run_threads
from polling import wait_until
from proxy import Proxy
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import Engine, make_url

import tierlock
from tierlock.contrib.flask import AppLockManager, TierLock

CLOSED_PORT_URLS = [
    "mysql+pymysql://root:secret@127.0.0.1:1/test",
    "postgresql+psycopg://postgres:secret@127.0.0.1:1/test",
]
# Wide enough that rich never folds a row of ``ls``.
WIDE = {"COLUMNS": "200"}


@pytest.fixture
def bank_url(db_url: str, db: str, tmp_path: Path) -> str:
    """Where the bank keeps its accounts: beside the locks, or in SQLite beside an
    engine that has no tables."""
    return db_url if db in SQL else f"sqlite:///{tmp_path / 'bank.db'}"


@pytest.fixture
def bank(bank_url: str, table: str) -> Iterator[int]:
    """An accounts table beside the test's lock table; the total money in it."""
    flask_bank.open_accounts(bank_url, table, ACCOUNTS)
    yield ACCOUNTS * flask_bank.OPENING_BALANCE
    engine = create_engine(bank_url)
    try:
        with engine.begin() as db:
            flask_bank.accounts_table(table).drop(db, checkfirst=True)
    finally:
        engine.dispose()


@pytest.fixture
def make_app() -> Iterator[Callable[..., Flask]]:
    """Make bank apps from settings; their managers are closed afterwards."""
    apps: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = flask_bank.create_app(config)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["tierlock"].close()
        app.extensions["bank"][0].dispose()


@pytest.fixture
def app(make_app: Callable[..., Flask], db_url: str, bank_url: str, table: str) -> Flask:
    return make_app(
        BANK_URL=bank_url,
        TIERLOCK_URL=db_url,
        TIERLOCK_TABLE=table,
        TIERLOCK_OPTIONS={"reaper_interval": None, "poll_interval": 0.02},
    )


# -- settings and laziness ----------------------------------------------------------


def test_creating_the_app_connects_to_nothing(app: Flask, engine: Engine, table: str) -> None:
    assert not inspect(engine).has_table(table)
    locks = app.extensions["tierlock"]
    assert isinstance(locks, AppLockManager)
    assert "not made yet" in repr(locks)
    with locks.lock("k") as lock:
        assert lock.token is not None
    assert inspect(engine).has_table(table)
    assert isinstance(locks.manager, tierlock.LockManager)
    assert (locks.url, locks.table) == (locks.manager.url, locks.manager.table)


@pytest.mark.parametrize("url", CLOSED_PORT_URLS)
def test_an_unreachable_database_fails_the_first_lock_not_the_app(
    make_app: Callable[..., Flask], url: str
) -> None:
    app = make_app(TIERLOCK_URL=url, TIERLOCK_TABLE="t", TIERLOCK_OPTIONS={"database_timeout": 1})
    with app.app_context(), pytest.raises(tierlock.BackendError, match="cannot reach"):
        flask_bank.locks.lock("k")
    # The next use tries again, and fails again; a service is not stuck with it.
    with pytest.raises(tierlock.BackendError):
        app.extensions["tierlock"].holders()
    result = app.test_cli_runner().invoke(args=["tierlock", "ls"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"tierlock: {make_url(url).render_as_string()}: ")
    assert "secret" not in result.stderr


def test_settings_are_checked_without_connecting(tmp_path: Path) -> None:
    def setup(**config: Any) -> AppLockManager:
        app = Flask(__name__, instance_path=str(tmp_path / "instance"))
        app.config.update(config)
        TierLock(app)
        lazy: AppLockManager = app.extensions["tierlock"]
        lazy.close()
        return lazy

    with pytest.raises(RuntimeError, match=r"TIERLOCK_URL .*SQLALCHEMY_DATABASE_URI"):
        setup()
    # Flask-SQLAlchemy's database, where Flask-SQLAlchemy puts a relative SQLite file.
    fallback = setup(SQLALCHEMY_DATABASE_URI="sqlite:///app.db")
    assert fallback.url == f"sqlite:///{tmp_path / 'instance' / 'app.db'}"
    url = "postgresql+psycopg://app:secret@db.example/app"
    assert setup(TIERLOCK_URL=url, SQLALCHEMY_DATABASE_URI="sqlite:///x.db").url == (
        "postgresql+psycopg://app:***@db.example/app"
    )
    assert setup(TIERLOCK_URL=url, TIERLOCK_TTL=5).ttl == 5.0
    with pytest.raises(ValueError, match="TIERLOCK_TTL"):
        setup(TIERLOCK_URL=url, TIERLOCK_TTL=0)
    with pytest.raises(ValueError, match="table must be a plain identifier"):
        setup(TIERLOCK_URL=url, TIERLOCK_TABLE="locks; DROP TABLE x")
    with pytest.raises(ValueError, match="TIERLOCK_TTL"):
        setup(TIERLOCK_URL=url, TIERLOCK_OPTIONS={"ttl": 3})
    with pytest.raises(TypeError, match="reaper_intervall"):
        setup(TIERLOCK_URL=url, TIERLOCK_OPTIONS={"reaper_intervall": 3})


def test_one_extension_per_app_and_outside_a_context_the_only_app(tmp_path: Path) -> None:
    ext = TierLock()
    first, second = Flask("first"), Flask("second")
    for app in (first, second):
        app.config["TIERLOCK_URL"] = f"sqlite:///{tmp_path / app.name}.db"
    ext.init_app(first)
    assert ext.locks is first.extensions["tierlock"]
    with pytest.raises(RuntimeError, match="already set up"):
        ext.init_app(first)
    ext.init_app(second)
    with pytest.raises(RuntimeError, match="which of its 2 apps"):
        ext.lock("k")
    with second.app_context():
        assert ext.locks is second.extensions["tierlock"]
    with Flask("third").app_context(), pytest.raises(RuntimeError, match="call init_app"):
        ext.lock("k")
    ext.close()
    assert not list(tmp_path.iterdir()), "nothing was opened"


def test_the_lazy_manager_has_the_manager_s_api(app: Flask, manager: tierlock.LockManager) -> None:
    lazy = app.extensions["tierlock"]
    public = {name for name in dir(manager) if not name.startswith("_")}
    assert public <= set(dir(lazy))
    for name in ("ttl", "renew", "on_lost", "poll_interval", "reaper_running"):
        assert getattr(lazy, name) == getattr(lazy.manager, name)


def test_synchronized_checks_at_import_and_locks_at_each_call(
    app: Flask, make_manager: MakeManager, bank: int
) -> None:
    with pytest.raises(ValueError, match="'user_id'"):
        TierLock().synchronized("user:{user_id}")(flask_bank.deposit)
    observer = make_manager()
    seen: list[tierlock.LockInfo | None] = []
    ext = TierLock()

    @ext.synchronized("account:{account}", ttl=7)
    def look(account: int) -> None:
        seen.append(observer.info(("account", account)))

    with pytest.raises(RuntimeError, match="not set up for any app"):
        look(1)
    with app.app_context():
        look(1)
    assert seen[0] is not None and seen[0].lease == 7
    assert observer.info("account:1") is None


def test_close_ends_every_use(tmp_path: Path) -> None:
    app = Flask(__name__)
    app.config["TIERLOCK_URL"] = f"sqlite:///{tmp_path / 'locks.db'}"
    ext = TierLock(app)
    lazy = app.extensions["tierlock"]
    lock = ext.lock("k")
    ext.close()
    assert "closed" in repr(lazy)
    with pytest.raises(tierlock.LockError):
        lock.acquire()
    with pytest.raises(tierlock.LockError, match="closed"):
        ext.lock("k")
    lazy.close()  # again: nothing


@SERVERS
@pytest.mark.multiprocess
def test_a_child_forked_while_the_manager_opens_opens_its_own(
    db_url: str, table: str, proxy: Proxy, children: procs.Children
) -> None:
    url = make_url(db_url).set(host="127.0.0.1", port=proxy.port)
    if url.get_backend_name() == "postgresql":
        url = url.update_query_dict({"sslmode": "disable"})
    options = {"reaper_interval": None}
    lazy = AppLockManager(url.render_as_string(False), table=table, ttl=5, options=options)
    proxy.stall()
    opening = threading.Thread(target=lambda: lazy.manager)
    opening.start()
    try:
        wait_until(lambda: proxy.open_connections, "the parent's manager to connect")

        def child() -> None:
            with lazy.lock("forked"):
                pass
            lazy.close()

        children.start(child)
        proxy.resume()
        children.join()
    finally:
        proxy.resume()
        opening.join(procs.WAIT_LIMIT)
        lazy.close()


# -- transfers through the test client ----------------------------------------------


def test_concurrent_transfers_conserve_money(app: Flask, bank: int) -> None:
    requests = plan(240, seed=7)
    threads = 8

    def client(number: int) -> None:
        http = app.test_client()
        for path, body in requests[number::threads]:
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text

    run_threads(threads, client)
    balances = app.test_client().get("/balances").get_json()
    assert len(balances) == ACCOUNTS
    assert sum(balances.values()) == bank + deposited(requests)
    assert app.extensions["tierlock"].holders() == []


# -- under gunicorn -----------------------------------------------------------------


@SERVERS
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("preload", [False, True], ids=["opened-in-workers", "opened-in-master"])
def test_gunicorn_workers_conserve_money(
    db_url: str, table: str, bank: int, preload: bool, tmp_path: Path
) -> None:
    log = tmp_path / "gunicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(procs.ROOT), os.environ.get("PYTHONPATH")])
        ),
        "FLASK_TIERLOCK_URL": db_url,
        "FLASK_TIERLOCK_TABLE": table,
    }
    if preload:
        env["BANK_OPEN_IN_MASTER"] = "1"
    command = [sys.executable, "-m", "gunicorn", "-w", "4", "--threads", "4", "-k", "gthread"]
    command += ["-b", "127.0.0.1:0", "--pythonpath", str(procs.ROOT / "tests")]
    command += ["--preload"] * preload + ["flask_bank:create_app()"]
    with log.open("w") as output:
        server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=output, stderr=output)
    try:
        listening = wait_until(
            lambda: re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", log.read_text()),
            "gunicorn to listen",
            limit=procs.WAIT_LIMIT,
        )
        assert listening is not None
        port = int(listening[1])
        wait_until(lambda: get_balances(port), "a worker to answer", limit=procs.WAIT_LIMIT)

        requests = plan(400, seed=11)
        threads = 8
        pids: set[int] = set()
        started = time.perf_counter()
        run_threads(
            threads,
            lambda number: pids.update(post(port, *r) for r in requests[number::threads]),
        )
        elapsed = time.perf_counter() - started
        balances = get_balances(port)
        assert balances is not None
        total = sum(balances.values())
        print(
            f"gunicorn {make_url(db_url).get_backend_name()} preload={preload}: "
            f"{len(requests)} requests from {threads} threads in {elapsed:.2f} s, "
            f"{len(pids)} workers served; total {total} of {bank + deposited(requests)}"
        )
        assert total == bank + deposited(requests)
        assert len(pids) > 1, "the load reached one worker only"

        server.send_signal(signal.SIGTERM)
        assert server.wait(procs.WAIT_LIMIT) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# -- flask tierlock ------------------------------------------------------------------


@pytest.fixture
def runner(app: Flask) -> FlaskCliRunner:
    return app.test_cli_runner()


def test_cli_ls_shows_the_holders_as_lines_and_as_json(
    app: Flask, runner: FlaskCliRunner, table: str, key: str
) -> None:
    locks = app.extensions["tierlock"]
    result = runner.invoke(args=["tierlock", "ls"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"no locks in table {table} at {locks.url}"

    with locks.lock(key, ttl=30) as lock:
        # The runner's output is no terminal: a header and a plain line per hold.
        result = runner.invoke(args=["tierlock", "ls"])
        assert result.exit_code == 0, result.output
        header, line = result.stdout.splitlines()
        assert header.startswith("key ")
        assert re.match(rf"{key} +exclusive +{lock.token} +", line), result.stdout

        result = runner.invoke(args=["tierlock", "ls", "--json"])
        assert result.exit_code == 0, result.output
        [record] = json.loads(result.stdout)
        assert record["key"] == key
        assert record["token"] == lock.token
        assert record["pid"] == os.getpid()
        assert record["expired"] is False
        assert record["acquired_at"].endswith("+00:00")


def test_cli_release_needs_force(
    app: Flask, runner: FlaskCliRunner, make_manager: MakeManager, key: str
) -> None:
    other = make_manager()  # another process's hold, as far as the app can tell
    hold = other.lock(key)
    hold.acquire()

    result = runner.invoke(args=["tierlock", "release", key])
    assert result.exit_code == 2
    assert "not releasing" in result.stderr and "without --force" in result.stderr
    assert other.info(key) is not None

    result = runner.invoke(args=["tierlock", "release", key, "--force"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"released {key!r}"
    assert other.info(key) is None
    with pytest.raises(tierlock.LockLostError):
        hold.release()

    result = runner.invoke(args=["tierlock", "release", key, "--force"], env=WIDE)
    assert result.stdout.strip() == f"{key!r} was not held; nothing to release"


@pytest.mark.keeps_expired
def test_cli_reap_counts_an_expired_row(
    runner: FlaskCliRunner, make_manager: MakeManager, table: str, key: str
) -> None:
    other = make_manager()
    hold = other.lock(key, renew=False, ttl=0.2)
    hold.acquire()
    wait_until(lambda: (info := other.info(key)) is not None and info.expired, "the lease to end")

    result = runner.invoke(args=["tierlock", "reap"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"reaped 1 expired lock(s) from {table}"
    assert result.stderr == ""
    assert other.info(key) is None
    result = runner.invoke(args=["tierlock", "reap"], env=WIDE)
    assert result.stdout.strip() == f"reaped 0 expired lock(s) from {table}"


@pytest.mark.sql_only("only SQL has a table to make")
def test_cli_says_how_to_make_a_missing_table(
    make_app: Callable[..., Flask], db_url: str, table: str
) -> None:
    app = make_app(
        TIERLOCK_URL=db_url, TIERLOCK_TABLE=table, TIERLOCK_OPTIONS={"create_table": False}
    )
    result = app.test_cli_runner().invoke(args=["tierlock", "ls"])
    assert result.exit_code == 1, result.output
    where = app.extensions["tierlock"].url
    assert (
        result.stderr == f"tierlock: table {table} does not exist in {where}; run `tierlock init`\n"
    )
