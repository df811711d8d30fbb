"""Semantic 11: bad input gets a clear error and writes nothing; keys are exact."""

from __future__ import annotations

import importlib.util
import json
import math
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import procs
import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import SingletonThreadPool
from uninstalled import ALL_SCHEMES, EXTRA_MODULES, without

import tierlock
from tierlock.aio import AsyncLockManager

MakeManager = Callable[..., tierlock.LockManager]

BAD_KEYS: list[tuple[object, type[Exception], str]] = [
    ("", ValueError, "empty"),
    ((), ValueError, "at least one part"),
    (42, TypeError, "str or a tuple"),
    (None, TypeError, "str or a tuple"),
    (b"user:42", TypeError, "str or a tuple"),
    (["user", 42], TypeError, "str or a tuple"),
    (("user", 4.2), TypeError, "float"),
    (("user", True), TypeError, "bool"),
    (("user", None), TypeError, "NoneType"),
    ("x" * 256, ValueError, "at most 255"),
    (("x" * 200, "y" * 60), ValueError, "at most 255"),
    ("\U0001f600" * 256, ValueError, "at most 255"),
    ("nul\x00inside", ValueError, "U\\+0000"),
    ("mark\x01inside", ValueError, "U\\+0001"),
    ("lone \ud800 surrogate", ValueError, "Unicode"),
]


@pytest.mark.parametrize(("key", "error", "message"), BAD_KEYS, ids=repr)
def test_bad_keys_are_rejected_and_nothing_is_written(
    manager: tierlock.LockManager, key: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        manager.lock(key)  # type: ignore[arg-type]
    for call in (manager.info, manager.force_release):
        with pytest.raises(error, match=message):
            call(key)  # type: ignore[arg-type]
    assert manager.holders() == []


BAD_SECONDS: list[tuple[object, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (math.nan, ValueError),
    ("5", TypeError),
    (True, TypeError),
]


@pytest.mark.parametrize(("ttl", "error"), BAD_SECONDS, ids=repr)
def test_bad_ttl_is_rejected_everywhere(
    make_manager: MakeManager, key: str, ttl: object, error: type[Exception]
) -> None:
    manager = make_manager()
    with pytest.raises(error, match="ttl"):
        make_manager(ttl=ttl)
    with pytest.raises(error, match="ttl"):
        manager.lock(key, ttl=ttl)  # type: ignore[arg-type]
    with manager.lock(key) as lock:
        before = manager.info(key)
        with pytest.raises(error, match="ttl"):
            lock.extend(ttl)  # type: ignore[arg-type]
        assert manager.info(key) == before
    assert manager.holders() == []


@pytest.mark.parametrize(
    ("blocking", "timeout", "error", "message"),
    [
        (True, -2, ValueError, "non-negative"),
        (True, -0.5, ValueError, "non-negative"),
        (True, math.nan, ValueError, "timeout"),
        (False, 1, ValueError, "non-blocking"),
        (False, 0, ValueError, "non-blocking"),
        (True, "1", TypeError, "timeout"),
    ],
)
def test_bad_acquire_arguments_follow_threading(
    manager: tierlock.LockManager,
    key: str,
    blocking: bool,
    timeout: object,
    error: type[Exception],
    message: str,
) -> None:
    lock = manager.lock(key)
    with pytest.raises(error, match=message):
        lock.acquire(blocking, timeout)  # type: ignore[arg-type]
    assert not lock.owned()
    assert manager.holders() == []


def test_acquire_accepts_threading_defaults(manager: tierlock.LockManager, key: str) -> None:
    lock = manager.lock(key)
    for blocking, timeout in [(True, -1), (True, None), (False, -1), (True, 0), (True, 1.5)]:
        assert lock.acquire(blocking, timeout)
        lock.release()
    with pytest.raises(ValueError, match="timeout"):
        manager.lock(key, timeout=-1)


@pytest.mark.parametrize(
    "table", ["bad-name", "locks; DROP TABLE x", "1locks", "public.locks", "", "t" * 41, "lo cks"]
)
def test_bad_table_names_are_rejected_and_nothing_is_created(
    db_url: str, engine: Engine, table: str
) -> None:
    def tables() -> set[str]:
        # Other tests running beside this one create and drop their own tl_ tables.
        return {name for name in inspect(engine).get_table_names() if not name.startswith("tl_")}

    before = tables()
    with pytest.raises(ValueError, match="plain identifier"):
        tierlock.LockManager(db_url, table=table, reaper_interval=None)
    assert tables() == before


def test_bad_manager_options_name_the_option(db_url: str, engine: Engine, table: str) -> None:
    with pytest.raises(ValueError, match="reaper_interval"):
        tierlock.LockManager(db_url, table=table, reaper_interval=0)
    with pytest.raises(ValueError, match="poll_interval"):
        tierlock.LockManager(db_url, table=table, poll_interval=-1)
    with pytest.raises(ValueError, match="not both"):
        tierlock.LockManager(db_url, engine=engine, table=table)
    with pytest.raises(TypeError, match="table"):
        tierlock.LockManager(db_url, table=42)  # type: ignore[arg-type]
    assert table not in inspect(engine).get_table_names()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("oracle://scott@localhost/x", "unsupported database"),
        ("not a url", "not a database URL"),
    ],
)
def test_unusable_urls_are_rejected(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tierlock.LockManager(url, reaper_interval=None)


def _async_engine() -> AsyncEngine:
    # psycopg has an asyncio driver; nothing connects, so no server is needed.
    return create_async_engine("postgresql+psycopg://postgres@127.0.0.1:1/test")


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: "sqlite:///locks.db", TypeError, "must be a SQLAlchemy Engine, not str"),
        (object, TypeError, "must be a SQLAlchemy Engine, not object"),
        (_async_engine, TypeError, r"AsyncEngine.*threads of its own.*engine\.sync_engine"),
        (lambda: create_engine("sqlite://"), ValueError, "in-memory"),
        (lambda: create_engine("sqlite:///:memory:"), ValueError, "in-memory"),
        (
            lambda: create_engine(
                "sqlite:///file:x?mode=memory&uri=true", poolclass=SingletonThreadPool
            ),
            ValueError,
            "in-memory",
        ),
    ],
    ids=["url-string", "object", "async-engine", "memory", "memory-named", "memory-uri"],
)
def test_unusable_engines_are_rejected(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[], object],
    error: type[Exception],
    message: str,
) -> None:
    """A clear error at once, rather than an AttributeError, or threads failing later
    on a table that each connection to an in-memory database lacks."""
    monkeypatch.chdir(tmp_path)  # where a relative SQLite file would appear
    engine = make()
    try:
        with pytest.raises(error, match=message):
            tierlock.LockManager(engine=engine, reaper_interval=None)  # type: ignore[arg-type]
    finally:
        if isinstance(engine, Engine):
            engine.dispose()
    assert list(tmp_path.iterdir()) == []


