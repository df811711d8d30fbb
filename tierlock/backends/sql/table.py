"""Every SQL statement of exclusive holds on the lock table (``layout``; those of read
holds and permits: ``shared``).

All times are taken from the database (semantic 3): ``utc_now()`` and ``utc_after()``
(in ``columns``) compile to each dialect's own clock, so a client with a skewed clock
can neither shorten nor stretch a lease. Timestamps are stored in UTC.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    String,
    Table,
    bindparam,
    delete,
    func,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.sql.expression import (
    ColumnElement,
    Delete,
    Insert,
    Select,
    Update,
)

from .columns import (
    MYSQL_FAMILY,
    if_absent,
    plain,
    unindexed,
    utc_after,
    utc_now,
)
from .layout import GROUP, RESERVED, SHARED
from .notify import FORCED

__all__ = [
    "HOLDER",
    "Statements",
    "holder_values",
    "key_serialiser",
    "listed",
]

# The reaper deletes at most this many rows per statement, so one pass never locks a
# large part of the table at once.
REAP_BATCH = 500


def key_serialiser(table: Table, key: ColumnElement[Any] | None = None) -> Select[Any]:
    """PostgreSQL: ``SELECT pg_advisory_xact_lock(...) AS locked`` (``locked`` is never
    NULL), the lock on ``key`` (default: the parameter ``key``) of ``table`` that a
    transaction holds from before it draws a token for the key's holds to its end; see
    ``Statements.insert_if_absent``."""
    key_hash = func.hashtext(bindparam("key") if key is None else key)
    # (The table's name is written into the SQL: one parameter less to send.)
    locked = func.pg_advisory_xact_lock(func.hashtext(plain(table.name)), key_hash)
    return select(locked.label("locked"))


def holder_values(suffix: str = "") -> dict[str, ColumnElement[Any]]:
    """The values of an inserted row that vary with each acquire, bound as ``key``,
    ``owner``, ``thread``, ``thread_label``, ``ttl`` and ``lease``, each name followed by
    ``suffix`` (a row of a multi-row insert)."""
    return {
        "lock_key": bindparam("key" + suffix),
        "owner_id": bindparam("owner" + suffix),
        "thread_id": bindparam("thread" + suffix),
        "thread_name": bindparam("thread_label" + suffix),
        "acquired_at": utc_now(),
        "expires_at": utc_after(bindparam("ttl" + suffix, type_=Float)),
        "lease": bindparam("lease" + suffix, type_=Float),
    }


def process_values() -> dict[str, ColumnElement[Any]]:
    """The values of an inserted row that name the holder's process, bound as
    ``host_name``, ``host_identity``, ``proc`` and ``proc_started``."""
    return {
        "host": bindparam("host_name"),
        "pid": bindparam("proc"),
        "host_id": bindparam("host_identity"),
        "proc_start": bindparam("proc_started", type_=BigInteger),
    }


# The values of an inserted row that vary with each acquire.
HOLDER = holder_values()


def _expired(table: Table, *, by_key: bool = False) -> ColumnElement[bool]:
    """Whether a row's lease has ended; ``by_key``: in a statement that changes rows it
    finds by their keys, which MariaDB must not look up by their expiry (``unindexed``)."""
    expires_at = unindexed(table.c.expires_at) if by_key else table.c.expires_at
    return expires_at <= utc_now()


_SESSION_ALIVE = {
    "mysql": "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = :session",
    "mariadb": "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = :session",
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE pid = :session",
    "sqlite": "SELECT 1 WHERE 0 = :session",
}


class Statements:
    """Every statement for one table and dialect. Bound parameter names: ``key``,
    ``owner``, ``ttl`` and ``lease`` (seconds), ``row`` (a row's token), ``handoffs``,
    and for the holder's record ``host_name``, ``host_identity``, ``proc``,
    ``proc_started``, ``thread``, ``thread_label``."""

    def __init__(self, table: Table, dialect_name: str, channel: str | None = None) -> None:
        self._table = table
        c = table.c
        key_is = c.lock_key == bindparam("key")
        owned = key_is & (c.owner_id == bindparam("owner"))
        self.returns_token = dialect_name == "postgresql"

        # insert_if_absent(key, owner, host_name, host_identity, proc, proc_started,
        # thread, thread_label, ttl, lease, mode, members, permits, parent):
        # 1 row (PostgreSQL: the token returned) if the key was free, 0 rows if taken.
        # The dialect's insert-if-absent form means contention raises no error and
        # writes no line to the server's log.
        self._dialect_name = dialect_name
        self.channel = channel  # (PostgreSQL: where releases are announced)
        self.insert_if_absent: Insert = self.insert_of(
            {
                **HOLDER,
                **process_values(),
                "mode": bindparam("mode", type_=String),
                "members": bindparam("members", type_=Integer),
                "permits": bindparam("permits", type_=Integer),
                "parent": bindparam("parent", type_=BigInteger),
            }
        )
        # serialise_key(key): PostgreSQL: the advisory lock that keeps inserts of one
        # key apart (see ``insert_of``), to the transaction's end.
        self.serialise_key: Select[Any] | None = None
        if dialect_name == "postgresql":
            self.serialise_key = key_serialiser(table)
        # rename_row(placeholder, key), MariaDB/MySQL: the row under placeholder is now
        # under key (a writer draws its token before it takes a reservation: see
        # ``takeover.take_reserved``).
        self.rename_row: Update | None = None
        if dialect_name in MYSQL_FAMILY:
            placed = c.lock_key == bindparam("placeholder")
            self.rename_row = update(table).where(placed).values(lock_key=bindparam("key"))

        # select_holder(key): the holder's row (its token, and who and where it is, and a
        # group's members) with the database's verdict on its lease; no row if the key is
        # free.
        self.select_holder = select(
            c.token,
            c.host_id,
            c.pid,
            c.proc_start,
            c.mode,
            c.members,
            _expired(table).label("expired"),
        ).where(key_is)

        # delete_expired_row(key, row): 1 row if that row of the key was removed because
        # its lease had ended (a waiter takes over); 0 rows if it is gone or was renewed.
        row_is = key_is & (unindexed(c.token) == bindparam("row", type_=BigInteger))
        self.delete_expired_row = delete(table).where(row_is & _expired(table, by_key=True))

        # delete_row(key, row): 1 row if that row of the key was removed, whatever its
        # lease: its holder process is proven gone (see tierlock.process).
        self.delete_row = delete(table).where(row_is)

        # delete_owned(key, owner): 1 row if the hold was ours and is now released;
        # 0 rows if it is no longer ours (reaped, taken over or force-released). With a
        # channel (PostgreSQL), the release is announced there with the key, and
        # delete_owned_quietly is the same release unannounced, for a key that the
        # process knows nobody waits for (see ``notify``).
        self.delete_owned: Delete | Select[Any] = delete(table).where(owned)
        self.delete_owned_quietly: Delete | None = None
        if channel is not None:
            self.delete_owned_quietly = self.delete_owned
            gone = delete(table).where(owned).returning(c.lock_key).cte("gone")
            self.delete_owned = select(func.pg_notify(plain(channel), gone.c.lock_key))

        # extend_owned(key, owner, ttl, lease): 1 row if our hold now lasts ttl from
        # now, renewed by lease if given; 0 rows if it is no longer ours.
        self.extend_owned = (
            update(table)
            .where(owned)
            .values(
                expires_at=utc_after(bindparam("ttl", type_=Float)),
                lease=bindparam("lease", type_=Float),
            )
        )

        # handoff_owned(key, owner, handoffs, thread, thread_label, ttl, lease): 1 row if
        # our hold now belongs to another thread of this process, with the hand-off count
        # given (exactly: local hand-offs are counted in memory) and a lease of ttl from
        # now, renewed by lease if given; 0 rows if the row is no longer ours.
        holder = {
            "handoffs": bindparam("handoffs", type_=Integer),
            "thread_id": bindparam("thread"),
            "thread_name": bindparam("thread_label"),
            "acquired_at": utc_now(),
            "lease": bindparam("lease", type_=Float),
        }
        self.handoff_owned = (
            update(table)
            .where(owned)
            .values(**holder, expires_at=utc_after(bindparam("ttl", type_=Float)))
        )

        # record_holder(key, owner, handoffs, thread, thread_label, lease): 1 row if our
        # row now names the thread that holds it after hand-offs that sent no statement;
        # 0 rows if it is no longer ours.
        self.record_holder = update(table).where(owned).values(**holder)

        # select_owned_token(key, owner): token and handoffs if we hold the key, else
        # no row. Resolves an insert or hand-off whose outcome a dropped connection hid.
        self.select_owned_token = select(c.token, c.handoffs).where(owned)

        # select_live(key): a row if the key has an unexpired hold.
        self.select_live = select(c.token).where(
            key_is & ~_expired(table) & _mode_is_not(table, RESERVED)
        )

        # select_info(key) / select_all(): rows with the database's verdict on expiry.
        # (A group row stands for its readers, whose own rows select_all lists.)
        columns = [*table.c, _expired(table).label("expired")]
        self.select_info: Select[Any] = select(*columns).where(
            key_is & _mode_is_not(table, RESERVED)
        )
        holds = _mode_is_not(table, GROUP) & _mode_is_not(table, RESERVED)
        self.select_all: Select[Any] = select(*columns).where(holds).order_by(c.lock_key)

        # session_alive(session): a row while the server session with this id (MySQL's
        # connection id, PostgreSQL's backend pid) exists; SQLite has no sessions.
        self.session_alive = text(_SESSION_ALIVE[dialect_name]).bindparams(
            bindparam("session", type_=BigInteger)
        )

        # delete_key(key, under, above): the rows of the key's holds, whoever's: its
        # own row and the rows of its readers and permits (keys between under and above).
        self.delete_key = delete(table).where(key_is | _between(table))
        # notify_forced(key): PostgreSQL: tell the holder's process that its rows went.
        self.notify_forced: Select[Any] | None = None
        if channel is not None:
            told = literal(FORCED) + bindparam("key", type_=String)
            self.notify_forced = select(func.pg_notify(literal(channel), told))

        # delete_expired_batch(): up to REAP_BATCH expired rows; fewer means none are left.
        # A reader's row is left out: it must go with its group's count (see shared).
        reapable = _expired(table) & _mode_is_not(table, SHARED)
        self.delete_expired_batch: Delete
        if dialect_name in MYSQL_FAMILY:
            # MySQL forbids a subquery on the table being deleted from, but has LIMIT.
            self.delete_expired_batch = (
                delete(table)
                .where(reapable)
                .with_dialect_options(**{f"{dialect_name}_limit": REAP_BATCH})
            )
        else:
            batch = select(c.token).where(reapable).limit(REAP_BATCH)
            self.delete_expired_batch = delete(table).where(c.token.in_(batch.scalar_subquery()))

    def insert_of(self, values: dict[str, ColumnElement[Any]]) -> Insert:
        """An insert of the row of ``values`` (column: value) unless its key has a row:
        ``insert_if_absent``'s form, which ``inserts`` fills in other ways."""
        table, c = self._table, self._table.c
        # The token is drawn from the sequence before the server checks the unique key,
        # so a second insert of the key must not be able to draw, win, and release in
        # between, or the first would then win with the lower token. PostgreSQL: a
        # transaction-level advisory lock on the key, taken before the draw, keeps
        # inserts of one key apart, and readers joining its group too, whose rows are
        # under keys of their own (``shared``). MariaDB/MySQL: INSERT ... SELECT holds
        # InnoDB's table-level AUTO-INC lock to the end of the statement
        # (innodb_autoinc_lock_mode 0 or 1, the default). SQLite runs one writer at a time.
        names = list(values)
        row = select(*(value.label(name) for name, value in values.items()))
        if self._dialect_name == "postgresql":
            serialised = key_serialiser(table).cte("serialised")
            return (
                postgresql.insert(table)
                .from_select(names, row.select_from(serialised))
                .on_conflict_do_nothing(index_elements=[c.lock_key])
                .returning(c.token)
            )
        if self._dialect_name == "sqlite":
            return (
                sqlite.insert(table)
                .values(values)
                .on_conflict_do_nothing(index_elements=[c.lock_key])
            )
        return if_absent(mysql.insert(table).from_select(names, row))

    # The heartbeat names the rows it renews: a statement for ``size`` rows binds keys
    # k0, k1, ... and owner ids o0, o1, ... (unused places get "", which no row has).
    # Owner ids are unique to one row, so the rows matched are exactly those listed
    # that are still ours, and their count tells whether any was lost.

    def renew_owned(self, size: int) -> Update:
        """1 row for each listed row still ours with a live, renewed lease: it now lasts
        its ``lease`` from now. Rows whose lease ended are left to expire."""
        c = self._table.c
        return (
            update(self._table)
            .where(
                listed(self._table, size)
                & c.lease.isnot(None)
                & ~_expired(self._table, by_key=True)
            )
            .values(expires_at=utc_after(c.lease))
        )

    def select_live_owned(self, size: int) -> Select[Any]:
        """The owner ids of the listed rows still ours with a live lease."""
        return select(self._table.c.owner_id).where(
            listed(self._table, size) & ~_expired(self._table)
        )


def _mode_is_not(table: Table, mode: str) -> ColumnElement[bool]:
    return table.c.mode.is_(None) | (table.c.mode != mode)


def _between(table: Table) -> ColumnElement[bool]:
    """Keys strictly between the parameters ``under`` and ``above``."""
    return (table.c.lock_key > bindparam("under")) & (table.c.lock_key < bindparam("above"))


def listed(table: Table, size: int) -> ColumnElement[bool]:
    keys: list[ColumnElement[Any]] = [bindparam(f"k{index}") for index in range(size)]
    owners: list[ColumnElement[Any]] = [bindparam(f"o{index}") for index in range(size)]
    return table.c.lock_key.in_(keys) & table.c.owner_id.in_(owners)
