"""Where cProfile's stats of a lock's threads go, layer by layer: a function's own time
to the layer its code lives in (tierlock's modules, SQLAlchemy, the drivers, the
benchmark); the standard library's and built-in functions' to their callers' layers in
proportion to the time each caller spent in them, so a ``uuid4()`` in ``records.py``
counts as the owner records'; the drivers' C calls (sqlite3's, psycopg's, the
sockets') to the driver. See :mod:`bench.profiling`.
"""

from __future__ import annotations

import collections
import pstats
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import tierlock

ROOT = str(Path(tierlock.__file__).resolve().parent.parent)
STDLIB = sysconfig.get_paths()["stdlib"]
DRIVER = "driver"
# The layers, by where their code lives: the first prefix that the path of a function,
# from the checkout or from site-packages on, starts with names its layer.
LAYERS = (
    (("pymysql/", "psycopg/", "psycopg_binary/", "psycopg_c/"), DRIVER),
    (("sqlalchemy/",), "SQLAlchemy pool: checkout, return, proxied connection"),
    (("tierlock/backends/sql/link.py", "tierlock/backends/sql/queries.py"), "result handling"),
    (("tierlock/backends/sql/running.py", "tierlock/backends/gate.py"), "runner: gate, tries"),
    (("tierlock/backends/",), "SQL backend: operations, parameters, wake-ups"),
    (("tierlock/tier1/leases.py",), "heartbeat registration"),
    (("tierlock/tier1/",), "tier 1 registry"),
    (("tierlock/records.py",), "owner records"),
    (("tierlock/stats.py", "tierlock/metrics.py"), "counters/metrics"),
    (("tierlock/",), "handles and manager"),
    (("bench/bare.py",), "bare cursor's own code"),
    (("bench/drivers.py",), "benchmark: counting statements"),
    (("bench/",), "benchmark: loop and contender"),
)
# Built-in functions that are the drivers' own work: sqlite3's and psycopg's C code,
# and the sockets that pymysql and psycopg talk through.
# (cProfile names the sqlite3 cursor's execute, called through super(), by its caller.)
DRIVER_CALLS = re.compile(r"sqlite3|SQLiteCursor|psycopg|_socket|select\.|poll")
# How far up the callers the time of a standard library function is followed.
CALLER_DEPTH = 20

Function = tuple[str, int, str]  # pstats' key: file, line, name


def relative(path: str) -> str:
    """``path`` from the checkout, site-packages or the standard library on, as
    :data:`LAYERS` names it."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    for root in (ROOT, STDLIB):
        if path.startswith(root):
            return path[len(root) + 1 :]
    return path


def own_layer(function: Function) -> str | None:
    """The layer of ``function``'s code; None for the standard library's and built-ins
    other than the drivers', whose time is their callers'."""
    path, _, name = function
    if path == "~":
        return DRIVER if DRIVER_CALLS.search(name) else None
    if path.startswith((STDLIB, "<frozen")) and "site-packages/" not in path:
        return None  # (site-packages may be under the standard library's directory)
    where = relative(path)
    return next((layer for prefixes, layer in LAYERS if where.startswith(prefixes)), "other")


def label(function: Function) -> str:
    path, _, name = function
    if path == "~":
        return re.sub(r" at 0x[0-9a-f]+", "", name)  # (a function object's address)
    return f"{name} ({relative(path)})"


def charged(
    stats: pstats.Stats, function: Function, amount: float, depth: int = 0
) -> Iterator[tuple[str, float]]:
    """``amount`` of ``function``'s own time, by layer: its own, or its callers'."""
    layer = own_layer(function)
    callers = stats.stats[function][4]  # type: ignore[attr-defined]
    spent = sum(entry[2] for entry in callers.values())
    if layer is not None or depth >= CALLER_DEPTH or spent <= 0:
        yield layer or "other", amount
        return
    for caller, entry in callers.items():
        yield from charged(stats, caller, amount * entry[2] / spent, depth + 1)


def own_times(
    profiles: list[str], sections: int, true: float
) -> tuple[dict[Function, float], dict[Function, float], pstats.Stats]:
    """From the cProfile files of ``sections``: each function's own CPU in µs per
    section, less the profiler's share and scaled so that all add up to ``true`` (the
    seconds per section measured without the profiler); its calls per section; and the
    merged stats. The profiler's cost per call event is the difference between what it
    measured and ``true`` over the calls, and each function is charged it for the calls
    into it and out of it."""
    stats = pstats.Stats(*profiles)
    table = stats.stats  # type: ignore[attr-defined]
    calls = {function: entry[1] for function, entry in table.items()}
    made: collections.Counter[Function] = collections.Counter()
    for entry in table.values():
        for caller, (calls_in, *_) in entry[4].items():
            made[caller] += calls_in
    measured = sum(entry[2] for entry in table.values()) / sections
    events = (sum(calls.values()) + sum(made.values())) / sections
    cost = max(0.0, measured - true) / events if events else 0.0
    own = {
        function: max(
            0.0, entry[2] / sections - (calls[function] + made[function]) / sections * cost
        )
        for function, entry in table.items()
    }
    scale = true / sum(own.values()) if any(own.values()) else 0.0
    per_call = {function: count / sections for function, count in calls.items()}
    return {key: value * scale * 1e6 for key, value in own.items()}, per_call, stats
