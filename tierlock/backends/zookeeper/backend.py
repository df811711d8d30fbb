"""The ZooKeeper backend: a hold is an EPHEMERAL node that lives as long as the
manager's session (``session``), named by its key, with the holder record as its data
and an owner node beside it (``nodes``, ``holds``); pollers watch the hold node and
mark the keys they wait for (``waiting``).

A renewed hold needs no renewal: the session is its lease, kept alive by kazoo's pings;
the heartbeat only checks that each node is still there, in the session it belongs to.
Whatever its lease, belief in a hold ends with its session's ``promise`` (see
``wire``), before the server can expire the session and free the key for others.
A fixed lease (``renew=False``) also ends ``ttl`` after the node's last write, by the
server's clock, and so does a renewed lease shorter than the session, which the
heartbeat rewrites (see ``nodes.Holder``); a waiter then takes the node over. The
fencing token is the node's ``czxid``: the id of the transaction that created it, which
only grows, across server restarts too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ... import process
from ...errors import UNREACHABLE, BackendError
from ...records import LockInfo, Owner, Promise
from ...stats import Counters
from .. import Doorbell, LockBackend
from ..basics import MAX_HANDOFFS, Record, check_table_name, fencing_token
from .address import parse_url
from .holds import Found, Nodes, holder_info
from .nodes import Holder, Paths, milliseconds
from .session import Calls, Session
from .sweeper import Sweeper, unless_unreachable
from .waiting import Waiting

__all__ = ["ZooKeeperBackend"]

logger = logging.getLogger(__name__)

# Tries of one acquire at a key whose node keeps changing under it (freed, taken, taken
# over by another waiter) before it counts as held.
ROUNDS = 4


class _Held(NamedTuple):
    """A hold of this backend, as it wrote it: what a hand-off or extend rewrites, the
    session its node lives in, and the server's time at its last write with this
    process's ``time.monotonic()`` when that was answered."""

    holder: Holder
    session: int
    written: int
    written_at: float

    def server_now(self) -> int:
        """The server's time now as seen from the last write (milliseconds)."""
        return self.written + milliseconds(time.monotonic() - self.written_at)


