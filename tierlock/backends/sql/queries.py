"""Statements compiled once for the driver, so that running one costs no SQLAlchemy
work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import ClauseElement

if TYPE_CHECKING:
    from .shared import SharedStatements
    from .table import Statements

__all__ = ["Queries", "Query"]


class Query(NamedTuple):
    """A statement compiled once for the driver, so that running it costs no
    SQLAlchemy work: its SQL, the values of parameters fixed in the statement (such
    as a LIMIT), and the order of parameters for drivers that take them by position
    (``None``: by name)."""

    sql: str
    fixed: dict[str, Any]
    order: tuple[str, ...] | None

    @classmethod
    def compile(cls, statement: ClauseElement, dialect: Dialect) -> Query:
        compiled = statement.compile(dialect=dialect)
        fixed = {name: value for name, value in compiled.params.items() if value is not None}
        order = getattr(compiled, "positiontup", None)
        return cls(compiled.string, fixed, None if order is None else tuple(order))

    def arguments(self, params: dict[str, Any]) -> Any:
        if self.fixed:
            params = {**self.fixed, **params}
        return params if self.order is None else tuple(params[name] for name in self.order)


class Queries:
    """Every statement of :class:`Statements`, compiled for one dialect; the statements
    for a list of rows are compiled for sizes that are powers of two, when first used."""

    # The most rows one listed statement names; longer lists are sent in parts.
    MOST_LISTED = 512

    def __init__(self, statements: Statements | SharedStatements, dialect: Dialect) -> None:
        for name, statement in vars(statements).items():
            if isinstance(statement, ClauseElement):
                setattr(self, name, Query.compile(statement, dialect))
        self._statements = statements
        self._dialect = dialect
        self._listed: dict[tuple[str, int], Query] = {}

    def listed(self, name: str, count: int) -> tuple[Query, int]:
        """Statement ``name`` of :class:`Statements` for ``count`` rows (at most
        ``MOST_LISTED``), and the number of places it has."""
        size = 1 << (count - 1).bit_length()
        query = self._listed.get((name, size))
        if query is None:
            statement = getattr(self._statements, name)(size)
            query = self._listed[name, size] = Query.compile(statement, self._dialect)
        return query, size

    insert_if_absent: Query
    serialise_key: Query | None = None
    rename_row: Query | None = None
    notify_forced: Query | None = None
    select_holder: Query
    delete_expired_row: Query
    delete_row: Query
    delete_owned: Query
    delete_owned_quietly: Query | None = None
    extend_owned: Query
    handoff_owned: Query
    record_holder: Query
    select_owned_token: Query
    select_live: Query
    select_info: Query
    select_all: Query
    delete_key: Query
    delete_expired_batch: Query
    session_alive: Query
