"""The SQL backend: holds as rows of one table, on SQLite, MariaDB/MySQL (pymysql) and
PostgreSQL (psycopg 3). Statements and their failures: ``running``; statements that
threads share: ``batches``; the table and every statement: ``table``; wake-ups:
``wakeups``; inspecting and cleaning the table: ``admin``."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy.engine import Engine

from ...keys import is_reader_key, user_key
from ...records import Owner
from ...stats import Counters
from .. import Doorbell, LockBackend
from ..basics import MAX_HANDOFFS, check_table_name, fencing_token
from .admin import TableAdmin
from .batches import ALONE, UNSURE, Batches, Insert, Inserted, Release, Released
from .engine import (
    DEFAULT_TIMEOUT,
    PAUSED_FOR_FORKS,
    SQLITE_BUSY_SLICE,
    SQLITE_LEAST_BUSY_WAIT,
    dedicated_connection,
    engines,
    pause_forks_for,
)
from .inserts import ExclusiveInsert, exclusive_params
from .layout import lock_table
from .link import Link
from .notify import channel_name
from .queries import Queries, Query
from .rows import insert_params, listed_params
from .running import SPARE_CONNECTIONS, Runner
from .schema import prepare_table
from .shared import SharedQueries, SharedStatements
from .sharedholds import SQLSharedHolds
from .sweeper import Sweep, Sweeper
from .table import Statements
from .takeover import Reserved, Takeover, take_reserved
from .wakeups import WakeUps
from .watchdog import Watchdog

__all__ = ["SQLBackend"]


class SQLBackend(TableAdmin, LockBackend):
    """Holds as rows of one table; what only administrators do: ``TableAdmin``."""

    MAX_HANDOFFS = MAX_HANDOFFS

    def __init__(
        self,
        *,
        url: str | None,
        engine: Engine | None,
        table: str,
        create_table: bool,
        counters: Counters,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.table = lock_table(check_table_name(table), MetaData())
        self.counters = counters
        self.timeout = timeout
        self._base_engine, self._engine, self._owns_engine = engines(url, engine, timeout)
        self.location = self._base_engine.url.render_as_string(hide_password=True)
        self.dialect_name = self._engine.dialect.name
        self._watchdog: Watchdog | None = None
        channel = None
        if self.dialect_name == "postgresql":
            channel = channel_name(self.table.name)
            self._watchdog = Watchdog(timeout / 2)
        self._wakeups = WakeUps(
            self.dialect_name,
            self._engine.url,
            self.table.name,
            channel,
            functools.partial(dedicated_connection, self._engine),
            counters,
        )
        self._runner = Runner(
            self._engine,
            counters=counters,
            timeout=timeout,
            commit=not self._owns_engine,
            watchdog=self._watchdog,
            spares=SPARE_CONNECTIONS if self._owns_engine else 0,
        )
        self._run = self.run = self._runner.run
        self._sweeper = Sweeper(self._sweep)
        self.sql = Statements(self.table, self.dialect_name, channel)
        self.queries = Queries(self.sql, self._engine.dialect)
        self._exclusive_insert = ExclusiveInsert(self.sql, self._engine.dialect, self.table)
        self._batches = Batches(self, self._runner, self._exclusive_insert)
        dialect = self._engine.dialect
        shared = SharedStatements(self.table, self.dialect_name, channel, dialect.update_returning)
        self._shared_queries = SharedQueries(shared, dialect)
        self.shared: SQLSharedHolds = SQLSharedHolds(self, self._shared_queries)
        self.takeover = self._takeover = Takeover(
            self.queries, counters, self.shared.steps.writer_waits
        )
        if self.dialect_name == "sqlite":
            pause_forks_for(self._runner.gate)
        gate = self._runner.gate
        gate.enter()
        try:
            prepare_table(self._engine, self.table, create=create_table, timeout=timeout)
        finally:
            gate.leave()

    @property
    def closed(self) -> bool:
        """Whether ``close`` has begun: no new operation starts."""
        return self._runner.gate.shut

    # -- holds -------------------------------------------------------------------

    def insert_row(
        self, link: Link, params: dict[str, Any], query: Query | None = None
    ) -> int | None:
        """Insert a row if its key is free (``insert_params``, or those of ``query``, a
        form of ``insert_if_absent``); its token, or ``None``."""
        if query is None:
            query = self.queries.insert_if_absent
        token: int | None
        if self.sql.returns_token:
            row = link.first(query, params)
            token = None if row is None else row[0]
        else:
            token = link.inserted(query, params)
        self.counters.add("insert_conflicts" if token is None else "inserts")
        return token

    def _insert(self, link: Link, params: dict[str, Any], query: Query | None) -> int | None:
        token = self.insert_row(link, params, query)
        return None if token is None else fencing_token(token, 0)

    def limit_busy_wait(
        self, link: Link, limit: float | None, least: float = SQLITE_LEAST_BUSY_WAIT
    ) -> None:
        """SQLite: let the next try wait no longer than ``limit`` (but ``least``) for the
        write lock."""
        if self.dialect_name == "sqlite" and limit is not None and limit < SQLITE_BUSY_SLICE:
            link.limit_busy_wait(max(limit, least))

    def _owned_token(self, link: Link, key: str, owner_id: str) -> int | None:
        """Our fencing token if ``owner_id`` holds ``key``: what an ambiguous try did."""
        rows = link.execute(self.queries.select_owned_token, {"key": key, "owner": owner_id}).rows
        return fencing_token(*rows[0]) if rows else None

    def try_acquire(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None = None,
        limit: float | None = None,
    ) -> int | None:
        query = self._exclusive_insert.query(owner)
        if query is None:  # (values that must be sent as parameters)
            params = {**insert_params(owner, ttl, lease), "key": key}
        else:
            params = exclusive_params(key, owner, ttl, lease)
        replace = None if query is None else self._exclusive_insert.replacing(owner)
        marked = None if replace is None else self._takeover.marked_group(key)
        # (A group this process's readers just left: a try that may wait marks it first.)
        may_wait = limit is None or limit > 0
        left = marked is None and may_wait and self._takeover.just_left(key)
        doubts = self._runner.doubts
        first: Inserted = ALONE
        if (
            marked is None
            and not left
            and query is not None
            and self._batches.shared
            and owner.owner_id not in doubts
        ):
            first = self._batches.inserts.ask(Insert(key, owner, params, limit))
            if isinstance(first, int):
                self._takeover.forget(key)
                return first
        queries = self.queries

        def attempt(link: Link, uncertain: bool) -> int | None:
            nonlocal first, marked, left
            token = None
            if uncertain:
                # A dropped connection hid whether our insert committed: ask.
                token = self._owned_token(link, key, owner.owner_id)
                if token is not None:
                    return token
            if marked is not None:  # (the reservation is likely there: take it first)
                token = self._claim(link, key, marked, params, query, replace)
                marked = None
            if left:
                left = False
                self.limit_busy_wait(link, limit)
                if self._takeover.mark_left_group(link, key, limit) is False:
                    return None  # (readers still count in it: a miss, as after an insert)
            if token is not None:
                pass
            elif first is None:  # (a shared insert found the key held just now)
                first = ALONE
            else:
                self.limit_busy_wait(link, limit)
                token = self._insert(link, params, query)
                if token is None and uncertain:  # (the doubtful insert may have come last)
                    token = self._owned_token(link, key, owner.owner_id)
            if token is None:
                freed = self._takeover.free_held_row(link, key, wait=limit)
                token = self._claim(link, key, freed, params, query, replace)
            if token is not None and self.closed:
                # Won just as the manager closed: nobody will hold it.
                link.count(queries.delete_owned, params)
                return None
            return token

        token = self._run("acquire", key, attempt, on_contention=lambda: None, owner=owner.owner_id)
        if token is not None:
            self._takeover.forget(key)
            if doubts:
                doubts.pop(owner.owner_id, None)
        return token

    def _claim(
        self,
        link: Link,
        key: str,
        freed: bool | Reserved,
        params: dict[str, Any],
        query: Query | None,
        replace: Query | None,
    ) -> int | None:
        """Insert once ``free_held_row`` said ``freed``: replace a row reserved for
        writers (PostgreSQL: with ``replace``, in one statement; else in a transaction),
        or insert again if the row is gone."""
        if not isinstance(freed, Reserved):
            return self._insert(link, params, query) if freed else None
        if replace is not None:
            return self._insert(link, {**params, "row": freed.row}, replace)

        def insert(row_key: str) -> int | None:
            return self._insert(link, {**params, "key": row_key}, query)

        token: int | None = take_reserved(link, key, params["owner"], freed, insert, self.queries)
        return token

    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        announce = self._wakeups.announced(user_key(key))
        gone: Released = ALONE
        if self._batches.shared:
            gone = self._batches.releases.ask(Release(key, owner_id, announce))
        if not isinstance(gone, bool):
            gone = self._release_alone(key, owner_id, live_until, announce, gone is UNSURE)
        if gone:
            self._wakeups.released(user_key(key))
        return gone

    def _release_alone(
        self, key: str, owner_id: str, live_until: float, announce: bool, unsure: bool
    ) -> bool:
        """Release with a statement of its own, retried; ``unsure``: an earlier one may
        have released it."""
        params = {"key": key, "owner": owner_id}
        query = self.queries.delete_owned
        quietly = self.queries.delete_owned_quietly
        if quietly is not None and not announce:
            query = quietly

        def attempt(link: Link, uncertain: bool) -> bool:
            if link.count(query, params) == 1:
                return True
            # The row is gone. After a dropped connection that may be our own earlier
            # try's doing, but only while the lease surely ran could nobody else (the
            # reaper, a waiter taking over) have removed it; after that, it is lost.
            return (uncertain or unsure) and time.monotonic() < live_until

        released: bool = self._run("release", key, attempt)
        return released

    def handoff(
        self,
        key: str,
        owner_id: str,
        handoffs: int,
        successor: Owner,
        ttl: float,
        lease: float | None,
    ) -> bool:
        params = {
            "key": key,
            "owner": owner_id,
            "handoffs": handoffs,
            "thread": successor.thread_id,
            "thread_label": successor.thread_name,
            "ttl": ttl,
            "lease": lease,
        }
        # The row stays ours whatever happens, so a retry after a lost reply just
        # sets the same values again.
        return self._run(
            "handoff",
            key,
            lambda link, _: link.count(self.queries.handoff_owned, params) == 1,
        )

    def renew(self, holds: Sequence[tuple[str, str]]) -> set[str]:
        renewed: set[str] = set()
        step = Queries.MOST_LISTED
        for first in range(0, len(holds), step):
            part = holds[first : first + step]
            renewed |= self._run("renew", None, functools.partial(self._renew, part=part))
        return renewed

    def _renew(self, link: Link, uncertain: bool, *, part: Sequence[tuple[str, str]]) -> set[str]:
        """One statement renews ``holds``; a second, only if some were not renewed,
        tells which were."""
        groups = sorted({user_key(key) for key, _ in part if is_reader_key(key)})
        if groups:  # (readers' rows: their groups are renewed with them)
            query, size = self._shared_queries.listed("renew_with_groups", len(part))
            params = listed_params(part, size, groups)
        else:
            query, size = self.queries.listed("renew_owned", len(part))
            params = listed_params(part, size)
        self.counters.add("heartbeats")
        owners = {owner for _, owner in part}
        if link.count(query, params) == len(part) + len(groups):
            return owners
        query, _ = self.queries.listed("select_live_owned", len(part))
        return {row[0] for row in link.execute(query, params).rows} & owners

    def record_holder(
        self, key: str, owner_id: str, holder: Owner, handoffs: int, lease: float | None
    ) -> bool:
        params = {
            "key": key,
            "owner": owner_id,
            "handoffs": handoffs,
            "thread": holder.thread_id,
            "thread_label": holder.thread_name,
            "lease": lease,
        }
        return self._run(
            "record",
            key,
            lambda link, _: link.count(self.queries.record_holder, params) == 1,
        )

    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        sessions = self._runner.doubts.pop(owner_id, None) if self._runner.doubts else None
        if sessions is None and not certain:
            return
        alive = tuple(session for session in sessions or () if session is not None)
        give_up = time.monotonic() + self.timeout * 1.5
        self._sweeper.add(Sweep(key, owner_id, alive, give_up))

    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        params = {"key": key, "owner": owner_id, "ttl": ttl, "lease": lease}
        return self._run(
            "extend",
            key,
            lambda link, _: link.count(self.queries.extend_owned, params) == 1,
        )

    def announce(self, key: str) -> None:
        """A row of ``key`` was deleted or changed: wake pollers elsewhere."""
        self._wakeups.released(key)

    def doorbell(self, key: str) -> Doorbell:
        return self._wakeups.doorbell(key)

    def ask_for_renewals(self, renew_now: Callable[[str | None], None]) -> None:
        self._wakeups.watch_forced(renew_now)

    def watch_wanted(self, told: Callable[[str], None]) -> bool:
        return self._wakeups.watch_wanted(told)

    def marks_heard_since(self) -> float | None:
        return self._wakeups.marks_heard_since()

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        return self._wakeups.others_waiting(key, ringing)

    def want(self, key: str, seconds: float) -> None:
        self._wakeups.want(key, seconds)

    def after_fork(self) -> None:
        # SQLAlchemy's advice for a child process: new pool, parent's sockets untouched.
        self._base_engine.dispose(close=False)
        self._runner.after_fork()
        self._batches.after_fork()
        if self.dialect_name == "sqlite":  # (the child's own forks wait for its gate)
            pause_forks_for(self._runner.gate)
        self._sweeper.forget()  # the parent sweeps its own rows
        self._wakeups.after_fork()
        if self._watchdog is not None:
            self._watchdog.forget()

    def close(self) -> None:
        if self.closed:
            return
        self._wakeups.wake_all()
        gate = self._runner.gate
        gate.close(self.timeout * 1.5)
        self._sweeper.finish(self.timeout)
        gate.seal()
        self._runner.close()
        self._wakeups.close()
        if self._watchdog is not None:
            self._watchdog.close()
        if self._owns_engine:
            self._base_engine.dispose()
        if self.dialect_name == "sqlite":
            PAUSED_FOR_FORKS.discard(self._runner.gate)
