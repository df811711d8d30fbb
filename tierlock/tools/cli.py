"""The ``tierlock`` command: the demo, and the lock table's admin commands.

Exit codes: 0 success; 1 the database, the table or the demo failed (one line on
stderr saying why); 2 bad usage, including ``release`` without ``--force``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

import click
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from .. import __version__
from ..backends.sql.ddl import table_ddl
from ..base import DEFAULT_DATABASE_TIMEOUT, DEFAULT_TABLE, DEFAULT_URL
from ..errors import BackendError, LockError
from ..manager import LockManager
from . import admin
from .demo import (
    DEFAULT_ACCOUNTS,
    DEFAULT_PROCESSES,
    DEFAULT_SECONDS,
    DEFAULT_THREADS,
    DemoConfig,
    run_demo,
)
from .demo_report import report
from .target import Target
from .top import DATABASE_TIMEOUT, watch

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

URL_ENV = "TIERLOCK_URL"
TABLE_ENV = "TIERLOCK_TABLE"


class Group(click.Group):
    """Turns the errors a user can cause or fix into one line on stderr, no traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BackendError as exc:
            target = ctx.find_object(Target) or Target()
            raise admin.Failure(admin.failure(exc, table=target.table, where=target.shown)) from exc
        except (LockError, ValueError, TypeError, SQLAlchemyError) as exc:
            raise admin.Failure(str(exc)) from exc


