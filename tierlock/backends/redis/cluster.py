"""Renewals on a Redis Cluster that follow the cluster when a node fails.

The holds are grouped by the node that serves their slot in the client's slot map, and
each node gets its batches in one pipeline on its own connection: every node at once,
each from a thread of its own, so that a node that fails or hangs neither delays nor
voids the others' renewals.

A node that cannot be reached, or that turns a batch away because the slot is no
longer its own (MOVED; READONLY: it is a replica now), makes the client read the slot
map again, and those batches go once more to whichever nodes the map names now: once a
replica has taken over from a failed primary, its holds are renewed there. A batch
whose slot is being migrated (ASK) is sent again through the cluster client, which
follows the redirection; a node that does not know the script yet (a promoted
replica) is sent it first.

A renewal waits at most ``patience`` seconds for the nodes. The holds of a node that
could not be reached, did not answer in time, or refused (the cluster is down while a
failover is under way) are *unreached*: neither renewed nor known lost.
``PartialRenewal`` names them, and the holds renewed. A node still busy with an
earlier renewal (it hangs) gets no other until that one ends: its holds are unreached
at once, and the slot map is read again in the background, so that a later renewal
finds the replica that takes its place.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from redis.cluster import ClusterNode, NodesManager
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TimeoutError,
)

from ...errors import LockError, PartialRenewal
from ...stats import Counters
from .renewal import RENEW_BATCH, Batch, owners, renewed, run_again, send
from .running import Runner
from .scripts import Scripts

__all__ = ["NODE_PATIENCE", "ClusterRenewal"]

logger = logging.getLogger(__name__)

# The longest a renewal waits for a node's answer, in seconds (at most half the
# client's timeout): far above a healthy node's round trip, and well below a third of
# any lease that a failover of a few seconds can leave alive.
NODE_PATIENCE = 1.0
# Replies after which a batch goes wherever the slot map, read again, puts its slot.
_MOVED = (ConnectionError, TimeoutError, MovedError, ReadOnlyError)
# Whether this redis-py can read the slot map from the failed node last.
_FAILED_LAST = "last_failed_node_name" in inspect.signature(NodesManager.initialize).parameters

Nodes = dict[str, tuple[ClusterNode, list[Batch]]]  # each node's batches, by node name


class ClusterRenewal:
    """Renews holds on a cluster, node by node; see the module docstring."""

    def __init__(
        self, client: Any, scripts: Scripts, counters: Counters, runner: Runner, patience: float
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.counters = counters
        self.runner = runner  # (its gate counts the node threads' work, for close)
        self.patience = patience
        self.forget()

    def forget(self) -> None:
        """Start afresh in a forked child: the parent's threads are not there."""
        self._mutex = threading.Lock()  # one renewal at a time
        self._busy: dict[str, _NodeRenewal] = {}  # renewals still under way, by node
        self._reading: threading.Thread | None = None  # the slot map's reading, if any

    def renew(self, holds: Batch) -> set[str]:
        """Renew each of ``holds`` still its owner's; return the owner ids renewed.

        :raises PartialRenewal: some holds were unreached.
        """
        with self._mutex:
            began = time.monotonic()
            self._busy = {name: work for name, work in self._busy.items() if work.is_alive()}
            unreached: set[str] = set()
            failures: list[str] = []
            started = []
            nodes = _by_node(self.client, _by_slot(self.client, holds))
            for name, (node, batches) in nodes.items():
                if name in self._busy:
                    unreached |= owners(batches)
                    failures.append(f"{name} has not answered an earlier renewal")
                    self.read_slot_map_soon(node)
                    continue
                work = self._busy[name] = _NodeRenewal(self, node, batches)
                work.start()
                started.append(work)
            done: set[str] = set()
            for work in started:
                work.join(max(0.0, began + self.patience - time.monotonic()))
                if work.is_alive():
                    unreached |= owners(work.batches)
                    failures.append(f"{work.node.name} did not answer in {self.patience:g} s")
                    self.read_slot_map_soon(work.node)
                else:
                    done |= work.renewed
                    unreached |= work.unreached
                    failures += work.failures
        if unreached:
            why = "; ".join(dict.fromkeys(failures))  # (each failure once)
            raise PartialRenewal(f"cluster nodes did not renew: {why}", done, unreached)
        return done

    def read_slot_map(self, failed: ClusterNode) -> None:
        """Ask the cluster again which node serves which slot (asking ``failed`` last)."""
        self.counters.add("statements")
        manager = self.client.nodes_manager
        try:
            if _FAILED_LAST:
                manager.initialize(last_failed_node_name=failed.name)
            else:
                manager.initialize()
        except (RedisError, RedisClusterException) as exc:
            logger.debug("reading the cluster's slot map failed: %s", exc)

    def read_slot_map_soon(self, failed: ClusterNode) -> None:
        """``read_slot_map`` in a thread of its own, unless one runs already."""
        if self._reading is None or not self._reading.is_alive():
            self._reading = threading.Thread(
                target=self.in_gate,
                args=(self.read_slot_map, failed),
                name="tierlock-slot-map",
                daemon=True,
            )
            self._reading.start()

    def in_gate(self, work: Any, *args: Any) -> bool:
        """Run ``work(*args)`` as an operation of the backend; ``False``: it is closed."""
        gate = self.runner.gate
        try:
            gate.enter()
        except LockError:
            return False
        try:
            work(*args)
        finally:
            gate.leave()
        return True


