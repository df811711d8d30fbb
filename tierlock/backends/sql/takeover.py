"""Taking over a row whose holder is gone: its lease ended, or its process exited.

An insert that finds the key held reads the holder's row, to take it over if its lease
has ended or its holder process is proven gone (on this host). A key that one of the
process's tries found held by a live holder is not read again for ``HOLDER_MEMORY``
seconds: a hot key held elsewhere then costs one statement per try (the insert) instead
of two, and a takeover comes at most that much later. The memory only ever spares a
read; whether the key is free is always the insert's answer. A row that keeps readers
out but lets a writer in (a group a writer waits for, a row reserved for writers) is
remembered for the process's readers only: a writer reads it at each try, so that it
takes the key as soon as the group's last reader has left, not up to that much later.
A writer of a process whose readers have just left a group that other readers still
count in (within ``HOLDER_MEMORY``) marks that group at once, as its try would once its
insert had failed and it had read the group's row: two statements fewer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ... import process
from ...keys import stand_in_key
from ...memories import remember
from ...stats import Counters
from .layout import GROUP, RESERVED
from .link import Link, Undo
from .queries import Queries

__all__ = ["Reserved", "Takeover"]

logger = logging.getLogger(__name__)

# How long a holder found alive is not read again: short next to any lease, and well
# under the second within which a dead holder on this host must be reclaimed.
HOLDER_MEMORY = 0.05


class Reserved(NamedTuple):
    """The token of a row reserved for writers (see ``sharing``)."""

    row: int


class Takeover:
    """Frees held rows whose holders are gone; see the module docstring."""

    def __init__(
        self,
        queries: Queries,
        counters: Counters,
        writer_waits: Callable[[Link, str, int, int, float | None], bool],
    ) -> None:
        """``writer_waits(link, key, group, members, wait)``: for a writer that found the
        key held by the ``members`` readers of group ``group`` (see ``sharing``); ``True``
        if they are gone."""
        self._queries = queries
        self._counters = counters
        self._writer_waits = writer_waits
        # Until when each key's holder counts as alive (time.monotonic()), for writers
        # and readers, and for readers only.
        self._alive_until: dict[str, float] = {}
        self._readers_out_until: dict[str, float] = {}
        # The group a writer of the process last marked, by key.
        self._marked: dict[str, int] = {}
        # A group the process's readers just left while others still counted in it, by
        # key: the group, its members, until when it is worth a writer's first try.
        self._left: dict[str, tuple[int, int, float]] = {}

    def forget(self, key: str) -> None:
        """``key`` was won by this process: its last holder is no longer news."""
        self._alive_until.pop(key, None)
        self._readers_out_until.pop(key, None)
        self._marked.pop(key, None)
        self._left.pop(key, None)

    def readers_out(self, key: str) -> None:
        """A reader's try found ``key`` closed to readers (a writer waits): it is not read
        again for readers for ``HOLDER_MEMORY`` seconds."""
        remember(self._readers_out_until, key, time.monotonic() + HOLDER_MEMORY)

    def others_read(self, key: str, group: int, members: int) -> None:
        """The process's readers left ``group`` of ``key``, which still counts
        ``members`` readers: the next writer of the process may mark it at once."""
        remember(self._left, key, (group, members, time.monotonic() + HOLDER_MEMORY))

    def just_left(self, key: str) -> bool:
        """Whether the process's readers just left a group of ``key`` others still read."""
        return time.monotonic() < self._left.get(key, (0, 0, 0.0))[2]

    def mark_left_group(self, link: Link, key: str, wait: float | None) -> bool | None:
        """For a writer's try: mark the group of ``key`` that the process's readers just
        left, as ``free_held_row`` marks a group it finds (``True``: its readers are
        gone, so insert); ``None`` if the process left none just now."""
        group, members, until = self._left.pop(key, (0, 0, 0.0))
        if time.monotonic() >= until:
            return None
        remember(self._marked, key, group)
        return self._writer_waits(link, key, group, members, wait)

    def marked_group(self, key: str) -> Reserved | None:
        """The group of ``key`` a writer of the process marked, once: its last reader
        reserves the row for writers as it leaves, and the writer's next try may then
        replace it at once, before it inserts and reads the holder's row."""
        group = self._marked.pop(key, None)
        return None if group is None else Reserved(group)

    def kept_readers_out(self, key: str) -> bool:
        """Whether a try of this process found ``key`` closed to readers (held by a
        live holder, or a writer waits) within the last ``HOLDER_MEMORY`` seconds."""
        now = time.monotonic()
        return now < max(self._alive_until.get(key, now), self._readers_out_until.get(key, now))

    def free_held_row(
        self, link: Link, key: str, *, writer: bool = True, wait: float | None = None
    ) -> bool | Reserved:
        """Delete the row holding ``key`` if its lease has ended or its holder process
        is proven gone; ``True`` if it did (or the row is gone), so the caller inserts
        again. ``writer``: the caller wants an exclusive hold (else a read hold), and
        will keep trying for ``wait`` seconds (``None``: until it gets it); a writer
        gets ``Reserved`` for a row reserved for writers, to replace in a transaction
        (see ``take_reserved``), so that no reader slips in between."""
        now = time.monotonic()
        if now < self._alive_until.get(key, now):
            return False
        if not writer and now < self._readers_out_until.get(key, now):
            return False
        rows = link.execute(self._queries.select_holder, {"key": key}).records()
        if not rows:
            return True  # released since the insert: try again at once
        row = rows[0]
        params = {"key": key, "row": row["token"]}
        if row["mode"] == RESERVED:  # (left by a group whose readers left, for writers)
            if writer and not row["expired"]:
                return Reserved(row["token"])
            if row["expired"] and link.count(self._queries.delete_row, params):
                return True
            self.readers_out(key)
            return False
        if row["expired"]:
            if not link.count(self._queries.delete_expired_row, params):
                return False  # renewed or taken meanwhile
            logger.warning("lock %r: took over a hold whose lease had ended", key)
            self._counters.add("takeovers")
            return True
        if row["mode"] == GROUP:
            # Readers hold it, whoever founded the group: a writer waits for them, and
            # reads the row again at its next try, which its readers' leaving may ring
            # for (its mark keeps new readers out meanwhile).
            if writer:
                remember(self._marked, key, row["token"])
                return self._writer_waits(link, key, row["token"], row["members"] or 0, wait)
            self.readers_out(key)
            return False
        if not process.is_gone(row["host_id"], row["pid"], row["proc_start"]):
            remember(self._alive_until, key, now + HOLDER_MEMORY)
            return False
        if not link.count(self._queries.delete_row, params):
            return False
        logger.warning(
            "lock %r: took over the row of process %d, which has exited", key, row["pid"]
        )
        self._counters.add("reclaims")
        return True


