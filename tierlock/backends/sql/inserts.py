"""The insert of an exclusive hold with the process's own values in its SQL.

Of the fourteen values of ``Statements.insert_if_absent``, eight are the same at every
exclusive acquire of a process: its host, host identity, pid and start time, and the
four NULLs of a row that is no read hold or permit. Written into the SQL once per
process, they leave six parameters for the driver to convert at each acquire. Only
plain text goes into SQL (see ``columns.plain``); a process whose values are not plain
sends them all as parameters, through ``insert_if_absent``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Integer, String, cast, literal_column, null
from sqlalchemy.engine import Dialect

from ...records import Owner
from .columns import plain
from .queries import Query
from .table import HOLDER

if TYPE_CHECKING:
    from .table import Statements

__all__ = ["ExclusiveInsert", "exclusive_params"]

# What names a process in its rows: host, host identity, pid, start time (see Owner).
Process = tuple[str, str | None, int, int | None]
# Processes whose statement is kept at most (past this, the memory starts afresh).
REMEMBERED_PROCESSES = 8


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


class ExclusiveInsert:
    """``insert_if_absent`` for exclusive holds, compiled for the process that asks."""

    def __init__(self, statements: Statements, dialect: Dialect) -> None:
        self._statements = statements
        self._dialect = dialect
        # The queries compiled, by process (None: its values are not plain). More than
        # one only where owners of other processes are made up, or after forks.
        self._made: dict[Process, Query | None] = {}

    def query(self, owner: Owner) -> Query | None:
        """The statement for ``owner``'s process (parameters: ``exclusive_params``), or
        ``None`` if its values must be sent as parameters."""
        process = (owner.host, owner.host_id, owner.pid, owner.proc_start)
        try:
            return self._made[process]
        except KeyError:
            pass
        if len(self._made) >= REMEMBERED_PROCESSES:
            self._made = {}
        query = self._made[process] = self._compile(process)
        return query

    def _compile(self, process: Process) -> Query | None:
        host, host_id, pid, started = process
        try:
            values = {
                **HOLDER,
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
        except (TypeError, ValueError):  # (not plain text, or not a number)
            return None
        return Query.compile(self._statements.insert_of(values), self._dialect)
