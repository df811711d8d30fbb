"""Read holds and permits of an ``SQLBackend``: each operation run with retries, on the
steps of ``sharing``, which says how they work."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...keys import reader_key
from ...records import Owner
from .. import Share, SharedHolds
from ..basics import fencing_token
from .engine import SQLITE_LEAST_SHARED_WAIT
from .link import Link
from .rows import insert_params
from .shared import SharedQueries
from .sharing import ENDED, Mismatch, Sharing, WriterWaits, slot_range

if TYPE_CHECKING:
    from .backend import SQLBackend

__all__ = ["SQLSharedHolds"]


class SQLSharedHolds(SharedHolds):
    """Read holds and permits of an ``SQLBackend``."""

    def __init__(self, backend: SQLBackend, queries: SharedQueries) -> None:
        self._backend = backend
        self.steps = self._steps = Sharing(
            backend.queries, queries, backend.insert_row, backend.counters
        )
        self._queries = queries
        self._look_first = queries.join_or_found is None  # (see _still_closed)

    def try_share(
        self, key: str, owner: Owner, ttl: float, lease: float | None, limit: float | None
    ) -> Share | None:
        backend, steps = self._backend, self._steps
        params = insert_params(owner, ttl, lease)
        reader = reader_key(key, owner.owner_id)

        def attempt(link: Link, uncertain: bool) -> Share | None:
            if uncertain:  # a dropped connection hid whether our transaction committed
                rows = link.execute(self._queries.select_reader, {"key": reader, **params}).rows
                if rows:
                    return Share(fencing_token(rows[0][0], 0), rows[0][1])
            if self._still_closed(link, key):
                return None
            backend.limit_busy_wait(link, limit, SQLITE_LEAST_SHARED_WAIT)
            joined = steps.join(link, key, params)
            if isinstance(joined, WriterWaits):  # (no holder's row to look at)
                backend.takeover.readers_out(key)
                return None
            if joined is None and backend.takeover.free_held_row(link, key, writer=False):
                joined = steps.join(link, key, params)
            if not isinstance(joined, tuple):
                return None
            if backend.closed:  # won just as the manager closed: nobody will hold it
                steps.leave(link, key, owner.owner_id, joined[1])
                return None
            return Share(fencing_token(joined[0], 0), joined[1])

        return backend.run(
            "acquire", key, attempt, on_contention=self._refused(), owner=owner.owner_id
        )

    def _still_closed(self, link: Link, key: str) -> bool:
        """Whether ``key``, which a try of this process found closed to readers lately,
        still is: where a refused join costs a transaction (not PostgreSQL's one
        statement), one look says so for less."""
        if not (self._look_first and self._backend.takeover.kept_readers_out(key)):
            return False
        return bool(link.execute(self._queries.read_blocked, {"key": key}).rows)

    def _refused(self) -> Callable[[], None] | None:
        """What a try that met contention gives: on SQLite, the file's write lock stayed
        busy past the try's wait, so "not now"; on a server, two transactions (readers
        joining at once, say) deadlocked, which says nothing about the key: try again."""
        return (lambda: None) if self._backend.dialect_name == "sqlite" else None

    def unshare(self, key: str, owner_id: str, group: int, live_until: float) -> bool:
        steps, run = self._steps, self._backend.run

        def attempt(link: Link, uncertain: bool) -> int | None:
            members = steps.leave(link, key, owner_id, group)
            if members is None and uncertain and time.monotonic() < live_until:
                return 0  # (an earlier try left, it seems; see SQLBackend.release)
            return members

        members: int | None = run("release", key, attempt)
        if members is not None and members > 0:
            self._backend.takeover.others_read(key, group, members)
        if members == ENDED or (
            members == 0
            and run("release", key, lambda link, _: steps.drop_if_empty(link, key, group))
        ):
            self._backend.announce(key)
        return members is not None

    def still_open(self, key: str, group: int) -> bool:
        return self._backend.run(
            "locked", key, lambda link, _: self._steps.still_open(link, key, group)
        )

    def downgrade(
        self, key: str, owner_id: str, reader: Owner, ttl: float, lease: float | None
    ) -> Share | None:
        params = {**insert_params(reader, ttl, lease), "held_by": owner_id}

        def attempt(link: Link, uncertain: bool) -> Share | None:
            if uncertain:
                query = self._queries.select_reader
                rows = link.execute(query, {"key": reader_key(key, reader.owner_id), **params}).rows
                if rows:
                    return Share(fencing_token(rows[0][0], 0), rows[0][1])
            done = self._steps.downgrade(link, key, params)
            return None if done is None else Share(fencing_token(done[0], 0), done[1])

        share: Share | None = self._backend.run("downgrade", key, attempt, owner=reader.owner_id)
        self._backend.announce(key)  # readers elsewhere may join now
        return share

    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        # The reader's row first, then its group, which must outlast it.
        if not self._backend.extend(reader_key(key, owner_id), owner_id, ttl, lease):
            return False
        return self._backend.run(
            "extend", key, lambda link, _: self._steps.extend_group(link, key, ttl)
        )

    def read_blocked(self, key: str) -> bool:
        query = self._queries.read_blocked
        return self._backend.run(
            "locked", key, lambda link, _: bool(link.execute(query, {"key": key}).rows)
        )

    def permits_taken(self, key: str) -> int:
        query, params = self._queries.count_under, slot_range(key, "p")
        return self._backend.run(
            "locked", key, lambda link, _: int(link.execute(query, params).rows[0][0])
        )

    def try_permit(
        self,
        key: str,
        permits: int,
        owner: Owner,
        ttl: float,
        lease: float | None,
        limit: float | None,
    ) -> tuple[str, int] | None:
        backend = self._backend
        params = insert_params(owner, ttl, lease)

        def attempt(link: Link, uncertain: bool) -> tuple[str, int] | Mismatch | None:
            if uncertain:
                mine = {**slot_range(key, "p"), **params}
                rows = link.execute(self._queries.select_permit, mine).rows
                if rows:
                    return rows[0][0], fencing_token(rows[0][1], 0)
            backend.limit_busy_wait(link, limit, SQLITE_LEAST_SHARED_WAIT)
            taken = self._steps.take_permit(link, key, permits, params)
            if taken is None or isinstance(taken, Mismatch):
                return taken
            if backend.closed:
                link.execute(backend.queries.delete_owned, {"key": taken[0], **params})
                return None
            return taken[0], fencing_token(taken[1], 0)

        owner_id = owner.owner_id
        taken = backend.run("acquire", key, attempt, on_contention=self._refused(), owner=owner_id)
        if isinstance(taken, Mismatch):
            raise ValueError(
                f"semaphore {key!r} asked for with permits={permits}, but it is held with "
                f"permits={taken.permits} (by pid {taken.pid})"
            )
        return taken