def take_reserved(
    link: Link,
    key: str,
    owner_id: str,
    reserved: Reserved,
    insert: Callable[[str], Any],
    queries: Queries,
) -> Any:
    """Replace the reserved row of ``key`` with the writer's (``insert(row_key)``, whose
    result is returned), in one transaction: an insert of the key by anyone else waits
    for it, and then finds the writer's row. MariaDB/MySQL: the writer's row is
    inserted first, under a key of its own, and moved to ``key`` once the reservation is
    gone: an insert there may wait for InnoDB's AUTO-INC lock, and one that waited for
    it holding the key's row would deadlock with another insert of the key, which holds
    that lock while it waits for the row."""
    with link.transaction():
        if queries.serialise_key is not None:
            # First, as the insert would: a reader's insert holds it while it waits for
            # the delete, and would deadlock with an insert that asked for it after.
            link.execute(queries.serialise_key, {"key": key})
        if queries.rename_row is None:
            if not link.count(queries.delete_row, {"key": key, "row": reserved.row}):
                return None
            return insert(key)
        placeholder = stand_in_key(key, owner_id)
        token = insert(placeholder)
        if token is None or not link.count(queries.delete_row, {"key": key, "row": reserved.row}):
            raise Undo
        link.count(queries.rename_row, {"key": key, "placeholder": placeholder})
        return token
    return None
