"""What ``tierlock demo`` prints when its runs are over: both runs side by side, the
lock statistics and the lock wait, and the verdict, which is the exit code."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from ..stats import LockStats
from .demo import DemoConfig, DemoRun, counted

__all__ = ["report"]


def _milliseconds(waits: list[float], quantile: Callable[[list[float]], float]) -> str:
    return f"{quantile(waits) * 1000:,.1f} ms" if len(waits) >= 2 else "-"


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def _summary(config: DemoConfig, guarded: DemoRun, unguarded: DemoRun) -> Table:
    table = Table(
        title=(
            f"{counted(config.processes, 'process', 'processes')} x "
            f"{counted(config.threads, 'thread', 'threads')}, "
            f"{config.accounts} accounts, {config.seconds:g} s per run"
        )
    )
    table.add_column("")
    table.add_column("with tierlock", justify="right")
    table.add_column("without a lock", justify="right")

    def money(run: DemoRun) -> str:
        drift = run.total_after - run.total_before
        return "[green]conserved[/]" if run.conserved else f"[red]{drift:+,} (broken)[/]"

    table.add_row("transfers", f"{guarded.transfers:,}", f"{unguarded.transfers:,}")
    table.add_row("transfers per second", f"{guarded.rate:,.0f}", f"{unguarded.rate:,.0f}")
    table.add_row("total before", f"{guarded.total_before:,}", f"{unguarded.total_before:,}")
    table.add_row("total after", f"{guarded.total_after:,}", f"{unguarded.total_after:,}")
    table.add_row("money", money(guarded), money(unguarded), end_section=True)
    stats = guarded.stats or LockStats()
    for label, value in (
        ("lock acquisitions", stats.acquisitions),
        ("database inserts", stats.inserts),
        ("queued in tier 1 (local_waits)", stats.local_waits),
        ("takeovers of expired holds", stats.takeovers),
        ("lost holds", stats.lost_holds),
    ):
        table.add_row(label, f"{value:,}", "-")
    table.add_row("lock wait p50", _milliseconds(guarded.waits, statistics.median), "-")
    table.add_row("lock wait p99", _milliseconds(guarded.waits, _p99), "-")
    return table


def report(config: DemoConfig, guarded: DemoRun, unguarded: DemoRun, console: Console) -> int:
    """Print the summary; return the exit code: 0 only if the guarded run conserved money."""
    console.print(_summary(config, guarded, unguarded))
    errors = [*guarded.errors, *unguarded.errors]
    for error in errors:
        console.print(f"[red]a worker failed:[/] {error}", highlight=False)
    if not guarded.conserved:
        console.print(
            f"[red bold]tierlock failed:[/] the total went from {guarded.total_before:,} to "
            f"{guarded.total_after:,} while every transfer held both accounts' locks, so two "
            "transfers of one account overlapped. That is a bug in tierlock."
        )
        return 1
    if errors:
        return 1
    console.print(
        f"With tierlock, {guarded.transfers:,} transfers kept the total at "
        f"{guarded.total_after:,}. {_unguarded_verdict(unguarded)}"
    )
    return 0


def _unguarded_verdict(run: DemoRun) -> str:
    lost = run.total_before - run.total_after
    if not lost:
        return "Without a lock the total happened to hold this time; run longer to see it break."
    return (
        "Without a lock, transfers that overlapped on an account overwrote each other's "
        f"balances: {abs(lost):,} {'vanished' if lost > 0 else 'appeared from nowhere'}."
    )
