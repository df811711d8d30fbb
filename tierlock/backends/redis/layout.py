"""Where a namespace's holds live in Redis, and what a hold's value holds.

A user's key ``K`` is stored under ``<table>:{K'}``, where ``K'`` is ``K`` with ``%``
written ``%25`` and ``}`` written ``%7D``: distinct keys stay distinct, and the braces
are a Redis Cluster hash tag that covers all of ``K'``, so that the hold's record, its
token counter ``<table>:{K'}:token``, the mark ``<table>:{K'}:want`` that a lost try
leaves (see ``RedisBackend.others_waiting``) and its channel of wake-ups all fall in one
slot (one Lua script may touch them together). Every key of a namespace begins with
``<table>:``.

A record's value is ``<owner id>\\n<number>\\n<Record JSON>``: the owner id first, so
that a script compares owners with one substring, then the base of the fencing token,
then ``basics.Record.dumps()``, whose list ends with the numbers ``acquired``, ``lease``
(or ``null``) and ``handoffs``, so that a script can find and rewrite those by a
pattern anchored at the end.
"""

from __future__ import annotations

import json
import math
import re
from typing import NamedTuple

from ...records import Owner
from ..basics import Record

__all__ = [
    "Names",
    "RecordHalves",
    "Stored",
    "milliseconds",
    "names",
    "record_halves",
    "scan_pattern",
    "user_key_of",
]

_ESCAPES = {"%": "%25", "}": "%7D"}
_ESCAPED = re.compile(r"[%}]")
_UNESCAPED = re.compile(r"%(25|7D)")
_UNESCAPES = {"25": "%", "7D": "}"}
# Owners (but for their ids) whose record halves a ``RecordHalves`` remembers at most;
# past this, it starts afresh.
REMEMBERED_OWNERS = 1024
# What ``record_halves`` puts where the server's clock reading goes: no other field
# that follows it (a positive lease, a hand-off count) can read ",-1,".
_ACQUIRED_SLOT = -1


class Names(NamedTuple):
    """The Redis names of one user key's hold."""

    record: str
    counter: str
    want: str
    channel: str


def names(table: str, key: str) -> Names:
    if "%" in key or "}" in key:
        key = _ESCAPED.sub(lambda found: _ESCAPES[found[0]], key)
    record = f"{table}:{{{key}}}"
    # The channel shares the record's name: channels and keys never meet.
    return Names(record, f"{record}:token", f"{record}:want", record)


def scan_pattern(table: str) -> str:
    """A SCAN pattern for the records of a namespace (counters and marks end in
    ``:token`` and ``:want``)."""
    return f"{table}:{{*}}"


def user_key_of(table: str, record: str) -> str:
    """The user's key of a record's Redis key."""
    escaped = record[len(table) + 2 : -1]
    return _UNESCAPED.sub(lambda found: _UNESCAPES[found[1]], escaped)


class Stored(NamedTuple):
    """A record's value, split."""

    owner_id: str
    number: int
    record: Record

    @classmethod
    def parse(cls, value: str) -> Stored:
        owner_id, number, text = value.split("\n", 2)
        return cls(owner_id, int(number), Record.loads(text))


def record_halves(record: Record) -> tuple[str, str]:
    """``record.dumps()`` cut where ``acquired`` goes, for a script to put the server's
    clock reading (milliseconds) between the halves."""
    text = record._replace(acquired=_ACQUIRED_SLOT).dumps()
    head, _, tail = text.rpartition(f",{_ACQUIRED_SLOT},")
    return head + ",", "," + tail


class RecordHalves:
    """``record_halves`` for acquires, made once per thread and lease: an owner's fields
    but its id stay the same from one acquire of a thread to the next, and writing the
    JSON anew each time costs more than the rest of the call."""

    def __init__(self) -> None:
        # By the owner's fields but its id, and the lease: the halves of a record with
        # no owner id, the head without its opening '[""'.
        self._known: dict[tuple[object, ...], tuple[str, str]] = {}

    def of(self, owner: Owner, lease: float | None) -> tuple[str, str]:
        """``record_halves(Record.of(owner, 0, lease))``."""
        fields = (*owner[1:], lease)
        known = self._known.get(fields)
        if known is None:
            if len(self._known) >= REMEMBERED_OWNERS:
                self._known.clear()
            head, tail = record_halves(Record.of(owner._replace(owner_id=""), 0, lease))
            known = self._known[fields] = (head[len('[""') :], tail)
        rest, tail = known
        return f"[{json.dumps(owner.owner_id, ensure_ascii=False)}{rest}", tail


def milliseconds(seconds: float) -> int:
    """A lease in whole milliseconds, never shorter than asked (and at least one)."""
    return max(1, math.ceil(seconds * 1000))
