"""A Redis Cluster failover: one primary of a private cluster (three primaries, each
with a replica) is killed, or frozen, while one manager renews holds on every primary;
its replica takes over, and the manager's renewals follow the cluster there. When the
replica had not copied every hold (its replication link was cut), the holds it lacks
are reported lost, within a third of a lease of the failover.

Each test forms a cluster of its own (``redis_servers.RedisCluster``): a failover
changes who serves what, so no two tests may share one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis
from polling import wait_until
from redis_servers import RedisCluster, RedisServer
from servers import ServerUnavailable

import tierlock
from tierlock.backends.redis.layout import names

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TABLE = "tl_failover"
KEYS = [f"key:{number}" for number in range(30)]
# A lease of 6 s, and nodes counted failed after 2 s of silence: the replica takes over
# in about 4 s, within the lease of a hold renewed just before the kill.
TTL = 6.0
NODE_TIMEOUT = 2000
# Holds taken on a primary after its replication link was cut.
LATE = 8
# How long another manager's try may spend failing to reach a key's node.
RIVAL_PATIENCE = 0.5


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """A private cluster of three primaries with a replica each, killed afterwards."""
    cluster = RedisCluster(tmp_path / "cluster", replicas=1, node_timeout=NODE_TIMEOUT)
    try:
        try:
            cluster.start()
        except ServerUnavailable as exc:
            unavailable(f"no private Redis Cluster: {exc}")
        yield cluster
    finally:
        cluster.close()


def primary_of(cluster: RedisCluster, keys: Iterable[str] = KEYS) -> dict[str, RedisServer]:
    """The primary that serves each of ``keys`` now."""
    with redis.RedisCluster.from_url(cluster.url.replace("+cluster", "")) as client:
        return {
            key: cluster.node(client.get_node_from_key(names(TABLE, key).record).name)
            for key in keys
        }


class Rival(threading.Thread):
    """Another manager's tries, without waiting, to take ``keys``, over and over until
    ``stop()``: ``taken`` says when (seconds after ``since``) it first got each key, and
    ``asked`` when it sent that try (the key was taken between the two). A try that
    cannot reach the key's node counts in ``errors``."""

    def __init__(self, locks: tierlock.LockManager, keys: list[str], since: float) -> None:
        super().__init__(name="rival", daemon=True)
        self.locks = locks
        self.keys = keys
        self.since = since
        self.taken: dict[str, float] = {}
        self.asked: dict[str, float] = {}
        self.tries = 0
        self.errors = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            for key in self.keys:
                lock = self.locks.lock(key)
                asked = time.monotonic() - self.since
                try:
                    if lock.acquire(blocking=False):
                        self.taken.setdefault(key, time.monotonic() - self.since)
                        self.asked.setdefault(key, asked)
                        lock.release()
                except tierlock.BackendError:
                    self.errors += 1
            self.tries += 1
            self._stopping.wait(0.05)

    def stop(self) -> None:
        self._stopping.set()
        self.join(30.0)


@pytest.mark.parametrize(
    "signal_number", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"]
)
def test_renewals_follow_a_failover(cluster: RedisCluster, signal_number: signal.Signals) -> None:
    """A primary is killed (or frozen: connections to it hang) right after a renewal.
    Holds on the other primaries are renewed on throughout; once its replica takes
    over, the holds it had copied (all: it had every write) are renewed there, within
    a third of their lease: no hold is lost, and no other manager takes any key."""
    options: dict[str, Any] = {"table": TABLE, "ttl": TTL, "reaper_interval": None}
    lost: list[str] = []
    with (
        tierlock.LockManager(cluster.url, **options) as holder,
        tierlock.LockManager(cluster.url, **options) as rival_locks,
    ):
        held = [holder.lock(key, on_lost=lambda key, token: lost.append(key)) for key in KEYS]
        assert all(lock.acquire(blocking=False) for lock in held)
        serving = primary_of(cluster)
        victim = next(node for node in cluster.primaries() if node is not cluster.nodes[0])
        healthy = [key for key in KEYS if serving[key] is not victim]
        moving = [key for key in KEYS if serving[key] is victim]
        assert len(set(serving.values())) == 3 and healthy and moving

        # Right after a renewal, with every record on the replicas too.
        renewals = holder.stats().renewals
        wait_until(lambda: holder.stats().renewals >= renewals + len(KEYS), "a renewal")
        cluster.wait_for_replicas()
        expiries = {key: expiry(rival_locks, key) for key in moving}
        failed_renewals = holder.stats().failed_renewals
        victim.kill(signal_number)
        killed_at = time.monotonic()
        rival = Rival(rival_locks, healthy, since=killed_at)
        rival.start()
        failover: list[float] = []
        threading.Thread(
            target=lambda: failover.append(cluster.wait_for_failover(victim)), daemon=True
        ).start()
        disowned: dict[str, float] = {}
        moved_at = None  # when the replica had renewed every hold it took over
        with contextlib.ExitStack() as later:
            looker = None  # a manager made after the failover: it knows the new primary
            while time.monotonic() < killed_at + 2 * TTL:
                for lock in held:
                    if not lock.owned():
                        disowned.setdefault(lock.key, time.monotonic() - killed_at)
                if failover and looker is None:
                    looker = later.enter_context(tierlock.LockManager(cluster.url, **options))
                if (
                    looker is not None
                    and moved_at is None
                    and all(expiry(looker, key) > expiries[key] for key in moving)
                ):
                    moved_at = time.monotonic() - killed_at
                time.sleep(0.05)
            rival.stop()
            took = failover[0] if failover else None
            print(f"replica in charge after {took} s, its holds renewed after {moved_at} s")

            assert failover, "no replica took over"
            assert disowned == {}, f"holds lost, seconds after the failure: {disowned}"
            assert holder.stats().lost_holds == 0 and lost == []
            assert rival.tries > 0 and rival.taken == {}, f"taken after (s): {rival.taken}"
            # The heartbeat was not stuck on the failed primary: a renewal came back,
            # saying which holds it could not reach. (Not necessarily before the replica
            # took over: the first renewal after the kill is due a third of a lease later
            # and gives up on the silent node after 1 s, about 3 s in all, and a
            # failover took from 2.8 s.)
            told = holder.stats().failed_renewals - failed_renewals
            assert told >= 1, f"no renewal came back failed in the {2 * TTL:.0f} s after the kill"
            assert moved_at is not None and moved_at - failover[0] <= TTL / 3, (
                f"replica took over after {failover[0]:.1f} s, renewed there after {moved_at} s"
            )
            assert looker is not None
            assert not any(looker.lock(key).acquire(blocking=False) for key in KEYS)
            for lock in held:
                lock.release()
            assert looker.holders() == []


