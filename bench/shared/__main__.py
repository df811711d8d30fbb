"""``python -m bench.shared``'s command: its options, the cells in turn, the report."""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..command import (
    Started,
    cell_parser,
    lock_tables,
    parse_cell_args,
    positive_float,
    positive_int,
    publish,
    rows_in,
    servers,
)
from ..workload import CellError
from .cell import run_cell
from .holders import entries
from .report import Row, header, section
from .scenarios import IMPLEMENTATIONS, READ_MOSTLY, SCENARIOS, SECTION, SEMAPHORE

OUTPUT = Path(__file__).resolve().parent.parent / "results" / "shared.md"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cell_parser(
        "python -m bench.shared",
        "tierlock's read/write locks and semaphores next to PostgreSQL's shared "
        "advisory locks and a Redis slot semaphore.",
        IMPLEMENTATIONS,
        list(SCENARIOS),
    )
    parser.add_argument(
        "--section",
        type=positive_float,
        default=SECTION,
        help=f"seconds asleep in each section ({SECTION:g})",
    )
    parser.add_argument(
        "--keys",
        type=positive_int,
        default=SCENARIOS[READ_MOSTLY].keys,
        help=f"{READ_MOSTLY}: keys ({SCENARIOS[READ_MOSTLY].keys})",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"report file ({OUTPUT})")
    args = parse_cell_args(parser, argv)
    args.scenarios = {**SCENARIOS, READ_MOSTLY: replace(SCENARIOS[READ_MOSTLY], keys=args.keys)}
    return args


def run_cells(args: argparse.Namespace, rows: list[Row], urls: dict[str, str]) -> None:
    """Every row's cell, ``args.repeats`` times, interleaved; after each cell of a lock
    table, the rows left in it are counted (and removed)."""
    for repeat in range(args.repeats):
        for row in rows:
            entry = row.entry
            if row.failure is not None:
                continue
            where = f"{entry.label} on {entry.database or 'no database'}"
            try:
                cell = run_cell(entry, args.scenarios[entry.scenario], args.seconds, args.section)
            except CellError as exc:
                row.failure = str(exc)
                print(f"{entry.scenario}, {where} failed:\n{exc}", file=sys.stderr)
                continue
            if entry.name.startswith("tierlock") and entry.database is not None:
                cell.leftover = rows_in(urls[entry.database], args.table)
            row.cells.append(cell)
            print(
                f"repeat {repeat + 1}/{args.repeats} {entry.scenario}, {where}: "
                f"{sum(cell.ops) / cell.elapsed:.0f} ops/s",
                file=sys.stderr,
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = Started()
    scenarios = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    chosen = set(args.impl or IMPLEMENTATIONS)
    redis_wanted = "redis-slots" in chosen and SEMAPHORE in scenarios
    with tempfile.TemporaryDirectory(prefix="tierlock-bench-shared-") as scratch:
        urls, redis_url, skipped = servers(args, Path(scratch), redis_wanted)
        for note in skipped:
            print(f"skipped {note}", file=sys.stderr)
        rows = [
            Row(entry)
            for entry in entries(urls, args.table, uuid.uuid4().hex[:12], redis_url)
            if entry.name in chosen and entry.scenario in scenarios
        ]
        if not any(row.entry.excludes for row in rows):
            print("nothing to measure", file=sys.stderr)
            return 1
        with lock_tables(urls.values(), args.table):
            run_cells(args, rows, urls)
    lines: list[str] = []
    for name in scenarios:
        chosen_rows = [row for row in rows if row.entry.scenario == name]
        lines += section(args.scenarios[name], chosen_rows, list(urls))
    publish(header(args, skipped, started) + lines, args.output)
    failed = any(row.failure is not None or row.violated() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