def _override(name: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def store(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            setattr(ctx.ensure_object(Target), name, value)

    return store


def target_options(command: F) -> F:
    """``--url`` and ``--table`` after the subcommand too: ``tierlock demo --url ...``."""
    for name in ("table", "url"):
        option = click.option(
            f"--{name}",
            metavar="URL" if name == "url" else "NAME",
            callback=_override(name),
            expose_value=False,
            help=f"Overrides tierlock --{name}.",
        )
        command = option(command)
    return command


def pass_target(command: Callable[..., None]) -> Callable[..., None]:
    """Call ``command(target, ...)`` once the URL and table name are known to be sound."""

    @functools.wraps(command)
    def with_target(*args: Any, **kwargs: Any) -> None:
        target = click.get_current_context().ensure_object(Target)
        target.check()
        command(target, *args, **kwargs)

    return with_target


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, "--version", prog_name="tierlock", message="%(prog)s %(version)s"
)
@click.option(
    "--url",
    metavar="URL",
    envvar=URL_ENV,
    default=DEFAULT_URL,
    show_default=True,
    show_envvar=True,
    help=(
        "Where the locks live: sqlite:///FILE, mysql+pymysql://..., postgresql+psycopg://..., "
        "redis://..., zookeeper://..., file:///DIR"
    ),
)
@click.option(
    "--table",
    metavar="NAME",
    envvar=TABLE_ENV,
    default=DEFAULT_TABLE,
    show_default=True,
    show_envvar=True,
    help="The lock table's name.",
)
@click.option(
    "--timeout",
    metavar="SECONDS",
    type=click.FloatRange(0, min_open=True),
    help=f"Seconds an admin command's database operation may keep failing (default "
    f"{DEFAULT_DATABASE_TIMEOUT:g}; top: 2); connecting gives up after half, at most 5 s.",
)
@click.pass_context
def main(ctx: click.Context, url: str, table: str, timeout: float | None) -> None:
    """tierlock: distributed locks in a SQL table (or Redis, ZooKeeper, a lock directory).

    Start with `tierlock demo`. Exit codes: 0 success; 1 the database, the table or the
    demo failed; 2 bad usage.
    """
    ctx.obj = Target(url, table, timeout)
    # The commands say what they did themselves; without a handler, the library's
    # warnings (a force-release, a reap) would reach stderr through logging's last resort.
    library_logger = logging.getLogger("tierlock")
    if not library_logger.handlers:
        library_logger.addHandler(logging.NullHandler())


# -- demo ------------------------------------------------------------------------


@main.command("demo")
@target_options
@click.option(
    "--processes",
    type=click.IntRange(1),
    default=DEFAULT_PROCESSES,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=DEFAULT_THREADS,
    show_default=True,
    help="Threads per process.",
)
@click.option(
    "--accounts",
    type=click.IntRange(2),
    default=DEFAULT_ACCOUNTS,
    show_default=True,
    help="Accounts to move money between.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0, min_open=True),
    default=DEFAULT_SECONDS,
    show_default=True,
    help="How long each run lasts.",
)
@pass_target
def demo_command(
    target: Target, processes: int, threads: int, accounts: int, seconds: float
) -> None:
    """Money transfers between accounts, guarded by tierlock, then unguarded.

    Worker processes move random amounts between accounts kept in table
    TABLE_demo_accounts, taking both accounts' locks for each transfer; then they do it
    again without locks. The summary compares the totals (conserved only with the lock),
    the rate, the lock statistics and the lock wait. Exits 1 if the guarded run lost money.
    """
    if target.timeout is not None:
        raise click.UsageError(
            "--timeout is for the admin commands; the demo runs with the default"
        )
    console = Console(highlight=False)
    config = DemoConfig(target.url, target.table, processes, threads, accounts, seconds)
    guarded, unguarded = run_demo(config, console)
    code = report(config, guarded, unguarded, console)
    if code:
        raise click.exceptions.Exit(code)


# -- admin -----------------------------------------------------------------------


@main.command()
@target_options
@click.option(
    "--print-sql",
    is_flag=True,
    help="Print the table's DDL for the URL's database instead of creating it.",
)
@pass_target
def init(target: Target, print_sql: bool) -> None:
    """Create the lock table (and its index) if it does not exist."""
    if not target.sql:
        if print_sql:
            raise admin.Failure(f"--print-sql is for SQL databases, not {target.shown}")
        # Reaching the engine is all there is to it (a lock directory is made).
        with LockManager(
            target.url,
            table=target.table,
            reaper_interval=None,
            database_timeout=target.database_timeout(),
        ):
            pass
        admin.console().print(f"{target.shown} needs no table: namespace {target.table} is ready")
        return
    if print_sql:
        try:
            click.echo(table_ddl(target.parsed, target.table, target.database_timeout()))
        except ValueError as exc:
            raise admin.Failure(f"cannot use {target.shown}: {exc}") from exc
        return
    with LockManager(
        target.url,
        table=target.table,
        reaper_interval=None,
        database_timeout=target.database_timeout(),
    ):
        pass
    admin.console().print(f"table {target.table} is ready in {target.shown}")


@main.command("ls")
@target_options
@click.option("--json", "as_json", is_flag=True, help="A JSON array, an object per row.")
@pass_target
def list_holders(target: Target, as_json: bool) -> None:
    """List the lock table's rows: who holds what, and for how long (away from a
    terminal, one plain line per row)."""
    with target.manager() as locks:
        holders = locks.holders()
    if as_json:
        click.echo(json.dumps([admin.holder_record(info) for info in holders], indent=2))
        return
    admin.show_holders(holders, table=target.table, where=target.shown, out=sys.stdout)


@main.command()
@target_options
@click.option(
    "--interval",
    type=click.FloatRange(0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between two reads of the table.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@pass_target
def top(target: Target, interval: float, once: bool) -> None:
    """A live view of the lock table's rows, until Ctrl-C or SIGTERM."""
    with target.manager(DATABASE_TIMEOUT) as locks, _stop_on_signals() as stop:
        watch(locks, Console(highlight=False), interval=None if once else interval, stop=stop)


@main.command()
@target_options
@click.argument("key")
@click.option("--force", is_flag=True, help="Really delete the row, whoever holds it.")
@pass_target
def release(target: Target, key: str, force: bool) -> None:
    """Delete KEY's lock row, whoever holds it."""
    if not force:
        raise click.UsageError(admin.FORCE_NEEDED.format(key=key))
    with target.manager() as locks:
        released = locks.force_release(key)
    admin.console().print(admin.released(key, released))


@main.command()
@target_options
@click.option(
    "--every",
    type=click.FloatRange(0, min_open=True),
    metavar="SECONDS",
    help="Keep running, reaping every SECONDS, until SIGTERM or SIGINT.",
)
@pass_target
def reap(target: Target, every: float | None) -> None:
    """Delete the rows whose lease has ended, once or as a service."""
    console = admin.console()
    with target.manager() as locks:
        count = locks.reap()
        console.print(admin.reaped(count, target.table))
        if every is None:
            return
        with _stop_on_signals() as stop:
            # Printed once the handlers are in place: a signal from now on stops cleanly.
            console.print(
                f"reaping {target.table} at {target.shown} every {every:g} s; "
                "stop with SIGTERM or Ctrl-C"
            )
            while not stop.wait(every):
                try:
                    count = locks.reap()
                except BackendError as exc:
                    # A service outlives a database that is briefly away.
                    admin.Failure(f"reap failed: {exc}").show()
                    continue
                if count:
                    console.print(f"reaped {count} expired lock(s)")
        console.print("stopped")


class _SignalStop:
    """Set by a signal handler, waited for by the main thread.

    Not a ``threading.Event``: a handler runs in the main thread between any two of its
    bytecodes, also while ``Event.wait`` holds the event's lock, and its ``set`` would
    then wait for that lock for ever. Writing a byte to a pipe takes no lock."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # (set already: the pipe is full)
            os.write(self._write, b"x")

    def wait(self, timeout: float) -> bool:
        """Whether it is set, waiting up to ``timeout`` seconds."""
        readable, _, _ = select.select([self._read], [], [], timeout)
        return bool(readable)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[_SignalStop]:
    """A stop that SIGTERM and SIGINT set; the previous handlers come back after."""
    stop = _SignalStop()

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop.close()
