"""A Redis Cluster failover: one primary of a private cluster (three primaries, each
with a replica) is killed, or frozen, while one manager renews holds on every primary;
its replica takes over, and the manager's renewals follow the cluster there.

Each test forms a cluster of its own (``redis_servers.RedisCluster``): a failover
changes who serves what, so no two tests may share one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
import time
from collections.abc import Iterator
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


def primary_of(cluster: RedisCluster) -> dict[str, RedisServer]:
    """The primary that serves each of ``KEYS`` now."""
    with redis.RedisCluster.from_url(cluster.url.replace("+cluster", "")) as client:
        return {
            key: cluster.node(client.get_node_from_key(names(TABLE, key).record).name)
            for key in KEYS
        }


class Rival(threading.Thread):
    """Another manager's tries, without waiting, to take ``keys``, over and over until
    ``stop()``: ``taken`` says when (seconds after ``since``) it first got each key."""

    def __init__(self, locks: tierlock.LockManager, keys: list[str], since: float) -> None:
        super().__init__(name="rival", daemon=True)
        self.locks = locks
        self.keys = keys
        self.since = since
        self.taken: dict[str, float] = {}
        self.tries = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            for key in self.keys:
                lock = self.locks.lock(key)
                if lock.acquire(blocking=False):
                    self.taken.setdefault(key, time.monotonic() - self.since)
                    lock.release()
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
        told = 0  # failed renewals the heartbeat had come back from by the failover
        with contextlib.ExitStack() as later:
            looker = None  # a manager made after the failover: it knows the new primary
            while time.monotonic() < killed_at + 2 * TTL:
                for lock in held:
                    if not lock.owned():
                        disowned.setdefault(lock.key, time.monotonic() - killed_at)
                if failover and looker is None:
                    told = holder.stats().failed_renewals - failed_renewals
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
            # The heartbeat was not stuck on the failed primary: its renewals came back,
            # saying which holds they could not reach, before the replica took over.
            assert told >= 1, f"no renewal came back in the {failover[0]:.1f} s of failover"
            assert moved_at is not None and moved_at - failover[0] <= TTL / 3, (
                f"replica took over after {failover[0]:.1f} s, renewed there after {moved_at} s"
            )
            assert looker is not None
            assert not any(looker.lock(key).acquire(blocking=False) for key in KEYS)
            for lock in held:
                lock.release()
            assert looker.holders() == []


def expiry(locks: tierlock.LockManager, key: str) -> datetime.datetime:
    """When ``key``'s hold expires, as the server that keeps it says (if not held: long
    ago)."""
    info = locks.info(key)
    return (
        datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
        if info is None
        else info.expires_at
    )
