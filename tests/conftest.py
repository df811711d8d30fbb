"""Fixtures: one contract suite over every database.

``--db NAME`` (repeatable) picks databases from ``DATABASES``; ``--dburi NAME=URL``
points one at another server. A server that cannot be reached skips its tests when
run by hand, and fails them when ``CI=true``.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import procs
import pytest
from proxy import Proxy
from scratch import Scratch
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

import tierlock

# pytester puts sys.modules back as it found them after each test that uses it: all of
# tierlock is loaded now, so that none of its modules is ever loaded twice.
import tierlock.pytest_plugin.once

MakeManager = Callable[..., tierlock.LockManager]

pytest_plugins = ["pytester"]

DATABASES = {
    "sqlite": None,  # a fresh file per test, under tmp_path
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--db", action="append", choices=sorted(DATABASES), help="database to test (repeatable)"
    )
    parser.addoption(
        "--dburi", action="append", default=[], metavar="NAME=URL", help="URL for database NAME"
    )


def pytest_configure(config: pytest.Config) -> None:
    for item in config.getoption("dburi"):
        name, _, url = item.partition("=")
        if name not in DATABASES or not url:
            raise pytest.UsageError(f"--dburi takes NAME=URL with NAME in {sorted(DATABASES)}")
        DATABASES[name] = url


@functools.cache
def _unreachable(url: str) -> str | None:
    """Why ``url`` cannot be used, or None; asked once per process."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        return f"{make_url(url).render_as_string(hide_password=True)} is unreachable: {exc}"
    finally:
        engine.dispose()
    return None


def require_server(url: str) -> None:
    reason = _unreachable(url)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
    ]
)
def db(request: pytest.FixtureRequest) -> str:
    """The name of the database under test."""
    name: str = request.param
    chosen = request.config.getoption("db")
    if chosen and name not in chosen:
        pytest.skip(f"{name} not chosen with --db")
    return name


@pytest.fixture
def db_url(db: str, tmp_path: Path) -> str:
    url = DATABASES[db]
    if url is None:
        return f"sqlite:///{tmp_path / 'locks.db'}"
    require_server(url)
    return url


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    """A lock table of this test's own, dropped afterwards (with the pytest plugin's
    table of run-once results beside it)."""
    name = f"tl_{uuid.uuid4().hex[:16]}"
    yield name
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            for dropped in (name, f"{name}_once"):
                connection.execute(text(f"DROP TABLE IF EXISTS {dropped}"))
    finally:
        engine.dispose()


@pytest.fixture
def make_manager(db_url: str, table: str) -> Iterator[MakeManager]:
    """Make managers on this test's database and table; all are closed afterwards."""
    managers: list[tierlock.LockManager] = []

    def make(**options: Any) -> tierlock.LockManager:
        options.setdefault("table", table)
        options.setdefault("reaper_interval", None)
        options.setdefault("poll_interval", 0.02)
        if "engine" not in options:
            options.setdefault("url", db_url)
        manager = tierlock.LockManager(**options)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()


@pytest.fixture
def manager(make_manager: Callable[..., tierlock.LockManager]) -> tierlock.LockManager:
    return make_manager()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A plain engine on the test database, for looking at the table directly."""
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def key() -> str:
    return f"key:{uuid.uuid4().hex}"


# For tests of what only a server shows (a network to lose, a session to end).
SERVERS = pytest.mark.parametrize(
    "db",
    [
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
    ],
    indirect=True,
)


@pytest.fixture
def direct(make_manager: MakeManager) -> tierlock.LockManager:
    """A manager straight on the server: it creates the table and tells the truth."""
    return make_manager()


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    url = make_url(db_url)
    assert url.host is not None and url.port is not None
    proxy = Proxy((url.host, url.port))
    yield proxy
    proxy.close()


@pytest.fixture
def proxied(
    direct: tierlock.LockManager, proxy: Proxy, db_url: str, make_manager: MakeManager
) -> MakeManager:
    """Make managers whose every connection goes through ``proxy``."""
    url = make_url(db_url).set(host="127.0.0.1", port=proxy.port)
    if url.get_backend_name() == "postgresql":
        # Keep the bytes readable: TLS would hide the statements from the proxy.
        url = url.update_query_dict({"sslmode": "disable"})

    def make(**options: Any) -> tierlock.LockManager:
        return make_manager(url=url.render_as_string(hide_password=False), **options)

    return make


@pytest.fixture
def scratch(
    db: str, db_url: str, table: str, engine: Engine, request: pytest.FixtureRequest
) -> Scratch:
    """A scratch suite for tierlock's pytest plugin: on SQLite, with the plugin's own
    default; on a server, on this test's table."""
    with engine.connect():  # (the driver is loaded before pytester notes sys.modules)
        pass
    pytester: pytest.Pytester = request.getfixturevalue("pytester")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # (this suite's own, under xdist)
    url_args = [] if db == "sqlite" else ["--tierlock-url", db_url, "-o", f"tierlock_table={table}"]
    return Scratch(pytester, url_args)


@pytest.fixture
def children() -> Iterator[procs.Children]:
    """The test's child processes; any still running at the end are killed."""
    group = procs.Children()
    try:
        yield group
    finally:
        group.kill_all()
