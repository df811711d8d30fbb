"""The nodes of a namespace and what they hold.

Everything of table ``T`` lives under ``<chroot>/T``::

    <chroot>/T/<encoded key>        the hold of a key: an EPHEMERAL node, the holder record
    <chroot>/T/#owners/<owner id>   beside each hold: an EPHEMERAL node named by its owner
    <chroot>/T/#waiting/<encoded key>/<process tag>-<sequence>
                                    EPHEMERAL marks of the processes that wait for a key
                                    (``waiting``)
    <chroot>/T/#clock               written to read the server's time from its stat

A hold node is created, taken over and deleted only together with its owner node, in
one transaction, so that the owner node exists exactly while its owner's hold node does.
Its owner checks for it in every transaction that changes or deletes the hold, and a
waiter that takes a hold over deletes it in the same transaction: data versions start
again at 0 on every node made at a path, so a compare-and-set on the version alone
could hit a successor's node (two waiters could both take one hold over); an owner
node's name is never used twice.

A key becomes a node name by percent-encoding every byte of its UTF-8 form except
letters, digits, ``_``, ``-`` and ``~``: the name is ASCII, never ``.`` or ``..``, and
never begins with ``#``, which the namespace's own nodes do.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from kazoo.exceptions import RolledBackError, RuntimeInconsistency

from ..basics import Record

__all__ = ["Holder", "Paths", "decode_holder", "encode_holder", "failure", "milliseconds"]

OWNERS = "#owners"
WAITING = "#waiting"
CLOCK = "#clock"
# Between the holder record (JSON, which never holds a raw newline) and its lapse.
TRAILER = "\n"


class Paths:
    """Node paths of one namespace."""

    def __init__(self, chroot: str, table: str) -> None:
        self.base = f"{chroot}/{table}"
        self.owners = f"{self.base}/{OWNERS}"
        self.waiting = f"{self.base}/{WAITING}"
        self.clock = f"{self.base}/{CLOCK}"

    def hold(self, key: str) -> str:
        return f"{self.base}/{encode_key(key)}"

    def owner(self, owner_id: str) -> str:
        return f"{self.owners}/{owner_id}"

    def queue(self, key: str) -> str:
        return f"{self.waiting}/{encode_key(key)}"


def encode_key(key: str) -> str:
    return quote(key, safe="").replace(".", "%2E")


def decode_key(name: str) -> str | None:
    """The key of a child of the namespace, or ``None`` for the namespace's own nodes."""
    return None if name.startswith("#") else unquote(name)


def milliseconds(seconds: float) -> int:
    return round(seconds * 1000)


class Holder(NamedTuple):
    """A hold node's content: the record, and ``lapse``: for a hold whose lease ends by
    the server's clock, how long after the node's last write (its ``mtime``) that is,
    in milliseconds; ``None`` for a hold that lives as long as its session.

    A fixed lease ends so. So does a renewed one shorter than the session's timeout,
    which the heartbeat rewrites every third of it: the session alone would keep it too
    long once its holder stops. A renewed lease as long as the session's timeout, or
    longer, is the session's.
    """

    record: Record
    lapse: int | None

    def encode(self) -> bytes:
        return encode_holder(self.record, self.lapse)

    def ends(self, stat: Any) -> int | None:
        """When the lease ends (server milliseconds); ``None``: with the session."""
        return None if self.lapse is None else int(stat.mtime) + self.lapse


def encode_holder(record: Record, lapse: int | None) -> bytes:
    text = record.dumps() if lapse is None else f"{record.dumps()}{TRAILER}{lapse}"
    return text.encode("utf-8")


def decode_holder(data: bytes) -> Holder | None:
    """``None`` for a node this backend did not write."""
    try:
        text, trailer, lapse = data.decode("utf-8").partition(TRAILER)
        return Holder(Record.loads(text), int(lapse) if trailer else None)
    except (ValueError, TypeError):
        return None


def failure(results: list[Any]) -> tuple[int, Exception] | None:
    """Which operation of a committed transaction failed, and how; ``None`` if none."""
    for index, result in enumerate(results):
        # (the others are reported as rolled back, or not applied at all)
        if isinstance(result, Exception) and not isinstance(
            result, (RolledBackError, RuntimeInconsistency)
        ):
            return index, result
    return None
