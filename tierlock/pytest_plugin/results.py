"""Where the outcomes of run-once functions wait for the run's other processes: a
table beside the lock table, ``<table>_once``, one row per run and key.

A row is written once, by the process that ran the function while holding the key's
lock, so no two processes ever write one; readers read it under the same lock. Each
run deletes its rows when it ends; rows of runs that never got there (a killed
controller) or that share their id across machines go a day later.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from sqlalchemy import Boolean, Column, Float, MetaData, String, Table, Text, create_engine
from sqlalchemy.dialects import mysql

from ..backends.sql.columns import LockKeyType
from ..errors import LockError
from ..manager import LockManager
from ..urls import engine_of, hide_password, sql_url

__all__ = ["Outcome", "Results"]

KEPT = 24 * 3600.0  # seconds that rows of runs which did not delete theirs are kept
_BODY = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


class Outcome(NamedTuple):
    failed: bool
    body: str  # the result as JSON, or the traceback the function raised
    made_by: str  # the process that ran the function, for messages


class Results:
    """The outcome table on one database."""

    def __init__(self, url: str, table: str) -> None:
        if engine_of(url) != "sql":
            raise LockError(
                f"tierlock_once keeps its results in a SQL table beside the locks, and "
                f"{hide_password(url)} is not a SQL database: give one as --tierlock-url"
            )
        self.engine = create_engine(sql_url(url))  # mysql:// takes PyMySQL, as the locks do
        self.table = Table(
            f"{table}_once",
            MetaData(),
            # Both compared exactly, as lock keys are (case, trailing spaces and all).
            Column("run_id", LockKeyType(), primary_key=True),
            Column("lock_key", LockKeyType(), primary_key=True),
            Column("failed", Boolean, nullable=False),
            Column("body", _BODY, nullable=False),
            Column("made_by", String(255), nullable=False),
            Column("made_at", Float, nullable=False),  # time.time() of the maker
            mysql_charset="utf8mb4",
        )

    def prepare(self, manager: LockManager) -> None:
        """Create the table if missing and drop rows past ``KEPT``; under a lock, as
        the run's processes all arrive here at once."""
        with manager.lock(f"{self.table.name}:prepare"), self.engine.begin() as connection:
            self.table.create(connection, checkfirst=True)
            connection.execute(self.table.delete().where(self.table.c.made_at < time.time() - KEPT))

    def get(self, run_id: str, key: str) -> Outcome | None:
        columns = self.table.c
        query = self.table.select().where(columns.run_id == run_id, columns.lock_key == key)
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else Outcome(row.failed, row.body, row.made_by)

    def put(self, run_id: str, key: str, outcome: Outcome) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                self.table.insert().values(
                    run_id=run_id, lock_key=key, made_at=time.time(), **outcome._asdict()
                )
            )

    def forget(self, run_id: str) -> None:
        with self.engine.begin() as connection:
            if self.engine.dialect.has_table(connection, self.table.name):
                connection.execute(self.table.delete().where(self.table.c.run_id == run_id))

    def close(self) -> None:
        self.engine.dispose()
