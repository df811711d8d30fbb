"""``python -m bench.plugin`` times whole pytest runs of scratch suites, briefly here.

Timings are for people to read: what is checked is that every row of both tables is
reported with numbers, that each run passed all its tests (the bench stops otherwise),
and that a run that does not pass stops it with the failing command.
"""

from __future__ import annotations

import re
from pathlib import Path

import procs
import pytest

NUMBER = r"-?\d+(?:\.\d+)?"


def cells(report: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    row = re.search(rf"^\| {re.escape(first)} \|(.*)\|$", report, re.MULTILINE)
    assert row is not None, f"no row {first!r}\n{report}"
    return [cell.strip() for cell in row[1].split("|")]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_both_sections_report_numbers(tmp_path: Path) -> None:
    output = tmp_path / "p.md"
    result = procs.run_python(
        *("-m", "bench.plugin", "--tests", "20", "--marked", "5", "--repeats", "1"),
        *("--warmup", "0", "--db", "sqlite", "--output", str(output)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert report in result.stdout
    assert "## Overhead on a suite that does not use the plugin: 20 trivial tests" in report
    for mode in ("without xdist", "-n 4"):
        plugin, without, ratio = cells(report, mode)
        assert all(re.fullmatch(NUMBER, cell) for cell in (plugin, without, ratio)), report
        assert float(plugin) > 0 and float(without) > 0
        assert float(ratio) == pytest.approx(float(plugin) / float(without), abs=0.002)
    assert "## A marked test on an uncontended key: 5 tests, each its own key" in report
    *figures, verdict = cells(report, "SQLite")
    assert len(figures) == 7 and all(re.fullmatch(NUMBER, cell) for cell in figures), report
    assert verdict in ("yes", "**no**")
    assert "| MariaDB |" not in report and "| PostgreSQL |" not in report
    # Every run was checked: 20 tests in each overhead run, 5 and 1 in the marked ones.
    assert result.stderr.count("1/1 ") == 8, result.stderr


def test_a_run_that_does_not_pass_stops_the_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(procs.ROOT))  # where bench is, as python -m finds it
    from bench.plugin import Run, RunFailed, time_run, write_suite

    suite = write_suite(tmp_path / "suite", {"test_x.py": "def test_x() -> None:\n    pass\n"})
    assert time_run(Run("one", suite, (), 1)) > 0
    with pytest.raises(RunFailed, match=r"expected 2 passed, got '1 passed in [\d.]+s'"):
        time_run(Run("two", suite, (), 2))
    with pytest.raises(RunFailed, match=r"exit status 4") as failed:
        time_run(Run("bad option", suite, ("--no-such-option",), 1))
    assert "--no-such-option" in str(failed.value)
