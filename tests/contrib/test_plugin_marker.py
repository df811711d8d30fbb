"""The pytest plugin's marker, in real pytest runs under pytest-xdist: marked tests on
one key never overlap, on different keys they run side by side, a timeout names the
holder, a killed holder strands no one, and bad arguments stop the run at collection."""

from __future__ import annotations

import itertools
import os
import socket
import time

import pytest
from conftest import PLUGIN_DATABASES, MakeManager
from polling import wait_until
from scratch import Scratch

from tierlock.base import DEFAULT_TTL

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@PLUGIN_DATABASES
def test_marked_tests_on_one_key_never_overlap(scratch: Scratch) -> None:
    scratch.write(
        test_one_key="""
        import time, pytest
        from conftest import record

        @pytest.mark.parametrize("n", range(8))
        @pytest.mark.tierlock("printer")
        def test_print(n, tierlock_manager):
            began = time.monotonic()
            assert tierlock_manager.lock("printer").owned()  # the body may take it again
            time.sleep(0.1)  # the work that must not overlap another test's
            record("spans", began, time.monotonic())
        """
    )
    result = scratch.run()
    result.assert_outcomes(passed=8)
    spans = sorted((float(began), float(ended)) for began, ended in scratch.records("spans"))
    assert len(spans) == 8
    overlaps = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert not overlaps
    assert len({pid for pid, *_ in scratch.records("started")}) > 1, "one process ran them all"


@PLUGIN_DATABASES
def test_tests_on_different_keys_run_side_by_side(scratch: Scratch) -> None:
    # Each test waits inside its body until all four are inside theirs: only tests
    # that run at the same time can all get there.
    scratch.write(
        test_keys="""
        import os, pytest
        from conftest import record, records, wait_until

        @pytest.mark.parametrize(
            "n", [pytest.param(n, marks=pytest.mark.tierlock(f"printer-{n}")) for n in range(4)]
        )
        def test_together(n):
            record("inside", os.getpid(), n)
            wait_until(lambda: len(records("inside")) == 4, "all four tests inside")
        """
    )
    scratch.run().assert_outcomes(passed=4)
    assert len({pid for pid, _ in scratch.records("inside")}) == 4


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)  # (the order is the plugin's)
def test_keys_are_taken_in_sorted_order_so_crossed_markers_do_not_deadlock(
    scratch: Scratch,
) -> None:
    scratch.write(
        test_crossed="""
        import time, pytest

        @pytest.mark.parametrize("n", range(6))
        @pytest.mark.tierlock("b", "a")
        def test_ba(n):
            time.sleep(0.02)

        @pytest.mark.parametrize("n", range(6))
        @pytest.mark.tierlock("a", "b")
        def test_ab(n):
            time.sleep(0.02)
        """
    )
    scratch.run(workers=2).assert_outcomes(passed=12)


@PLUGIN_DATABASES
def test_a_timeout_names_the_process_holding_the_key(
    scratch: Scratch, make_manager: MakeManager
) -> None:
    manager = make_manager()  # on the run's database and table
    scratch.url_args = ["--tierlock-url", manager.url, "-o", f"tierlock_table={manager.table}"]
    scratch.write(
        test_held="""
        import pytest

        @pytest.mark.tierlock("printer", timeout=1)
        def test_print():
            pass
        """
    )
    with manager.lock("printer"):
        began = time.monotonic()
        result = scratch.run(workers=2)
        waited = time.monotonic() - began
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"*'printer' not taken within 1 s: held by thread 'MainThread' "
            f"(host {socket.gethostname()}, pid {os.getpid()})*"
        ]
    )
    assert waited < 60


@PLUGIN_DATABASES
def test_a_timeout_names_the_test_holding_the_key(scratch: Scratch) -> None:
    scratch.write(
        test_named="""
        import pytest
        from conftest import record, records, wait_until

        @pytest.mark.tierlock("printer")
        def test_holder():
            record("holding", 1)
            wait_until(lambda: records("waiter-done"), "the waiter to give up")

        @pytest.mark.tierlock("printer", timeout=1)
        def test_waiter():
            pass
        """
    )
    scratch.pytester.makeconftest(
        scratch.pytester.path.joinpath("conftest.py").read_text()
        + """
def pytest_runtest_setup(item):
    if item.name == "test_waiter":
        wait_until(lambda: records("holding"), "the holder to hold the key")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.endswith("test_waiter"):
        record("waiter-done", 1)
"""
    )
    result = scratch.run(workers=2)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*'printer' not taken within 1 s: held by test test_named.py::test_holder on worker gw*"]
    )


