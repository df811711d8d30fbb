"""The background job that deletes rows whose lease has ended.

Waiters take an expired row over by themselves; the reaper is for rows nobody asks
for again, left by holders that died or failed to release.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timezone
from typing import TYPE_CHECKING

from .errors import LockError

if TYPE_CHECKING:
    from apscheduler.schedulers.background import BackgroundScheduler

__all__ = ["Reaper"]

logger = logging.getLogger(__name__)

JOB_ID = "tierlock-reaper"

# APScheduler logs its start and every pass at INFO ("Running job", "executed
# successfully") in every process that uses tierlock. Its scheduler and executor log
# here instead: a logger of tierlock's that passes on only warnings and errors, so the
# application's logging configuration, apscheduler.* included, is left as it is.
_scheduler_logger = logging.getLogger(f"{__name__}.scheduler")
_scheduler_logger.setLevel(logging.WARNING)


def _scheduler() -> BackgroundScheduler:
    """A scheduler with one worker thread whose jobs log to ``_scheduler_logger``.
    APScheduler is imported here, at the first reaper started: a process that starts
    none (the command line, a test run's plugin) never pays for importing it."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    class Executor(ThreadPoolExecutor):  # type: ignore[misc]  # (APScheduler is untyped)
        # A job is handed the name of the logger that ``start`` sets,
        # ``apscheduler.executors.<alias>`` by default.
        def start(self, scheduler: BackgroundScheduler, alias: str) -> None:
            super().start(scheduler, alias)
            self._logger = _scheduler_logger

    return BackgroundScheduler(
        logger=_scheduler_logger,
        executors={"default": Executor(1)},
        job_defaults={"coalesce": True, "max_instances": 1},
        timezone=timezone.utc,
    )


class Reaper:
    """One scheduler with one interval job that calls ``reap``."""

    def __init__(self, reap: Callable[[], int]) -> None:
        self._reap = reap
        self._scheduler: BackgroundScheduler | None = None

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def start(self, interval: float) -> None:
        """Run ``reap`` every ``interval`` seconds; restarting changes the interval."""
        self.stop()
        scheduler = _scheduler()
        scheduler.add_job(self._run, "interval", seconds=interval, id=JOB_ID)
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        """Stop the job, waiting for a pass in progress to end."""
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            scheduler.shutdown(wait=True)

    def forget(self) -> None:
        """Drop the scheduler without stopping it: in a forked child its thread is gone."""
        self._scheduler = None

    def _run(self) -> None:
        try:
            self._reap()
        except LockError as exc:
            logger.warning("reaper pass failed, will try again: %s", exc)