EXACT_KEYS = [
    "a",
    "a ",
    " a",
    "A",
    "\u00df",  # sharp s
    "ss",
    "\u00e9",  # e with acute, precomposed
    "e\u0301",  # e + combining acute
    "\U0001f600",  # a 4-byte character
    "\U0001f600 ",
    "\U0001f601",
    "100%_'\";--\\",
    "\U0001f600" * 255,
    "x" * 255,
]


def test_keys_are_compared_exactly(manager: tierlock.LockManager) -> None:
    locks = [manager.lock(key) for key in EXACT_KEYS]
    for lock in locks:
        assert lock.acquire(blocking=False), f"{lock.key!r} collided with another key"
    stored = {info.key for info in manager.holders()}
    assert stored == set(EXACT_KEYS)
    for lock in locks:
        info = manager.info(lock.key)
        assert info is not None and info.token == lock.token
        lock.release()
    assert manager.holders() == []


# -- URLs a user gets wrong, and engines whose library is not installed ----------------

# URLs whose engine imports one of them (nothing is reached: nothing listens on port 1),
# that module, and the fix the error names.
MISSING_LIBRARIES = [
    ("redis://127.0.0.1:1/0", "redis", 'pip install "tierlock[redis]"'),
    ("rediss+cluster://127.0.0.1:1", "redis", 'pip install "tierlock[redis]"'),
    ("zookeeper://127.0.0.1:1/x", "kazoo", 'pip install "tierlock[zookeeper]"'),
    ("mysql://root@127.0.0.1:1/test", "pymysql", 'pip install "tierlock[mysql]"'),
    ("mariadb://root@127.0.0.1:1/test", "pymysql", 'pip install "tierlock[mysql]"'),
    ("mysql+pymysql://root@127.0.0.1:1/test", "pymysql", 'pip install "tierlock[mysql]"'),
    ("postgresql://postgres@127.0.0.1:1/test", "psycopg", 'pip install "tierlock[postgres]"'),
    ("postgresql+psycopg://u@127.0.0.1:1/test", "psycopg", 'pip install "tierlock[postgres]"'),
]
# The child tries both managers on each URL it is given, and prints what each raised.
OPEN_EACH = """
import json, sys
import tierlock, tierlock.aio

seen = []
for url in sys.argv[1:]:
    for make in (tierlock.LockManager, tierlock.aio.AsyncLockManager):
        try:
            make(url, reaper_interval=None)
        except tierlock.MissingDriverError as exc:
            parents = [isinstance(exc, ImportError), isinstance(exc, tierlock.LockError)]
            seen.append([url, make.__name__, *parents, exc.name, str(exc)])
        else:
            raise SystemExit(f"{url}: {make.__name__} opened without its library")
print(json.dumps(seen))
"""


