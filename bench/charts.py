"""A PNG chart per scenario beside the report, for what the tables make hard to see:
how far apart the implementations are, often by orders of magnitude, and how much the
repeats disagree.

Each chart has a column per engine: throughput above, p50 and p99 wait (or, for
tries without waiting, the length of a try) below, a bar per implementation in the
same colour everywhere. The panels side by side share their y axis, so databases
compare at a glance; where their values span more than :data:`SPAN` times, the axis is
logarithmic. Bars are the medians the tables show; whiskers span the repeats, from the
lowest to the highest.

matplotlib is imported only when a chart is drawn, so ``python -m bench --help`` and
the measuring itself do without it.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .report import DATABASE_TITLES, Row, Titled, figures

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# One colour per implementation; GET_LOCK and advisory locks, the server's own lock
# on their one database each, share theirs.
COLOURS = {
    "tierlock": "tab:blue",
    "table-only": "tab:orange",
    "get-lock": "tab:green",
    "advisory": "tab:green",
    "redis": "tab:red",
    "python-redis-lock": "tab:brown",
    "kazoo": "tab:olive",
    "filelock": "tab:cyan",
    "floor": "tab:gray",
    "bare-cursor": "goldenrod",
    "tierlock-aio": "tab:purple",
    "redis-aio": "tab:pink",
}
# The figures of each panel row, with what they share: the name of the y axis and,
# for a row of several figures, what tells them apart (lighter: p50, full: p99).
BLOCKING = (
    (("rate",), "sections/s"),
    (("p50", "p99"), "wait to acquire, ms"),
)
TRYING = (
    (("rate",), "wins/s"),
    (("p50_us", "p99_us"), "one try, µs"),
)
SHADES = (0.45, 1.0)
PERCENTILES = ("p50", "p99")
# From this ratio of the largest to the smallest value on, a panel row is drawn on a
# log scale: linear bars would flatten all but the tallest.
SPAN = 20.0


def chart_file(scenario: Titled) -> str:
    """The chart's file name, beside the report and linked from it."""
    return f"{scenario.name}.png"


@dataclass(frozen=True)
class Bar:
    """One figure of one row: median over repeats and range, or why there is none."""

    median: float = math.nan
    low: float = math.nan
    high: float = math.nan
    missing: str | None = None  # written where the bar would be


def bars(row: Row, names: Sequence[str]) -> list[Bar]:
    """The bars of ``names`` for one row."""
    if row.failure is not None:
        return [Bar(missing="failed") for _ in names]
    per_cell = [figures(cell) for cell in row.cells]
    found = []
    for name in names:
        values = [each[name] for each in per_cell if not math.isnan(each[name])]
        if values:
            found.append(Bar(statistics.median(values), min(values), max(values)))
        else:
            found.append(Bar(missing="none"))
    return found


def log_ticks(row: Sequence[Bar]) -> tuple[float, ...] | None:
    """Where the labelled ticks of a panel row go on a log axis, in each decade: at 1, 2
    and 5 over a few decades, at 1 over more; None if the row is linear."""
    values = [value for bar in row for value in (bar.median, bar.low, bar.high) if value > 0]
    if not values or max(values) < SPAN * min(values):
        return None
    return (1.0, 2.0, 5.0) if max(values) < 1000 * min(values) else (1.0,)


