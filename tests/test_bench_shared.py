"""``python -m bench.shared`` drives read/write locks and semaphores, briefly here.

Timings are for people to read: what is checked is that every row is reported with
numbers, that no lock let a writer meet anyone or let more holders than permits in, while
the run without a lock was caught doing both, that the missing Redis peer is explained,
and that a run leaves no table and no process behind.
"""

from __future__ import annotations

import math
import re
import uuid
from pathlib import Path

import procs
import pytest
from conftest import SHARED_HOLDS
from sqlalchemy import create_engine, inspect
from test_bench import processes_naming, require_redis

pytestmark = SHARED_HOLDS

READ_MOSTLY = {
    "sqlite": ["tierlock read_lock/lock", "tierlock lock only"],
    "mariadb": ["tierlock read_lock/lock", "tierlock lock only"],
    "postgresql": [
        "tierlock read_lock/lock",
        "tierlock lock only",
        "pg_advisory_lock_shared/pg_advisory_lock",
    ],
}
SEMAPHORE = {
    "sqlite": ["tierlock semaphore", "Redis SET NX PX slots"],
    "mariadb": ["tierlock semaphore", "Redis SET NX PX slots"],
    "postgresql": ["tierlock semaphore", "pg_try_advisory_lock slots", "Redis SET NX PX slots"],
}


def rows(report: str, scenario: str) -> tuple[list[str], dict[str, list[str]]]:
    """The headers and the cells of each row of the scenario's first table."""
    section = report.split(f"\n## {scenario}:", 1)[1].split("\n## ", 1)[0]
    first = section.split("\n### ", 2)[1]
    lines = [line for line in first.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return cells[0][1:], {row[0]: row[1:] for row in cells[2:]}


def value(cell: str) -> float:
    """The figure of a cell, without its ratio to tierlock's."""
    return float(cell.split(maxsplit=1)[0])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_every_row_reports_and_nothing_overlaps(db: str, db_url: str, tmp_path: Path) -> None:
    require_redis()
    output = tmp_path / "shared.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    result = procs.run_python(
        *("-m", "bench.shared", "--seconds", "0.2", "--repeats", "1", "--table", table),
        *("--db", db, "--dburi", f"{db}={db_url}", "--output", str(output)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert report in result.stdout
    assert "- legend: " in report and "- machine: " in report
    assert re.search(r"No Redis row: redis-py [\d.]+ has no read/write lock", report)

    headers, found = rows(report, "read-mostly")
    assert list(found) == READ_MOSTLY[db], report
    for label, cells in found.items():
        figures = dict(zip(headers, cells, strict=True))
        assert figures["violations"] == "0", f"{label} let a writer meet someone\n{report}"
        assert value(figures["ops/s"]) > 0, f"{label} ran nothing\n{report}"
        assert 0 < value(figures["Jain"]) <= 1
        assert value(figures["statements/op"]) > 0
    caught = re.search(r"the check caught (\d+) overlaps and (\d+) lost writes", report)
    assert caught is not None and int(caught[1]) > 0, report

    headers, found = rows(report, "semaphore")
    assert list(found) == SEMAPHORE[db], report
    for label, cells in found.items():
        figures = dict(zip(headers, cells, strict=True))
        assert figures["violations"] == "0", f"{label} let too many in\n{report}"
        assert value(figures["ops/s"]) > 0, f"{label} ran nothing\n{report}"
        assert 1 <= value(figures["peak holders"]) <= 5, report
    teeth = re.search(
        r"caught (\d+) sections with more than 5 holders inside \(peak (\d+)\)", report
    )
    assert teeth is not None and int(teeth[1]) > 0 and int(teeth[2]) > 5, report

    engine = create_engine(db_url)
    try:
        assert not inspect(engine).has_table(table), "the lock table is dropped afterwards"
    finally:
        engine.dispose()
    assert processes_naming(table) == [], "no worker outlives the run"


def test_jain_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(procs.ROOT))  # where bench is, as python -m finds it
    from bench.shared.report import jain

    assert jain([5, 5, 5, 5]) == 1
    assert jain([8, 0, 0, 0]) == 0.25
    assert math.isnan(jain([]))  # nothing ran
