"""``python -m bench`` drives every implementation through each kind of scenario, on
every engine.

Timings are for people to read, not for tests: what is checked is that every row is
reported, that no lock let two sections of a key overlap while the floor, which locks
nothing, was caught doing so, that counts add up (the peers' commands and requests per
uncontended section, wins within tries, one heartbeat statement per 512 renewed holds
on SQL, none without renewal), that the asyncio scenarios' tasks share a few threads
where the sync manager needs one per worker, that each scenario's chart is a readable
PNG linked under its heading, and that a run leaves no table, key, node or file and no
process behind.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import procs
import pytest
import redis
from aiohelpers import FEW_THREADS
from engines import SQL, left_over, require_server

from tierlock.backends.files.names import parse_url
from tierlock.urls import engine_of

REDIS_URL = "redis://127.0.0.1:6379/0"
SCENARIOS = ("uncontended", "hot-4x4")  # one thread; processes contending
ASYNC_SCENARIOS = ("async-hot", "async-spread")
ASYNC_ROWS = ["tierlock.aio", "tierlock, threads"]
REDIS_AIO = "redis.asyncio Lock"
# The locks of each engine, in the report's order; the floor comes after them.
LOCKS = {
    "sqlite": ["tierlock", "table-only"],
    "mariadb": ["tierlock", "table-only", "GET_LOCK"],
    "postgresql": ["tierlock", "table-only", "pg_advisory_lock"],
    "redis": ["tierlock", "redis-py Lock", "python-redis-lock"],
    "zookeeper": ["tierlock", "kazoo Lock"],
    "file": ["tierlock", "filelock FileLock"],
}
# The lock a user would write on a bare cursor, after table-only in the SQL databases'
# scenarios with keys to spare, which it is the floor of.
BARE = "bare cursor"
BARE_SCENARIOS = ("uncontended", "spread-4x4")
FLOORS = {
    "mariadb": "floor: 2x SELECT 1",
    "postgresql": "floor: 2x SELECT 1",
    "redis": "floor: 2x PING",
    "zookeeper": "floor: 2x exists",
    "file": "floor: 2x stat",
}
# What an uncontended section costs each peer, counted at its client: redis-py's SET NX
# and release script; python-redis-lock's GET (held already?), SET NX and release
# script; the floors' two round trips (file-system calls).
UNCONTENDED = {
    BARE: 2,
    "redis-py Lock": 2,
    "python-redis-lock": 3,
    "floor: 2x SELECT 1": 2,
    "floor: 2x PING": 2,
    "floor: 2x exists": 2,
    "floor: 2x stat": 2,
}
# Columns of the tables, after the implementation's.
PER_SECTION = 6
PER_TRY = 7


def engine_params(*names: str) -> list[Any]:
    """``db`` parameters for a test that names its engines, marked as conftest marks them."""
    return [
        pytest.param(name, marks=() if name == "sqlite" else getattr(pytest.mark, name))
        for name in names
    ]


def require_redis() -> None:
    """Skip without the Redis server, or fail when ``CI=true``, as ``require_server`` does
    (for benchmarks whose peers need it beside the database under test)."""
    require_server(REDIS_URL)


def run_bench(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m bench`` from this checkout, briefly. The bound turns a hang into a
    failure: a short run of a dozen cells, each starting its processes, takes 15 s on an
    idle machine and went past 120 s under the whole suite at a load average of 7."""
    return procs.run_python(
        *("-m", "bench", "--seconds", "0.1", "--repeats", "1", "--iterations", "20", *args),
        cwd=cwd,
        timeout=timeout,
    )


def rows(report: str, scenario: str) -> dict[str, list[str]]:
    """The cells of each row of the scenario's first table, by implementation."""
    section = report.split(f"\n## {scenario}:", 1)[1].split("\n## ", 1)[0]
    first = section.split("\n### ", 2)[1]  # the first database's part
    lines = [line for line in first.splitlines() if line.startswith("|")][2:]  # below headers
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in cells}


