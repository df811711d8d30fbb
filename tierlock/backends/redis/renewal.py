"""Renewing many holds in one round trip.

One RENEW script renews a batch of holds; the batches go in one pipeline. A script may
only touch keys of one cluster slot, so on a cluster each batch is one slot's holds and
each node gets one pipeline of its slots' batches: a round trip per node. A batch that
a node turns away (its slot moved, or it does not know the script yet) is sent again
through the cluster client, which follows redirections.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ...stats import Counters
from .scripts import RENEW, Scripts

__all__ = ["renew_holds"]

# Holds per script: each costs the server a GET and a PEXPIRE, and a script blocks the
# server while it runs, so a batch stays well under a millisecond.
RENEW_BATCH = 500

Batch = Sequence[tuple[str, str]]  # (record key, owner id) pairs


def renew_holds(
    client: Any, scripts: Scripts, counters: Counters, holds: Batch, *, cluster: bool
) -> set[str]:
    """Renew each of ``holds`` still its owner's by the lease its record names; return
    the owner ids renewed. Each round trip counts as a heartbeat."""
    if cluster:
        by_slot: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for hold in holds:
            by_slot[client.keyslot(hold[0])].append(hold)
        by_node: dict[str, list[Batch]] = defaultdict(list)
        nodes = {}
        for slot_holds in by_slot.values():
            for first in range(0, len(slot_holds), RENEW_BATCH):
                node = client.get_node_from_key(slot_holds[0][0])
                nodes[node.name] = node
                by_node[node.name].append(slot_holds[first : first + RENEW_BATCH])
        renewed: set[str] = set()
        for name, batches in by_node.items():
            counters.add("heartbeats")
            renewed |= _in_pipeline(nodes[name].redis_connection, client, scripts, batches)
        return renewed
    batches = [holds[first : first + RENEW_BATCH] for first in range(0, len(holds), RENEW_BATCH)]
    counters.add("heartbeats")
    if len(batches) == 1:
        return _renewed(batches[0], scripts.run(client, RENEW, *_arguments(batches[0])))
    return _in_pipeline(client, client, scripts, batches)


def _in_pipeline(target: Any, fallback: Any, scripts: Scripts, batches: list[Batch]) -> set[str]:
    """Send ``batches`` to ``target`` in one pipeline; a batch turned away is sent again
    on ``fallback``."""
    pipeline = target.pipeline(transaction=False)
    for batch in batches:
        keys, owners = _arguments(batch)
        pipeline.evalsha(RENEW.sha, len(keys), *keys, *owners)
    scripts.count(len(batches))
    renewed: set[str] = set()
    for batch, reply in zip(batches, pipeline.execute(raise_on_error=False), strict=True):
        positions = (
            scripts.run(fallback, RENEW, *_arguments(batch))
            if isinstance(reply, Exception)
            else reply
        )
        renewed |= _renewed(batch, positions)
    return renewed


def _arguments(batch: Batch) -> tuple[list[str], list[str]]:
    return [key for key, _ in batch], [owner_id for _, owner_id in batch]


def _renewed(batch: Batch, positions: list[int]) -> set[str]:
    return {batch[position - 1][1] for position in positions}
