"""The insert of an exclusive hold with the process's own values in its SQL, for one
row or for several acquires that share a statement (see ``batches``).

Of the fourteen values of ``Statements.insert_if_absent``, eight are the same at every
exclusive acquire of a process: its host, host identity, pid and start time, and the
four NULLs of a row that is no read hold or permit. Written into the SQL once per
process, they leave six parameters for the driver to convert at each acquire. Only
plain text goes into SQL (see ``columns.plain``); a process whose values are not plain
sends them all as parameters, through ``insert_if_absent``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    bindparam,
    cast,
    delete,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import ColumnElement, Insert

from ...records import Owner
from .columns import if_absent, plain
from .layout import RESERVED
from .queries import Query
from .table import holder_values, key_serialiser

if TYPE_CHECKING:
    from sqlalchemy import Table

    from .table import Statements

__all__ = ["ExclusiveInsert", "exclusive_params", "rows_params"]

# What names a process in its rows: host, host identity, pid, start time (see Owner).
Process = tuple[str, str | None, int, int | None]
# Statements kept at most (past this, the memory starts afresh): one per process and
# number of rows. More than one process only where owners of other processes are made
# up, or after forks.
REMEMBERED_STATEMENTS = 64
# ``rows``' count for ``replacing``'s statement.
REPLACING = -1


def exclusive_params(key: str, owner: Owner, ttl: float, lease: float | None) -> dict[str, Any]:
    """The parameters of ``ExclusiveInsert.query``'s statement, which also has those of
    a delete or select of the owner's row (``key``, ``owner``)."""
    return {
        "key": key,
        "owner": owner.owner_id,
        "thread": owner.thread_id,
        "thread_label": owner.thread_name,
        "ttl": ttl,
        "lease": lease,
    }


def rows_params(params: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of ``ExclusiveInsert.rows``'s statement for rows of ``params``
    (each of ``exclusive_params``), in the order given."""
    return {
        f"{name}_{index}": value
        for index, each in enumerate(params)
        for name, value in each.items()
    }


class ExclusiveInsert:
    """``insert_if_absent`` for exclusive holds, compiled for the process that asks."""

    def __init__(self, statements: Statements, dialect: Dialect, table: Table) -> None:
        self._statements = statements
        self._dialect = dialect
        self._table = table
        # The queries compiled, by process and rows (None: its values are not plain).
        self._made: dict[tuple[Process, int], Query | None] = {}

    def query(self, owner: Owner) -> Query | None:
        """The statement for ``owner``'s process (parameters: ``exclusive_params``), or
        ``None`` if its values must be sent as parameters."""
        return self.rows(owner, 0)

    def rows(self, owner: Owner, count: int) -> Query | None:
        """With ``count`` rows (0: the one-row form of ``query``), the statement that
        inserts those of ``owner``'s process whose keys are free, in the order given,
        and returns their tokens and owner ids (parameters: ``rows_params``); ``None``
        if the process's values must be sent as parameters."""
        process = (owner.host, owner.host_id, owner.pid, owner.proc_start)
        try:
            return self._made[process, count]
        except KeyError:
            pass
        if len(self._made) >= REMEMBERED_STATEMENTS:
            self._made = {}
        query = self._made[process, count] = self._compile(process, count)
        return query

    def replacing(self, owner: Owner) -> Query | None:
        """PostgreSQL: the statement that replaces the key's row reserved for writers
        (parameter ``row``: its token) with ``owner``'s, in one statement under the
        key's advisory lock, as ``takeover.take_reserved`` does in a transaction;
        parameters: ``exclusive_params`` and ``row``; the new row's token, or no row if
        the reservation is gone. ``None`` elsewhere, or if the process's values must be
        sent as parameters."""
        if self._dialect.name != "postgresql":
            return None
        return self.rows(owner, REPLACING)

    def _compile(self, process: Process, count: int) -> Query | None:
        try:
            fixed = _process_values(process)
        except (TypeError, ValueError):  # (not plain text, or not a number)
            return None
        if count == REPLACING:
            statement = self._replace_reserved({**holder_values(), **fixed})
        elif not count:
            statement = self._statements.insert_of({**holder_values(), **fixed})
        else:
            rows = [{**holder_values(f"_{index}"), **fixed} for index in range(count)]
            statement = self._insert_rows(rows)
        return Query.compile(statement, self._dialect)

    def _replace_reserved(self, values: dict[str, ColumnElement[Any]]) -> Insert:
        """See ``replacing``. The key's advisory lock comes first, as in every insert
        of the key: a reader's join holds it while it waits for the reservation."""
        table, c = self._table, self._table.c
        serialised = key_serialiser(table).cte("serialised")
        reserved = (
            (c.lock_key == bindparam("key"))
            & (c.token == bindparam("row", type_=BigInteger))
            & (c.mode == RESERVED)
            & serialised.c.locked.is_not(None)
        )
        gone = delete(table).where(reserved).returning(c.token).cte("gone")
        row = select(*(value.label(name) for name, value in values.items())).select_from(gone)
        return (
            postgresql.insert(table)
            .from_select(list(values), row)
            .on_conflict_do_nothing(index_elements=[c.lock_key])
            .returning(c.token)
        )

    def _insert_rows(self, rows: list[dict[str, ColumnElement[Any]]]) -> Insert:
        """``Statements.insert_of`` for several rows: PostgreSQL serialises each row's
        key before its token is drawn, in the order given (sorted keys keep two such
        statements from waiting for each other); MariaDB's INSERT ... SELECT holds the
        table's AUTO-INC lock to the statement's end; SQLite has one writer."""
        table, c = self._table, self._table.c
        names = list(rows[0])
        name = self._dialect.name
        if name == "sqlite":
            return (
                sqlite.insert(table)
                .values(rows)
                .on_conflict_do_nothing(index_elements=[c.lock_key])
                .returning(c.token, c.owner_id)
            )
        selects = []
        for values in rows:
            row = select(*(value.label(column) for column, value in values.items()))
            if name == "postgresql":
                row = row.select_from(key_serialiser(table, values["lock_key"]).subquery())
            selects.append(row)
        if name == "postgresql":
            return (
                postgresql.insert(table)
                .from_select(names, union_all(*selects))
                .on_conflict_do_nothing(index_elements=[c.lock_key])
                .returning(c.token, c.owner_id)
            )
        # (A duplicate's row comes back too, under its holder's owner id.)
        return if_absent(mysql.insert(table).from_select(names, union_all(*selects))).returning(
            c.token, c.owner_id
        )


def _process_values(process: Process) -> dict[str, ColumnElement[Any]]:
    """The values of a row that are the same for every exclusive hold of ``process``."""
    host, host_id, pid, started = process
    return {
        "host": plain(host),
        "pid": literal_column(str(int(pid)), Integer),
        "host_id": cast(null(), String) if host_id is None else plain(host_id),
        "proc_start": (
            cast(null(), BigInteger)
            if started is None
            else literal_column(str(int(started)), BigInteger)
        ),
        "mode": cast(null(), String),
        "members": cast(null(), Integer),
        "permits": cast(null(), Integer),
        "parent": cast(null(), BigInteger),
    }
