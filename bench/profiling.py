"""``python -m bench.profiling``: where the CPU of an acquire + release of the sync
``LockManager`` goes, layer by layer, next to the bare cursor's (see :mod:`bench.bare`).

Each implementation runs the benchmark's workload (by default ``spread-1x4``: the 1000
keys of ``spread-4x4``, taken at random by the 4 threads of one process) in cells of
two kinds, interleaved. Plain cells measure the CPU per section: ``time.process_time()``
of the process and ``time.thread_time()`` of each thread that takes keys, between the
start and the stop. In profiled cells each of those threads runs under cProfile on its
own CPU clock, which counts every call and is blind to the machine's load (a sampler
there takes a thread that waits for a core for one that runs). The profiler's own cost,
the difference between the two kinds' CPU per section, is taken off each function in
proportion to the calls into and out of it, and what is left is scaled to the plain
cells' CPU.

Each function's own time goes to a layer (see :mod:`bench.layers`). The threads that
take no keys (tierlock's heartbeat, lease clock and wake-ups) are not profiled: their
CPU is the process's less the key-taking threads'. Statements are counted at the driver (see
:func:`bench.drivers.count_statements`).

::

    python -m bench.profiling                         # into bench/results/profile.md
    python -m bench.profiling --db mariadb --seconds 10 --repeats 3
    python -m bench.profiling --scenario spread-4x4 --output /tmp/profile-4x4.md
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .bare import bare_tables
from .command import (
    Started,
    cell_parser,
    lock_tables,
    parse_cell_args,
    positive_int,
    publish,
    servers,
)
from .drivers import count_statements
from .interface import AsyncSubject, Contender, Implementation, Subject
from .layers import Function, charged, label, own_times
from .report import DATABASE_TITLES, number
from .subjects import implementations
from .tally import Tally
from .workload import KEYS, SCENARIOS, Scenario, Signals, Worker, run_workers

OUTPUT = Path(__file__).resolve().parent / "results" / "profile.md"
PROFILED = ("tierlock", "bare-cursor")
# The keys of spread-4x4 in one process alone, the default: the process's threads meet
# in tier 1 as there, and on two cores four busy processes would not also wait for
# each other's cores (which cProfile does not count, but which slows the cells).
ONE_PROCESS = Scenario("spread-1x4", 1, 4, KEYS, round_robin=False)
PROFILED_SCENARIOS = {
    scenario.name: scenario
    for scenario in (ONE_PROCESS, SCENARIOS["spread-4x4"], SCENARIOS["uncontended"])
}
# Sections each thread runs before a cell starts.
WARM_UP_SECTIONS = 50
OWN_THREADS = "tierlock's own threads: heartbeat, lease clock, wake-ups (not profiled)"
SECTION = "critical section: 100 µs busy-wait (not profiled)"


@dataclass
class Side:
    """What the cells of one implementation on one database add up to."""

    cpu: float = 0.0  # of the process, plain cells
    thread_cpu: float = 0.0  # of the threads taking keys, plain cells
    section_cpu: float = 0.0  # of their critical sections, plain cells
    sections: int = 0  # plain cells
    statements: int = 0  # plain cells, at the driver
    profiled_sections: int = 0
    profiles: list[str] = field(default_factory=list)  # cProfile's files

    def per_section(self, seconds: float) -> float:
        return seconds / self.sections * 1e6 if self.sections else float("nan")


class PausingTally(Tally):
    """A tally whose sections the profiler of the thread does not see, and whose CPU the
    thread counts: their busy-wait is the benchmark's, and its thousands of clock reads
    would swamp the profiler's own cost, which is taken off by calls."""

    def __init__(self, keys: int) -> None:
        super().__init__(keys)
        self.threads = threading.local()  # a thread's profiler, and its sections' CPU

    def section(self, index: int, me: int, seconds: float) -> bool:
        profiler: cProfile.Profile | None = getattr(self.threads, "profiler", None)
        if profiler is not None:
            profiler.disable()
        began = time.thread_time()
        try:
            return super().section(index, me, seconds)
        finally:
            self.threads.cpu = getattr(self.threads, "cpu", 0.0) + time.thread_time() - began
            if profiler is not None:
                profiler.enable()


