"""``python -m bench.plugin``: what tierlock's pytest plugin costs a test suite.

Each figure is the wall time of whole ``python -m pytest`` runs of a generated scratch
suite with a ``pytest.ini`` of its own (so that this project's options do not apply):

- overhead: trivial tests that do not use the plugin, with it loaded and with
  ``-p no:tierlock``, without pytest-xdist and with ``-n 4``. pytest loads the plugin in
  every run of every project that installs tierlock, so it must cost those nothing.
- marked: tests that each hold a key of their own (uncontended) against the same tests
  unmarked, on each database; and one marked test against one unmarked, which isolates
  the one-time start-up (the manager, its connections, its table). The project's target:
  a marked test on an uncontended key costs under 5 ms more than the same test unmarked.

The runs of a section are interleaved, each round in the reverse order of the last, so
that drift hits every side alike; the report gives medians. A run that does not pass
exactly its tests stops the bench.

::

    python -m bench.plugin                       # into bench/results/plugin.md
    python -m bench.plugin --db sqlite --tests 500 --marked 100 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import tierlock

from .command import (
    DATABASES,
    Started,
    add_db_option,
    drop,
    positive_int,
    publish,
    unreachable,
)
from .report import DATABASE_TITLES

OUTPUT = Path(__file__).resolve().parent / "results" / "plugin.md"
PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q")
OFF = ("-p", "no:tierlock")
MODES = {"without xdist": (), "-n 4": ("-n", "4")}
FILES = 20  # of the overhead suite
PER_FILE = 100  # tests per file of the marked suites
TARGET_MS = 5.0
RUN_LIMIT = 900.0  # seconds: a run only a hang reaches
# The summary line of ``pytest -q``: "2000 passed in 1.81s", maybe between "=" signs.
SUMMARY = re.compile(r"^=*\s*(?P<counts>.+?) in [\d.]+s\b")


class RunFailed(Exception):
    """A run of a scratch suite did not pass exactly its tests."""


@dataclass(frozen=True)
class Run:
    """One kind of pytest run, timed again in every round."""

    label: str
    suite: Path
    args: tuple[str, ...]
    tests: int  # that must pass


def write_suite(directory: Path, files: dict[str, str]) -> Path:
    """A scratch suite: ``files`` beside an empty ``[pytest]`` section, which makes it
    the rootdir's ini file, so that no pyproject.toml above adds options."""
    directory.mkdir(parents=True)
    (directory / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def plain_suite(directory: Path, tests: int) -> Path:
    """``tests`` trivial tests over up to ``FILES`` files, in each half plain functions
    and half one parametrized function: both of what collection makes items from."""
    count = min(FILES, tests)
    files = {}
    for index in range(count):
        size = tests // count + (index < tests % count)
        plain = size // 2
        body = ["import pytest", ""]
        body += [f"def test_plain_{n}() -> None:\n    assert True\n" for n in range(plain)]
        if size > plain:
            body.append(
                f"@pytest.mark.parametrize('n', range({size - plain}))\n"
                "def test_param(n: int) -> None:\n    assert n >= 0\n"
            )
        files[f"test_plain_{index:02d}.py"] = "\n".join(body)
    return write_suite(directory, files)


def marked_suite(directory: Path, tests: int, marked: bool) -> Path:
    """``tests`` empty tests, each holding a key of its own if ``marked``: the same
    module either way but for the marker, so the difference is the marker's cost."""
    files = {}
    for first in range(0, tests, PER_FILE):
        body = ["import pytest", ""]
        for n in range(first, min(tests, first + PER_FILE)):
            mark = f"@pytest.mark.tierlock('k{n}')\n" if marked else ""
            body.append(f"{mark}def test_{n}() -> None:\n    pass\n")
        files[f"test_marked_{first // PER_FILE:03d}.py"] = "\n".join(body)
    return write_suite(directory, files)


def time_run(run: Run) -> float:
    """Seconds that ``python -m pytest`` took on ``run``'s suite, start to exit. Its own
    basetemp spares the user's old ones, which pytest deletes; no ``PYTEST_*`` variables
    (as a pytest run of this bench hands down) reach it."""
    basetemp = run.suite.parent / f"{run.suite.name}-tmp"
    command = [*PYTEST, f"--basetemp={basetemp}", *run.args]
    environment = {name: v for name, v in os.environ.items() if not name.startswith("PYTEST_")}
    began = time.perf_counter()
    result = subprocess.run(
        command,
        cwd=run.suite,
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
        check=False,
    )
    wall = time.perf_counter() - began
    lines = result.stdout.strip().splitlines()
    summary = SUMMARY.match(lines[-1]) if lines else None
    found = [] if summary is None else re.findall(r"(\d+) (\w+)", summary["counts"])
    counts = {word: int(number) for number, word in found}
    if result.returncode != 0 or counts != {"passed": run.tests}:
        raise RunFailed(
            f"{run.label}: expected {run.tests} passed, got "
            f"{lines[-1] if lines else 'no output'!r} (exit status {result.returncode})\n"
            f"$ cd {run.suite} && {shlex.join(command)}\n"
            + "\n".join([*lines[-30:], *result.stderr.strip().splitlines()[-30:]])
        )
    return wall


def medians(runs: Sequence[Run], repeats: int, warmup: int) -> list[float]:
    """The median seconds of each of ``runs``, over ``repeats`` interleaved rounds after
    ``warmup`` untimed ones (which fill the disk cache and create server tables)."""
    walls: list[list[float]] = [[] for _ in runs]
    for round_ in range(warmup + repeats):
        order = list(enumerate(runs))
        for index, run in order if round_ % 2 == 0 else reversed(order):
            wall = time_run(run)
            state = "warm-up" if round_ < warmup else f"{round_ - warmup + 1}/{repeats}"
            print(f"{state} {run.label}: {wall:.2f} s", file=sys.stderr)
            if round_ >= warmup:
                walls[index].append(wall)
    return [statistics.median(times) for times in walls]


def overhead_section(scratch: Path, tests: int, repeats: int, warmup: int) -> list[str]:
    """Plugin loaded against ``-p no:tierlock`` on a suite that does not use it."""
    suite = plain_suite(scratch / "plain", tests)
    sides = {"plugin": (), "-p no:tierlock": OFF}
    runs = [
        Run(f"overhead, {mode}, {side}", suite, (*mode_args, *side_args), tests)
        for mode, mode_args in MODES.items()
        for side, side_args in sides.items()
    ]
    found = iter(medians(runs, repeats, warmup))
    lines = [
        f"## Overhead on a suite that does not use the plugin: {tests} trivial tests",
        "",
        f"Tests in {min(FILES, tests)} files, half plain functions, half parametrized; whole "
        "`python -m pytest` runs, median seconds; ratio: plugin / -p no:tierlock.",
        "",
        "| mode | plugin s | -p no:tierlock s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for mode in MODES:
        on, off = next(found), next(found)
        lines.append(f"| {mode} | {on:.3f} | {off:.3f} | {on / off:.3f} |")
    return [*lines, ""]


Suite = tuple[str, Path, int]  # what its runs are called, where it is, how many tests
FORMATS = (".3f", ".3f", ".2f", ".3f", ".3f", ".0f", ".2f")  # of a marked row's figures


def marked_row(suites: list[Suite], database: str, args: tuple[str, ...], *rounds: int) -> str:
    """One database's row: marked tests against unmarked, many and one."""
    runs = [Run(f"{database}, {name}", suite, args, tests) for name, suite, tests in suites]
    marked, plain, one_marked, one_plain = medians(runs, *rounds)
    many = suites[0][2]
    per_test = (marked - plain) / many * 1000
    start_up = (one_marked - one_plain) * 1000
    after = (marked - plain - start_up / 1000) / (many - 1) * 1000 if many > 1 else float("nan")
    figures = (plain, marked, per_test, one_plain, one_marked, start_up, after)
    shown = [format(figure, spec) for figure, spec in zip(figures, FORMATS, strict=True)]
    shown.append("yes" if per_test < TARGET_MS else "**no**")
    return f"| {DATABASE_TITLES[database]} | " + " | ".join(shown) + " |"


def marked_section(
    scratch: Path, urls: dict[str, str | None], table: str, tests: int, *rounds: int
) -> list[str]:
    """Marked tests on uncontended keys against the same tests unmarked, per database."""
    suites: list[Suite] = []
    for count in (tests, 1):
        for kind in ("marked", "unmarked"):
            suite = marked_suite(scratch / f"{count}-{kind}", count, marked=kind == "marked")
            suites.append((f"{count} {kind}", suite, count))
    lines = [
        f"## A marked test on an uncontended key: {tests} tests, each its own key",
        "",
        f"Without xdist; median seconds of whole runs of {tests} tests marked "
        f"`@pytest.mark.tierlock('k<i>')` and unmarked, and of 1 test each way. Extra per "
        f"test: (marked - unmarked) / {tests}, start-up included; first marked test "
        "(start-up): 1 marked - 1 unmarked, the manager, its connections and its table; "
        f"per test after start-up: (marked - unmarked - start-up) / {max(1, tests - 1)}. "
        "SQLite: the default URL, a fresh file in each run's basetemp; the servers: "
        f"`--tierlock-url URL -o tierlock_table={table}`. Target: extra per test under "
        f"{TARGET_MS:g} ms.",
        "",
        f"| database | {tests} unmarked s | {tests} marked s | extra per test ms | "
        "1 unmarked s | 1 marked s | first marked test (start-up) ms | "
        f"per test after start-up ms | under {TARGET_MS:g} ms |",
        "|---|" + "---:|" * 7 + "---|",
    ]
    for database, url in urls.items():
        args = () if url is None else ("--tierlock-url", url, "-o", f"tierlock_table={table}")
        lines.append(marked_row(suites, database, args, *rounds))
    return [*lines, ""]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plugin",
        description="What tierlock's pytest plugin costs: loaded in a suite that does not "
        "use it, and per marked test on an uncontended key.",
    )
    add_db_option(parser)
    parser.add_argument("--tests", type=positive_int, default=2000, help="overhead suite (2000)")
    parser.add_argument("--marked", type=positive_int, default=300, help="marked suite (300)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed rounds (3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (1)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"report file ({OUTPUT})")
    parser.add_argument(
        "--table",
        default=f"tl_bench_{uuid.uuid4().hex[:12]}",
        help="lock table on the servers, dropped afterwards (default: a random name)",
    )
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    return args


def header(args: argparse.Namespace, skipped: list[str], started: Started) -> list[str]:
    """What was measured where: the load, which the timings follow closely, at both ends."""
    details = [
        f"- software: tierlock {tierlock.__version__}, pytest {version('pytest')}, "
        f"pytest-xdist {version('pytest-xdist')}, Python {platform.python_version()}",
        f"- settings: median of {args.repeats} interleaved round(s) after {args.warmup} "
        "untimed; each run `python -m pytest -p no:cacheprovider -q --basetemp=<own dir>` "
        "in the scratch suite's directory, timed from start to exit",
    ]
    return started.header("tierlock pytest plugin benchmark", details, skipped, load_at_end=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = Started()
    chosen = {name: url for name, url in DATABASES.items() if not args.db or name in args.db}
    reasons = {name: unreachable(url) for name, url in chosen.items() if url is not None}
    urls = {name: url for name, url in chosen.items() if reasons.get(name) is None}
    skipped = [f"{name}: {reason}" for name, reason in reasons.items() if reason is not None]
    for note in skipped:
        print(f"skipped {note}", file=sys.stderr)
    rounds = (args.repeats, args.warmup)
    try:
        with tempfile.TemporaryDirectory(prefix="tierlock-bench-plugin-") as scratch:
            lines = overhead_section(Path(scratch), args.tests, *rounds)
            if urls:
                lines += marked_section(Path(scratch), urls, args.table, args.marked, *rounds)
    except (RunFailed, subprocess.TimeoutExpired) as exc:
        print(f"python -m bench.plugin: a run failed:\n{exc}", file=sys.stderr)
        return 1
    finally:
        for url in filter(None, urls.values()):
            drop(url, args.table)
            drop(url, f"{args.table}_once")
    publish(header(args, skipped, started) + lines, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
