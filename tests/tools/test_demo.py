"""``tierlock demo``: the lock keeps the money, its absence loses it, and the numbers add up.

Small runs (2 processes x 2 threads, about a second each) on every engine.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from engines import left_over
from rich.console import Console

from tierlock.stats import LockStats
from tierlock.tools.cli import main
from tierlock.tools.demo import (
    OPENING_BALANCE,
    DemoConfig,
    DemoRun,
    run_demo,
)
from tierlock.tools.demo_accounts import accounts_name
from tierlock.tools.demo_report import report

ACCOUNTS = 6  # few accounts, so that unguarded transfers collide all the time


def small(db_url: str, table: str) -> DemoConfig:
    return DemoConfig(db_url, table, processes=2, threads=2, accounts=ACCOUNTS, seconds=1.0)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_demo_conserves_money_only_with_the_lock(db_url: str, table: str) -> None:
    config = small(db_url, table)
    out = io.StringIO()
    console = Console(file=out, width=120)
    guarded, unguarded = run_demo(config, console)

    opening = ACCOUNTS * OPENING_BALANCE  # summed from the table, so it must be exact
    assert (guarded.total_before, unguarded.total_before) == (opening, opening)
    assert guarded.errors == unguarded.errors == []
    assert guarded.transfers > 0
    assert guarded.conserved, (guarded.total_before, guarded.total_after)
    # Read-pause-write without a lock loses updates: the demo has something to show.
    assert unguarded.transfers > 0
    assert not unguarded.conserved

    stats = guarded.stats
    assert stats is not None
    assert unguarded.stats is None
    # Every transfer took two distinct accounts' locks and released both, none reentrant.
    assert stats.acquisitions == stats.releases == 2 * guarded.transfers
    assert stats.reentrant_acquisitions == 0
    assert 0 < stats.inserts <= stats.acquisitions
    assert stats.local_waits <= stats.acquisitions
    assert (stats.takeovers, stats.lost_holds) == (0, 0)  # 30 s leases never ran out
    assert len(guarded.waits) == guarded.transfers
    assert all(wait >= 0 for wait in guarded.waits)
    assert guarded.rate > 0

    assert report(config, guarded, unguarded, console) == 0
    text = out.getvalue()
    assert re.search(rf"│ transfers +│ +{guarded.transfers:,} │ +{unguarded.transfers:,} │", text)
    assert re.search(rf"│ lock acquisitions +│ +{stats.acquisitions:,} │", text)
    assert re.search(rf"│ queued in tier 1 \(local_waits\) +│ +{stats.local_waits:,} │", text)
    assert re.search(r"│ lock wait p99 +│ +[\d,.]+ ms │", text)
    assert "conserved" in text
    assert "(broken)" in text
    assert not left_over(db_url, accounts_name(table)), "the accounts are dropped"


def run(guarded: bool, before: int, after: int, errors: list[str] | None = None) -> DemoRun:
    return DemoRun(
        guarded=guarded,
        transfers=10,
        elapsed=1.0,
        total_before=before,
        total_after=after,
        stats=LockStats(acquisitions=20, inserts=20, releases=20) if guarded else None,
        waits=[0.001] * 10 if guarded else [],
        errors=errors or [],
    )


def test_report_fails_if_the_guarded_run_lost_money() -> None:
    out = io.StringIO()
    config = DemoConfig("sqlite:///x.db", "locks")
    code = report(config, run(True, 6000, 5990), run(False, 6000, 5000), Console(file=out))
    assert code == 1
    assert "tierlock failed" in out.getvalue()
    assert "6,000 to 5,990" in out.getvalue()


def test_report_fails_if_a_worker_failed() -> None:
    out = io.StringIO()
    config = DemoConfig("sqlite:///x.db", "locks")
    failed = run(True, 6000, 6000, errors=["LockTimeout: lock 'a' not acquired within 30 s"])
    assert report(config, failed, run(False, 6000, 5000), Console(file=out)) == 1
    assert "a worker failed: LockTimeout" in out.getvalue()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_demo_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    args = ["demo", "--url", url, "--processes", "1", "--threads", "2", "--seconds", "0.5"]
    result = CliRunner(env={"COLUMNS": "120"}).invoke(main, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"tierlock demo on {url}: 1 process x 2 threads" in out
    assert "with tierlock" in out
    assert "without a lock" in out
    assert re.search(r"With tierlock, [\d,]+ transfers kept the total at 20,000\.", out)
