"""``tierlock top``: the lock table's holders, read and drawn afresh every few seconds.

It is a monitor, so a database that goes away once the view is up shows in the view,
which keeps trying; only a table that cannot be read at the start ends the command.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from ..errors import BackendError
from ..manager import LockManager
from . import admin

__all__ = ["DATABASE_TIMEOUT", "watch"]

# The manager's database_timeout: how long one read may spend on a database that is
# away, and so about how soon the view says so and a stop request is heeded.
DATABASE_TIMEOUT = 2.0


class Stop(Protocol):
    def wait(self, timeout: float) -> bool:
        """Whether the view should stop, waiting up to ``timeout`` seconds."""


def watch(locks: LockManager, console: Console, *, interval: float | None, stop: Stop) -> None:
    """Show ``locks``'s table on ``console``: one frame if ``interval`` is ``None``, or
    a frame every ``interval`` seconds until ``stop`` is set.

    :raises BackendError: the first read failed (a wrong URL or table, most likely).
    """
    last_read = datetime.now(timezone.utc)
    first = _frame(*_read(locks), now=last_read, interval=interval)
    if interval is None:
        console.print(first)
        return
    with Live(first, console=console, auto_refresh=False) as live:
        while not stop.wait(interval):
            now = datetime.now(timezone.utc)
            try:
                summary, body = _read(locks)
                last_read = now
            except BackendError as exc:
                summary = f"{locks.table} at {locks.url}"
                message = admin.failure(exc, table=locks.table, where=locks.url)
                body = Text(
                    f"{message}\ntrying again every {interval:g} s; "
                    f"last read at {_clock(last_read)}",
                    style="red",
                )
            live.update(_frame(summary, body, now=now, interval=interval), refresh=True)


def _read(locks: LockManager) -> tuple[str, RenderableType]:
    """The table's rows, read now, as a header's summary and ``tierlock ls``'s table."""
    holders = locks.holders()
    now = datetime.now(timezone.utc)  # after the read: no age comes out below zero
    table, where = locks.table, locks.url
    view = admin.holders_table(holders, table=table, where=where, now=now, titled=False)
    return admin.holders_title(holders, table=table, where=where), view


def _frame(
    summary: str, body: RenderableType, *, now: datetime, interval: float | None
) -> RenderableType:
    header = f"tierlock top · {summary} · {_clock(now)}"
    if interval is not None:
        header += f" · every {interval:g} s, Ctrl-C quits"
    return Group(Text(header, style="bold"), body)


def _clock(moment: datetime) -> str:
    """``moment`` on this machine's clock, as people here read it."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
