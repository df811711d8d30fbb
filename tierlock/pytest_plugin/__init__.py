"""tierlock's pytest plugin: locks and run-once fixtures for suites that run in many
processes (pytest-xdist, or several CI machines against one database).

::

    @pytest.mark.tierlock("sandbox-account")     # the body runs holding the key
    def test_refund(): ...

    @pytest.fixture(scope="session")
    def schema(tierlock_once):
        return tierlock_once("schema", create_schema)  # once per run, result for all

pytest loads it in every run (entry point ``pytest11``; ``-p no:tierlock`` turns it
off), so it costs nothing until a test uses it: this module imports no database code,
the manager and its connections are made on first use, and the per-test hook of the
marker is registered only when a collected test carries the marker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from .run import MARKER, PluginRun

if TYPE_CHECKING:
    from ..manager import LockManager
    from .once import OnceFailed

__all__ = ["OnceFailed"]

_RUN = pytest.StashKey[PluginRun]()
FIXTURES = frozenset({"tierlock_manager", "tierlock_once"})


def __getattr__(name: str) -> object:
    if name == "OnceFailed":  # (its module imports the database code)
        from .once import OnceFailed

        return OnceFailed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tierlock", "tierlock: locks across the run's processes")
    group.addoption(
        "--tierlock-url",
        metavar="URL",
        help="database of the marker's locks and tierlock_once's results (default: a "
        "SQLite file in the temporary directory that the run's workers share)",
    )
    group.addoption(
        "--tierlock-run",
        metavar="ID",
        help="share tierlock_once results between pytest runs given the same ID, such as "
        "one run's jobs on several machines (default: this run's own)",
    )
    parser.addini("tierlock_url", "database of tierlock's locks, as --tierlock-url")
    parser.addini("tierlock_table", "tierlock's lock table", default="tierlock_locks")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*keys, timeout=None): run the test body holding every key, across all "
        "processes of the run (tierlock)",
    )
    config.stash[_RUN] = PluginRun(config)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Where the locks live. An xdist controller says it here, since only its workers
    collect tests; other runs say it after collection, if a test uses the plugin."""
    return config.stash[_RUN].where if config.pluginmanager.hasplugin("dsession") else None


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    run = config.stash[_RUN]
    return run.where if run.used else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Check the marker's arguments while collecting, where a mistake stops the run."""
    if metafunc.definition.get_closest_marker(MARKER) is not None:
        from .marker import parse

        try:
            parse(metafunc.definition)
        except (TypeError, ValueError) as exc:
            error = f"@pytest.mark.{MARKER} on {metafunc.definition.nodeid}: {exc}"
        else:
            return
        pytest.fail(error, pytrace=False)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash[_RUN]
    marked = any(item.get_closest_marker(MARKER) is not None for item in items)
    if marked:
        from .marker import MarkedTests

        config.pluginmanager.register(MarkedTests(run), "tierlock-marked")
    run.used = marked or any(
        not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())) for item in items
    )


@pytest.fixture(scope="session")
def tierlock_manager(pytestconfig: pytest.Config) -> LockManager:
    """The run's ``LockManager`` in this process, made on first use and closed when the
    session ends; it holds the marker's keys, so the body may take them again."""
    return pytestconfig.stash[_RUN].manager


@pytest.fixture(scope="session")
def tierlock_once(pytestconfig: pytest.Config) -> Callable[[str, Callable[[], Any]], Any]:
    """``tierlock_once(key, fn)``: ``fn()``'s JSON result, computed by one process of
    the run and given to all; see the README's pytest section."""
    from .once import Once

    return Once(pytestconfig.stash[_RUN])


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is not None:
        run.finish()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: note which run's results a finished worker
    stored, to delete them once every worker is done."""
    node.config.stash[_RUN].worker_finished(getattr(node, "workeroutput", {}))
