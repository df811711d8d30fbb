"""The Redis backend: a hold is a key with an expiry, written only by Lua scripts that
compare owner ids. Where things live: ``layout``; the scripts: ``scripts``; failures
and retries: ``running``; many renewals at once: ``renewal`` (on a cluster, node by
node: ``cluster``); wake-ups: ``wakeups``; who else wants a key: ``wanting``;
abandoned holds: ``sweeping``.

Leases run on the server's clock: a record's expiry (PX) is its lease, so Redis removes
an expired hold by itself. ``reap()`` therefore has nothing to do, and ``info()`` and
``holders()`` never show an expired hold: it is gone by then.

Fencing tokens: a hold's number is one more than the key's last, kept in a counter
beside the record, or the server's clock in ticks of 100 microseconds if that is
higher. (Ticks rather than microseconds: shifted by ``basics.HANDOFF_BITS``, ticks keep
tokens below 2**63, within a signed 64-bit column, until about the year 2400, where
microseconds would pass it today.) With persistence (an append-only file), tokens never
go down across restarts. Without, the counter is lost with the data, and tokens still
rise across a restart as long as the server's clock then reads later than the key's
last number: the clock at its last acquire, plus however far acquires faster than
10,000 a second had pushed the counter ahead of the clock.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ... import process
from ...errors import LockError
from ...records import LockInfo, Owner
from ...stats import Counters
from ...urls import hide_password
from .. import Doorbell, LockBackend
from ..basics import MAX_HANDOFFS, Record, check_table_name, fencing_token
from .cluster import NODE_PATIENCE, ClusterRenewal
from .layout import (
    Names,
    RecordHalves,
    Stored,
    milliseconds,
    names,
    record_halves,
    scan_pattern,
    user_key_of,
)
from .renewal import renew_holds
from .running import CLUSTER_SCHEMES, Runner, open_client
from .scripts import ACQUIRE, EXTEND, FORCE_RELEASE, PASS, PEEK, RELEASE, Script, Scripts
from .sweeping import Sweeper
from .wakeups import WakeUps
from .wanting import Wanting
from .wire import Wire

__all__ = ["RedisBackend"]

logger = logging.getLogger(__name__)

# How long a key's token counter outlives its last acquire, in ms. Within it, numbers
# rise even if the server's clock steps back; after it the counter is gone (so keys
# used once cost no memory for good), and the next number is the server's clock in
# ticks, above every earlier one unless the clock stepped back by more than the key
# was idle.
COUNTER_LIFE = 7 * 24 * 3600 * 1000
# Keys asked for per SCAN.
SCAN_COUNT = 1000


class RedisBackend(LockBackend):
    """Holds as Redis keys with expiries; see the module docstring."""

    MAX_HANDOFFS = MAX_HANDOFFS

    def __init__(self, url: str, *, table: str, counters: Counters, timeout: float) -> None:
        self.table = check_table_name(table)
        self.counters = counters
        self.timeout = timeout
        self.location = hide_password(url)
        self._url = url
        self._cluster = url.partition("://")[0].lower() in CLUSTER_SCHEMES
        self._runner = Runner(url, timeout)
        self._run = self._runner.run
        self._scripts = Scripts(counters)
        # One try, as an SQL engine's first connection: a wrong address or password is
        # told at once.
        self._client: Any = self._run("connect", None, lambda _: self._connect(), retry=False)
        # Where the scripts of acquires and releases go: a cluster client finds each
        # key's node, a server's pool is used by the short way (``wire``).
        self._scripted: Any = self._client if self._cluster else Wire(self._client)
        self._halves = RecordHalves()
        self._wakeups = WakeUps(self._listening_connection)
        self._wanting = Wanting(self._scripts, counters, self._wakeups, cluster=self._cluster)
        self._sweeper = Sweeper(self._delete_owned, give_up_after=timeout)
        self._renewal = (
            ClusterRenewal(
                self._client,
                self._scripts,
                counters,
                self._runner,
                patience=min(NODE_PATIENCE, timeout / 2),
            )
            if self._cluster
            else None
        )
        self._expiry_times = True  # until the server turns PEXPIRETIME down

    def _connect(self) -> Any:
        client = open_client(self._url, self.timeout)
        if not self._cluster:  # (a cluster client has asked its nodes already)
            self.counters.add("statements")
            client.ping()
        return client

    def _call(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any:
        return self._scripts.run(self._scripted, script, keys, args)

    def _done(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> bool:
        """Run a script that returns 1 when it did its work (0: the hold was not there)."""
        return bool(self._call(script, keys, args) == 1)

    @property
    def closed(self) -> bool:
        """Whether ``close`` has begun: no new operation starts."""
        return self._runner.gate.shut

    # -- holds -----------------------------------------------------------------------

    def try_acquire(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None = None,
        limit: float | None = None,
    ) -> int | None:
        where = names(self.table, key)
        keys = (where.record, where.counter, where.want)
        owner_id = owner.owner_id
        head, tail = self._halves.of(owner, lease)
        tag, mark_life = self._wanting.acquire_args()
        args = [owner_id, milliseconds(ttl), head, tail, "", COUNTER_LIFE, tag, mark_life]

        def attempt(uncertain: bool) -> int | None:
            sent = time.monotonic()
            reply = self._call(ACQUIRE, keys, args)
            if isinstance(reply, str):  # held by someone else: the holder's value
                self._wanting.lost(where, sent)
                holder = Stored.parse(reply).record
                if not process.is_gone(holder.host_id, holder.pid, holder.proc_start):
                    self.counters.add("insert_conflicts")
                    return None
                # Its holder process is gone: take it if nobody changed it since.
                reply = self._call(ACQUIRE, keys, [*args[:4], reply, *args[5:]])
                if isinstance(reply, str):
                    self.counters.add("insert_conflicts")
                    return None
                if reply > 0:
                    logger.warning(
                        "lock %r: took over the hold of process %d, which has exited",
                        key,
                        holder.pid,
                    )
                    self.counters.add("reclaims")
            if reply > 0:
                self.counters.add("inserts")
            if self.closed:  # won just as the manager closed: nobody will hold it
                self._release(where, owner_id)
                return None
            return abs(int(reply))

        number = self._run("acquire", key, attempt, owner=owner_id)
        if number is None:
            return None
        self._runner.doubts.discard(owner_id)
        return fencing_token(number, 0)

    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        where = names(self.table, key)

        def attempt(uncertain: bool) -> bool:
            if self._release(where, owner_id):
                return True
            # The hold is gone. After a dropped connection that may be our own earlier
            # try's doing, but only while its lease surely ran could nothing else (its
            # expiry, a force_release) have removed it; after that, it is lost.
            return uncertain and time.monotonic() < live_until

        released: bool = self._run("release", key, attempt)
        return released

    def _release(self, where: Names, owner_id: str) -> bool:
        """Delete ``owner_id``'s hold and ring its key's pollers; ``False``: not theirs."""
        return self._done(RELEASE, (where.record,), (owner_id, where.channel))

    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        doubted = owner_id in self._runner.doubts
        self._runner.doubts.discard(owner_id)
        if doubted:
            # A script sent on a connection given up on may still arrive: once the
            # client's timeout has passed twice over, it surely has or never will.
            self._sweeper.add(key, owner_id, again_after=self.timeout)
        elif certain:
            self._sweeper.add(key, owner_id, again_after=None)

    def _delete_owned(self, key: str, owner_id: str) -> None:
        where = names(self.table, key)
        if self._run("sweep", key, lambda _: self._release(where, owner_id)):
            logger.warning("lock %r: deleted a hold its interrupted owner left", key)

    def handoff(
        self,
        key: str,
        owner_id: str,
        handoffs: int,
        successor: Owner,
        ttl: float,
        lease: float | None,
    ) -> bool:
        ttl_ms = milliseconds(ttl)
        return self._pass("handoff", key, owner_id, successor, handoffs, lease, ttl_ms)

    def record_holder(
        self, key: str, owner_id: str, holder: Owner, handoffs: int, lease: float | None
    ) -> bool:
        return self._pass("record", key, owner_id, holder, handoffs, lease, "")

    def _pass(
        self,
        what: str,
        key: str,
        owner_id: str,
        holder: Owner,
        handoffs: int,
        lease: float | None,
        ttl: int | str,
    ) -> bool:
        """Make ``owner_id``'s record name ``holder``, a thread of this process (so the
        record's process fields stay as they are), with a lease of ``ttl`` ms from now
        (``""``: the expiry stays). A retry after a lost reply writes the same again."""
        record = Record.of(holder._replace(owner_id=owner_id), 0, lease, handoffs)
        head, tail = record_halves(record)
        record_key = names(self.table, key).record
        args = (owner_id, head, tail, ttl)
        return self._run(what, key, lambda _: self._done(PASS, (record_key,), args))

    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        record_key = names(self.table, key).record
        args = (owner_id, milliseconds(ttl), json.dumps(lease))
        return self._run("extend", key, lambda _: self._done(EXTEND, (record_key,), args))

    def renew(self, holds: Sequence[tuple[str, str]]) -> set[str]:
        """See ``LockBackend.renew``. On a cluster, a node that cannot be reached in
        time leaves its holds unreached (``PartialRenewal``), while the other nodes'
        holds are renewed; see ``cluster``."""
        if not holds:
            return set()
        listed = [(names(self.table, key).record, owner_id) for key, owner_id in holds]
        renewal = self._renewal
        if renewal is not None:
            return self._run("renew", None, lambda _: renewal.renew(listed))
        return self._run(
            "renew", None, lambda _: renew_holds(self._client, self._scripts, self.counters, listed)
        )

    # -- looking -----------------------------------------------------------------------

    def is_locked(self, key: str) -> bool:
        record_key = names(self.table, key).record

        def attempt(uncertain: bool) -> bool:
            self.counters.add("statements")
            return bool(self._client.exists(record_key))

        return self._run("locked", key, attempt)

    def info(self, key: str) -> LockInfo | None:
        record_key = names(self.table, key).record
        reply = self._run("info", key, lambda _: self._call(PEEK, (record_key,), ()))
        if reply is None:
            return None
        value, expires, _ = reply
        return _info(key, value, int(expires))

    def holders(self) -> list[LockInfo]:
        return sorted(self._run("holders", None, lambda _: self._holders()), key=_by_key)

    def _holders(self) -> list[LockInfo]:
        records = list(self._client.scan_iter(match=scan_pattern(self.table), count=SCAN_COUNT))
        self.counters.add("statements", 1 + len(records) // SCAN_COUNT)
        if not records:
            return []
        replies = self._get_with_expiry(records)
        seconds, micros = self._client.time()
        self.counters.add("statements", 2 * len(records) + 1)
        now = int(seconds) * 1000 + int(micros) // 1000
        holders = []
        for index, record_key in enumerate(records):
            value, expires = replies[2 * index], replies[2 * index + 1]
            if value is not None and expires >= 0:  # (else gone meanwhile)
                key = user_key_of(self.table, record_key)
                at = expires if self._expiry_times else now + expires
                holders.append(_info(key, value, at))
        return holders

    def _get_with_expiry(self, records: list[str]) -> list[Any]:
        """Each record's value and when it expires: PEXPIRETIME (Redis 7), the same in
        every call, or (where the server has none) its PTTL."""
        pipeline = self._client.pipeline(transaction=False)
        for record_key in records:
            pipeline.get(record_key)
            if self._expiry_times:
                pipeline.pexpiretime(record_key)
            else:
                pipeline.pttl(record_key)
        replies: list[Any] = pipeline.execute(raise_on_error=False)
        if self._expiry_times and isinstance(replies[1], ResponseError):
            self._expiry_times = False  # (an older server)
            return self._get_with_expiry(records)
        return replies

    def force_release(self, key: str) -> bool:
        where = names(self.table, key)
        return self._run(
            "force_release",
            key,
            lambda _: self._done(FORCE_RELEASE, (where.record,), (where.channel,)),
        )

    def reap(self) -> int:
        # Redis removes expired holds itself; the gate refuses a closed backend's call.
        nothing: int = self._run("reap", None, lambda _: 0)
        return nothing

    # -- wake-ups ----------------------------------------------------------------------

    def doorbell(self, key: str) -> Doorbell:
        return self._wakeups.doorbell(names(self.table, key).channel)

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        """Listeners on the key's channel, or the mark of a lost try: see ``wanting``."""
        where = names(self.table, key)
        try:
            return self._run(
                "others_waiting",
                key,
                lambda _: self._wanting.others_waiting(self._scripted, where),
                retry=False,
            )
        except LockError as exc:  # (closed, or out of reach: the next cohort asks again)
            logger.debug("counting who waits for %r failed: %s", key, exc)
            return None

    def want(self, key: str, seconds: float) -> None:
        """The lost try before this call has marked the key already, for longer than
        tier 1 asks (see ``wanting``): only a mark asked for longer costs a SET."""
        where = names(self.table, key)
        try:
            self._run(
                "want",
                key,
                lambda _: self._wanting.want(self._client, where, seconds),
                retry=False,
            )
        except LockError as exc:  # (a lost mark costs only a turn)
            logger.debug("marking %r wanted failed: %s", key, exc)

    def _listening_connection(self) -> Any:
        """A new connection like the pool's, outside it, for the wake-ups."""
        client = self._client
        if self._cluster:
            client = client.get_default_node().redis_connection
        pool = client.connection_pool
        return pool.connection_class(**pool.connection_kwargs)

    # -- life --------------------------------------------------------------------------

    def after_fork(self) -> None:
        # A new pool: the parent's sockets stay open and untouched (redis-py's pools
        # also notice the new pid, which a cluster client's nodes rely on).
        if not self._cluster:
            self._client = open_client(self._url, self.timeout)
            self._scripted = Wire(self._client)
        self._runner.after_fork()
        if self._renewal is not None:
            self._renewal.forget()
        self._sweeper.forget()  # the parent sweeps its own holds
        self._wakeups.forget()
        self._wanting.forget()

    def close(self) -> None:
        if self.closed:
            return
        self._wakeups.close()
        gate = self._runner.gate
        gate.close(self.timeout * 1.5)
        self._sweeper.finish(self.timeout)
        gate.seal()
        if isinstance(self._scripted, Wire):
            self._scripted.close()
        self._client.close()


def _info(key: str, value: str, expires: int) -> LockInfo:
    """``expires``: the key's expiry time. A record read is live, never shown expired:
    Redis keeps a key through the millisecond of its expiry time, and a TIME read after
    the GET (even in one script) may be past the clock Redis judged the key by."""
    stored = Stored.parse(value)
    return stored.record.info(key, stored.number, expires, now=expires - 1)


def _by_key(info: LockInfo) -> str:
    return info.key
