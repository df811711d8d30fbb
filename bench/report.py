"""Figures of a cell, medians over repeats, and the markdown tables of the report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .interface import Implementation
from .workload import Cell

DATABASE_TITLES = {
    "sqlite": "SQLite",
    "mariadb": "MariaDB",
    "postgresql": "PostgreSQL",
    "redis": "Redis",
    "zookeeper": "ZooKeeper",
    "file": "Lock directory",
}

# The figures of a row, each with its column header; all are also shown as a ratio to
# tierlock's on the same engine.
COLUMNS = {
    "rate": "sections/s",
    "p50": "p50 wait ms",
    "p99": "p99 wait ms",
    "fewest": "fewest/thread",
    "most": "most/thread",
    "fairness": "fairness",
    "per_section": "statements/section",
}
# The same for scenarios whose threads try without waiting: a section is a win.
TRY_COLUMNS = {
    "rate": "wins/s",
    "try_rate": "tries/s",
    "p50_us": "p50 try µs",
    "p99_us": "p99 try µs",
    "fewest": "fewest wins/thread",
    "most": "most wins/thread",
    "fairness": "fairness",
    "per_try": "statements/try",
}

LEGEND = (
    "sections/s: critical sections completed per second, all threads; p50/p99 wait: time "
    "to acquire; fewest/most per thread: sections of the least and the most served thread; "
    "fairness: fewest over most (1: even); statements/section: SQL statements "
    "(Redis: commands; ZooKeeper: requests; lock directory: file-system calls) sent per "
    "section, counted at the client; "
    "violations: lost updates and overlapping sections the shared counters caught, summed "
    "over repeats; each figure is the median over repeats and (0.83x) its ratio to tierlock's "
    "on the same engine."
)
TRY_LEGEND = (
    "wins/s and tries/s: tries that took the key, and all tries, per second, all threads; "
    "p50/p99 try: the time one try took, won or lost; fewest/most wins per thread: of "
    "the least and the most served thread; fairness: fewest over most; statements/try: "
    "SQL statements (Redis: commands; ZooKeeper: requests; lock directory: file-system "
    "calls) per try, the release of a win included."
)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; NaN without samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def figures(cell: Cell) -> dict[str, float]:
    done = sum(cell.sections)
    waits = sorted(cell.waits)  # once: percentile's own sort of a sorted list is quick
    return {
        "rate": done / cell.elapsed if cell.elapsed else math.nan,
        "try_rate": cell.tries / cell.elapsed if cell.elapsed else math.nan,
        "p50": percentile(waits, 0.50) * 1000,
        "p99": percentile(waits, 0.99) * 1000,
        "p50_us": percentile(waits, 0.50) * 1e6,
        "p99_us": percentile(waits, 0.99) * 1e6,
        "fewest": min(cell.sections, default=0),
        "most": max(cell.sections, default=0),
        "fairness": min(cell.sections) / max(cell.sections) if any(cell.sections) else math.nan,
        "per_section": cell.statements / cell.ran if cell.ran else math.nan,
        "per_try": cell.statements / cell.tried if cell.tried else math.nan,
    }


@dataclass
class Row:
    """One implementation under one scenario, over all repeats."""

    implementation: Implementation
    cells: list[Cell]
    failure: str | None = None

    def median(self, name: str) -> float:
        return statistics.median(figures(cell)[name] for cell in self.cells)

    def violated(self) -> bool:
        """Whether a lock that should exclude was caught letting sections overlap."""
        return self.implementation.excludes and any(
            cell.lost or cell.overlaps or cell.leftover for cell in self.cells
        )

    def violations(self) -> str:
        if self.failure is not None:
            return "failed"
        if not self.implementation.excludes:
            return "n/a"
        return tallies(
            (
                (sum(cell.lost for cell in self.cells), "lost updates"),
                (sum(cell.overlaps for cell in self.cells), "overlaps"),
                (sum(cell.leftover for cell in self.cells), "rows left"),
            )
        )


def tallies(counts: Iterable[tuple[int, str]]) -> str:
    """Counts of what went wrong, such as ``3 overlaps, 1 rows left``: those not 0, or 0."""
    return ", ".join(f"{count} {what}" for count, what in counts if count) or "0"


# Figures that are counts, or large enough that decimals are noise.
WHOLE = {"rate", "try_rate", "fewest", "most"}


def number(value: float, whole: bool = False) -> str:
    if math.isnan(value):
        return "-"
    if whole or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if 0 < abs(value) < 0.1:
        return f"{value:.2g}"  # (a small ratio, such as statements per try, keeps its digits)
    return f"{value:.2f}"


def shown(name: str, value: float) -> str:
    """A figure as the tables show it."""
    return number(value, name in WHOLE)


class Measured(Protocol):
    """A row of a report's table: the medians of its cells, unless it failed."""

    @property
    def cells(self) -> Sequence[object]: ...

    @property
    def failure(self) -> str | None: ...

    def median(self, name: str) -> float: ...