def test_holds_the_replica_lacks_are_reported_lost(cluster: RedisCluster) -> None:
    """A primary's replication link is cut, its holder then takes more holds there
    ("late" ones, which its replica never copies), and the primary is killed. Once the
    replica takes over, the late holds' keys are free there, and another manager takes
    them. Their holder is told, at its first renewal on the new primary: each late hold's
    ``on_lost`` fires once and ``owned()`` turns False, before the hold's lease ends,
    within a third of a lease of the failover and within a third of a lease of the
    other manager's take. The holds taken there before the cut may be lost too (their
    renewals after the cut were not copied: the replica's copies expire up to a third of
    a lease early), and any such loss is told within the same bounds; the holds on the
    other primaries are kept throughout, and no other manager takes any of them."""
    options: dict[str, Any] = {"table": TABLE, "ttl": TTL, "reaper_interval": None}
    lost: list[tuple[str, float]] = []  # (key, when its on_lost was called)

    def on_lost(key: str, token: int) -> None:
        lost.append((key, time.monotonic()))

    with (
        tierlock.LockManager(cluster.url, **options) as holder,
        # The rival's tries give up soon on the failed primary, so that each take is
        # known to within that much.
        tierlock.LockManager(cluster.url, **options, database_timeout=RIVAL_PATIENCE) as rivals,
    ):
        held = {key: holder.lock(key, on_lost=on_lost) for key in KEYS}
        assert all(lock.acquire(blocking=False) for lock in held.values())
        serving = primary_of(cluster)
        victim = next(node for node in cluster.primaries() if node is not cluster.nodes[0])
        healthy = [key for key in KEYS if serving[key] is not victim]
        early = [key for key in KEYS if serving[key] is victim]
        assert len(set(serving.values())) == 3 and healthy and early
        late = keys_of(cluster, victim, LATE)

        # Right after a renewal, with every record on the replicas too: then the link
        # is cut, and the late holds are taken on the victim alone.
        renewals = holder.stats().renewals
        wait_until(lambda: holder.stats().renewals >= renewals + len(KEYS), "a renewal")
        cluster.wait_for_replicas()
        (replica,) = cluster.cut_replication(victim)
        sent: dict[str, float] = {}  # when each late hold's acquire was sent
        for key in late:
            held[key] = holder.lock(key, on_lost=on_lost)
            sent[key] = time.monotonic()
            assert held[key].acquire(blocking=False)
        records = {names(TABLE, key).record: key for key in early + late}
        copied = {records[record] for record in replica.present(records)}
        assert not replica.linked, "the replica linked to its primary again"
        assert copied == set(early), f"the replica has {sorted(copied)}, not {sorted(early)}"

        seen = watch_failover(
            cluster, victim, held, rivals, [healthy, *([key] for key in early + late)]
        )
        told = seen.told(lost)
        after = {key: round(ats[0] - seen.at, 3) for key, ats in told.items()}
        seen.report(after, late, early)

        assert replica in cluster.primaries(), "not the replica cut off took over"
        assert all(len(ats) == 1 for ats in told.values()), f"on_lost more than once: {told}"
        assert set(told) == set(seen.disowned), f"on_lost: {set(told)}, {seen.disowned = }"
        # Every late hold is told lost: at the latest when its lease ends, and within a
        # third of a lease of the failover.
        for key in late:
            assert key in told, f"{key}: the replica lacked it, and its holder was not told"
            assert told[key][0] <= sent[key] + TTL, f"{key}: told after its lease ended"
            assert seen.disowned[key] - seen.at <= TTL / 3, f"{key}: owned() stayed True"
        # A hold copied before the cut may be lost too, but is told as soon.
        assert set(told) <= {*early, *late}, "a hold lost on a primary that never failed"
        assert all(delay <= TTL / 3 for delay in after.values()), f"told late: {after}"
        # No key was held twice for over a third of a lease without its holder being told.
        overlaps = {
            key: (round(told[key][0] - at, 3), round(seen.disowned[key] - at, 3))
            if key in told
            else None
            for key, at in seen.asked.items()
        }
        print(f"seconds from the try that took a key to its holder told: {overlaps}")
        assert all(
            overlap is not None and max(overlap) <= TTL / 3 for overlap in overlaps.values()
        ), f"seconds from a take to its holder being told (on_lost, owned()): {overlaps}"
        assert set(late) <= set(seen.taken), f"the rival never took {set(late) - set(seen.taken)}"
        assert not set(healthy) & set(seen.taken), "a key of a primary that never failed taken"
        assert holder.stats().lost_holds == len(told)

        for key, lock in held.items():
            if key in told:
                with pytest.raises(tierlock.LockLostError):
                    lock.release()
            else:
                lock.release()
        assert holder.holders() == []


