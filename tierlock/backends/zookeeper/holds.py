"""The transactions on hold nodes (see ``nodes`` for the layout and why an owner node
goes with each hold node), and reading holds back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from ...records import LockInfo
from ...stats import Counters
from .nodes import Holder, Paths, decode_holder, decode_key, failure, milliseconds
from .session import Calls

__all__ = ["Found", "Nodes"]


class Found(NamedTuple):
    """A hold node as read: its content (``None``: not written by this backend) and
    its ``ZnodeStat``."""

    holder: Holder | None
    stat: Any

    @property
    def owner_id(self) -> str | None:
        return None if self.holder is None else self.holder.record.owner_id

    def ends(self) -> int | None:
        """When its lease ends (server milliseconds); ``None``: it lives as long as its
        holder's session (or was not written by this backend)."""
        return None if self.holder is None else self.holder.ends(self.stat)


class Nodes:
    """Hold nodes of one namespace, read and written within an operation's ``calls``."""

    def __init__(self, paths: Paths, counters: Counters) -> None:
        self.paths = paths
        self.counters = counters

    def prepare(self, calls: Calls) -> None:
        """Make the namespace's nodes (and the chroot) where they are missing."""
        paths = self.paths
        for path in (paths.owners, paths.waiting, paths.clock):
            calls.wait(calls.send(calls.client.ensure_path_async(path)))

    def read(self, calls: Calls, key: str) -> Found | None:
        try:
            data, stat = calls.wait(calls.send(calls.client.get_async(self.paths.hold(key))))
        except NoNodeError:
            return None
        return Found(decode_holder(data), stat)

    def read_all(self, calls: Calls) -> tuple[list[tuple[str, Found]], int]:
        """Every hold node, ordered by key, and the server's time (one round trip after
        the listing)."""
        client = calls.client
        names = calls.wait(calls.send(client.get_children_async(self.paths.base)))
        keys = sorted(key for name in names if (key := decode_key(name)) is not None)
        clock = self.clock(calls)
        asked = [(key, calls.send(client.get_async(self.paths.hold(key)))) for key in keys]
        now = self.now(calls, clock)
        found = []
        for key, request in asked:
            try:
                data, stat = calls.wait(request)
            except NoNodeError:
                continue  # (released meanwhile)
            found.append((key, Found(decode_holder(data), stat)))
        return found, now

    def remove_empty_queues(self, calls: Calls) -> None:
        """Delete the queues of keys nobody marks (left by pollers that died)."""
        client, waiting = calls.client, self.paths.waiting
        names = calls.wait(calls.send(client.get_children_async(waiting)))
        asked = [calls.send(client.delete_async(f"{waiting}/{name}")) for name in names]
        for request in asked:
            with contextlib.suppress(NoNodeError, NotEmptyError):
                calls.wait(request)

    def create(
        self,
        calls: Calls,
        key: str,
        holder: Holder,
        replacing: Found | None,
        sent: Callable[[Any], None],
    ) -> Any:
        """Create ``key``'s hold node with its owner node, in place of ``replacing``
        (which must be unchanged since it was read) if given; the new node's stat, or
        ``None`` if the key is held (or ``replacing`` changed). ``sent(request)`` is told
        of the request before its answer is awaited."""
        path, data = self.paths.hold(key), holder.encode()
        for _ in range(2):  # (again once the namespace is made, if it was deleted)
            transaction = calls.client.transaction()
            if replacing is not None:
                if replacing.owner_id is None:
                    return None  # (not this backend's: only force_release removes it)
                transaction.delete(self.paths.owner(replacing.owner_id))
                transaction.delete(path, version=replacing.stat.version)
            transaction.create(path, data, ephemeral=True)
            transaction.create(self.paths.owner(holder.record.owner_id), b"", ephemeral=True)
            transaction.set_data(path, data, 0)  # (only to learn the new node's stat)
            request = calls.send(transaction.commit_async())
            sent(request)
            results = calls.wait(request)
            failed = failure(results)
            if failed is None:
                self.counters.add("inserts")
                return results[-1]
            index, error = failed
            deletes = 0 if replacing is None else 2
            if index < deletes and isinstance(error, (NoNodeError, BadVersionError)):
                # The hold to replace changed since it was read (renewed, released, or
                # replaced by another waiter, whose transaction deleted its owner node).
                return None
            if index == deletes and isinstance(error, NodeExistsError):
                self.counters.add("insert_conflicts")
                return None
            if not isinstance(error, NoNodeError):
                raise error
            self.prepare(calls)  # (the namespace was deleted meanwhile)
        return None

    def delete_owned(self, calls: Calls, key: str, owner_id: str) -> bool:
        """Delete ``owner_id``'s hold of ``key``; ``False`` if it has none."""
        transaction = calls.client.transaction()
        transaction.delete(self.paths.owner(owner_id))
        transaction.delete(self.paths.hold(key))
        failed = failure(calls.wait(calls.send(transaction.commit_async())))
        if failed is None:
            return True
        index, error = failed
        if not isinstance(error, NoNodeError):
            raise error
        if index == 1:  # an owner node without its hold node: a pair broken by hand
            calls.wait(calls.send(calls.client.delete_async(self.paths.owner(owner_id))))
        return False

    def remove(self, calls: Calls, key: str, found: Found) -> bool:
        """Delete the hold ``found``, whoever's it is; ``False`` if it changed since."""
        path, owner_id = self.paths.hold(key), found.owner_id
        transaction = calls.client.transaction()
        if owner_id is not None:
            transaction.delete(self.paths.owner(owner_id))
        transaction.delete(path, version=found.stat.version)
        failed = failure(calls.wait(calls.send(transaction.commit_async())))
        if failed is None:
            return True
        index, error = failed
        if not isinstance(error, (NoNodeError, BadVersionError)):
            raise error
        if owner_id is None or index != 0:
            return False
        # No owner node: the hold was replaced since (a waiter's transaction deleted
        # it), or it is a node this backend did not make. Only the second may go, and
        # only if it is still the same node.
        again = self.read(calls, key)
        if again is None or again.stat.czxid != found.stat.czxid:
            return False
        request = calls.send(calls.client.delete_async(path, version=found.stat.version))
        try:
            calls.wait(request)
        except (NoNodeError, BadVersionError):
            return False
        return True

    def rewrite(self, calls: Calls, key: str, owner_id: str, holder: Holder) -> Any:
        """Make ``owner_id``'s hold node of ``key`` hold ``holder``: the request, whose
        ``rewritten`` answer tells how it went."""
        transaction = calls.client.transaction()
        transaction.check(self.paths.owner(owner_id), -1)
        transaction.set_data(self.paths.hold(key), holder.encode())
        return calls.send(transaction.commit_async())

    @staticmethod
    def rewritten(calls: Calls, request: Any) -> Any:
        """The new stat of a node ``rewrite`` asked to change, or ``None`` if the hold
        was no longer its owner's."""
        results = calls.wait(request)
        failed = failure(results)
        if failed is None:
            return results[1]
        if isinstance(failed[1], NoNodeError):
            return None
        raise failed[1]

    def clock(self, calls: Calls) -> Any:
        """Ask the server's time (the request; ``now`` reads the answer)."""
        return calls.send(calls.client.set_async(self.paths.clock, b""))

    def now(self, calls: Calls, request: Any) -> int:
        """The server's time in milliseconds since the epoch, from a ``clock`` request:
        the time it wrote the clock node."""
        try:
            return int(calls.wait(request).mtime)
        except NoNodeError:
            self.prepare(calls)
            return int(calls.wait(self.clock(calls)).mtime)


def holder_info(key: str, found: Found, now: int) -> LockInfo:
    """``found`` as ``LockInfo``, judged at ``now`` (server milliseconds).

    A node's ``ctime`` is when it was acquired (a record names a later time after a
    hand-off). A hold that lives as long as its holder's session never shows expired;
    its ``expires_at`` is what a heartbeat every third of the lease would have left, as
    the SQL engines show it: the lease from the last such beat.
    """
    assert found.holder is not None
    record, stat = found.holder.record, found.stat
    acquired = record.acquired or int(stat.ctime)
    ends = found.ends()
    if ends is None:
        lease = milliseconds(record.lease or 0.0)
        beat = max(1, lease // 3)
        ends = acquired + lease + max(0, now - acquired) // beat * beat
    return record._replace(acquired=acquired).info(key, int(stat.czxid), ends, now)
