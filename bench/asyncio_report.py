"""The report of an asyncio scenario: the benchmark's tables, with ratios to tierlock.aio's
row, and a last table of tierlock.aio's throughput over the others' on each database."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from .asyncio_cells import AsyncCell, AsyncScenario
from .interface import TTL, WAIT_LIMIT
from .report import DATABASE_TITLES, Row, number, scenario_section

REFERENCE = "tierlock-aio"
# The rows tierlock.aio is divided by, as named for --impl.
OTHERS = ("tierlock", "redis-aio")

INTRO = (
    "Each section reads the key's counter, awaits `asyncio.sleep(0)` (threads: "
    "`time.sleep(0)`) and writes the counter plus one, so the holder lets every other "
    "ready task run while it holds; no busy-wait. tierlock.aio: one `AsyncLockManager` "
    f"shared by the tasks, `async with locks.lock(key, timeout={WAIT_LIMIT:g})`; "
    "tierlock, threads: one `LockManager` shared by the threads; both with the default "
    "poll_interval, renewed leases, reaper off. redis.asyncio Lock: one "
    "`redis.asyncio.Redis` client shared by the tasks, `async with client.lock(key, "
    f"timeout={TTL:g}, blocking_timeout={WAIT_LIMIT:g})` with its default 0.1 s sleep "
    "between tries, as the redis-py Lock rows, on Redis. Ratios in parentheses are to "
    "tierlock.aio's figures; fewest/most per thread are per task in the task rows."
)


def rate(row: Row) -> float:
    """The median sections/s of ``row``, NaN if it failed or ran no cell."""
    if row.failure is not None or not row.cells:
        return math.nan
    return row.median("rate")


def threads(row: Row) -> str:
    """The median count of the process's threads as the run stopped."""
    counts = [cell.threads for cell in row.cells if isinstance(cell, AsyncCell)]
    if row.failure is not None or not counts:
        return "-"
    return number(statistics.median(counts), whole=True)


def ratio(ours: float, theirs: float) -> str:
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return "-"
    return f"{ours / theirs:.2f}"


def summary(rows: Sequence[Row], databases: Sequence[str]) -> list[str]:
    """A row per database: tierlock.aio's sections/s and its ratio to each other row's,
    and the threads of each row's process."""
    labels = {row.implementation.name: row.implementation.label for row in rows}
    others = [name for name in OTHERS if name in labels]
    lines = [
        f"### {labels[REFERENCE]} next to the others",
        "",
        f"{labels[REFERENCE]} sections/s over each other row's on the same database "
        "(medians); threads: of the process, Python's and the rest, as the run stopped.",
        "",
        "| database | "
        + " | ".join(
            [
                f"{labels[REFERENCE]} sections/s",
                *(f"{labels[REFERENCE]} / {labels[name]}" for name in others),
                *(f"threads: {labels[name]}" for name in (REFERENCE, *others)),
            ]
        )
        + " |",
        "|---|" + "---:|" * (1 + 2 * len(others) + 1),
    ]
    for database in databases:
        found = {
            row.implementation.name: row
            for row in rows
            if row.implementation.database in (database, None)
        }
        ours = found.get(REFERENCE)
        if ours is None:
            continue
        cells = [number(rate(ours), whole=True)]
        cells += [ratio(rate(ours), rate(found[name])) if name in found else "-" for name in others]
        cells += [threads(found[name]) if name in found else "-" for name in (REFERENCE, *others)]
        lines.append(f"| {DATABASE_TITLES[database]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def async_section(
    scenario: AsyncScenario, rows: Sequence[Row], databases: Sequence[str], chart: str | None
) -> list[str]:
    """The tables of one asyncio scenario, one per database, then the summary."""
    lines = scenario_section(scenario, rows, databases, chart, (INTRO,), REFERENCE)
    if any(row.implementation.name == REFERENCE for row in rows):
        lines += summary(rows, databases)
    return lines