def figure(
    row: Measured,
    name: str,
    reference: Measured | None,
    show: Callable[[str, float], str] = shown,
) -> str:
    """``row``'s median of figure ``name`` and, unless ``row`` is the ``reference``
    (None: no ratio), its ratio to the reference's."""
    if row.failure is not None or not row.cells:
        return "-"
    value = row.median(name)
    text = show(name, value)
    if reference is None or reference is row or reference.failure is not None:
        return text
    if not reference.cells:
        return text
    base = reference.median(name)
    if math.isnan(value) or math.isnan(base) or base == 0:
        return text
    return f"{text} ({value / base:.2f}x)"


def scenario_table(
    rows: Sequence[Row], columns: dict[str, str] = COLUMNS, reference: str = "tierlock"
) -> list[str]:
    """One scenario's rows on one database, the ``reference`` row's first (named as for
    ``--impl``: the others' ratios divide by its figures), as markdown lines."""
    base = next((row for row in rows if row.implementation.name == reference), None)
    lines = [
        "| implementation | " + " | ".join(columns.values()) + " | violations |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for row in rows:
        cells = [figure(row, name, base) for name in columns]
        lines.append(
            f"| {row.implementation.label} | " + " | ".join(cells) + f" | {row.violations()} |"
        )
    for row in rows:
        if row.failure is not None:
            lines.append(f"\n{row.implementation.label} failed: {row.failure.strip()}")
        elif not row.implementation.excludes and row.cells:
            lost = sum(cell.lost for cell in row.cells)
            overlaps = sum(cell.overlaps for cell in row.cells)
            lines.append(
                f"\nThe floor excludes nothing: in its sections the check caught {lost} lost "
                f"updates and {overlaps} overlaps."
            )
    return lines


class Titled(Protocol):
    """A scenario as the report and the charts show it."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def blocking(self) -> bool:
        """Whether threads wait for their keys, rather than try them once."""


def scenario_section(
    scenario: Titled,
    rows: Sequence[Row],
    databases: Sequence[str],
    chart: str | None = None,
    intro: Sequence[str] = (),
    reference: str = "tierlock",
) -> list[str]:
    """The tables of one scenario, one per engine; rows without one appear in each.
    ``chart``: the scenario's chart, relative to the report, to show above them and the
    paragraphs of ``intro``; ``reference``: the row whose figures the others' ratios
    divide by, named as for ``--impl``."""
    lines = [f"## {scenario.name}: {scenario.description}", ""]
    if chart is not None:
        lines += [f"![{scenario.name}: throughput and wait by database]({chart})", ""]
    for paragraph in intro:
        lines += [paragraph, ""]
    columns = COLUMNS
    if not scenario.blocking:
        columns = TRY_COLUMNS
        lines += [TRY_LEGEND, ""]
    for database in databases:
        chosen = [row for row in rows if row.implementation.database in (database, None)]
        if chosen:
            table = scenario_table(chosen, columns, reference)
            lines += [f"### {DATABASE_TITLES[database]}", "", *table, ""]
    return lines


def floor_summary(rows: Sequence[Row], databases: Sequence[str]) -> list[str]:
    """A row per database with a bare cursor's row: tierlock's sections/s over the bare
    cursor's and over table-only's, and each's statements per section; or nothing."""
    if not any(row.implementation.name == "bare-cursor" for row in rows):
        return []
    names = ("tierlock", "bare-cursor", "table-only")
    lines = [
        "### tierlock next to the bare cursor and the table alone",
        "",
        "tierlock's sections/s over the bare cursor's (the same two statements on a bare "
        "DBAPI connection per thread, no pool, no SQLAlchemy) and over table-only's (tierlock "
        "with a manager per thread), medians on the same database; then statements/section.",
        "",
        "| database | tierlock sections/s | tierlock / bare cursor | tierlock / table-only "
        "| statements/section: tierlock | bare cursor | table-only |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for database in databases:
        found = {
            row.implementation.name: row
            for row in rows
            if row.implementation.database == database and row.implementation.name in names
        }
        ours = found.get("tierlock")
        if ours is None or "bare-cursor" not in found:
            continue
        ratios = [over(ours, found.get(name)) for name in names[1:]]
        sent = [
            figure(found[name], "per_section", None) if name in found else "-" for name in names
        ]
        cells = [figure(ours, "rate", None), *ratios, *sent]
        lines.append(f"| {DATABASE_TITLES[database]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def over(ours: Row, theirs: Row | None) -> str:
    """``ours`` median sections/s over ``theirs``, as ``0.63x``; ``-`` without both."""
    if theirs is None or not ours.cells or not theirs.cells:
        return "-"
    if ours.failure is not None or theirs.failure is not None:
        return "-"
    base = theirs.median("rate")
    return f"{ours.median('rate') / base:.2f}x" if base else "-"
