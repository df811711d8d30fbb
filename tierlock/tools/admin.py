"""What the admin commands show and say, shared by ``tierlock``, Django's
``manage.py tierlock`` and ``flask tierlock``: the holders as a table or as JSON, and
the messages of ``release`` and ``reap`` and of a database that fails them."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..errors import BackendError
from ..records import LockInfo

__all__ = [
    "FORCE_NEEDED",
    "Failure",
    "console",
    "duration",
    "failure",
    "holder_record",
    "holders_table",
    "holders_title",
    "missing_table",
    "nothing_held",
    "reaped",
    "released",
]

FORCE_NEEDED = (
    "not releasing {key!r} without --force: this deletes the row whoever holds it, and a "
    "holder still at work would not know until its own release or extend raises "
    "LockLostError; a dead holder's lock frees itself when its lease ends"
)


class Failure(click.ClickException):
    """An error the user can act on, shown as one line: ``tierlock: <message>``."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: Any = None) -> None:
        click.echo(f"tierlock: {self.message}", file=file, err=True)


def console() -> Console:
    """Rich output that keeps long lines whole, so that logs and pipes read well."""
    return Console(soft_wrap=True, highlight=False)


def holders_table(
    holders: list[LockInfo], *, table: str, where: str, now: datetime, titled: bool = True
) -> Table:
    """``holders`` of lock table ``table`` at ``where`` (a URL, password hidden), as of
    ``now`` (UTC): expired rows in red. ``titled=False`` leaves out the title, which
    counts them, for a view that says so in its own header (see ``holders_title``)."""
    expired = sum(info.expired for info in holders)
    view = Table(
        title=holders_title(holders, table=table, where=where) if titled else None,
        caption=(
            f"{expired} expired: free to take; `tierlock reap` deletes them" if expired else None
        ),
    )
    view.add_column("key", overflow="fold")
    view.add_column("mode")
    view.add_column("token", justify="right")
    view.add_column("host")
    view.add_column("pid", justify="right")
    view.add_column("thread")
    view.add_column("age", justify="right")
    view.add_column("lease left", justify="right")
    view.add_column("renewed by", justify="right")
    for info in holders:
        age = duration((now - info.acquired_at).total_seconds())
        left = "expired" if info.expired else duration((info.expires_at - now).total_seconds())
        view.add_row(
            info.key,
            info.mode,
            str(info.token),
            info.host,
            str(info.pid),
            info.thread_name,
            age,
            left,
            "fixed" if info.lease is None else duration(info.lease),
            style="red" if info.expired else None,
        )
    return view


def holders_title(holders: list[LockInfo], *, table: str, where: str) -> str:
    return f"{len(holders)} lock(s) in {table} at {where}"


def holder_record(info: LockInfo) -> dict[str, Any]:
    """``info`` as a JSON object: every field of ``LockInfo``, times in ISO 8601 (UTC)."""
    record = dataclasses.asdict(info)
    for name, value in record.items():
        if isinstance(value, datetime):
            record[name] = value.isoformat()
    return record


def duration(seconds: float) -> str:
    """``seconds`` for people: ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def nothing_held(table: str, where: str) -> str:
    return f"no locks in table {table} at {where}"


def released(key: str, done: bool) -> str:
    return f"released {key!r}" if done else f"{key!r} was not held; nothing to release"


def reaped(count: int, table: str) -> str:
    return f"reaped {count} expired lock(s) from {table}"


def missing_table(table: str, where: str) -> str:
    return f"table {table} does not exist in {where}; run `tierlock init`"


def failure(error: BackendError, *, table: str, where: str) -> str:
    """What to tell of ``error`` from lock table ``table`` at ``where``: how to make a
    missing table, since that is the usual first mistake, or else the database's words."""
    return missing_table(table, where) if _is_missing_table(error) else f"{where}: {error}"


def _is_missing_table(error: BackendError) -> bool:
    """Whether the database said the table does not exist."""
    orig = getattr(error.__cause__, "orig", None)
    return (
        getattr(orig, "sqlstate", None) == "42P01"  # PostgreSQL: undefined_table
        or (orig is not None and orig.args[:1] == (1146,))  # MySQL: ER_NO_SUCH_TABLE
        or str(orig).startswith("no such table")  # SQLite
    )