@PLUGIN_DATABASES
def test_a_killed_holder_strands_no_one(scratch: Scratch) -> None:
    scratch.write(
        test_killed="""
        import os, signal, time, pytest
        from conftest import record, records, wait_until

        @pytest.mark.tierlock("printer")
        def test_holder():
            wait_until(lambda: any("test_waiter" in r[-1] for r in records("started")), "waiter")
            record("killed", time.monotonic())
            os.kill(os.getpid(), signal.SIGKILL)

        @pytest.mark.tierlock("printer")
        def test_waiter():
            record("got", time.monotonic())
        """
    )
    # The waiter starts once the holder holds the key.
    scratch.pytester.makeconftest(
        scratch.pytester.path.joinpath("conftest.py").read_text()
        + """
def pytest_runtest_setup(item):
    if item.name == "test_waiter":
        wait_until(lambda: any("test_holder" in r[-1] for r in records("started")), "holder")
"""
    )
    result = scratch.run(workers=2)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*crashed while running*test_holder*"])
    (killed,) = scratch.records("killed")
    (got,) = scratch.records("got")
    # At once on the same host (the holder's process is gone), well inside the lease.
    assert float(got[0]) - float(killed[0]) < DEFAULT_TTL / 3


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("", "give at least one key*"),
        ("42", "a key is a str, not int: 42"),
        ("('a', 'b')", "a key is a str, not tuple*"),
        ("''", "a lock key must not be empty"),
        ("'printer', timeout=-1", "timeout must be a non-negative number of seconds, got -1"),
        ("'printer', timeout='1'", "timeout must be a number of seconds, not str"),
        ("'printer', wait=1", "unexpected keyword argument 'wait'; it takes timeout="),
    ],
)
def test_bad_marker_arguments_stop_the_run_at_collection(
    pytester: pytest.Pytester, arguments: str, error: str
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.tierlock({arguments})
        def test_print():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", timeout=120)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "During handling" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"@pytest.mark.tierlock on test_bad.py::test_print: {error}"])


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.tierlock("printer")
        def test_print():
            pass
        """
    )
    strict = ["-p", "no:cacheprovider", "--strict-markers", "-W", "error"]
    pytester.runpytest_subprocess(*strict).assert_outcomes(passed=1)
    off = pytester.runpytest_subprocess(*strict, "-p", "no:tierlock")  # turned off: unknown
    off.stdout.fnmatch_lines(["*'tierlock' not found in `markers` configuration option*"])


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_run_that_does_not_use_the_plugin_loads_no_database_code(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    pytester.makeconftest(
        """
        import atexit, os, sys

        @atexit.register
        def note_modules():
            loaded = sorted(m for m in sys.modules if m.startswith(("sqlalchemy", "tierlock")))
            with open(f"modules-{os.getpid()}", "w") as file:
                file.write(" ".join(loaded))
        """
    )
    pytester.makepyfile(test_plain="def test_plain(): pass")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers).assert_outcomes(passed=1)
    noted = [path.read_text().split() for path in pytester.path.glob("modules-*")]
    assert len(noted) == (1 if not workers else 3)
    for modules in noted:
        assert modules == [
            "tierlock",
            "tierlock.errors",  # (what urls' errors are: no database code)
            "tierlock.pytest_plugin",
            "tierlock.pytest_plugin.run",
            "tierlock.urls",
        ]


def test_the_header_names_the_database_only_when_a_test_uses_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="def test_plain(): pass",
        test_marked="""
        import pytest

        @pytest.mark.tierlock("printer")
        def test_print():
            pass
        """,
    )
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_plain.py")
    plain.assert_outcomes(passed=1)
    assert "tierlock:" not in plain.stdout.str()
    marked = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    marked.assert_outcomes(passed=2)
    marked.stdout.fnmatch_lines(["tierlock: sqlite:///*/tierlock.sqlite3 (table tierlock_locks)"])


def test_the_header_hides_the_password(pytester: pytest.Pytester) -> None:
    # An xdist controller names the database before any test runs; nothing connects.
    pytester.makepyfile(test_plain="def test_plain(): pass")
    url = "postgresql+psycopg://tester:s3cret@127.0.0.1:1/nowhere"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "1", "--tierlock-url", url
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tierlock: postgresql+psycopg://tester:***@127.0.0.1:1/nowhere *"])
    assert "s3cret" not in result.stdout.str()


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_run_reaps_the_expired_holds_of_killed_runs(
    scratch: Scratch, make_manager: MakeManager
) -> None:
    left = make_manager(ttl=0.2, renew=False)  # as a killed run leaves its row behind
    scratch.url_args = ["--tierlock-url", left.url, "-o", f"tierlock_table={left.table}"]
    assert left.lock("pytest-once:killed-run:schema").acquire()
    wait_until(lambda: not left.lock("pytest-once:killed-run:schema").locked(), "the lease")
    assert left.info("pytest-once:killed-run:schema") is not None
    scratch.write(
        test_one="""
        import pytest

        @pytest.mark.tierlock("printer")
        def test_print():
            pass
        """
    )
    scratch.run(workers=0).assert_outcomes(passed=1)
    assert left.holders() == []
