"""Soak: the killing load of ``procs.KillingLoad`` against one engine for minutes.

::

    python -m tests.soak --url mysql+pymysql://root@127.0.0.1:3306/test --minutes 10

Workers in four processes hammer a few keys while they are killed with SIGKILL at every
point of a hold and restarted, and stopped with SIGSTOP while they hold a key for longer
than its lease (``--no-stops`` leaves that out). Prints critical sections, kills, stops,
violations and the longest time a key stayed blocked after its holder died, and exits
non-zero if two sections of a key overlapped, a hold's fencing token was not above the
one before, or anything else went wrong. Works in a table (or namespace) of its own,
dropped at the end.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--url", required=True, help="URL of the database or engine")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=1.0, help="lease of every hold, seconds")
    parser.add_argument(
        "--stops",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop workers that hold a key past its lease (SIGSTOP), then continue them",
    )
    options = parser.parse_args(argv)

    # Run as ``python -m tests.soak``, this module's siblings are not importable as the
    # top-level modules the test suite imports them as.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import procs
    from engines import drop_namespace

    logging.basicConfig(level=logging.ERROR)  # takeovers and reaps are the point here
    table = f"tl_soak_{uuid.uuid4().hex[:16]}"
    load = procs.KillingLoad(
        options.url,
        table,
        keys=options.keys,
        processes=options.processes,
        ttl=options.ttl,
        stops=options.stops,
    )
    try:
        report = load.run(options.minutes * 60)
    finally:
        drop_namespace(options.url, table)
    print(report.summary())
    return 0 if report.violations == 0 and not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
