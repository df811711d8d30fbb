"""The Flask extension's transaction rule for Flask-SQLAlchemy's ``db.session``: on by
default whichever extension is set up first, off with ``TIERLOCK_HOLD_UNTIL_COMMIT =
False``; and the money it keeps whole under gunicorn's workers (tests/flask_sqla_bank.py),
which the same load loses without it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flask_sqla_bank
import procs
import pytest
from conftest import SERVERS
from flask import Flask
from flask_load import get_balances, post, run_threads
from flask_sqla_bank import db, locks
from polling import wait_until
from session_bank import Bank, expected, plan
from sqlalchemy import text
from sqlalchemy.engine import make_url

import tierlock

MakeApp = Callable[..., Flask]


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[MakeApp]:
    """Make bank apps on SQLite files of the test's own; their managers and engines
    are closed afterwards."""
    apps: list[Flask] = []

    def make(**config: Any) -> Flask:
        config.setdefault("TIERLOCK_URL", f"sqlite:///{tmp_path / 'locks.db'}")
        config.setdefault("SQLALCHEMY_DATABASE_URI", f"sqlite:///{tmp_path / 'data.db'}")
        app = flask_sqla_bank.create_app({"TIERLOCK_TABLE": "tl_flask_rule", **config})
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["tierlock"].close()
        with app.app_context():
            db.engine.dispose()


def put_off(app: Flask, key: str) -> bool:
    """Whether a lock released in a request's ``db.session`` transaction stays held
    until its commit; and it is released after."""
    with app.app_context():
        db.session.execute(text("SELECT 1"))
        with locks.lock(key) as lock:
            pass
        waited = lock.owned()
        db.session.commit()
        assert not lock.owned()
    return waited


@pytest.mark.parametrize(
    "tierlock_first", [False, True], ids=["sqlalchemy-first", "tierlock-first"]
)
def test_on_by_default_whichever_extension_comes_first(
    make_app: MakeApp, key: str, tierlock_first: bool
) -> None:
    app = make_app(BANK_TIERLOCK_FIRST=tierlock_first)
    assert put_off(app, key)


def test_on_for_a_manager_made_before_flask_sqlalchemy_was_set_up(key: str, tmp_path: Path) -> None:
    app = Flask(__name__)
    app.config["TIERLOCK_URL"] = f"sqlite:///{tmp_path / 'early.db'}"
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'data.db'}"
    locks.init_app(app)
    try:
        with app.app_context(), locks.lock(key):  # (made and used before db exists)
            pass
        db.init_app(app)
        assert put_off(app, key)
    finally:
        app.extensions["tierlock"].close()


def test_off_with_the_setting(make_app: MakeApp, key: str) -> None:
    assert not put_off(make_app(TIERLOCK_HOLD_UNTIL_COMMIT=False), key)
    with pytest.raises(TypeError, match="TIERLOCK_HOLD_UNTIL_COMMIT must be True or False"):
        make_app(TIERLOCK_HOLD_UNTIL_COMMIT="no")


def test_the_request_s_end_releases_what_it_did_not_commit(make_app: MakeApp, key: str) -> None:
    app = make_app()
    with app.app_context():
        db.session.execute(text("SELECT 1"))
        with locks.lock(key) as lock:
            pass
        assert lock.owned()
        other = tierlock.LockManager(app.config["TIERLOCK_URL"], table=app.config["TIERLOCK_TABLE"])
        try:
            assert not other.lock(key).acquire(blocking=False)
        finally:
            other.close()
    with app.app_context():  # (the same thread: its hold is gone)
        assert not locks.lock(key).owned()
        assert locks.locks.info(key) is None


# -- under gunicorn -----------------------------------------------------------------


@contextlib.contextmanager
def served(env: dict[str, str], tmp_path: Path) -> Iterator[int]:
    """gunicorn serving the app with 4 workers of 4 threads; its port."""
    log = tmp_path / "gunicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(procs.ROOT), os.environ.get("PYTHONPATH")])
        ),
        **env,
    }
    command = [sys.executable, "-m", "gunicorn", "-w", "4", "--threads", "4", "-k", "gthread"]
    command += ["-b", "127.0.0.1:0", "--pythonpath", str(procs.ROOT / "tests")]
    command += ["flask_sqla_bank:create_app()"]
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
        yield port
        server.send_signal(signal.SIGTERM)
        assert server.wait(procs.WAIT_LIMIT) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@SERVERS
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("hold", [True, False], ids=["rule", "no-rule"])
def test_gunicorn_workers_conserve_money_only_under_the_rule(
    db_url: str, table: str, hold: bool, tmp_path: Path
) -> None:
    bank = Bank(table)
    bank.open(db_url)
    try:
        env = {
            "FLASK_TIERLOCK_URL": db_url,
            "FLASK_TIERLOCK_TABLE": table,
            "FLASK_TIERLOCK_HOLD_UNTIL_COMMIT": "true" if hold else "false",
        }
        transfers = plan(200, seed=13)
        threads = 8
        pids: set[int] = set()
        with served(env, tmp_path) as port:
            started = time.perf_counter()
            run_threads(
                threads,
                lambda number: pids.update(
                    post(port, "/transfer", {"from": source, "to": target})
                    for source, target in transfers[number::threads]
                ),
            )
            elapsed = time.perf_counter() - started
        balances = bank.balances(db_url)
    finally:
        bank.close(db_url)
    wrong = sum(balances[account] != balance for account, balance in expected(transfers).items())
    print(
        f"gunicorn {make_url(db_url).get_backend_name()}, rule {'on' if hold else 'off'}: "
        f"{len(transfers)} transfers from {threads} threads in {elapsed:.2f} s, "
        f"{len(pids)} workers served; total {sum(balances.values())} of "
        f"{sum(expected(transfers).values())}, {wrong} accounts wrong"
    )
    assert len(pids) > 1, "the load reached one worker only"
    if hold:
        assert balances == expected(transfers)
    else:
        assert wrong, "the load lost no update: it cannot tell the rule is needed"
