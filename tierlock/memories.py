"""Bounded memories of keys: what tier 1 and the engines remember of a key for a short
while (when it was released or missed, until when a mark lasts, who queues for it).

A plain dict that starts afresh once it holds ``REMEMBERED_KEYS`` keys: forgetting
costs at most a turn or a statement, and the acquire path reads these memories, where
a dict takes 30-80 ns a call against about 215 for cachetools' ``LRUCache`` and
1.2 µs for its ``TTLCache``.
"""

from __future__ import annotations

import time
from typing import TypeVar

__all__ = ["REMEMBERED_KEYS", "remember", "remember_later"]

K = TypeVar("K")
V = TypeVar("V")

# Keys remembered at most in each memory.
REMEMBERED_KEYS = 4096


def remember(memory: dict[K, V], key: K, value: V) -> None:
    """Set ``memory[key]``; a memory that grew to REMEMBERED_KEYS keys starts afresh."""
    if len(memory) >= REMEMBERED_KEYS and key not in memory:
        memory.clear()
    memory[key] = value


def remember_later(memory: dict[K, float], key: K, until: float) -> None:
    """Remember ``until`` (``time.monotonic()``) for ``key`` unless a later time is
    remembered already; a full memory first drops the times that have passed, so that
    what still lasts (a mark that says someone waits) is kept."""
    if until <= memory.get(key, -1.0):
        return
    if len(memory) >= REMEMBERED_KEYS and key not in memory:
        now = time.monotonic()
        for old in [old for old, ends in list(memory.items()) if ends <= now]:
            memory.pop(old, None)
    remember(memory, key, until)
