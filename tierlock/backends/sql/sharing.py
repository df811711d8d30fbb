"""Read holds and semaphore permits as rows of the lock table.

**Read holds.** Readers of a key hold it together through one *group row* under the key
itself, so an exclusive hold's single insert is refused while readers hold the key, and
costs nothing more than before. The group row counts its members; each reader process
also has a row of its own, under ``<key>\x01r<owner id>``, with its holder record,
lease and ``parent``, the group row's token. A reader joins by adding one to the count
of an open group (or inserting the group row) and inserting its row, in one short
transaction; it leaves by deleting its row and, only if that delete removed it,
subtracting one, in one transaction, then deletes the group row if the count is zero.
(On PostgreSQL each transaction is one statement, with data-modifying CTEs; a join
whose snapshot missed a group founded while it waited for the key's lock goes on with
the transaction. On MariaDB/MySQL a join inserts its row before it counts itself in,
and founds an empty group apart: no transaction there draws a token after it locked a
row, which deadlocks with an insert holding InnoDB's AUTO-INC lock; and every
transaction that changes a group and a reader's row changes the group first.)
Whoever deletes a reader's row (its owner, a writer freeing a dead reader, the reaper,
the sweep after an interrupted acquire) counts it out in the same transaction, so each
member is counted out exactly once, and a retry after a lost reply repeats nothing. An
empty group left behind (its last reader's process died between the two steps) is
deleted by the next writer that meets it.

The race the count prevents: with "delete the group when no reader rows exist" instead,
PostgreSQL re-checks a concurrently updated row against the latest version but
evaluates the ``NOT EXISTS`` with the statement's old snapshot, and deletes a group a
reader has just joined. ``DELETE ... WHERE members = 0`` is re-checked on the row itself.

The group row outlasts the lease each member counts on: a join pushes the group's end
to at least the joiner's lease from the moment of the join (the reader counts its lease
from before it asked), and the heartbeat renews a reader's row and its group in one
statement. So a group whose lease has ended has no member whose lease surely runs,
and a writer may take it over as it takes over any expired row.

**Writer preference.** A writer whose insert finds a group marks it ``waiting`` for
``WRITER_WAIT`` seconds, again at each try; a group marked so takes no new members, so
it drains and the writer gets the key. The writer also reclaims the rows of readers
whose lease ended or whose process it can prove gone.

**Permits.** A semaphore of ``n`` permits is ``n`` slots, rows under ``<key>\\x01p<i>``,
each an exclusive hold of its own (lease, takeover, renewal as for any key), with
``permits`` recorded. A taker lists the key's slot rows (one range read), refuses a
count that disagrees with a live holder's, and inserts the lowest free slot; the unique
key decides between two takers of one slot, so there is no window in which ``n + 1``
rows could stand, and no transaction is held open.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from ... import process
from ...keys import MARK, permit_key, reader_key, user_key
from ...stats import Counters
from .layout import GROUP, PERMIT, RESERVED, SHARED
from .link import Link, Undo
from .queries import Queries, Query
from .shared import SharedQueries

__all__ = [
    "ENDED",
    "WRITER_WAIT",
    "WRITER_WAITS",
    "Mismatch",
    "Sharing",
    "WriterWaits",
    "slot_range",
]

logger = logging.getLogger(__name__)

# How long a waiting writer's mark keeps new readers out after its last try (at most
# the time the writer has left).
WRITER_WAIT = 1.0

# What ``Sharing.leave`` gives when the leave itself ended the group.
ENDED = -1


class Mismatch(NamedTuple):
    """A holder of a semaphore found counting another number of permits."""

    permits: int
    pid: int


class WriterWaits:
    """A join refused because a writer waits: the key's row is a group or a reservation,
    with no holder whose row a reader could take over."""


WRITER_WAITS = WriterWaits()


def _members(row: Any) -> int:
    """A count-out's members, or ``ENDED`` if it reserved the group (see ``leave``)."""
    return ENDED if row[1] == RESERVED else int(row[0])


def slot_range(key: str, kind: str) -> dict[str, str]:
    """Parameters ``under``/``above`` for the rows of ``kind`` ("r", "p") under ``key``."""
    return {"under": f"{key}{MARK}{kind}", "above": f"{key}{MARK}{chr(ord(kind) + 1)}"}