class ZooKeeperBackend(LockBackend):
    """Holds as ephemeral nodes under ``<chroot>/<table>``."""

    MAX_HANDOFFS = MAX_HANDOFFS

    def __init__(
        self, url: str, *, table: str, ttl: float, counters: Counters, timeout: float
    ) -> None:
        table = check_table_name(table)
        address = parse_url(url)
        self.location = address.location
        self.paths = Paths(address.chroot, table)
        if self.paths.base.startswith("/zookeeper/") or self.paths.base == "/zookeeper":
            raise ValueError("/zookeeper is ZooKeeper's own: choose another chroot or table")
        self.counters = counters
        self.timeout = timeout
        self._renew_now: Callable[[str | None], None] | None = None
        self.session = Session(address, ttl, timeout, counters, self._promised, self._connected)
        self.nodes = Nodes(self.paths, counters)
        self._sweeper = Sweeper()
        self._waiting = Waiting(self.session, self.paths, counters, self._later)
        self._forget_holds()
        self.session.run("prepare", None, lambda calls, _: self.nodes.prepare(calls))

    def _promised(self, promise: Promise) -> None:
        """Bound the holds taken from now on by a new session's ``promise`` (those of an
        earlier session keep its own, which ended with it)."""
        self.promise = promise

    def _connected(self) -> None:
        """Renewals fail at once while the connection is lost: after a reconnect, the
        next goes at once, for a server that restarts again and again may be reachable
        only for moments."""
        renew_now = self._renew_now
        if renew_now is not None:
            renew_now(None)

    def ask_for_renewals(self, renew_now: Callable[[str | None], None]) -> None:
        self._renew_now = renew_now

    def _later(self, job: Callable[[], bool], delay: float) -> None:
        self._sweeper.add(job, delay=delay)

    def _forget_holds(self) -> None:
        self._held: dict[str, _Held] = {}  # by owner id
        # Owner ids whose create went unanswered, with its request (IAsyncResult).
        self._doubts: dict[str, Any] = {}

    @property
    def closed(self) -> bool:
        return self.session.gate.shut

    # -- holds -----------------------------------------------------------------------

    def try_acquire(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None = None,
        limit: float | None = None,
    ) -> int | None:
        holder = Holder(Record.of(owner, 0, lease), self._lapse(ttl, lease))
        owner_id = owner.owner_id

        def sent(request: Any) -> None:
            self._doubts[owner_id] = request

        def attempt(calls: Calls, uncertain: bool) -> int | None:
            if uncertain:  # an earlier create may have been applied: look
                found = self.nodes.read(calls, key)
                if found is not None and found.owner_id == owner_id:
                    return self._won(calls, found.holder or holder, found.stat)
            replacing, why = None, None
            for _ in range(ROUNDS):
                stat = self.nodes.create(calls, key, holder, replacing, sent)
                if stat is not None:
                    if why is not None:
                        self.counters.add(why)
                    if self.closed:  # won just as the manager closed: nobody will hold it
                        self.nodes.delete_owned(calls, key, owner_id)
                        return None
                    return self._won(calls, holder, stat)
                replacing = self.nodes.read(calls, key)
                why = None if replacing is None else self._why_free(calls, replacing)
                if replacing is not None and why is None:
                    return None
            return None

        token: int | None = self.session.run("acquire", key, attempt)
        self._doubts.pop(owner_id, None)
        return token

    def _lapse(self, ttl: float, lease: float | None) -> int | None:
        """``Holder.lapse`` of a hold of ``ttl`` renewed by ``lease`` (``None``: fixed)."""
        if lease is None:
            return milliseconds(ttl)
        return milliseconds(lease) if lease < self.session.granted else None

    def _won(self, calls: Calls, holder: Holder, stat: Any) -> int:
        self._held[holder.record.owner_id] = _Held(
            holder, int(stat.ephemeralOwner), int(stat.mtime), calls.began
        )
        return fencing_token(int(stat.czxid), holder.record.handoffs)

    def _why_free(self, calls: Calls, found: Found) -> str | None:
        """Why the hold ``found`` may be taken over, as the counter of such takings:
        its holder process is proven gone, or its fixed lease has ended by the server's
        clock; ``None`` if it may not."""
        if found.holder is None:
            return None  # (not this backend's: only force_release removes it)
        record = found.holder.record
        if process.is_gone(record.host_id, record.pid, record.proc_start):
            return "reclaims"
        ends = found.ends()
        if ends is not None and self.nodes.now(calls, self.nodes.clock(calls)) >= ends:
            return "takeovers"
        return None

    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        def attempt(calls: Calls, uncertain: bool) -> bool:
            held = self._held.get(owner_id)
            if held is not None and held.session != self.session.session_id:
                return False  # its session ended, and took the node along
            if self.nodes.delete_owned(calls, key, owner_id):
                return True
            # The node is gone. After a dropped connection that may be our own earlier
            # try's doing, but only while the lease surely ran could nobody else have
            # removed it; after that, it is lost.
            return uncertain and time.monotonic() < live_until

        released: bool = self.session.run("release", key, attempt)
        self._held.pop(owner_id, None)
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
        def passed(held: _Held) -> Holder:
            record = held.holder.record.passed_to(successor, handoffs, lease)
            return Holder(record._replace(acquired=held.server_now()), self._lapse(ttl, lease))

        return self._rewrite("handoff", key, owner_id, passed)

    def record_holder(
        self, key: str, owner_id: str, holder: Owner, handoffs: int, lease: float | None
    ) -> bool:
        def passed(held: _Held) -> Holder:
            record = held.holder.record.passed_to(holder, handoffs, lease)
            lapse = held.holder.lapse if lease is None else self._lapse(lease, lease)
            return Holder(record._replace(acquired=held.server_now()), lapse)

        return self._rewrite("record", key, owner_id, passed)

    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        def extended(held: _Held) -> Holder:
            record = held.holder.record._replace(lease=lease)
            return Holder(record, self._lapse(ttl, lease))

        return self._rewrite("extend", key, owner_id, extended)

    def _rewrite(
        self, what: str, key: str, owner_id: str, change: Callable[[_Held], Holder]
    ) -> bool:
        """Write ``change(held)`` into ``owner_id``'s hold of ``key``; ``False`` if the
        hold is no longer theirs. Writing the same again after a lost answer is
        harmless: only the owner writes its node."""

        def attempt(calls: Calls, uncertain: bool) -> bool:
            held = self._held.get(owner_id) or self._reread(calls, key, owner_id)
            if held is None:
                return False
            holder = change(held)
            stat = self.nodes.rewritten(calls, self.nodes.rewrite(calls, key, owner_id, holder))
            if stat is None:
                return False
            self._held[owner_id] = _Held(holder, held.session, int(stat.mtime), calls.began)
            return True

        done: bool = self.session.run(what, key, attempt)
        return done

    def _reread(self, calls: Calls, key: str, owner_id: str) -> _Held | None:
        """``owner_id``'s hold of ``key`` as the server has it, for a hold this backend
        has forgotten (which it should not): rewriting it needs its record."""
        found = self.nodes.read(calls, key)
        if found is None or found.holder is None or found.owner_id != owner_id:
            return None
        stat = found.stat
        return _Held(found.holder, int(stat.ephemeralOwner), int(stat.mtime), calls.began)

    def renew(self, holds: Sequence[tuple[str, str]]) -> set[str]:
        """The session keeps renewed holds alive: check, in one round trip, that each
        owner node is still there, in the session of now; rewrite (in the same round
        trip) the holds whose lease is shorter than the session's."""
        self.counters.add("heartbeats")
        session = self.session
        if not session.connected:
            if session.may_have_expired():
                return set()  # (their nodes may be gone: say so, rather than hide it)
            raise BackendError(f"{UNREACHABLE}ZooKeeper at {self.location} (renewals)")
        current = session.session_id
        ours = [(key, owner) for key, owner in holds if self._in_session(owner, current)]

        def attempt(calls: Calls, uncertain: bool) -> set[str]:
            asked = [(owner, self._renewal(calls, key, owner)) for key, owner in ours]
            renewed = set()
            for owner, (request, held) in asked:
                if held is None:
                    stat = calls.wait(request)
                    if stat is not None and stat.ephemeralOwner == current:
                        renewed.add(owner)
                elif (stat := self.nodes.rewritten(calls, request)) is not None:
                    if self._held.get(owner) is held:  # (not released or rewritten since)
                        self._held[owner] = held._replace(
                            written=int(stat.mtime), written_at=calls.began
                        )
                    renewed.add(owner)
            return renewed

        renewed: set[str] = session.run("renew", None, attempt, wait=False)
        return renewed

    def _renewal(self, calls: Calls, key: str, owner_id: str) -> tuple[Any, _Held | None]:
        """Send what renews ``owner_id``'s hold of ``key``: a rewrite for a hold whose
        lease ends by the server's clock (with the hold), else a look at its owner node."""
        held = self._held.get(owner_id)
        if held is not None and held.holder.lapse is not None:
            return self.nodes.rewrite(calls, key, owner_id, held.holder), held
        return calls.send(calls.client.exists_async(self.paths.owner(owner_id))), None

    def _in_session(self, owner_id: str, session: int | None) -> bool:
        held = self._held.get(owner_id)
        return session is not None and (held is None or held.session == session)

    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        self._held.pop(owner_id, None)
        pending = self._doubts.pop(owner_id, None)
        if pending is None and not certain:
            return

        def sweep() -> bool:
            deleted: bool = self.session.run(
                "sweep", key, lambda calls, _: self.nodes.delete_owned(calls, key, owner_id)
            )
            if deleted:
                logger.warning("lock %r: deleted a node its interrupted owner left", key)
            return True

        self._sweeper.add(unless_unreachable(sweep), pending)

    # -- what others see -------------------------------------------------------------

    def is_locked(self, key: str) -> bool:
        def attempt(calls: Calls, uncertain: bool) -> bool:
            found = self.nodes.read(calls, key)
            if found is None:
                return False
            ends = found.ends()
            return ends is None or self.nodes.now(calls, self.nodes.clock(calls)) < ends

        locked: bool = self.session.run("locked", key, attempt)
        return locked

    def info(self, key: str) -> LockInfo | None:
        def attempt(calls: Calls, uncertain: bool) -> LockInfo | None:
            clock = self.nodes.clock(calls)
            found = self.nodes.read(calls, key)
            now = self.nodes.now(calls, clock)
            if found is None or found.holder is None:
                return None
            return holder_info(key, found, now)

        info: LockInfo | None = self.session.run("info", key, attempt)
        return info

    def holders(self) -> list[LockInfo]:
        def attempt(calls: Calls, uncertain: bool) -> list[LockInfo]:
            found, now = self.nodes.read_all(calls)
            return [holder_info(key, one, now) for key, one in found if one.holder is not None]

        holders: list[LockInfo] = self.session.run("holders", None, attempt)
        return holders

    def force_release(self, key: str) -> bool:
        def attempt(calls: Calls, uncertain: bool) -> bool:
            for _ in range(ROUNDS):
                found = self.nodes.read(calls, key)
                if found is None:
                    return uncertain  # (our own earlier try may have deleted it)
                if self.nodes.remove(calls, key, found):
                    return True
            return False

        removed: bool = self.session.run("force_release", key, attempt)
        return removed

    def reap(self) -> int:
        def attempt(calls: Calls, uncertain: bool) -> int:
            found, now = self.nodes.read_all(calls)
            reaped = 0
            for key, one in found:
                ends = one.ends()
                if ends is not None and ends <= now and self.nodes.remove(calls, key, one):
                    reaped += 1
            self.nodes.remove_empty_queues(calls)
            return reaped

        reaped: int = self.session.run("reap", None, attempt)
        self.counters.add("reaped", reaped)
        return reaped

    # -- waiting ---------------------------------------------------------------------

    def doorbell(self, key: str) -> Doorbell:
        return self._waiting.doorbell(key)

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        return self._waiting.others_waiting(key)

    def want(self, key: str, seconds: float) -> None:
        self._waiting.want(key, seconds)

    # -- the backend's life --------------------------------------------------------------

    def after_fork(self) -> None:
        self.session.forget()
        self._sweeper.forget()
        self._waiting.forget()
        self._forget_holds()

    def close(self) -> None:
        if self.closed:
            return
        self._waiting.wake_all()
        gate = self.session.gate
        gate.close(self.timeout * 1.5)
        self._sweeper.stop()
        gate.seal()
        self.session.close()
