"""The pytest plugin's ``tierlock_once``, in real pytest runs under pytest-xdist: one
process runs the function and every process gets its result or its error; runs never
answer one another (unless they share an id); a killed runner's function runs again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import PLUGIN_DATABASES
from scratch import Scratch
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Each test asks for the run-once value and records which process saw what.
SUITE = """
import json, os, uuid, pytest
from conftest import record

@pytest.fixture(scope="session")
def value(tierlock_once):
    def make():
        record("ran", os.getpid())
        return {"made_by": os.getpid(), "nonce": uuid.uuid4().hex, "pair": (1, 2)}
    return tierlock_once("value", make)

@pytest.mark.parametrize("n", range(8))
def test_value(n, value):
    record("saw", os.getpid(), json.dumps(value, separators=(",", ":")))
"""


def test_the_function_runs_once_and_every_worker_gets_its_result(scratch: Scratch) -> None:
    scratch.write(test_once=SUITE)
    scratch.run().assert_outcomes(passed=8)
    assert len(scratch.records("ran")) == 1
    seen = scratch.records("saw")
    assert len({pid for pid, _ in seen}) > 1, "one process ran every test"
    (value,) = {value for _, value in seen}
    assert json.loads(value)["pair"] == [1, 2]  # as JSON gives it, in the maker's process too


@PLUGIN_DATABASES
def test_a_raising_function_runs_once_and_every_worker_gets_its_error(scratch: Scratch) -> None:
    scratch.write(
        test_raises="""
        import os, pytest
        from conftest import record
        from tierlock.pytest_plugin import OnceFailed

        def make():
            record("ran", os.getpid())
            raise ValueError("the schema is broken")

        @pytest.mark.parametrize("n", range(8))
        def test_value(n, tierlock_once):
            with pytest.raises(Exception) as raised:
                tierlock_once("value", make)
            record("error", type(raised.value).__name__)
            if isinstance(raised.value, OnceFailed):
                assert "ValueError: the schema is broken" in str(raised.value)
                assert "is not run again in this run" in str(raised.value)
        """
    )
    scratch.run().assert_outcomes(passed=8)
    assert len(scratch.records("ran")) == 1
    errors = sorted(name for (name,) in scratch.records("error"))
    assert errors == ["OnceFailed"] * 7 + ["ValueError"]


def test_keys_are_compared_exactly(scratch: Scratch) -> None:
    scratch.write(
        test_keys="""
        def test_keys(tierlock_once):
            keys = ["schema", "schema ", "Schema", "sch\u00e9ma", "sche\u0301ma", "\U0001f512"]
            assert [tierlock_once(key, lambda key=key: key) for key in keys] == keys
        """
    )
    scratch.run(workers=0).assert_outcomes(passed=1)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_run_s_manager_is_closed_at_the_end(scratch: Scratch) -> None:
    scratch.write(
        test_manager="""
        import conftest

        def test_lock(tierlock_manager):
            conftest.manager = tierlock_manager
            with tierlock_manager.lock("printer"):
                pass
        """
    )
    scratch.pytester.makeconftest(
        scratch.pytester.path.joinpath("conftest.py").read_text()
        + """
import pytest, tierlock

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    try:
        manager.lock("printer")
    except tierlock.LockError as exc:
        record("closed", type(exc).__name__)
