"""Scratch suites run by pytest in a subprocess, with tierlock's plugin, for its tests.

Their tests record what they saw in files of the scratch directory, with the helpers
of ``CONFTEST``, and the test that ran them reads the records.
"""

from __future__ import annotations

from typing import Any

import pytest

# The scratch suites' conftest: records in files, and waiting for other processes.
CONFTEST = """
import os, pathlib, time

ROOT = pathlib.Path(__file__).parent


def record(name, *values):
    with open(ROOT / name, "a") as file:
        file.write(" ".join(str(value) for value in values) + "\\n")


def records(name):
    path = ROOT / name
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(condition, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def pytest_runtest_logstart(nodeid, location):
    if "PYTEST_XDIST_WORKER" in os.environ:  # (an xdist controller hears of it too)
        record("started", os.getpid(), time.monotonic(), nodeid.replace(" ", "_"))
"""


class Scratch:
    """A scratch suite in ``pytester``'s directory, run on one database."""

    def __init__(self, pytester: pytest.Pytester, url_args: list[str]) -> None:
        self.pytester = pytester
        self.url_args = url_args
        pytester.makeini("[pytest]\n")
        pytester.makeconftest(CONFTEST)

    def write(self, **sources: str) -> None:
        self.pytester.makepyfile(**sources)

    def run(self, *args: str, workers: int = 4, **options: Any) -> pytest.RunResult:
        """Run the suite (``workers=0``: in one process, without xdist)."""
        xdist = ["-n", str(workers), "--dist", "load"] if workers else ["-p", "no:xdist"]
        return self.pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", *xdist, *self.url_args, *args, timeout=240, **options
        )

    def records(self, name: str) -> list[list[str]]:
        path = self.pytester.path / name
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []
