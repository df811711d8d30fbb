"""Fixtures: one contract suite over every engine.

``--db NAME`` (repeatable) picks engines from ``engines.ENGINES``; ``--dburi NAME=URL``
points one at another server. A server that cannot be reached skips its tests when
run by hand, and fails them when ``CI=true``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import procs
import pytest
from counting import CountingCursor, DriverStatements
from engines import ENGINES, SQL, drop_namespace, keeps_expired, require_server
from proxy import Proxy
from scratch import Scratch
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool.base import _ConnectionFairy

import tierlock

# pytester puts sys.modules back as it found them after each test that uses it: all of
# tierlock is loaded now, so that none of its modules is ever loaded twice.
import tierlock.pytest_plugin.once

MakeManager = Callable[..., tierlock.LockManager]

pytest_plugins = ["pytester"]

# Fixtures that only an SQL engine has: a test that asks for one runs on SQL only.
SQL_FIXTURES = {
    "engine",
    "scratch",
    "counting_engine",
    "driver_statements",
    "mixed_case_table",
}
# The pytest plugin's whole-run tests, each several pytest runs of their own: on the
# embedded default and one server. What differs on MariaDB (keys and run ids compared
# exactly, the results' column types) has tests of its own there.
PLUGIN_DATABASES = pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)
# Read/write locks and semaphores: what test_engines shows the other engines do instead.
SHARED_HOLDS = pytest.mark.sql_only("read holds and semaphore permits are SQL rows")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--db", action="append", choices=sorted(ENGINES), help="engine to test (repeatable)"
    )
    parser.addoption(
        "--dburi", action="append", default=[], metavar="NAME=URL", help="URL for engine NAME"
    )


def pytest_configure(config: pytest.Config) -> None:
    for item in config.getoption("dburi"):
        name, _, url = item.partition("=")
        if name not in ENGINES or not url:
            raise pytest.UsageError(f"--dburi takes NAME=URL with NAME in {sorted(ENGINES)}")
        ENGINES[name] = url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of the ``db`` fixture runs on every engine, unless it needs what only
    SQL has (``SQL_FIXTURES``, or the ``sql_only`` mark), looks at holds whose lease
    ended (the ``keeps_expired`` mark), or names its engines itself."""
    if "db" not in metafunc.fixturenames or any(
        "db" in mark.args[0] for mark in metafunc.definition.iter_markers("parametrize")
    ):
        return
    sql_only = metafunc.definition.get_closest_marker("sql_only") is not None or bool(
        SQL_FIXTURES & set(metafunc.fixturenames)
    )
    names = SQL if sql_only else tuple(ENGINES)
    if metafunc.definition.get_closest_marker("keeps_expired") is not None:
        names = tuple(name for name in names if keeps_expired(name))
    metafunc.parametrize(
        "db",
        [
            pytest.param(name, marks=() if name == "sqlite" else getattr(pytest.mark, name))
            for name in names
        ],
        indirect=True,
    )


@pytest.hookimpl(tryfirst=True)  # (before xdist reads the groups into the node ids)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the cases that a parameter marks ``sql_only`` (a semaphore among kinds of
    handle, say) on the other engines; ``pytest_generate_tests`` sees only the marks of
    whole tests. Run the benchmark's tests of one database server one after another."""
    dropped = [
        item
        for item in items
        if item.get_closest_marker("sql_only") is not None
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("db", "sqlite") not in SQL  # type: ignore[attr-defined]
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
    for item in items:
        _one_bench_run_per_server(item)


# Database servers whose connections a benchmark's run may use up: one run of
# ``python -m bench`` on PostgreSQL held 49 at once, and two side by side met
# PostgreSQL's default limit of 100 ("too many clients already").
CONNECTION_BOUND = ("mariadb", "postgresql")


def _one_bench_run_per_server(item: pytest.Item) -> None:
    """Put a benchmark test on a server with a bound on its connections in that
    server's xdist group (unless it is in a group of its own already)."""
    callspec = getattr(item, "callspec", None)
    db = None if callspec is None else callspec.params.get("db")
    if (
        db in CONNECTION_BOUND
        and item.path.name.startswith("test_bench")
        and item.get_closest_marker("xdist_group") is None
    ):
        item.add_marker(pytest.mark.xdist_group(f"bench-{db}"))


@pytest.fixture
def db(request: pytest.FixtureRequest) -> str:
    """The name of the engine under test."""
    name: str = request.param
    chosen = request.config.getoption("db")
    if chosen and name not in chosen:
        pytest.skip(f"{name} not chosen with --db")
    return name


@pytest.fixture
def db_url(db: str, tmp_path: Path) -> str:
    url = ENGINES[db]
    if url is None:
        if db == "file":
            return f"file://{tmp_path / 'locks'}"
        return f"sqlite:///{tmp_path / 'locks.db'}"
    require_server(url)
    return url


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    """A lock namespace of this test's own, removed afterwards (on SQL, with the pytest
    plugin's table of run-once results beside it)."""
    name = f"tl_{uuid.uuid4().hex[:16]}"
    yield name
    drop_namespace(db_url, name)


@pytest.fixture
def make_manager(db_url: str, table: str) -> Iterator[MakeManager]:
    """Make managers on this test's database and table; all are closed afterwards."""
    with managers(db_url, table) as make:
        yield make


@contextlib.contextmanager
def managers(default_url: str, table: str) -> Iterator[MakeManager]:
    """``make(url=default_url, **options)`` makes managers on ``table`` with the test
    suite's defaults (no reaper, short polls); all are closed at the end."""
    made: list[tierlock.LockManager] = []

    def make(url: str | None = None, **options: Any) -> tierlock.LockManager:
        options.setdefault("table", table)
        options.setdefault("reaper_interval", None)
        options.setdefault("poll_interval", 0.02)
        if "engine" not in options:
            options["url"] = url or default_url
        manager = tierlock.LockManager(**options)
        made.append(manager)
        return manager

    try:
        yield make
    finally:
        for manager in made:
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


# For tests of what the SQL engines do alike, on the embedded one and both servers.
SQL_DATABASES = pytest.mark.parametrize(
    "db",
    [
        "sqlite",
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
    ],
    indirect=True,
)
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
) -> Iterator[MakeManager]:
    """Make managers whose every connection goes through ``proxy``. They are closed
    before the proxy is: closed after it, a manager with a row left to sweep would
    spend its ``database_timeout`` on a refused port."""
    url = make_url(db_url).set(host="127.0.0.1", port=proxy.port)
    if url.get_backend_name() == "postgresql":
        # Keep the bytes readable: TLS would hide the statements from the proxy.
        url = url.update_query_dict({"sslmode": "disable"})
    made: list[tierlock.LockManager] = []

    def make(**options: Any) -> tierlock.LockManager:
        manager = make_manager(url=url.render_as_string(hide_password=False), **options)
        made.append(manager)
        return manager

    yield make
    proxy.resume()  # (a test that failed may have left it stalled or refusing)
    proxy.accept_new()
    for manager in made:
        manager.close()


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


@pytest.fixture
def driver_statements(monkeypatch: pytest.MonkeyPatch) -> DriverStatements:
    """Every statement sent to a driver cursor of a pooled connection during the test."""
    statements = DriverStatements()
    cursor = _ConnectionFairy.cursor

    def counting_cursor(self: _ConnectionFairy, *args: object, **kwargs: object) -> object:
        return CountingCursor(cursor(self, *args, **kwargs), statements)

    monkeypatch.setattr(_ConnectionFairy, "cursor", counting_cursor)
    return statements
