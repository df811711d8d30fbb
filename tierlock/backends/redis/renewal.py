"""Renewing many holds in one round trip.

One RENEW script renews a batch of holds, and a server's batches go in one pipeline: a
round trip. On a cluster a script may only touch keys of one slot, so there each batch
is one slot's holds, and each node gets a pipeline of its own slots' batches, all
nodes at once (``cluster``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ...stats import Counters
from .scripts import RENEW, Scripts

__all__ = ["RENEW_BATCH", "Batch", "owners", "renew_holds", "renewed", "run_again", "send"]

# Holds per script: each costs the server a GET and a PEXPIRE, and a script blocks the
# server while it runs, so a batch stays well under a millisecond.
RENEW_BATCH = 500

Batch = Sequence[tuple[str, str]]  # (record key, owner id) pairs


def renew_holds(client: Any, scripts: Scripts, counters: Counters, holds: Batch) -> set[str]:
    """Renew each of ``holds`` still its owner's on one server, by the lease its record
    names; return the owner ids renewed. The round trip counts as a heartbeat."""
    batches = [holds[first : first + RENEW_BATCH] for first in range(0, len(holds), RENEW_BATCH)]
    counters.add("heartbeats")
    if len(batches) == 1:
        return renewed(batches[0], run_again(client, scripts, batches[0]))
    done: set[str] = set()
    for batch, reply in zip(batches, send(client, scripts, batches), strict=True):
        # A batch turned away (a restarted server lacks the script) is sent on its own.
        positions = reply if isinstance(reply, list) else run_again(client, scripts, batch)
        done |= renewed(batch, positions)
    return done


def send(target: Any, scripts: Scripts, batches: Sequence[Batch]) -> list[Any]:
    """Send ``batches`` to ``target`` in one pipeline: each batch's positions renewed,
    or the error it was turned away with. Raises what the connection meets."""
    pipeline = target.pipeline(transaction=False)
    for batch in batches:
        keys, owner_ids = _arguments(batch)
        pipeline.evalsha(RENEW.sha, len(keys), *keys, *owner_ids)
    scripts.count(len(batches))
    replies: list[Any] = pipeline.execute(raise_on_error=False)
    return replies


def run_again(target: Any, scripts: Scripts, batch: Batch) -> list[int]:
    """Send one batch on its own to ``target`` (a server, a node, or a cluster client,
    which follows redirections), sending the script first if it is unknown there."""
    positions: list[int] = scripts.run(target, RENEW, *_arguments(batch))
    return positions


def renewed(batch: Batch, positions: list[int]) -> set[str]:
    """The owner ids of ``batch`` that a RENEW reply names."""
    return {batch[position - 1][1] for position in positions}


def owners(batches: Iterable[Batch]) -> set[str]:
    return {owner_id for batch in batches for _, owner_id in batch}


def _arguments(batch: Batch) -> tuple[list[str], list[str]]:
    return [key for key, _ in batch], [owner_id for _, owner_id in batch]
