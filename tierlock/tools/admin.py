"""What the admin commands show and say, shared by ``tierlock``, Django's
``manage.py tierlock`` and ``flask tierlock``: the holders as a table, as plain lines for
pipes and scripts, or as JSON, and the messages of ``release`` and ``reap`` and of a
database that fails them."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import IO, Any

import click
from rich.console import Console
from rich.table import Table

from ..errors import BackendError
from ..process import is_gone
from ..records import LockInfo

__all__ = [
    "FORCE_NEEDED",
    "Failure",
    "console",
    "duration",
    "failure",
    "holder_gone",
    "holder_lines",
    "holder_record",
    "holder_state",
    "holders_table",
    "holders_title",
    "missing_table",
    "nothing_held",
    "reaped",
    "released",
    "show_holders",
]

FORCE_NEEDED = (
    "not releasing {key!r} without --force: this deletes the row whoever holds it, and a "
    "holder still at work would not know until its own release or extend raises "
    "LockLostError; a dead holder's lock frees itself when its lease ends"
)
# The plain lines' columns: the table's, one word each, and the thread's last, since a
# thread name may hold spaces; every other value is one whitespace-free word.
PLAIN_COLUMNS = (
    *("key", "mode", "token", "host", "pid", "age", "lease_left", "renewed_by", "state"),
    "thread",
)


class Failure(click.ClickException):
    """An error the user can act on, shown as one line: ``tierlock: <message>``."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: Any = None) -> None:
        click.echo(f"tierlock: {self.message}", file=file, err=True)


def console(file: IO[str] | None = None) -> Console:
    """Rich output that keeps long lines whole, so that logs and pipes read well."""
    return Console(file=file, soft_wrap=True, highlight=False)


def show_holders(holders: list[LockInfo], *, table: str, where: str, out: IO[str]) -> None:
    """What ``ls`` prints of lock table ``table`` at ``where``: the table on a terminal,
    and elsewhere (a pipe, a file) ``holder_lines``, since rich would lay the table out
    at 80 columns there and fold a long key over several lines, where a search for it
    by line finds nothing. Written to ``out`` at once, so that Django's
    ``OutputWrapper`` adds no newlines."""
    now = datetime.now(timezone.utc)  # (after the read: no age comes out below zero)
    if not holders:
        text = nothing_held(table, where) + "\n"
    elif out.isatty():
        screen = console(out)
        with screen.capture() as capture:
            screen.print(holders_table(holders, table=table, where=where, now=now))
        text = capture.get()
    else:
        text = holder_lines(holders, now=now)
    out.write(text)


def holders_table(
    holders: list[LockInfo], *, table: str, where: str, now: datetime, titled: bool = True
) -> Table:
    """``holders`` of lock table ``table`` at ``where`` (a URL, password hidden), as of
    ``now`` (UTC): expired rows in red, those of a holder gone in yellow. ``titled=False``
    leaves out the title, which counts them, for a view that says so in its own header
    (see ``holders_title``)."""
    states = [holder_state(info) for info in holders]
    notes = []
    if expired := states.count("expired"):
        notes.append(f"{expired} expired: free to take; `tierlock reap` deletes them")
    if gone := states.count("gone"):
        notes.append(f"{gone} gone: the holder exited; a waiter on this host takes it at once")
    view = Table(
        title=holders_title(holders, table=table, where=where) if titled else None,
        caption="\n".join(notes) or None,
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
    view.add_column("state")
    for info, state in zip(holders, states, strict=True):
        age, left, renewal = _times(info, now)
        view.add_row(
            info.key,
            info.mode,
            str(info.token),
            info.host,
            str(info.pid),
            info.thread_name,
            age,
            left,
            renewal,
            state,
            style={"expired": "red", "gone": "yellow"}.get(state),
        )
    return view


def holder_lines(holders: list[LockInfo], *, now: datetime) -> str:
    """``holders`` for pipes and scripts: a header, then one line per hold with every
    value whole, in columns padded with spaces (``PLAIN_COLUMNS``), however long the
    lines get. Durations lose their spaces (``4.2s``), and control characters (a newline
    in a key, say) are escaped as Python writes them, so that a hold never takes two
    lines."""
    rows: list[tuple[str, ...]] = [PLAIN_COLUMNS]
    for info in holders:
        times = (text.replace(" ", "") for text in _times(info, now))
        cells = (info.key, info.mode, str(info.token), info.host, str(info.pid), *times)
        rows.append(tuple(map(_one_line, (*cells, holder_state(info), info.thread_name))))
    widths = [max(len(row[column]) for row in rows) for column in range(len(PLAIN_COLUMNS) - 1)]
    lines = []
    for *first, last in rows:  # (the last column is not padded: no trailing spaces)
        padded = [cell.ljust(width) for cell, width in zip(first, widths, strict=True)]
        lines.append("   ".join([*padded, last]) + "\n")
    return "".join(lines)


def holder_state(info: LockInfo) -> str:
    """``"expired"``: the lease has ended, and anyone may take the row; ``"gone"``: the
    holder was a process of this host, now proven exited, so a waiter here takes the row
    over at once rather than waiting out the lease; ``"held"`` otherwise."""
    if info.expired:
        return "expired"
    return "gone" if holder_gone(info) else "held"


def holder_gone(info: LockInfo) -> bool:
    """Whether ``info``'s holder process is proven gone (see ``tierlock.process``)."""
    return is_gone(info.host_id, info.pid, info.process_start)


def _times(info: LockInfo, now: datetime) -> tuple[str, str, str]:
    """The hold's age, its lease left and what the heartbeat renews it by, for people."""
    age = duration((now - info.acquired_at).total_seconds())
    left = "expired" if info.expired else duration((info.expires_at - now).total_seconds())
    return age, left, "fixed" if info.lease is None else duration(info.lease)


def _one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``), so that it fits one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def holders_title(holders: list[LockInfo], *, table: str, where: str) -> str:
    return f"{len(holders)} lock(s) in {table} at {where}"


def holder_record(info: LockInfo) -> dict[str, Any]:
    """``info`` as a JSON object: every field of ``LockInfo``, times in ISO 8601 (UTC),
    and ``holder_gone`` (see ``holder_state``), which only this host can tell."""
    record = dataclasses.asdict(info)
    for name, value in record.items():
        if isinstance(value, datetime):
            record[name] = value.isoformat()
    record["holder_gone"] = holder_gone(info)
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
