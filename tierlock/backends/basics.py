"""What every engine shares: the namespace name, fencing tokens, how long connecting
may take, and the holder record that engines keeping a hold as one value (a Redis
string, a ZooKeeper node's data) store as JSON."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, NamedTuple

from ..records import LockInfo, Owner

__all__ = [
    "CONNECT_TIMEOUT",
    "HANDOFF_BITS",
    "MAX_HANDOFFS",
    "Record",
    "check_table_name",
    "connect_timeout",
    "fencing_token",
]

# Names derived from the table name (index, constraint, sequence) must stay under
# PostgreSQL's 63-character identifier limit.
MAX_TABLE_NAME_LENGTH = 40
_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# A fencing token is a hold's number from the engine (a row's, a counter's, a node's
# creation id) shifted left by HANDOFF_BITS plus how many times the hold was handed from
# one thread of its process to the next; hand-offs per hold stay far below
# 2**HANDOFF_BITS, so tokens strictly increase across all holds of a key.
HANDOFF_BITS = 16
MAX_HANDOFFS = (1 << HANDOFF_BITS) - 1


# The longest, in seconds, that opening a connection may take (see ``connect_timeout``).
CONNECT_TIMEOUT = 5.0


def connect_timeout(timeout: float) -> float:
    """How long opening a connection may take (the TCP connect, the server's greeting
    and the login together) when one operation may take ``timeout``: at most half of
    it, so that a try that connects still has time for its request."""
    return min(CONNECT_TIMEOUT, timeout / 2)


def fencing_token(number: int, handoffs: int) -> int:
    return (number << HANDOFF_BITS) | handoffs


def check_table_name(name: object) -> str:
    """``table=``: the name of the lock table, key prefix, node or directory."""
    if not isinstance(name, str):
        raise TypeError(f"table must be a str, not {type(name).__name__}")
    if not _PLAIN_IDENTIFIER.match(name) or len(name) > MAX_TABLE_NAME_LENGTH:
        raise ValueError(
            f"table must be a plain identifier (letters, digits, underscores, not starting "
            f"with a digit, at most {MAX_TABLE_NAME_LENGTH} characters), got {name!r}"
        )
    return name


def _utc(milliseconds: int) -> datetime:
    return datetime.fromtimestamp(milliseconds / 1000, timezone.utc)


class Record(NamedTuple):
    """A holder record: who holds, since when (``acquired``, milliseconds since the epoch
    by the engine's clock), with which lease renewal (``lease``: ``None`` for a fixed
    lease) and after how many hand-offs. The fencing token and the lease's end are kept
    by the engine beside it."""

    owner_id: str
    host: str
    host_id: str | None
    pid: int
    proc_start: int | None
    thread_id: int
    thread_name: str
    acquired: int
    lease: float | None
    handoffs: int = 0

    @classmethod
    def of(cls, owner: Owner, acquired: int, lease: float | None, handoffs: int = 0) -> Record:
        return cls(
            owner.owner_id,
            owner.host,
            owner.host_id,
            owner.pid,
            owner.proc_start,
            owner.thread_id,
            owner.thread_name,
            acquired,
            lease,
            handoffs,
        )

    def passed_to(self, holder: Owner, handoffs: int, lease: float | None) -> Record:
        """This record naming ``holder``, a thread of the same process."""
        return self._replace(
            thread_id=holder.thread_id,
            thread_name=holder.thread_name,
            handoffs=handoffs,
            lease=lease,
        )

    def dumps(self) -> str:
        return json.dumps(self, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def loads(cls, data: str | bytes) -> Record:
        fields: list[Any] = json.loads(data)
        return cls(*fields)

    def info(self, key: str, number: int, expires: int, now: int) -> LockInfo:
        """The hold as ``LockInfo``: ``number`` is the engine's base of the fencing
        token, ``expires`` and ``now`` milliseconds since the epoch by its clock."""
        return LockInfo(
            key=key,
            token=fencing_token(number, self.handoffs),
            owner=self.owner_id,
            host=self.host,
            pid=self.pid,
            thread_id=self.thread_id,
            thread_name=self.thread_name,
            acquired_at=_utc(self.acquired),
            expires_at=_utc(expires),
            expired=expires <= now,
            lease=self.lease,
            host_id=self.host_id,
            process_start=self.proc_start,
        )
