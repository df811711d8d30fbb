"""The statements of read holds and permits, for ``sharing``, which says how they work."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Column,
    Float,
    String,
    Table,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.sql.expression import ColumnElement, Delete, Insert, Select, Update

from .columns import if_absent, larger, unindexed, utc_after, utc_now
from .layout import GROUP, RESERVED, SHARED
from .notify import WRITER
from .queries import Queries, Query
from .table import (
    REAP_BATCH,
    _between,
    _expired,
    holder_values,
    key_serialiser,
    listed,
    process_values,
)

__all__ = ["SharedQueries", "SharedStatements"]


class SharedStatements:
    """The statements of read holds and permits (parameters as in ``Statements``, plus
    ``group`` (a group row's token), ``wait`` (seconds), ``under``/``above`` (a range of
    keys))."""

    def __init__(
        self, table: Table, dialect_name: str, channel: str | None, update_returning: bool
    ) -> None:
        self._table = table
        c = table.c
        ttl = bindparam("ttl", type_=Float)
        key_is = c.lock_key == bindparam("key")
        group_is = key_is & (c.mode == GROUP)
        open_group = (c.waiting.is_(None)) | (c.waiting <= utc_now())
        this_group = key_is & (unindexed(c.token) == bindparam("group", type_=BigInteger))

        # join_group(key, ttl): 1 row if an open, live group of the key now counts one
        # more member and lasts at least ttl from now (its token returned where UPDATE
        # ... RETURNING exists: PostgreSQL, SQLite 3.35+; elsewhere select_group reads it).
        # PostgreSQL: the key's advisory lock first, held to the end of the joining
        # transaction, which inserts the reader's row: its token is drawn under the key's
        # lock, so a writer's insert of the key cannot draw before it and win after it
        # left (its token would be below the reader's).
        joinable = group_is & (unindexed(c.expires_at) > utc_now()) & open_group
        serialised = key_serialiser(table).cte("serialised")
        if dialect_name == "postgresql":
            joinable &= serialised.c.locked.is_not(None)
        join = (
            update(table)
            .where(joinable)
            .values(
                members=c.members + 1,
                lease=larger(c.lease, ttl),
                expires_at=larger(c.expires_at, utc_after(ttl)),
            )
        )
        self.join_group = join.returning(c.token) if update_returning else join

        # read_blocked(key): a row if a writer holds the key (mode NULL) or waits for it
        # (a group's or a reservation's); its token and mode.
        writer_waits = ((c.mode == GROUP) & (c.waiting > utc_now())) | (c.mode == RESERVED)
        self.read_blocked = select(c.token, c.mode).where(
            key_is & ~_expired(table) & (c.mode.is_(None) | writer_waits)
        )

        # join_or_found(key, reader, group_owner, and an insert's parameters but key),
        # PostgreSQL: join_group, or found the group (owned by group_owner) if the key has
        # no row, and insert the reader's row under the key reader, in one statement under
        # the key's advisory lock; the reader's token, the group's, and 1 if it founded
        # the group; nulls and the blocking row's mode if neither could be done because a
        # writer holds the key or waits for it. No row: a reader founded the group while
        # this one waited for the lock, unseen in the statement's snapshot, and
        # ``Sharing.join`` goes the long way.
        self.join_or_found = None
        if dialect_name == "postgresql":
            self.join_or_found = _join_or_found(
                table, join.returning(c.token), serialised, self.read_blocked
            )

        # insert_member(key, owner, ..., parent: as insert_if_absent's), MariaDB/MySQL:
        # a reader's row, inserted with VALUES, not INSERT ... SELECT: InnoDB then draws
        # its token under a short mutex instead of the table's AUTO-INC lock held to the
        # statement's end, which deadlocked readers joining other keys at once. (A reader's
        # row is only ever inserted by its owner, so no other insert of its key can draw
        # in between, and a writer of the key can win only once the group is gone, after
        # every member drew.) insert_founder(key, owner, ...): the same for an empty
        # group under the key. A writer's insert may draw after it and win before it:
        # the group's token is then below the writer's, but it fences nothing (a read's
        # token is its reader's row's, drawn once the group stands, and a writer that
        # takes a group's key over draws anew).
        # open_group(key), join_this_group(key, group, ttl), MariaDB/MySQL: the token of
        # the key's group if it is live and takes members (a plain read: no lock); that
        # group joined, as join_group. There a reader inserts its row first and joins
        # the group after (see ``Sharing.join``).
        counted_last: tuple[Any, Any, Any, Any] = (None, None, None, None)
        if dialect_name in ("mysql", "mariadb"):
            counted_last = _counted_last(table, join.where(this_group), joinable)
        self.insert_member, self.insert_founder, self.open_group, self.join_this_group = (
            counted_last
        )

        # select_group(key): the token of the key's group row, if it has one.
        self.select_group = select(c.token).where(group_is)

        # group_open(key, group): a row if that group still takes members.
        self.group_open = select(c.token).where(this_group & open_group & ~_expired(table))

        # count_out(key, group): that group counts one member fewer. count_out_members
        # (where UPDATE ... RETURNING exists): the same, and a group it leaves empty
        # while a writer waits is reserved for writers at once, as reserve_empty_group
        # would (both read the row as it was); the members it counts now and its mode.
        self.count_out = count_out = update(table).where(this_group).values(members=c.members - 1)
        emptied = (c.members <= 1) & ~open_group
        counted = count_out.values(
            mode=case((emptied, literal(RESERVED)), else_=c.mode),
            expires_at=case((emptied, c.waiting), else_=c.expires_at),
        ).returning(c.members, c.mode, c.lock_key)
        self.count_out_members = counted if update_returning else None

        # leave_group(reader, owner, key, group), PostgreSQL: the reader's row of owner
        # deleted and counted out of that group, as count_out_members, in one statement
        # that also announces a reservation; the members and the mode (no row: the
        # reader's row or the group was gone).
        self.leave_group = None
        if dialect_name == "postgresql":
            owned = (c.lock_key == bindparam("reader")) & (c.owner_id == bindparam("owner"))
            gone = delete(table).where(owned).returning(c.token).cte("gone")
            left = counted.where(exists(select(gone.c.token))).cte("left")
            announced: Any = null()
            if channel is not None:
                announced = func.pg_notify(literal(channel), left.c.lock_key)
            self.leave_group = select(
                left.c.members, left.c.mode, case((left.c.mode == RESERVED, announced))
            )

        # delete_empty_group(key, group): 1 row if that group had no member left, nor a
        # writer waiting, and is gone. reserve_empty_group(key, group): 1 row if that
        # group had no member left and a writer waits, and is now a reservation for
        # writers until the writer's mark ends. (PostgreSQL: each announced.)
        empty = this_group & (c.members <= 0)
        self.delete_empty_group = _announced(
            delete(table).where(empty & open_group), c.lock_key, channel
        )
        reserve = (
            update(table).where(empty & ~open_group).values(mode=RESERVED, expires_at=c.waiting)
        )
        self.reserve_empty_group = _announced(reserve, c.lock_key, channel)

        # writer_waits(key, wait): the key's group takes no new member for wait seconds.
        # (PostgreSQL: announced as a writer's mark, for processes that keep read holds.)
        self.writer_waits = _announced(
            update(table).where(group_is).values(waiting=utc_after(bindparam("wait", type_=Float))),
            c.lock_key,
            channel,
            WRITER,
        )

        # select_under(under, above): the rows of readers or permits of a key.
        self.select_under = select(
            c.lock_key,
            c.token,
            c.owner_id,
            c.parent,
            c.permits,
            c.host_id,
            c.pid,
            c.proc_start,
            _expired(table).label("expired"),
        ).where(_between(table))

        # select_reader(key, owner): a reader's row's token and group, if it is ours.
        self.select_reader = select(c.token, c.parent).where(
            key_is & (c.owner_id == bindparam("owner"))
        )

        # select_permit(under, above, owner): the key and token of our permit, if any.
        self.select_permit = select(c.lock_key, c.token).where(
            _between(table) & (c.owner_id == bindparam("owner"))
        )

        # count_under(under, above): how many live rows of permits (or readers) a key has.
        self.count_under = select(func.count()).where(_between(table) & ~_expired(table))

        # expired_readers(): readers' rows whose lease has ended, for the reaper.
        self.expired_readers = (
            select(c.lock_key, c.token, c.parent)
            .where((c.mode == SHARED) & _expired(table))
            .limit(REAP_BATCH)
        )

        # to_group(key, owner, ttl): 1 row if our exclusive hold of the key is now a
        # group of one member, lasting at least ttl from now (a writer downgrades).
        self.to_group = (
            update(table)
            .where(key_is & (c.owner_id == bindparam("owner")) & c.mode.is_(None))
            .values(
                mode=GROUP,
                members=1,
                waiting=null(),
                lease=larger(func.coalesce(c.lease, ttl), ttl),
                expires_at=larger(c.expires_at, utc_after(ttl)),
            )
        )

        # extend_group(key, ttl): the key's group lasts at least ttl from now.
        self.extend_group = (
            update(table)
            .where(group_is)
            .values(lease=larger(c.lease, ttl), expires_at=larger(c.expires_at, utc_after(ttl)))
        )

    def renew_with_groups(self, size: int) -> Any:
        """As ``Statements.renew_owned``, and also the groups ``g0``, ``g1``, ... (keys),
        in the same statement, so that a group always outlasts its renewed members."""
        c = self._table.c
        groups: list[ColumnElement[Any]] = [bindparam(f"g{index}") for index in range(size)]
        named = listed(self._table, size) & c.lease.isnot(None)
        return (
            update(self._table)
            .where(
                (named | ((c.mode == GROUP) & c.lock_key.in_(groups)))
                & ~_expired(self._table, by_key=True)
            )
            .values(expires_at=utc_after(c.lease))
        )


def _join_or_found(table: Table, join: Update, serialised: CTE, blocked: Select[Any]) -> Any:
    """``SharedStatements.join_or_found`` from ``join``, which returns the token of the
    group it joined, ``serialised``, the key's advisory lock, and ``blocked``, which
    finds a writer's row or mark."""
    c = table.c
    joined = join.cte("joined")
    founder = {
        **holder_values(),
        **process_values(),
        "owner_id": bindparam("group_owner"),
        "lease": bindparam("ttl", type_=Float),
        "mode": literal(GROUP),
        "members": literal(1),
    }
    founded = (
        postgresql.insert(table)
        .from_select(
            list(founder), _row(founder).select_from(serialised).where(~exists(joined.select()))
        )
        .on_conflict_do_nothing(index_elements=[c.lock_key])
        .returning(c.token)
        .cte("founded")
    )
    groups = union_all(joined.select(), founded.select()).cte("chosen")
    member = {
        **holder_values(),
        **process_values(),
        "lock_key": bindparam("reader"),
        "mode": literal(SHARED),
        "parent": groups.c.token,
    }
    was_founded = select(func.count()).select_from(founded).scalar_subquery()
    inserted = (
        postgresql.insert(table)
        .from_select(list(member), _row(member).select_from(serialised, groups))
        .on_conflict_do_nothing(index_elements=[c.lock_key])
        .returning(c.token, c.parent, was_founded.label("founded"))
        .cte("inserted")
    )
    blocker = blocked.subquery()
    refused = select(null(), null(), null(), blocker.c.mode).where(~exists(inserted.select()))
    done = select(inserted.c.token, inserted.c.parent, inserted.c.founded, cast(null(), String))
    return union_all(done, refused)