class MeasuredWorker(Worker):
    """A worker whose report adds its process's CPU from the start to the stop and that
    of its threads taking keys; with a ``directory``, each of those threads runs under
    cProfile on its own CPU clock and leaves its stats there."""

    def __init__(
        self,
        directory: str | None,
        implementation: Implementation,
        scenario: Scenario,
        tally: PausingTally,
        number: int,
        signals: Signals,
    ) -> None:
        super().__init__(implementation, scenario, tally, number, signals)
        self.directory = directory
        self.pausing = tally
        self.report.update(cpu_start=0.0, cpu_end=0.0, thread_cpu=0.0, section_cpu=0.0)

    def warm_up(self, member: Contender, me: int) -> None:
        """Sections enough that the threads, taking them side by side, have opened
        every connection they will use: a connection's set-up (a TLS context of 23 ms
        for each of PyMySQL's) would otherwise be measured, and count for more in
        the profiled cells, which run fewer sections."""
        for _ in range(WARM_UP_SECTIONS):
            super().warm_up(member, me)

    def note_baseline(self) -> None:
        super().note_baseline()
        self.report["cpu_start"] = time.process_time()

    def run(self, contender: Contender, me: int) -> None:
        profiler = cProfile.Profile(time.thread_time) if self.directory else None
        self.pausing.threads.profiler = profiler
        self.pausing.threads.cpu = 0.0
        began = time.thread_time()
        if profiler is not None:
            profiler.enable()
        try:
            super().run(contender, me)
        finally:
            if profiler is not None:
                profiler.disable()
        spent = time.thread_time() - began
        if profiler is not None and self.directory is not None:
            profiler.dump_stats(os.path.join(self.directory, f"{os.getpid()}-{me}.prof"))
        with self.gather:
            self.report["thread_cpu"] += spent
            self.report["section_cpu"] += self.pausing.threads.cpu
            self.report["cpu_end"] = time.process_time()


class DriverCountedSubject(Subject):
    """The subject ``open_subject`` makes, whose statements are counted at the driver in
    its whole process from its opening on, whoever sends them."""

    def __init__(self, open_subject: Callable[[], Subject | AsyncSubject]) -> None:
        super().__init__()
        self.executed = count_statements()
        subject = open_subject()
        if not isinstance(subject, Subject):
            raise TypeError("an asyncio subject has no threads to profile")
        self.subject = subject

    def make_contender(self) -> Contender:
        return self.subject.contender()

    def statements(self) -> int:
        return self.executed()

    def close(self) -> None:
        self.subject.close()


def run_measured(
    implementation: Implementation,
    scenario: Scenario,
    seconds: float,
    side: Side,
    directory: str | None,
) -> None:
    """One cell of ``implementation``, profiled into ``directory`` if given."""
    counted = Implementation(
        implementation.name,
        implementation.label,
        implementation.database,
        partial(DriverCountedSubject, implementation.open),
    )
    worker = partial(MeasuredWorker, directory, counted, scenario, PausingTally(scenario.keys))
    _, reports = run_workers(scenario.processes, scenario.threads, seconds, worker)
    ran = sum(report["ran"] for report in reports)
    if directory is not None:
        side.profiled_sections += ran
        side.profiles += [str(path) for path in Path(directory).glob("*.prof")]
        return
    side.sections += ran
    side.statements += sum(report["statements"] for report in reports)
    side.cpu += sum(report["cpu_end"] - report["cpu_start"] for report in reports)
    side.thread_cpu += sum(report["thread_cpu"] for report in reports)
    side.section_cpu += sum(report["section_cpu"] for report in reports)


def layers(side: Side) -> tuple[dict[str, float], list[str]]:
    """CPU per section by layer, and the lines of the costliest functions."""
    true = (side.thread_cpu - side.section_cpu) / side.sections
    own, calls, stats = own_times(side.profiles, side.profiled_sections, true)
    by_layer: dict[str, float] = collections.defaultdict(float)
    where: dict[Function, str] = {}
    for function, amount in own.items():
        shares: dict[str, float] = collections.defaultdict(float)
        for layer, part in charged(stats, function, amount):
            shares[layer] += part
            by_layer[layer] += part
        where[function] = max(shares, key=lambda layer: shares[layer])
    by_layer[OWN_THREADS] = side.per_section(side.cpu - side.thread_cpu)
    by_layer[SECTION] = side.per_section(side.section_cpu)
    hottest = [
        f"| `{label(function)}` | {where[function]} | {number(calls[function])} "
        f"| {number(amount)} |"
        for function, amount in sorted(own.items(), key=lambda item: -item[1])
    ]
    return by_layer, hottest


