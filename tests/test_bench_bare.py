"""The benchmark's floor on the SQL databases: the lock a user would write on a bare
DBAPI cursor (``bench.bare``), and tierlock's ratios to it in the report.

The lock itself is checked where the benchmark's short runs could not catch it failing:
on one hot key it excludes, a row whose lease has ended is taken over, and the release
of a hold taken over fails. The report is checked for its rows (the bare cursor beside
table-only in the uncontended and spread scenarios), its two statements per uncontended
section, tierlock's ratios that agree with the tables above them, and the bare cursor's
time for one uncontended acquire + release beside tierlock's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import ModuleType

import procs
import pytest
from conftest import SQL_DATABASES
from engines import left_over
from test_bench import BARE, PER_SECTION, check_cleaned_up, rows, run_bench, value

SCENARIOS = ("uncontended", "spread-4x4")
ROWS = ["tierlock", "table-only", BARE]
SUMMARY = "\n### tierlock next to the bare cursor and the table alone\n"


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench.bare``, from this checkout as ``python -m bench`` finds it."""
    monkeypatch.syspath_prepend(str(procs.ROOT))
    import bench.bare

    return bench.bare


@pytest.fixture
def bare_table(bare: ModuleType, db_url: str) -> Iterator[str]:
    """The bare cursor's table of a run of this test's own, dropped afterwards."""
    run = f"bench_{uuid.uuid4().hex[:12]}"
    with bare.bare_tables([db_url], run):
        yield bare.bare_table(run)


@SQL_DATABASES
@pytest.mark.multiprocess
def test_the_bare_cursor_excludes_on_one_hot_key(
    bare: ModuleType, bare_table: str, db_url: str
) -> None:
    from bench.command import rows_in
    from bench.interface import Implementation
    from bench.peers import ConnectionSubject
    from bench.workload import Scenario, run_cell

    contender = partial(bare.BareCursorContender, db_url, bare_table)
    implementation = Implementation(
        "bare-cursor", BARE, None, partial(ConnectionSubject, contender)
    )
    hot = Scenario("hot", processes=2, threads=3, keys=1, round_robin=False)
    cell = run_cell(implementation, hot, 0.3)
    assert sum(cell.sections) > 0, cell
    assert cell.lost == cell.overlaps == 0, cell
    assert cell.statements >= 2 * cell.ran, "an insert and a delete at least per section"
    assert rows_in(db_url, bare_table) == 0, "every hold was released"


@SQL_DATABASES
def test_a_row_whose_lease_ended_is_taken_over(
    bare: ModuleType, bare_table: str, db_url: str
) -> None:
    holder = bare.BareCursorContender(db_url, bare_table)
    gone = bare.BareCursorContender(db_url, bare_table, ttl=-1.0)  # its lease ends at once
    other = bare.BareCursorContender(db_url, bare_table)
    try:
        holder.acquire(1)
        assert not other.try_acquire(1), "a live lease keeps the key"
        assert other.sent == 2, "the insert that missed, and the look for an ended lease"
        holder.release(1)

        gone.acquire(2)
        assert other.try_acquire(2), "the row of a lease that ended is deleted and taken"
        with pytest.raises(RuntimeError, match="key 2 was no longer held"):
            gone.release(2)
        other.release(2)
        assert holder.try_acquire(2), "the taker's release freed the key"
        holder.release(2)
    finally:
        for contender in (holder, gone, other):
            contender.close()


def test_the_bare_cursor_is_the_floor_of_two_scenarios_only(bare: ModuleType) -> None:
    """It is no lock to wait on (it polls every 2 ms), so the hot and flash-sale
    scenarios, and their reports, go without it."""
    from bench.report import floor_summary
    from bench.subjects import sql_peers
    from bench.workload import SCENARIOS as ALL_SCENARIOS

    (floor,) = (peer for peer in sql_peers("mariadb", "mysql://", "t", "r") if peer.label == BARE)
    assert [name for name in ALL_SCENARIOS if floor.runs_in(name)] == list(SCENARIOS)
    assert floor_summary([], ["mariadb"]) == [], "no summary where the bare cursor did not run"


def summary(report: str, scenario: str, database: str) -> list[str]:
    """The cells of ``database``'s row in ``scenario``'s table of tierlock's ratios."""
    section = report.split(f"\n## {scenario}:", 1)[1].split("\n## ", 1)[0]
    table = section.split(SUMMARY, 1)[1]
    line = next(line for line in table.splitlines() if line.startswith(f"| {database} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.sql_only("the bare cursor is the floor of the SQL databases")
def test_the_bare_cursor_is_the_floor_of_spread_and_uncontended(
    db: str, db_url: str, tmp_path: Path
) -> None:
    output = tmp_path / "results.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        *(f"--scenario={scenario}" for scenario in (*SCENARIOS, "acquire-release")),
        *("--impl", "tierlock", "--impl", "table-only", "--impl", "bare-cursor"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert "bare cursor (uncontended and spread-4x4 only): INSERT IGNORE" in report

    for scenario in SCENARIOS:
        found = rows(report, scenario)
        assert list(found) == ROWS, report
        for label, cells in found.items():
            assert cells[-1] == "0", f"{scenario}: {label} violated exclusion\n{report}"
            assert value(cells[0]) > 0, f"{scenario}: {label} ran no section\n{report}"
        sent = value(found[BARE][PER_SECTION])
        if scenario == "uncontended":
            assert sent == 2, f"an insert and a delete per section\n{report}"
        else:
            assert sent >= 2, report
        title = {"sqlite": "SQLite", "mariadb": "MariaDB", "postgresql": "PostgreSQL"}[db]
        rate, to_bare, to_table, *statements = summary(report, scenario, title)
        tierlock = value(found["tierlock"][0])
        assert value(rate) == tierlock, report
        for ratio, label in ((to_bare, BARE), (to_table, "table-only")):
            # The tables show rates rounded to whole sections; the ratio is of the medians.
            expected = tierlock / value(found[label][0])
            assert float(ratio.removesuffix("x")) == pytest.approx(expected, rel=0.02, abs=0.01)
        in_order = ("tierlock", BARE, "table-only")
        assert statements == [found[label][PER_SECTION].split()[0] for label in in_order], report
    # The uncontended acquire + release timed on the bare cursor too, beside tierlock's.
    line = next(line for line in report.splitlines() if line.startswith(f"| {db} |"))
    timed = [float(cell) for cell in line.strip("|").split("|")[1:]]
    assert len(timed) == 8 and min(timed) > 0, report
    ours, bare, over_bare = timed[0], timed[5], timed[7]
    assert over_bare == pytest.approx(ours / bare, rel=0.02, abs=0.01), report
    assert not left_over(db_url, f"{table}_bare"), "the bare cursor's table is dropped"
    check_cleaned_up(db_url, table)