def _counted_last(
    table: Table, join_this_group: Update, joinable: ColumnElement[bool]
) -> tuple[Insert, Insert, Select[Any], Update]:
    """``SharedStatements.insert_member``, ``insert_founder``, ``open_group`` and
    ``join_this_group``, for MariaDB/MySQL."""
    inserts = []
    for shared in (
        {"mode": literal(SHARED), "parent": bindparam("parent", type_=BigInteger)},
        {"mode": literal(GROUP), "members": literal(0)},
    ):
        values = {**holder_values(), **process_values(), **shared}
        inserts.append(if_absent(mysql.insert(table).values(values)))
    return inserts[0], inserts[1], select(table.c.token).where(joinable), join_this_group


def _row(values: dict[str, ColumnElement[Any]]) -> Select[Any]:
    return select(*(value.label(name) for name, value in values.items()))


def _announced(
    statement: Delete | Update, key: Column[Any], channel: str | None, kind: str = ""
) -> Any:
    """``statement``; on PostgreSQL (``channel`` given), also a NOTIFY of the key of each
    row it deletes or changes, after ``kind`` (a prefix of ``notify``'s), as releases send."""
    if channel is None:
        return statement
    changed = statement.returning(key).cte("changed")
    payload = literal(kind) + changed.c.lock_key if kind else changed.c.lock_key
    return select(func.pg_notify(literal(channel), payload))


class SharedQueries(Queries):
    """``SharedStatements`` compiled for one dialect."""

    join_group: Query
    join_or_found: Query | None = None
    insert_member: Query | None = None
    insert_founder: Query | None = None
    open_group: Query | None = None
    join_this_group: Query | None = None
    select_group: Query
    group_open: Query
    count_out: Query
    count_out_members: Query | None = None
    leave_group: Query | None = None
    delete_empty_group: Query
    reserve_empty_group: Query
    writer_waits: Query
    select_under: Query
    expired_readers: Query
    select_reader: Query
    select_permit: Query
    read_blocked: Query
    count_under: Query
    to_group: Query
    extend_group: Query