def tick(value: float, _: object) -> str:
    """A tick label as plain as the tables' figures: 0.2, 5, 2,000."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def draw_panel(axes: Axes, rows: Sequence[Row], found: Sequence[Sequence[Bar]]) -> None:
    """Bars of one panel: a group per row, a bar per figure of ``found[row]``; a call per
    figure, not per bar, since each call's artists cost time to lay out and draw."""
    count = len(found[0])
    width = 0.8 / count
    for index in range(count):
        offset = (index - (count - 1) / 2) * width
        shown = []
        for place, (row, group) in enumerate(zip(rows, found, strict=True)):
            bar = group[index]
            if bar.missing is None and bar.median != 0:
                shown.append((place + offset, row, bar))
                continue
            axes.annotate(
                bar.missing or "0",
                (place + offset, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                rotation=90,
                fontsize=8,
            )
        axes.bar(
            [x for x, _, _ in shown],
            [bar.median for _, _, bar in shown],
            width,
            color=[COLOURS[row.implementation.name] for _, row, _ in shown],
            alpha=SHADES[index] if count > 1 else 1.0,
            hatch=["" if row.implementation.excludes else "//" for _, row, _ in shown],
            edgecolor="black",
            linewidth=0.5,
        )
        spread = [(x, bar) for x, _, bar in shown if bar.high > bar.low]
        if spread:
            axes.errorbar(
                [x for x, _ in spread],
                [bar.median for _, bar in spread],
                yerr=[
                    [bar.median - bar.low for _, bar in spread],
                    [bar.high - bar.median for _, bar in spread],
                ],
                fmt="none",
                ecolor="black",
                elinewidth=1,
                capsize=2,
            )
    axes.grid(axis="y", which="major", alpha=0.4)
    axes.set_axisbelow(True)


def label_rows(axes: Axes, rows: Sequence[Row]) -> None:
    """Name the bar groups of a column's bottom panel, a lock that let sections overlap
    in red: its speed is no win."""
    axes.set_xticks(
        range(len(rows)),
        [row.implementation.label + (" (violated)" if row.violated() else "") for row in rows],
        rotation=30,
        horizontalalignment="right",
    )
    for row, label in zip(rows, axes.get_xticklabels(), strict=True):
        if row.violated():
            label.set_color("tab:red")


def draw(scenario: Titled, rows: Sequence[Row], databases: Sequence[str], path: Path) -> None:
    """Write the chart of one scenario: a column per database with rows, as in the report."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    columns = [
        (database, chosen)
        for database in databases
        if (chosen := [row for row in rows if row.implementation.database in (database, None)])
    ]
    figure = Figure(figsize=(1.2 + 3.6 * len(columns), 7.5), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(2, len(columns), sharex="col", sharey="row", squeeze=False)
    for line, (names, unit) in enumerate(BLOCKING if scenario.blocking else TRYING):
        found = [[bars(row, names) for row in chosen] for _, chosen in columns]
        subs = log_ticks([bar for panel in found for group in panel for bar in group])
        for column, ((database, chosen), panel) in enumerate(zip(columns, found, strict=True)):
            axes = grid[line][column]
            draw_panel(axes, chosen, panel)
            if subs is not None:
                axes.set_yscale("log")
                axes.yaxis.set_major_locator(LogLocator(subs=subs))
                axes.yaxis.set_major_formatter(FuncFormatter(tick))
                axes.yaxis.set_minor_locator(NullLocator())
            if line == 0:
                axes.set_title(DATABASE_TITLES[database])
            if column == 0:
                axes.set_ylabel(unit + ("" if subs is None else " (log scale)"))
            if line == len(grid) - 1:
                label_rows(axes, chosen)
        if len(names) > 1:
            grid[line][0].legend(
                handles=[
                    Patch(facecolor="grey", alpha=shade, edgecolor="black", label=label)
                    for label, shade in zip(PERCENTILES, SHADES, strict=True)
                ],
                loc="best",
                fontsize=8,
            )
    width = figure.get_figwidth()
    figure.suptitle(textwrap.fill(f"{scenario.name}: {scenario.description}", int(width * 12)))
    repeats = max(len(row.cells) for row in rows)
    notes = [f"bars: median of {repeats} repeat(s)"]
    if repeats > 1:
        notes.append("whiskers: lowest to highest repeat")
    if any(not row.implementation.excludes for row in rows):
        notes.append("hatched: the floor, which locks nothing")
    figure.supxlabel("; ".join(notes), fontsize=9)
    figure.savefig(path, dpi=100)