"""
    )
    scratch.run(workers=0).assert_outcomes(passed=1)
    assert scratch.records("closed") == [["LockError"]]


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_result_json_cannot_hold_is_an_error_where_it_was_made(scratch: Scratch) -> None:
    scratch.write(
        test_object="""
        import pytest

        def test_value(tierlock_once):
            with pytest.raises(TypeError, match="returned a set, which cannot be stored as JSON"):
                tierlock_once("value", lambda: {1, 2})
        """
    )
    scratch.run(workers=0).assert_outcomes(passed=1)


@PLUGIN_DATABASES
def test_a_run_does_not_see_the_results_of_an_earlier_one(
    scratch: Scratch, db_url: str, table: str, engine: Engine
) -> None:
    scratch.url_args = ["-o", f"tierlock_url={db_url}", "-o", f"tierlock_table={table}"]
    scratch.write(test_once=SUITE)
    for _ in range(2):
        scratch.run(workers=2).assert_outcomes(passed=8)
    assert len(scratch.records("ran")) == 2
    assert len({value for _, value in scratch.records("saw")}) == 2
    with engine.connect() as connection:  # and each run deleted its own
        assert connection.execute(text(f"SELECT COUNT(*) FROM {table}_once")).scalar() == 0


def test_runs_given_one_id_share_results(
    scratch: Scratch, db_url: str, table: str, engine: Engine
) -> None:
    scratch.url_args = ["--tierlock-url", db_url, "-o", f"tierlock_table={table}"]
    scratch.write(test_once=SUITE)
    for _ in range(2):
        scratch.run("--tierlock-run=nightly-7", workers=2).assert_outcomes(passed=8)
    assert len(scratch.records("ran")) == 1
    assert len({value for _, value in scratch.records("saw")}) == 1
    scratch.run("--tierlock-run=Nightly-7", workers=2).assert_outcomes(passed=8)
    assert len(scratch.records("ran")) == 2  # IDs are compared exactly, case and all
    with engine.connect() as connection:  # kept for the runs' other machines
        assert connection.execute(text(f"SELECT COUNT(*) FROM {table}_once")).scalar() == 2


@PLUGIN_DATABASES
def test_concurrent_runs_do_not_share_results(
    scratch: Scratch, db_url: str, table: str, engine: Engine
) -> None:
    # Each run's function waits until the other run's is running too: had the runs
    # shared the key, the second would wait for the first's result instead.
    scratch.write(
        test_once=SUITE.replace(
            'record("ran", os.getpid())',
            'record("ran", os.getpid()); wait_until(lambda: len(records("ran")) == 2, "other run")',
        ).replace("from conftest import record", "from conftest import record, records, wait_until")
    )
    args = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "load",
        "--tierlock-url", db_url, "-o", f"tierlock_table={table}",
    ]  # fmt: skip
    runs = [
        subprocess.Popen(
            [*args, f"--basetemp={scratch.pytester.path / f'base{n}'}"],
            cwd=scratch.pytester.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(2)
    ]
    outputs = [run.communicate(timeout=240)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    ran = scratch.records("ran")
    assert len(ran) == 2
    assert len({value for _, value in scratch.records("saw")}) == 2
    with engine.connect() as connection:
        assert connection.execute(text(f"SELECT COUNT(*) FROM {table}_once")).scalar() == 0
    assert inspect(engine).has_table(f"{table}_once")


@PLUGIN_DATABASES
def test_a_function_whose_runner_was_killed_runs_again_in_a_survivor(scratch: Scratch) -> None:
    scratch.write(
        test_killed="""
        import os, signal, pytest
        from conftest import record, records, wait_until

        def make():
            record("ran", os.getpid())
            if len(records("ran")) == 1:  # the first runner dies, its result unstored
                wait_until(lambda: len({r[0] for r in records("started")}) == 2, "a peer")
                os.kill(os.getpid(), signal.SIGKILL)
            return os.getpid()

        @pytest.mark.parametrize("n", range(4))
        def test_value(n, tierlock_once):
            record("saw", os.getpid(), tierlock_once("value", make))
        """
    )
    result = scratch.run(workers=2)
    result.assert_outcomes(passed=3, failed=1)
    first, second = scratch.records("ran")
    assert {value for _, value in scratch.records("saw")} == {second[0]}
    assert first[0] != second[0]


def test_a_run_id_too_long_for_the_table_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tierlock-run={'x' * 65}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tierlock-run takes an ID of 1 to 64 characters*"])