def value(cell: str) -> float:
    """The figure of a cell, without its ratio to tierlock's."""
    return float(cell.split(maxsplit=1)[0])


PNG = b"\x89PNG\r\n\x1a\n"


def check_charts(report: str, directory: Path, scenarios: Sequence[str]) -> None:
    """Each scenario's chart is a PNG beside the report, linked right under its heading;
    the scenarios without one (renewal, acquire-release) have none."""
    import matplotlib.image  # only here: slow to import, and only these tests need it

    assert sorted(path.name for path in directory.glob("*.png")) == sorted(
        f"{scenario}.png" for scenario in scenarios
    )
    for scenario in scenarios:
        link = re.search(rf"\n## {scenario}: [^\n]*\n\n!\[[^\]\n]+\]\(([^)\n]+)\)\n", report)
        assert link is not None, f"no chart under the {scenario} heading\n{report}"
        assert link[1] == f"{scenario}.png", "linked relative to the report"
        chart = directory / link[1]
        assert chart.read_bytes().startswith(PNG)
        assert chart.stat().st_size > 10_000, "more than an empty canvas"
        height, width, channels = matplotlib.image.imread(chart).shape
        assert height > 300 and width > 300 and channels in (3, 4)


def processes_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            pass  # ended meanwhile
    return found


def check_cleaned_up(url: str, table: str) -> None:
    """Nothing of the run is left on the engine: no lock table, no key of tierlock's or
    its peers' (python-redis-lock's ``lock:`` and ``lock-signal:`` keys included), no
    node, nothing in the lock directory; and no worker process."""
    assert not left_over(url, table), "the lock table (namespace) is removed afterwards"
    kind = engine_of(url)
    if kind == "redis":
        with redis.Redis.from_url(url) as client:
            assert list(client.scan_iter(match=f"*{table}*", count=1000)) == []
    elif kind == "zookeeper":
        assert not left_over(url, f"{table}_peers"), "the peers' nodes are removed afterwards"
    elif kind == "file":
        assert list(Path(parse_url(url)).iterdir()) == [], "the peers' files too"
    assert processes_naming(table) == [], "no worker outlives the run"


def locks_in(db: str, scenario: str) -> list[str]:
    """The locks of ``db`` in ``scenario``'s rows, in the report's order."""
    if db in SQL and scenario in BARE_SCENARIOS:
        return [*LOCKS[db][:2], BARE, *LOCKS[db][2:]]
    return LOCKS[db]


def check_locks(report: str, scenario: str, db: str) -> dict[str, list[str]]:
    """The rows of one blocking scenario: every lock of ``db`` and its floor, in order;
    no lock let sections overlap and each ran some. Returns the rows by label."""
    found = rows(report, scenario)
    floors = [FLOORS[db]] if db in FLOORS else []
    locks = locks_in(db, scenario)
    assert list(found) == [*locks, *floors], report
    for label in locks:
        assert found[label][-1] == "0", f"{scenario}: {label} violated exclusion\n{report}"
        # Table-only's threads on one hot key back off up to 0.1 s between tries
        # (150-900 sections/s in full runs): a 0.1 s cell on a loaded machine may
        # end before any wins. Every other lock runs sections in every cell.
        if not (label == "table-only" and scenario.startswith("hot-")):
            sections = float(found[label][0].split()[0])
            assert sections > 0, f"{scenario}: {label} ran no section\n{report}"
    for label in floors:
        assert found[label][-1] == "n/a"
    return found


def check_uncontended_counts(report: str) -> None:
    """Each peer sends what its code says per uncontended section, counted at its client;
    tierlock at least its take and its release."""
    for label, cells in rows(report, "uncontended").items():
        sent = value(cells[PER_SECTION])
        if label in UNCONTENDED:
            assert sent == UNCONTENDED[label], f"{label}: {sent} per section\n{report}"
        elif label == "kazoo Lock":
            # Create, list the children, delete; and first either ask whether the key's
            # node exists (a new Lock object; two requests more if it makes the node)
            # or look for a node of its own that an earlier acquire may have left.
            assert 4 <= sent <= 6, f"{label}: {sent} per section\n{report}"
        else:
            assert sent >= 2, f"{label}: {sent} per section\n{report}"


