"""The database and lock table an admin command works on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ..backends.basics import check_table_name
from ..backends.sql.engine import refuse_memory_database
from ..base import DEFAULT_DATABASE_TIMEOUT, DEFAULT_TABLE, DEFAULT_URL
from ..manager import LockManager
from ..urls import KNOWN_SCHEMES, engine_of, hide_password, shown_url, sql_url
from . import admin

__all__ = ["Target"]


@dataclasses.dataclass
class Target:
    """The database and lock table a command works on, and ``--timeout`` if given."""

    url: str = DEFAULT_URL
    table: str = DEFAULT_TABLE
    timeout: float | None = None

    def database_timeout(self, default: float = DEFAULT_DATABASE_TIMEOUT) -> float:
        """The managers' ``database_timeout``: ``--timeout``, else the command's ``default``."""
        return default if self.timeout is None else self.timeout

    def check(self) -> None:
        """Fail with one line if the URL (in-memory SQLite too) or the table name cannot be used."""
        if self.sql:
            try:
                make_url(self.url)
            except (ArgumentError, ValueError):
                raise admin.Failure(
                    f"not a database URL: {hide_password(self.url)} (schemes: {KNOWN_SCHEMES})"
                ) from None
            refuse_memory_database(self.parsed)
        check_table_name(self.table)

    @property
    def sql(self) -> bool:
        return engine_of(self.url) == "sql"

    @property
    def parsed(self) -> URL:
        """The URL the SQL engine uses: with its default driver (``mysql+pymysql``)."""
        return sql_url(self.url)

    @property
    def shown(self) -> str:
        """The URL with its password hidden, fit to print."""
        return shown_url(self.url)

    def manager(self, default_timeout: float = DEFAULT_DATABASE_TIMEOUT) -> LockManager:
        """A manager for admin work: it neither creates the table nor reaps by itself;
        ``default_timeout`` is its ``database_timeout`` unless ``--timeout`` is given."""
        parsed = self.parsed if self.sql else None
        # Opening a missing SQLite file would create an empty one. (Where none can be
        # created, SQLite's own error says that the database is out of reach.)
        sqlite_file = parsed.database if parsed and parsed.get_backend_name() == "sqlite" else None
        if sqlite_file and not Path(sqlite_file).exists() and Path(sqlite_file).parent.is_dir():
            raise admin.Failure(admin.missing_table(self.table, self.shown))
        return LockManager(
            self.url,
            table=self.table,
            create_table=False,
            reaper_interval=None,
            database_timeout=self.database_timeout(default_timeout),
        )
