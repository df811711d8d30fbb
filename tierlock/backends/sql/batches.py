"""The statements that threads of a process share (see ``combining``): inserts of
exclusive holds (``INSERT ... RETURNING`` the rows inserted) and releases (``DELETE
... RETURNING`` the rows deleted), each in a ``Lane`` of its own.

A shared statement is tried once. If it fails, or was never sent, each thread goes its
own way (``ALONE``): the one-row statement, retried as ``Runner.run`` does, and after a
failure that may have taken effect, starting with a check by owner id. A thread that
left (interrupted) while its insert was under way has its row swept away (``discard``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam, case, delete, func, select
from sqlalchemy.sql.expression import ColumnElement

from ...records import Owner
from ..basics import fencing_token
from .columns import MYSQL_FAMILY, plain
from .combining import Lane
from .inserts import ExclusiveInsert, rows_params
from .link import Link
from .queries import Query
from .running import SPARE_CONNECTIONS, Runner, Unshared
from .table import listed

if TYPE_CHECKING:
    from .backend import SQLBackend

__all__ = ["ALONE", "UNSURE", "Batches", "Insert", "Inserted", "Release", "Released"]

# Threads whose statements one shared statement carries at most.
MOST_SHARED = 32
# Statements of a kind (inserts, releases) under way at once, each for one thread, before
# the threads that come next share one: as many as the connections the runner keeps at
# hand. Measured on MariaDB (2 cores, 1000 keys, medians): 4 processes of 4 threads
# sharing beyond one statement ran 0.48x the bare cursor's sections/s against 0.54-0.61x
# alone; 32 threads of one process ran 1.35-1.4x the sections with 4, 1.5x with 1.
WIDTH = SPARE_CONNECTIONS


class Way(enum.Enum):
    ALONE = "alone"  # nothing is known: send the one-row statement, retried
    UNSURE = "unsure"  # the statement may have taken effect: check, then send


ALONE, UNSURE = Way.ALONE, Way.UNSURE


class Insert(NamedTuple):
    """An exclusive acquire's insert: ``params`` of ``exclusive_params``; SQLite's
    busy wait at most ``limit``."""

    key: str
    owner: Owner
    params: dict[str, Any]
    limit: float | None


class Release(NamedTuple):
    """A release of ``owner_id``'s row of ``key``; ``announce``: wake pollers elsewhere
    (PostgreSQL's NOTIFY)."""

    key: str
    owner_id: str
    announce: bool


# An insert's answer: the fencing token won, None (the key is held), or ALONE.
Inserted = int | None | Way
# A release's answer: whether the row was ours and is gone, ALONE or UNSURE.
Released = bool | Way


class Batches:
    """The shared inserts and releases of one backend."""

    def __init__(self, backend: SQLBackend, runner: Runner, exclusive: ExclusiveInsert) -> None:
        self._backend = backend
        self._runner = runner
        self._exclusive = exclusive
        self._dialect = runner.dialect
        self._deletes: dict[int, Query] = {}
        self.inserts: Lane[Insert, Inserted] = Lane(
            self._send_inserts,
            self._undo_inserts,
            unsent=ALONE,
            unsure=ALONE,
            most=MOST_SHARED,
            width=WIDTH,
        )
        self.releases: Lane[Release, Released] = Lane(
            self._send_releases, _keep, unsent=ALONE, unsure=UNSURE, most=MOST_SHARED, width=WIDTH
        )

    @property
    def shared(self) -> bool:
        """Whether the database says which rows a multi-row statement inserted or
        deleted (MariaDB from 10.5, which the dialect knows once it has connected; not
        MySQL): if not, each thread sends its own statements, side by side."""
        dialect = self._dialect
        return dialect.name not in MYSQL_FAMILY or bool(
            dialect.insert_returning and dialect.delete_returning
        )

    def after_fork(self) -> None:
        self.inserts.after_fork()
        self.releases.after_fork()

    # -- inserts -----------------------------------------------------------------

    def _send_inserts(self, requests: Sequence[Insert]) -> list[Inserted]:
        owners = [request.owner.owner_id for request in requests]
        try:
            tokens = self._runner.once(
                "acquire", len(requests), lambda link: self._insert_rows(link, requests), owners
            )
        except Unshared:
            tokens = None
        if tokens is None:
            return [ALONE] * len(requests)
        return [
            None if (token := tokens.get(owner)) is None else fencing_token(token, 0)
            for owner in owners
        ]

    def _insert_rows(self, link: Link, requests: Sequence[Insert]) -> dict[str, int] | None:
        """Insert the rows of ``requests`` in one statement: raw tokens by owner id of
        those that won; ``None`` if they cannot share one (their processes' values
        differ)."""
        backend = self._backend
        first = requests[0].owner
        query = self._exclusive.rows(first, 0 if len(requests) == 1 else len(requests))
        if query is None or any(
            (each.owner.host, each.owner.host_id, each.owner.pid, each.owner.proc_start)
            != (first.host, first.host_id, first.pid, first.proc_start)
            for each in requests
        ):
            return None
        limits = [each.limit for each in requests if each.limit is not None]
        backend.limit_busy_wait(link, min(limits) if limits else None)
        if len(requests) == 1:
            request = requests[0]
            token = backend.insert_row(link, request.params, query)
            won = {} if token is None else {request.owner.owner_id: token}
        else:
            ordered = sorted(requests, key=lambda each: each.key)  # (see ExclusiveInsert)
            params = rows_params([each.params for each in ordered])
            mine = {each.owner.owner_id for each in requests}  # (not a duplicate's holder)
            rows = link.execute(query, params).rows
            won = {owner: token for token, owner in rows if owner in mine}
            counters = backend.counters
            counters.add("shared_statements")
            counters.add("inserts", len(won))
            counters.add("insert_conflicts", len(requests) - len(won))
        if won and backend.closed:
            # Won just as the manager closed: nobody will hold them.
            for request in requests:
                if request.owner.owner_id in won:
                    link.count(backend.queries.delete_owned, request.params)
            return {}
        return won

    def _undo_inserts(self, requests: Sequence[Insert], answers: Sequence[Inserted]) -> None:
        for request in requests:
            # (Won or unsure alike: a row left in doubt is swept once its session ends.)
            self._backend.discard(request.key, request.owner.owner_id, certain=True)

    # -- releases ----------------------------------------------------------------

    def _send_releases(self, requests: Sequence[Release]) -> list[Released]:
        try:
            gone = self._runner.once(
                "release", len(requests), lambda link: self._delete_rows(link, requests)
            )
        except Unshared as exc:
            return [UNSURE if exc.unsure else ALONE] * len(requests)
        return [request.owner_id in gone for request in requests]

    def _delete_rows(self, link: Link, requests: Sequence[Release]) -> set[str]:
        """Delete the rows of ``requests`` in one statement; the owner ids of those
        that were still ours."""
        queries = self._backend.queries
        if len(requests) == 1:
            alone = requests[0]
            quietly = queries.delete_owned_quietly
            one = queries.delete_owned if alone.announce or quietly is None else quietly
            mine = {"key": alone.key, "owner": alone.owner_id}
            return {alone.owner_id} if link.count(one, mine) == 1 else set()
        size = 1 << (len(requests) - 1).bit_length()
        query = self._deletes.get(size)
        if query is None:
            query = self._deletes[size] = Query.compile(self._delete_rows_of(size), self._dialect)
        channel = self._backend.sql.channel
        params: dict[str, Any] = {}
        for index in range(size):
            request = requests[index] if index < len(requests) else None
            params[f"k{index}"] = "" if request is None else request.key
            params[f"o{index}"] = "" if request is None else request.owner_id
            if channel is not None:
                params[f"n{index}"] = request.key if request and request.announce else ""
        self._backend.counters.add("shared_statements")
        return {row[0] for row in link.execute(query, params).rows}

    def _delete_rows_of(self, size: int) -> Any:
        """``delete_owned`` for ``size`` listed rows (see ``Statements.renew_owned``),
        returning the owner ids of those deleted; with a channel (PostgreSQL), the keys
        among ``n0``, ``n1``, ... are announced there."""
        table = self._backend.table
        c = table.c
        deleted = delete(table).where(listed(table, size))
        channel = self._backend.sql.channel
        if channel is None:
            return deleted.returning(c.owner_id)
        gone = deleted.returning(c.lock_key, c.owner_id).cte("gone")
        loud: list[ColumnElement[Any]] = [bindparam(f"n{index}") for index in range(size)]
        notify = func.pg_notify(plain(channel), gone.c.lock_key)
        return select(gone.c.owner_id, case((gone.c.lock_key.in_(loud), notify)).label("told"))


def _keep(requests: Sequence[Release], answers: Sequence[Released]) -> None:
    """A release whose thread left: its row is gone or stays, as after any interrupt."""