def keys_of(cluster: RedisCluster, node: RedisServer, count: int) -> list[str]:
    """``count`` keys (``late:<number>``) whose holds ``node`` serves."""
    candidates = primary_of(cluster, (f"late:{number}" for number in range(100 * count)))
    keys = [key for key, serving in candidates.items() if serving is node][:count]
    assert len(keys) == count
    return keys


@dataclasses.dataclass
class Seen:
    """What the holder and its rivals went through after a primary was killed: when
    (``time.monotonic()``) the replica was seen in charge (``at``, ``took`` seconds after
    the kill), the holder's ``owned()`` was first seen False for each key
    (``disowned``), and the rivals sent (``asked``) and got back (``taken``) their first
    successful try for each key."""

    took: float
    at: float
    disowned: dict[str, float]
    asked: dict[str, float]
    taken: dict[str, float]

    def report(self, after: dict[str, float], late: list[str], early: list[str]) -> None:
        """Print the failover's time, and the times of the holds lost (``after``: seconds
        after the failover, by key) and of the rivals' takes."""
        print(f"the replica took over {self.took:.3f} s after the kill")
        print(f"late holds lost, seconds after the failover: {[after.get(key) for key in late]}")
        early_lost = {key: after[key] for key in early if key in after}
        print(f"holds from before the cut lost, seconds after the failover: {early_lost}")
        takes = {
            key: (round(self.asked[key] - self.at, 3), round(got - self.at, 3))
            for key, got in self.taken.items()
        }
        print(f"the rivals' takes, seconds after the failover (asked, got): {takes}")

    @staticmethod
    def told(lost: list[tuple[str, float]]) -> dict[str, list[float]]:
        """When each key's ``on_lost`` was called, from ``(key, when)`` pairs."""
        told: dict[str, list[float]] = {}
        for key, at in lost:
            told.setdefault(key, []).append(at)
        return told


def watch_failover(
    cluster: RedisCluster,
    victim: RedisServer,
    held: dict[str, tierlock.Lock],
    rivals: tierlock.LockManager,
    groups: list[list[str]],
) -> Seen:
    """Kill ``victim``, and watch the ``held`` locks (held by the calling thread) for two
    leases while ``rivals`` try for their keys, each group of keys (a key alone is a
    group) in a thread of its own, so that a try held up by one key does not delay those
    of another."""
    victim.kill()
    killed_at = time.monotonic()
    rival_group = [Rival(rivals, keys, since=killed_at) for keys in groups]
    for rival in rival_group:
        rival.start()
    failover: list[tuple[float, float]] = []
    threading.Thread(
        target=lambda: failover.append((cluster.wait_for_failover(victim), time.monotonic())),
        daemon=True,
    ).start()
    disowned: dict[str, float] = {}
    try:
        while time.monotonic() < killed_at + 2 * TTL:
            for key, lock in held.items():
                if key not in disowned and not lock.owned():
                    disowned[key] = time.monotonic()
            time.sleep(0.01)
    finally:
        for rival in rival_group:
            rival.stop()
    tries = sum(rival.tries for rival in rival_group)
    errors = sum(rival.errors for rival in rival_group)
    print(f"the rivals' rounds of tries: {tries}, tries that failed: {errors}")
    assert failover, "no replica took over"
    return Seen(
        *failover[0],
        disowned,
        {key: killed_at + at for rival in rival_group for key, at in rival.asked.items()},
        {key: killed_at + at for rival in rival_group for key, at in rival.taken.items()},
    )


def expiry(locks: tierlock.LockManager, key: str) -> datetime.datetime:
    """When ``key``'s hold expires, as the server that keeps it says (if not held: long
    ago)."""
    info = locks.info(key)
    return (
        datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
        if info is None
        else info.expires_at
    )