class _NodeRenewal(threading.Thread):
    """One node's share of a renewal: ``renewed`` and ``unreached`` owner ids, and
    what went wrong (``failures``)."""

    def __init__(self, renewal: ClusterRenewal, node: ClusterNode, batches: list[Batch]) -> None:
        super().__init__(name=f"tierlock-renew-{node.name}", daemon=True)
        self.node = node
        self.batches = batches
        self.renewed: set[str] = set()
        self.unreached: set[str] = set()
        self.failures: list[str] = []
        self._renewal = renewal

    def run(self) -> None:
        try:
            if not self._renewal.in_gate(self._renew, self.node, self.batches, True):
                self.unreached = owners(self.batches)
                self.failures.append("the manager is closing")
        except Exception as exc:  # (a fault of ours rather than the store's)
            logger.exception("renewing holds on %s failed", self.node.name)
            self.unreached |= owners(self.batches) - self.renewed
            self.failures.append(f"{self.node.name}: {exc!r}")

    def _renew(self, node: ClusterNode, batches: list[Batch], follow: bool) -> None:
        """Send ``batches`` to ``node``; if it is out of reach or no longer serves their
        slots, read the slot map again and (if ``follow``) send them where it says."""
        renewal = self._renewal
        renewal.counters.add("heartbeats")
        connection = node.redis_connection
        try:
            replies = send(connection, renewal.scripts, batches)
        except RedisError as exc:
            replies = [exc] * len(batches)
        moved = []
        for batch, first in zip(batches, replies, strict=True):
            reply = self._settled(connection, batch, first)
            if isinstance(reply, list):
                self.renewed |= renewed(batch, reply)
            elif isinstance(reply, _MOVED) and follow:
                moved.append(batch)
            else:
                self._unreached([batch], f"{node.name}: {reply}")
        if not moved:
            return
        renewal.read_slot_map(node)
        try:
            nodes = _by_node(renewal.client, moved)
        except RedisClusterException as exc:
            self._unreached(moved, str(exc))
            return
        for target, its_batches in nodes.values():
            self._renew(target, its_batches, follow=False)

    def _settled(self, connection: Any, batch: Batch, reply: Any) -> Any:
        """``reply``, or the reply to ``batch`` sent again where that helps: to the node
        (``connection``) once it has the script (NOSCRIPT), or through the cluster
        client, which follows the redirection (ASK)."""
        if isinstance(reply, NoScriptError):
            target = connection
        elif isinstance(reply, AskError) and not isinstance(reply, MovedError):
            target = self._renewal.client
        else:
            return reply
        try:
            return run_again(target, self._renewal.scripts, batch)
        except RedisError as exc:
            return exc

    def _unreached(self, batches: list[Batch], why: str) -> None:
        self.unreached |= owners(batches)
        self.failures.append(why)


def _by_slot(client: Any, holds: Batch) -> list[Batch]:
    """``holds`` in batches of one slot each."""
    slots: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for hold in holds:
        slots[client.keyslot(hold[0])].append(hold)
    return [
        same[first : first + RENEW_BATCH]
        for same in slots.values()
        for first in range(0, len(same), RENEW_BATCH)
    ]


def _by_node(client: Any, batches: list[Batch]) -> Nodes:
    """``batches`` by the node that serves their slot in the client's slot map."""
    nodes: Nodes = {}
    for batch in batches:
        node = client.get_node_from_key(batch[0][0])
        nodes.setdefault(node.name, (node, []))[1].append(batch)
    return nodes
