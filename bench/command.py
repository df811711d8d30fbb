"""What every benchmark command shares: the servers it runs on (found reachable, a lock
table or namespace made and dropped, holds left counted), its common options, the
machine it ran on, and where its report goes."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import tierlock

from . import engines

DATABASES: dict[str, str | None] = {
    "sqlite": None,  # a file in a temporary directory
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
}
REDIS_URL = "redis://127.0.0.1:6379/0"
# The engines that are not SQL databases, which ``python -m bench`` runs on beside them.
LOCK_SERVERS: dict[str, str | None] = {
    "redis": REDIS_URL,
    "zookeeper": "zookeeper://127.0.0.1:2181/tierlock",
    "file": None,  # a directory in a temporary directory
}
ENGINES = {**DATABASES, **LOCK_SERVERS}


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def add_db_option(
    parser: argparse.ArgumentParser, known: Mapping[str, str | None] = DATABASES
) -> None:
    parser.add_argument(
        "--db", action="append", choices=sorted(known), help="engine (repeatable; all)"
    )


def cell_parser(
    prog: str,
    description: str,
    implementations: Sequence[str],
    scenarios: Sequence[str],
    known: Mapping[str, str | None] = DATABASES,
) -> argparse.ArgumentParser:
    """A benchmark of cells' parser with its first options: which of the ``known``
    engines (name to default URL; and their URLs), implementations and scenarios, how
    long each cell runs and how often. :func:`parse_cell_args` adds the last."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.set_defaults(known=dict(known))
    add_db_option(parser, known)
    parser.add_argument(
        "--dburi", action="append", default=[], metavar="NAME=URL", help="URL for engine NAME"
    )
    parser.add_argument(
        "--impl", action="append", choices=implementations, help="implementation (repeatable; all)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=scenarios, help="scenario (repeatable; all)"
    )
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per cell (3)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="of each cell (3)")
    return parser


def parse_cell_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Adds ``--table``, parses ``argv``, and sets ``args.urls``: each engine's URL,
    ``--dburi``'s or the default (None: SQLite's file or the lock directory in a scratch
    directory, see :func:`scratch_url`)."""
    parser.add_argument(
        "--table",
        default=f"bench_{uuid.uuid4().hex[:12]}",
        help="lock table (Redis: key prefix; ZooKeeper: node; file: directory), created "
        "and dropped on each engine (default: a random name)",
    )
    args = parser.parse_args(argv)
    urls = dict(args.known)
    for item in args.dburi:
        name, _, url = item.partition("=")
        if name not in urls or not url:
            parser.error(f"--dburi takes NAME=URL with NAME in {sorted(urls)}")
        urls[name] = url
    args.urls = urls
    return args


def unreachable(url: str) -> str | None:
    """Why the database, Redis or ZooKeeper server or lock directory at ``url`` cannot be
    used, or None."""
    if not engines.is_sql(url):
        return engines.unreachable(url)
    try:
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        return f"cannot use {make_url(url).render_as_string(hide_password=True)}: {exc}"
    return None


def rows_in(url: str, table: str) -> int:
    """How many rows ``table`` holds (Redis, ZooKeeper, lock directory: holds it lists);
    deletes them, so the next cell starts clean."""
    if not engines.is_sql(url):
        return engines.holds_left(url, table)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            count: int = connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
            if count:
                connection.execute(text(f"DELETE FROM {table}"))
        return count
    finally:
        engine.dispose()


def drop(url: str, table: str) -> None:
    """Drop ``table``; on Redis, ZooKeeper and a lock directory, remove its namespace
    and its peers'."""
    if not engines.is_sql(url):
        engines.drop_namespace(url, table)
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        engine.dispose()


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in cpuinfo
                    if line.startswith("model name")
                ),
                model,
            )
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({model}), "
        f"load average {load()} at the start"
    )


def load() -> str:
    """The load averages now."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def servers(
    args: argparse.Namespace, scratch: Path, redis_wanted: bool
) -> tuple[dict[str, str], str | None, list[str]]:
    """The URLs of the engines (by name, those ``args.urls`` knows) and of the Redis
    server that ``redis_wanted`` asks for, that can be used, and a note for each that
    cannot. SQLite's and the lock directory's default: in ``scratch``."""
    urls: dict[str, str] = {}
    skipped: list[str] = []
    for name in args.urls:
        if args.db and name not in args.db:
            continue
        url = args.urls[name] or scratch_url(name, scratch)
        reason = unreachable(url)
        if reason is None:
            urls[name] = url
        else:
            skipped.append(f"{name}: {reason}")
    redis_url: str | None = None
    if redis_wanted:
        reason = unreachable(REDIS_URL)
        if reason is None:
            redis_url = REDIS_URL
        else:
            skipped.append(f"redis: {reason}")
    return urls, redis_url, skipped


def scratch_url(name: str, scratch: Path) -> str:
    """The URL of engine ``name`` (SQLite or a lock directory) kept in ``scratch``."""
    return f"file://{scratch / 'locks'}" if name == "file" else f"sqlite:///{scratch / 'bench.db'}"


@contextlib.contextmanager
def lock_tables(urls: Iterable[str], table: str) -> Iterator[None]:
    """``table`` created on each engine for the block and dropped after it."""
    urls = list(urls)
    try:
        for url in urls:
            engines.prepare(url)
            tierlock.LockManager(url, table=table, reaper_interval=None).close()
        yield
    finally:
        for url in urls:
            drop(url, table)


class Started:
    """When and where a benchmark's run started, for its report's header."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.host = machine()

    def header(
        self, title: str, details: Sequence[str], skipped: Sequence[str], load_at_end: bool
    ) -> list[str]:
        """The report's head: ``title``, the date and wall time, the machine (and the load
        now, if ``load_at_end``), ``details`` (lines of their own) and what was skipped."""
        wall = time.monotonic() - self.began
        host = f"{self.host}, {load()} at the end" if load_at_end else self.host
        return [
            f"# {title}",
            "",
            f"- date: {self.date}; wall time {wall / 60:.1f} min",
            f"- machine: {host}",
            *details,
            *(f"- skipped: {note}" for note in skipped),
            "",
        ]


def publish(lines: list[str], output: Path) -> None:
    """Print the report and write it to ``output``."""
    report = "\n".join(lines)
    print(report)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report, encoding="utf-8")
