"""The reaper's background job, as the application's logs see it.

APScheduler logs its start and every pass at INFO in whatever process runs it; the
reaper must keep that below WARNING out of the application's logs, without touching
their configuration, while its own warnings still get through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from polling import wait_until
from sqlalchemy import text
from sqlalchemy.engine import Engine

import tierlock

MakeManager = Callable[..., tierlock.LockManager]


def scheduler_chatter(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Records below WARNING that APScheduler's code logged, under whatever logger."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno < logging.WARNING and "apscheduler" in Path(record.pathname).parts
    ]


@pytest.mark.keeps_expired
def test_reaper_passes_log_nothing_below_warning(
    make_manager: MakeManager, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the root logger, so every logger that does not say
    manager = make_manager()
    lock = manager.lock(key, ttl=0.05, renew=False)
    assert lock.acquire()
    wait_until(lambda: not lock.locked(), "the lease to end")
    manager.start_reaper(0.05)
    wait_until(lambda: manager.stats().reaped == 1, "a reaper pass to delete the row")
    manager.stop_reaper()  # waits for the pass to end, so that all it logs is in
    assert scheduler_chatter(caplog) == []
    apscheduler = logging.getLogger("apscheduler")  # the application's to configure
    assert (apscheduler.level, apscheduler.handlers) == (logging.NOTSET, [])
    # What is captured: tierlock's DEBUG lines and the pass's own warning.
    messages = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert any(
        level == logging.DEBUG and message.startswith(f"acquired {key!r}")
        for level, message in messages
    )
    assert (logging.WARNING, "reaped 1 expired lock row(s)") in messages


def test_a_failing_reaper_pass_still_warns(
    make_manager: MakeManager, engine: Engine, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    manager = make_manager()
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE {table}"))
    manager.start_reaper(0.05)

    def failure_warned() -> bool:
        return any(
            record.name == "tierlock.reaper"
            and record.levelno == logging.WARNING
            and record.getMessage().startswith("reaper pass failed, will try again: ")
            for record in caplog.records
        )

    wait_until(failure_warned, "the failed pass's warning")
    manager.stop_reaper()
    assert scheduler_chatter(caplog) == []
