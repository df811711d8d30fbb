"""A cron job that must run on one host at a time, though cron starts it on every host.

Each run tries the job's lock without waiting (``acquire(blocking=False)``). The run
that gets it does the work; any other run, on this host or another, logs who holds the
lock and exits 0, so cron sees nothing wrong. If a run dies holding the lock, the lock
frees itself when the lease ends: the job's ``ttl`` bounds how long it may take (a
longer job would call ``lock.extend()`` as it goes).

Every host points at the same database::

    python examples/cron_job.py --url mysql+pymysql://root@127.0.0.1:3306/test
    python examples/cron_job.py     # SQLite: tierlock.db in the working directory
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import tierlock

logger = logging.getLogger("cron_job")

JOB_TTL = 600.0  # the longest a run may take before another may start


def send_nightly_report(seconds: float) -> None:
    time.sleep(seconds)  # the real work


def run(locks: tierlock.LockManager, job: str, seconds: float) -> bool:
    """Run ``job`` unless it is running somewhere already; return whether it ran."""
    lock = locks.lock(("cron", job), ttl=JOB_TTL)
    if not lock.acquire(blocking=False):
        holder = locks.info(lock.key)
        where = "" if holder is None else f" on {holder.host} (pid {holder.pid})"
        logger.info("skipped %s: already running%s", job, where)
        return False
    try:
        logger.info("running %s (fencing token %s)", job, lock.token)
        send_nightly_report(seconds)
        logger.info("finished %s", job)
    finally:
        lock.release()
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description="A job that runs on one host at a time.")
    parser.add_argument("--url", default="sqlite:///tierlock.db", help="lock database")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    parser.add_argument("--job", default="nightly-report", help="the job's name")
    parser.add_argument("--seconds", type=float, default=1.0, help="how long the work takes")
    args = parser.parse_args()
    # The job's own steps at INFO; the library's and the scheduler's only when they warn.
    logging.basicConfig(stream=sys.stdout, format="%(asctime)s [%(process)d] %(message)s")
    logger.setLevel(logging.INFO)
    with tierlock.LockManager(args.url, table=args.table) as locks:
        run(locks, args.job, args.seconds)
    return 0  # skipping is not a failure


if __name__ == "__main__":
    raise SystemExit(main())