def test_a_library_not_installed_is_one_error_naming_its_extra(tmp_path: Path) -> None:
    """Each engine's library, and each SQL database's driver, missing from the venv: both
    managers raise MissingDriverError, an ImportError naming the module, whose message
    says which extra to install."""

    urls = [url for url, _, _ in MISSING_LIBRARIES]
    result = procs.run_python("-c", without(*EXTRA_MODULES) + OPEN_EACH, *urls, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = iter(json.loads(result.stdout))
    for url, module, fix in MISSING_LIBRARIES:
        scheme = url.partition(":")[0]
        for manager in ("LockManager", "AsyncLockManager"):
            assert next(seen) == [
                url,
                manager,
                True,  # an ImportError
                True,  # a LockError
                module,
                f"{scheme}:// URLs need the {module} package, which is not installed: {fix}",
            ]
    assert next(seen, None) is None


@pytest.mark.parametrize(
    ("url", "module", "fix"),
    [
        (
            "mysql+mysqldb://root@127.0.0.1:1/test",
            "MySQLdb",
            'install it, or write mysql+pymysql:// and pip install "tierlock[mysql]"',
        ),
        (
            "postgresql+psycopg2://postgres@127.0.0.1:1/test",
            "psycopg2",
            'install it, or write postgresql+psycopg:// and pip install "tierlock[postgres]"',
        ),
    ],
)
def test_a_driver_named_in_the_url_is_kept_and_said_missing(
    url: str, module: str, fix: str
) -> None:
    """A ``+driver`` given is used as given. No extra installs these two, nor does this
    venv have them, so the fix also offers the extra's driver."""

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    for make in (tierlock.LockManager, AsyncLockManager):
        with pytest.raises(tierlock.MissingDriverError) as caught:
            make(url, reaper_interval=None)
        error = caught.value
        assert isinstance(error, ImportError) and isinstance(error, tierlock.LockError)
        assert (error.name, error.fix) == (module, fix)
        assert str(error).endswith(f"which is not installed: {fix}")
        copy = pickle.loads(pickle.dumps(error))  # errors cross processes whole
        assert (type(copy), str(copy), copy.name) == (type(error), str(error), module)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("zookeper://127.0.0.1:2181", "unsupported database 'zookeper'"),
        ("redis-cluster://127.0.0.1:1", "not a database URL"),  # (no scheme SQLAlchemy reads)
    ],
)
def test_an_unknown_scheme_lists_every_engine(url: str, message: str) -> None:

    for make in (tierlock.LockManager, AsyncLockManager):
        with pytest.raises(ValueError, match=message) as caught:
            make(url, reaper_interval=None)
        listed = re.split(r", | or ", re.split(r": use | one of ", str(caught.value))[-1])
        assert set(listed) == ALL_SCHEMES


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"]
)
def test_in_memory_sqlite_is_refused_for_what_it_is(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the manager, saying why, rather than sent on to make a table no one else sees."""
    monkeypatch.chdir(tmp_path)  # where a relative SQLite file would appear
    with pytest.raises(ValueError, match="in-memory") as caught:
        tierlock.LockManager(url, reaper_interval=None)
    assert "coordinates nothing" in str(caught.value)
    assert "init" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
def test_a_mysql_url_without_a_driver_takes_pymysql(
    db_url: str, table: str, key: str, scheme: str
) -> None:
    """README's mysql:// URLs work with the mysql extra's PyMySQL alone."""
    url = db_url.replace("mysql+pymysql://", f"{scheme}://", 1)
    assert url.startswith(f"{scheme}://root@")
    with tierlock.LockManager(url, table=table, reaper_interval=None) as locks:
        assert locks.url.startswith(f"{scheme}+pymysql://root@")
        with locks.lock(key) as lock:
            info = locks.info(key)
            assert info is not None and info.token == lock.token
        assert locks.info(key) is None