class Inserter(Protocol):
    """The backend's insert-if-absent (``SQLBackend.insert_row``)."""

    def __call__(
        self, link: Link, params: dict[str, Any], query: Query | None = None
    ) -> int | None: ...


class Sharing:
    """The steps of read holds and permits, each on a link of the backend's; see the
    module docstring."""

    def __init__(
        self,
        queries: Queries,
        shared: SharedQueries,
        insert: Inserter,
        counters: Counters,
    ) -> None:
        """``insert(link, params)``: the backend's insert-if-absent, giving the new
        row's token (not yet a fencing token) or ``None``."""
        self.plain = queries
        self.queries = shared
        self._insert = insert
        self._counters = counters

    # -- readers -------------------------------------------------------------------

    def join(
        self, link: Link, key: str, params: dict[str, Any]
    ) -> tuple[int, int] | WriterWaits | None:
        """Join or found ``key``'s group and insert the reader's row, in one transaction
        (MariaDB/MySQL: the founding apart, see ``_join_counted_last``); the row's token
        and the group's, or ``None`` if the key is held exclusively or a writer waits
        (PostgreSQL: ``WRITER_WAITS`` when it says that a writer waits). ``params``: an
        insert's, for the reader's row."""
        if self.queries.join_or_found is not None:  # (PostgreSQL: in one statement first)
            owner = params["owner"]
            found = {**params, "key": key, "reader": reader_key(key, owner)}
            found["group_owner"] = "g" + owner[1:]  # (owner ids are hex: "g..." is unique)
            rows = link.execute(self.queries.join_or_found, found).rows
            if rows:
                token, group, founded, blocker = rows[0]
                if token is None:  # (a writer holds the key, or waits for it)
                    return WRITER_WAITS if blocker in (GROUP, RESERVED) else None
                self._counters.add("inserts", 1 + founded)
                return int(token), int(group)
        if self.queries.join_this_group is not None:
            return self._join_counted_last(link, key, params)
        with link.transaction():
            group = self._join_group(link, key, params["ttl"])
            if group is None:
                founder = {**params, "key": key, "mode": GROUP, "members": 1}
                founder.update(owner="g" + params["owner"][1:], lease=params["ttl"])
                group = self._insert(link, founder)  # (owner ids are hex: "g..." is unique)
            if group is None:  # (another reader may have founded it meanwhile)
                group = self._join_group(link, key, params["ttl"])
            if group is None:
                return None
            member = self._member(key, params, group)
            token = self._insert(link, member, self.queries.insert_member)
        if token is None:  # (an earlier try of the owner inserted it after all)
            raise RuntimeError(f"a reader's row of {key!r} exists already")
        return token, group

    def _join_counted_last(
        self, link: Link, key: str, params: dict[str, Any]
    ) -> tuple[int, int] | None:
        """``join`` on MariaDB/MySQL, where an insert that draws a token may wait for
        InnoDB's AUTO-INC lock, held by another key's insert that may itself wait for a
        row lock: so the transaction draws first, before it locks a row. It reads the
        group's token (founding the group, empty, if the key has no row), inserts the
        reader's row, and then counts it in; if the group closed or ended meanwhile, it
        rolls back, and the caller looks at the key again."""
        queries = self.queries
        assert queries.join_this_group is not None
        group = self._open_group(link, key)
        if group is None:
            founder = {**params, "key": key, "mode": GROUP, "members": 0}
            founder.update(owner="g" + params["owner"][1:], lease=params["ttl"])
            group = self._insert(link, founder, queries.insert_founder)  # ("g...": unique)
            if group is None:  # (another reader founded it meanwhile)
                group = self._open_group(link, key)
        if group is None:
            return None
        with link.transaction():
            token = self._insert(link, self._member(key, params, group), queries.insert_member)
            if token is None:
                raise RuntimeError(f"a reader's row of {key!r} exists already")
            counted_in = {"key": key, "group": group, "ttl": params["ttl"]}
            if link.count(queries.join_this_group, counted_in) != 1:
                raise Undo
            return token, group
        return None

    def _open_group(self, link: Link, key: str) -> int | None:
        """The token of ``key``'s group if it takes members, by a plain read (no lock)."""
        assert self.queries.open_group is not None
        row = link.first(self.queries.open_group, {"key": key})
        return None if row is None else int(row[0])

    @staticmethod
    def _member(key: str, params: dict[str, Any], group: int) -> dict[str, Any]:
        member = {**params, "key": reader_key(key, params["owner"]), "mode": SHARED}
        member["parent"] = group
        return member

    def _join_group(self, link: Link, key: str, ttl: float) -> int | None:
        queries = self.queries
        result = link.execute(queries.join_group, {"key": key, "ttl": ttl})
        if result.rows:  # (where UPDATE ... RETURNING exists, the token comes with it)
            return int(result.rows[0][0])
        if result.rowcount != 1:
            return None
        rows = link.execute(queries.select_group, {"key": key}).rows
        return int(rows[0][0]) if rows else None

    def leave(self, link: Link, key: str, owner_id: str, group: int) -> int | None:
        """Delete the reader's row and count it out of ``group``, in one transaction
        (PostgreSQL: one statement); ``None`` if the row or its group was gone (the hold
        was lost; the group gone means a writer took it over once its lease ended),
        ``ENDED`` if that left the group empty while a writer waits and the group is
        now reserved for writers (where UPDATE ... RETURNING exists; PostgreSQL
        announces it in the same statement), else the members the group still counts
        (0 where the database cannot say: perhaps none). The caller then ends an empty
        group, apart, so that a retry of either repeats nothing."""
        queries, reader = self.queries, reader_key(key, owner_id)
        this_group = {"key": key, "group": group}
        if queries.leave_group is not None:
            rows = link.execute(
                queries.leave_group, {**this_group, "reader": reader, "owner": owner_id}
            ).rows
            return _members(rows[0]) if rows else None
        with link.transaction():  # (the group's row first: see ``_free_reader``)
            if queries.count_out_members is None:
                members = 0 if self._count_out(link, key, group) else None
            else:
                rows = link.execute(queries.count_out_members, this_group).rows
                members = _members(rows[0]) if rows else None
            if link.count(self.plain.delete_owned, {"key": reader, "owner": owner_id}) != 1:
                raise Undo  # (the hold was lost: whoever deleted the row counted it out)
            return members
        return None

    def _count_out(self, link: Link, key: str, group: int) -> bool:
        """``group`` counts one member fewer; ``False`` if it is gone."""
        return link.execute(self.queries.count_out, {"key": key, "group": group}).rowcount == 1

    def drop_if_empty(self, link: Link, key: str, group: int) -> bool:
        """End ``group`` if it counts no member: delete it, or, while a writer waits,
        leave it reserved for writers (so that no reader founds a new group before the
        writer's next try); ``True`` if it ended."""
        params = {"key": key, "group": group}
        if link.execute(self.queries.delete_empty_group, params).rowcount == 1:
            return True
        return link.execute(self.queries.reserve_empty_group, params).rowcount == 1

    def discard_reader(self, link: Link, row_key: str, owner_id: str) -> int | None:
        """Delete the reader's row ``row_key`` of ``owner_id`` if it is there, counted out
        of its group, in one transaction; the group's token if it was there."""
        params = {"key": row_key, "owner": owner_id}
        rows = link.execute(self.queries.select_reader, params).rows
        if not rows:
            return None
        group: int = rows[0][1]
        with link.transaction():  # (the group's row first: see ``_free_reader``)
            self._count_out(link, user_key(row_key), group)
            if link.count(self.plain.delete_owned, params) != 1:
                raise Undo
            return group
        return None

    def still_open(self, link: Link, key: str, group: int) -> bool:
        """Whether ``group`` takes members (no writer waits)."""
        return bool(link.execute(self.queries.group_open, {"key": key, "group": group}).rows)

    def writer_waits(
        self, link: Link, key: str, group: int, members: int, wait: float | None
    ) -> bool:
        """A writer found ``key`` held by the live group ``group`` of ``members``
        readers: close it to new readers if the writer will wait (for ``wait`` seconds;
        ``None``: no limit), count out readers whose lease ended or whose process is
        gone, and delete the group if that left it empty; ``True`` if it is gone (or the
        mark found no group of the key), so the writer inserts again. (A group that
        still counts readers is left to the last of them, whose leave sees the mark and
        leaves the row to writers.)"""
        if wait is None or wait > 0:
            mark = WRITER_WAIT if wait is None else min(wait, WRITER_WAIT)
            if not link.execute(self.queries.writer_waits, {"key": key, "wait": mark}).rowcount:
                return True
        freed = 0
        for row in link.execute(self.queries.select_under, slot_range(key, "r")).records():
            freed += self._free_reader(link, key, row)
        if members > freed:
            return False
        return self.drop_if_empty(link, key, group)

    def _free_reader(self, link: Link, key: str, row: dict[str, Any]) -> bool:
        if not self._holder_gone(row):
            return False  # (a live reader: no transaction to open for nothing)
        # Every transaction that changes a group and a reader's row locks the group's row
        # first, as the heartbeat's renewal of both does (the group's key sorts first):
        # InnoDB then never meets two of them locking the two rows in opposite orders.
        with link.transaction():
            self._count_out(link, key, row["parent"])
            if not self._free(link, row):
                raise Undo
            return True
        return False

    def _free(self, link: Link, row: dict[str, Any]) -> bool:
        """Delete a reader's or permit's row whose lease ended or whose holder process is
        gone; ``True`` if this call deleted it."""
        params = {"key": row["lock_key"], "row": row["token"]}
        if row["expired"]:
            if link.execute(self.plain.delete_expired_row, params).rowcount != 1:
                return False
            self._counters.add("takeovers")
            logger.warning("lock %r: a hold whose lease had ended was taken over", row["lock_key"])
            return True
        if not self._holder_gone(row):
            return False
        if link.execute(self.plain.delete_row, params).rowcount != 1:
            return False
        self._counters.add("reclaims")
        logger.warning(
            "lock %r: freed the hold of process %d, which has exited", row["lock_key"], row["pid"]
        )
        return True

    @staticmethod
    def _holder_gone(row: dict[str, Any]) -> bool:
        """Whether a reader's or permit's row may be freed: its lease ended, or its
        holder process is gone."""
        return bool(row["expired"]) or process.is_gone(
            row["host_id"], row["pid"], row["proc_start"]
        )

    def reap_readers(self, link: Link) -> int:
        """Delete expired readers' rows, each counted out of its group."""
        deleted = 0
        for row in link.execute(self.queries.expired_readers).records():
            row.update(expired=True, host_id=None, pid=None, proc_start=None)
            key = user_key(row["lock_key"])
            if self._free_reader(link, key, row):
                deleted += 1
                self.drop_if_empty(link, key, row["parent"])  # (else the next writer does)
        return deleted

    def downgrade(self, link: Link, key: str, params: dict[str, Any]) -> tuple[int, int] | None:
        """Turn the exclusive hold of ``key`` of ``params["held_by"]`` into a group of one
        reader, whose row is inserted with ``params``; its token and the group's, or
        ``None`` if the hold was no longer theirs."""
        held = {"key": key, "owner": params["held_by"], "ttl": params["ttl"]}
        rows = link.execute(self.plain.select_owned_token, held).rows
        if not rows:
            return None
        group = int(rows[0][0])  # (the row keeps its token as it becomes the group)
        with link.transaction():  # (the reader's token drawn first: ``_join_counted_last``)
            token = self._insert(link, self._member(key, params, group), self.queries.insert_member)
            if token is None:
                raise RuntimeError(f"a reader's row of {key!r} exists already")
            if link.count(self.queries.to_group, held) != 1:
                raise Undo
            return token, group
        return None

    def extend_group(self, link: Link, key: str, ttl: float) -> bool:
        return link.execute(self.queries.extend_group, {"key": key, "ttl": ttl}).rowcount == 1

    # -- permits -------------------------------------------------------------------

    def take_permit(
        self, link: Link, key: str, permits: int, params: dict[str, Any]
    ) -> tuple[str, int] | Mismatch | None:
        """Insert the lowest free slot of ``key``'s ``permits``, freeing slots whose
        holders are gone; the slot's key and token, or ``None`` if all are taken, or
        the ``Mismatch`` of a live holder that counts another number of permits."""
        rows = link.execute(self.queries.select_under, slot_range(key, "p")).records()
        for row in rows:
            if row["permits"] != permits and not row["expired"]:
                return Mismatch(row["permits"], row["pid"])
        taken = {row["lock_key"]: row for row in rows}
        slot = {**params, "mode": PERMIT, "permits": permits}
        for index in range(permits):
            name = permit_key(key, index)
            holder = taken.get(name)
            if holder is not None and not self._free(link, holder):
                continue
            token = self._insert(link, {**slot, "key": name})
            if token is not None:
                return name, token
        return None