def section(database: str, sides: dict[str, Side], top: int) -> list[str]:
    found = {name: layers(side) for name, side in sides.items() if side.profiles}
    ours, _ = found.get("tierlock", ({}, []))
    bare, _ = found.get("bare-cursor", ({}, []))
    total = sum(ours.values())
    lines = [f"## {DATABASE_TITLES[database]}", ""]
    for name, side in sides.items():
        lines.append(
            f"- {name}: {number(side.per_section(side.cpu))} µs CPU per section, "
            f"{number(side.per_section(side.thread_cpu))} of it in the threads taking keys; "
            f"{number(side.statements / side.sections)} statements per section at the "
            f"driver; {side.sections} sections plain, {side.profiled_sections} profiled"
        )
    lines += [
        "",
        "| layer | tierlock µs/section | share of tierlock's | bare cursor µs/section |",
        "|---|---:|---:|---:|",
    ]
    for layer in sorted({*ours, *bare}, key=lambda name: (-ours.get(name, 0), -bare.get(name, 0))):
        amount = ours.get(layer, 0.0)
        lines.append(
            f"| {layer} | {number(amount)} | {f'{amount / total:.1%}' if total else '-'} "
            f"| {number(bare.get(layer, 0.0))} |"
        )
    lines.append(f"| all | {number(total)} | 100% | {number(sum(bare.values()))} |")
    if "tierlock" in found:
        lines += [
            "",
            f"tierlock's {top} costliest functions, own time (the standard library's and "
            "built-ins' charged to their callers' layer):",
            "",
            "| function | layer | calls/section | µs/section |",
            "|---|---|---:|---:|",
            *found["tierlock"][1][:top],
        ]
    return [*lines, ""]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cell_parser(
        "python -m bench.profiling",
        "CPU per section of tierlock and the bare cursor, by layer, under cProfile.",
        PROFILED,
        tuple(PROFILED_SCENARIOS),
    )
    parser.set_defaults(seconds=5.0)
    parser.add_argument("--top", type=positive_int, default=20, help="functions listed (20)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"report file ({OUTPUT})")
    return parse_cell_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = Started()
    scenario = PROFILED_SCENARIOS[(args.scenario or [ONE_PROCESS.name])[-1]]
    chosen = [name for name in PROFILED if name in (args.impl or PROFILED)]
    with tempfile.TemporaryDirectory(prefix="tierlock-profile-") as scratch:
        urls, _, skipped = servers(args, Path(scratch), redis_wanted=False)
        cells = [
            implementation
            for implementation in implementations(urls, args.table, args.table[-12:])
            if implementation.name in chosen
        ]
        sides = {database: {name: Side() for name in chosen} for database in urls}
        with lock_tables(urls.values(), args.table), bare_tables(urls.values(), args.table):
            for repeat in range(args.repeats):
                for implementation in cells:
                    assert implementation.database is not None
                    side = sides[implementation.database][implementation.name]
                    directory = tempfile.mkdtemp(dir=scratch)
                    # Plain and profiled in turn, the first alternating by repeat.
                    for profiled in (repeat % 2 == 1, repeat % 2 == 0):
                        where = directory if profiled else None
                        run_measured(implementation, scenario, args.seconds, side, where)
                    print(
                        f"repeat {repeat + 1}/{args.repeats} {implementation.label} on "
                        f"{implementation.database}: "
                        f"{number(side.per_section(side.cpu))} µs CPU per section",
                        file=sys.stderr,
                    )
            lines = [
                line
                for database, each in sides.items()
                for line in section(database, each, args.top)
            ]
    details = [
        f"- scenario: {scenario.name}, {scenario.description}; {args.seconds:g} s per "
        f"cell, {args.repeats} interleaved repeat(s) of a plain and a profiled cell of "
        "each; µs/section: CPU per section (see bench/profiling.py)",
    ]
    title = "tierlock's acquire + release by layer, next to the bare cursor"
    publish(started.header(title, details, skipped, load_at_end=True) + lines, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