def floor_caught(report: str, scenario: str) -> int:
    """Lost updates and overlaps the check caught in the floor's sections."""
    section = report.split(f"\n## {scenario}:", 1)[1].split("\n## ", 1)[0]
    caught = re.search(r"caught (\d+) lost updates and (\d+) overlaps", section)
    assert caught is not None, report
    return int(caught[1]) + int(caught[2])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.sql_only("Redis, ZooKeeper and files run every scenario in one test, to save time")
def test_every_lock_excludes_and_the_run_cleans_up(db: str, db_url: str, tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        *(f"--scenario={scenario}" for scenario in (*SCENARIOS, "acquire-release")),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert report in result.stdout
    assert "- legend: " in report and "- machine: " in report

    for scenario in SCENARIOS:
        check_locks(report, scenario, db)
    check_uncontended_counts(report)
    if db in FLOORS:
        # Sixteen threads on one key with no lock: the check must catch them.
        assert floor_caught(report, "hot-4x4") > 0, report
    assert re.search(rf"\| {db} \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", report)
    check_charts(report, tmp_path, SCENARIOS)
    check_cleaned_up(db_url, table)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("db", engine_params("redis", "zookeeper", "file"), indirect=True)
def test_redis_zookeeper_and_file_locks_exclude_and_the_run_cleans_up(
    db: str, db_url: str, tmp_path: Path
) -> None:
    """tierlock and the engine's peers through the blocking scenarios, the flash sale
    and renewal, in one short run."""
    output = tmp_path / "results.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    scenarios = (*SCENARIOS, "hot-1x8", "flash-sale")
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        *(f"--scenario={scenario}" for scenario in (*scenarios, "renewal", "acquire-release")),
        *("--renewal-holds", "20", "--renewal-ttl", "2.0"),  # (room for a loaded machine)
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert report in result.stdout
    assert "\n## acquire-release" not in report, "the bare driver's statements are SQL's"

    check_locks(report, "hot-4x4", db)
    alone = check_locks(report, "uncontended", db)
    one_process = check_locks(report, "hot-1x8", db)
    check_uncontended_counts(report)
    # Holds pass between the threads of a process with no request (file-system call):
    # with no other process after the key, a hot section costs a fraction of one
    # through the store. (Not hot-4x4 against the peers: there cohorts end after 5 ms
    # for the other processes, so on a loaded machine fewer sections share their
    # requests, while a polling peer's requests go with time too; in a 0.1 s cell at
    # a load average of 6, tierlock's 17.6 per section on a lock directory met
    # filelock's 17.5, and on ZooKeeper 2.4-2.7 passed its own 2.0 through the store.)
    through_store = value(alone["tierlock"][PER_SECTION])
    assert value(one_process["tierlock"][PER_SECTION]) < through_store / 2, report

    sales = rows(report, "flash-sale")
    assert list(sales) == [*LOCKS[db], FLOORS[db]], report
    for label, cells in sales.items():
        wins, tries, per_try = value(cells[0]), value(cells[1]), value(cells[PER_TRY])
        assert 0 <= wins <= tries and tries > 0, f"{label}: {wins} wins of {tries}\n{report}"
        if label in LOCKS[db]:
            assert cells[-1] == "0", f"{label} violated exclusion\n{report}"
        if label != "tierlock":
            # A try costs every peer a round trip (a file-system call) at least; most
            # of tierlock's lost tries fail in tier 1.
            assert value(sales["tierlock"][PER_TRY]) < per_try, report
    assert value(sales["tierlock"][0]) > 0, report
    # Sixteen and thirty-two threads on one key with no lock: the check must catch them.
    assert floor_caught(report, "hot-4x4") + floor_caught(report, "flash-sale") > 0, report

    renewal = rows(report, "renewal")
    renewed, fixed = renewal["tierlock, renew=True"], renewal["tierlock, renew=False"]
    # window s, statements/s, per 1000 holds, statements/beat, heartbeats/s, renewals/s
    assert value(renewed[5]) > 0, report
    assert [value(cell) for cell in (*fixed[1:3], *fixed[4:6])] == [0, 0, 0, 0], report
    assert renewed[-1] == fixed[-1] == "0", "every hold is released"
    check_charts(report, tmp_path, scenarios)
    check_cleaned_up(db_url, table)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.sql_only("Redis, ZooKeeper and files run every scenario in one test, to save time")
def test_flash_sale_and_renewal_report_sane_numbers(db: str, db_url: str, tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    holds = 520  # two heartbeat statements per beat: 512 holds at most in one
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        *("--scenario", "flash-sale", "--scenario", "renewal", "--seconds", "0.5"),
        *("--renewal-holds", str(holds), "--renewal-ttl", "2.0"),
        *(f"--impl={name}" for name in ("tierlock", "table-only", "get-lock", "advisory")),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")

    sales = rows(report, "flash-sale")
    assert list(sales) == LOCKS[db], report
    for label, cells in sales.items():
        wins, tries, per_try = value(cells[0]), value(cells[1]), value(cells[PER_TRY])
        assert 0 <= wins <= tries and tries > 0, f"{label}: {wins} wins of {tries}\n{report}"
        # On SQLite, 32 connections of table-only share one writer: in half a second
        # they may win nothing. Everywhere else every lock sells.
        if db != "sqlite" or label == "tierlock":
            assert wins > 0, f"{label} won nothing\n{report}"
        assert per_try > 0, f"{label} sent no statement\n{report}"
        assert cells[-1] == "0", f"{label} violated exclusion\n{report}"
    # A lost try costs table-only at least its insert; tierlock's are mostly local.
    assert value(sales["table-only"][PER_TRY]) >= 1
    assert value(sales["tierlock"][PER_TRY]) < value(sales["table-only"][PER_TRY])

    renewal = rows(report, "renewal")
    renewed, fixed = renewal["tierlock, renew=True"], renewal["tierlock, renew=False"]
    # window s, statements/s, per 1000 holds, statements/beat, heartbeats/s, renewals/s
    assert value(renewed[1]) > 0, report
    assert value(renewed[3]) == 2, report
    assert renewed[4] == renewed[1], "the driver saw only the heartbeat's statements"
    assert value(renewed[5]) == pytest.approx(value(renewed[4]) * holds / 2, rel=0.01)
    assert [value(cell) for cell in fixed[1:3]] == [0, 0], report
    assert renewed[-1] == fixed[-1] == "0", "every hold is released"
    check_charts(report, tmp_path, ["flash-sale"])
    check_cleaned_up(db_url, table)


@pytest.mark.multiprocess
def test_a_cell_of_tries_runs_on_until_one_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flash sale whose one try at the server is still out when the cell's seconds end,
    while its other tries are turned away at once (as tierlock's tier 1 does), runs on
    until a try wins: refusals alone measure no sale."""
    monkeypatch.syspath_prepend(str(procs.ROOT))  # where bench is, as python -m finds it
    from bench.interface import Contender, Implementation, Subject
    from bench.tally import CTX
    from bench.workload import Scenario, run_cell

    seconds = 0.05
    stock = CTX.Lock()  # shared by the forked workers

    class LateContender(Contender):
        """Loses every try until the server answers, four cells after its first."""

        def __init__(self) -> None:
            self.answers_at: float | None = None

        def acquire(self, index: int) -> None:
            stock.acquire()

        def try_acquire(self, index: int) -> bool:
            now = time.monotonic()
            if self.answers_at is None:
                self.answers_at = now + 4 * seconds
            return now >= self.answers_at and stock.acquire(False)

        def release(self, index: int) -> None:
            stock.release()

        def close(self) -> None:
            """Nothing to close."""

    class LateSubject(Subject):
        def make_contender(self) -> Contender:
            return LateContender()

        def close(self) -> None:
            """Nothing to close."""

    late = Implementation("late", "late server", None, LateSubject)
    sale = Scenario("late", 2, 2, 1, round_robin=False, blocking=False, io=200e-6, section=1e-3)
    cell = run_cell(late, sale, seconds)
    assert sum(cell.sections) > 0, cell
    assert cell.tries > sum(cell.sections) and cell.elapsed > seconds, cell
    assert cell.lost == cell.overlaps == 0, cell


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("cpu-measures")  # (see test_processes' fairness test)
@pytest.mark.parametrize("db", engine_params(*SQL, "redis", "file"), indirect=True)
def test_asyncio_scenarios_exclude_and_report_ratios(db: str, db_url: str, tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        *(f"--scenario={scenario}" for scenario in ASYNC_SCENARIOS),
        *("--seconds", "0.3"),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert report in result.stdout

    expected = [*ASYNC_ROWS, REDIS_AIO] if db == "redis" else ASYNC_ROWS
    for scenario in ASYNC_SCENARIOS:
        found = rows(report, scenario)
        assert list(found) == expected, report
        for label, cells in found.items():
            assert cells[-1] == "0", f"{scenario}: {label} violated exclusion\n{report}"
            # Every worker finishes the section under way at the stop: each row ran some,
            # and sent statements (commands, requests) for them.
            sent = value(cells[PER_SECTION])
            assert sent > 0, f"{scenario}: {label} sent nothing\n{report}"
        if scenario == "async-hot":
            for label in ASYNC_ROWS:
                assert value(found[label][0]) > 0, f"{label} ran no section\n{report}"
        section = report.split(f"\n## {scenario}:", 1)[1].split("\n## ", 1)[0]
        summary = section.split("\n### tierlock.aio next to the others\n", 1)[1]
        line = [line for line in summary.splitlines() if line.startswith("|")][2]
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        # The engine, tierlock.aio's sections/s and its ratios to the other rows', then
        # the threads of each row's process as the run stopped.
        others = len(expected) - 1
        assert len(cells) == 2 + 2 * others + 1, report
        aio_threads, sync_threads, *redis_threads = (int(cell) for cell in cells[2 + others :])
        workers = 100 if scenario == "async-hot" else 32
        assert sync_threads > workers, f"a thread per worker, and the manager's\n{report}"
        # The tasks share the loop's thread, and the manager a few of its own (statements,
        # doorbells, heartbeat), whatever the number of tasks.
        assert aio_threads <= FEW_THREADS + 2, report  # (+ the main and the loop's threads)
        assert all(count < 24 for count in redis_threads), report
        if scenario == "async-hot":
            assert all(value(cell) > 0 for cell in cells[1 : 2 + others]), report
    # Holds pass between tasks (threads) of one manager with no statement: a section on
    # the hot key costs under half of the two statements of a section through the store
    # alone. (Not against the spread row: there, sections share statements.)
    hot = rows(report, "async-hot")
    for label in ASYNC_ROWS:
        passed = value(hot[label][PER_SECTION])
        assert passed < 1.0, f"{label}: {passed} statements per hot section\n{report}"
    check_charts(report, tmp_path, ASYNC_SCENARIOS)
    check_cleaned_up(db_url, table)


@pytest.mark.multiprocess
def test_unreachable_server_is_skipped_with_a_note(tmp_path: Path) -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    dead_redis = "redis://127.0.0.1:1/0"
    output = tmp_path / "results.md"
    result = run_bench(
        *("--db", "sqlite", "--dburi", f"sqlite=sqlite:///{tmp_path / 'bench.db'}"),
        *("--db", "postgresql", "--dburi", f"postgresql={dead}"),
        *("--db", "redis", "--dburi", f"redis={dead_redis}"),
        *("--impl", "tierlock", "--scenario", "uncontended", "--output", str(output)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = output.read_text(encoding="utf-8")
    assert f"- skipped: postgresql: cannot use {dead}" in report
    assert f"- skipped: redis: cannot use {dead_redis}" in report
    assert list(rows(report, "uncontended")) == ["tierlock"]
    assert "### SQLite" in report
    assert "### PostgreSQL" not in report and "### Redis" not in report
