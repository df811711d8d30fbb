"""Tier 1 alone: the registry of claims, with no database."""

from __future__ import annotations

import threading
import tracemalloc
from functools import partial
from typing import Any

import pytest
from polling import wait_until

from tierlock.errors import NotHeldError
from tierlock.stats import Counters
from tierlock.tier1.local import Registry


def _hold_in_thread(registry: Registry[str, None], key: str, started: threading.Event) -> None:
    assert registry.claim(key, None, None)
    registry.settle(key, "hold")
    started.set()


def test_claim_settle_exit_unclaim() -> None:
    registry: Registry[str, None] = Registry(Counters())
    assert registry.claim("k", None, None)
    assert registry.hold("k") is None  # claimed, not yet held
    registry.settle("k", "h1")
    assert registry.hold("k") == "h1"
    assert registry.is_held("k")
    assert registry.reenter("k")
    assert registry.exit("k") is None
    assert registry.exit("k") == "h1"
    registry.unclaim("k")
    assert len(registry) == 0
    with pytest.raises(NotHeldError):
        registry.exit("k")


def test_waiters_are_served_first_come_first_served_one_at_a_time() -> None:
    registry: Registry[int, None] = Registry(Counters())
    assert registry.claim("k", None, None)
    registry.settle("k", 0)
    order: list[int] = []
    holding = threading.Lock()  # must never be contended if only one is woken

    def waiter(number: int, queued_event: threading.Event) -> None:
        queued_event.set()
        assert registry.claim("k", None, None)
        assert holding.acquire(blocking=False), "two waiters woke at once"
        registry.settle("k", number)
        order.append(number)
        holding.release()
        assert registry.exit("k") == number
        registry.unclaim("k")

    threads = []
    for number in range(1, 9):
        event = threading.Event()
        thread = threading.Thread(target=waiter, args=(number, event))
        thread.start()
        assert event.wait(5)
        # Wait until this thread is parked in the queue before starting the next.
        wait_until(partial(_queue_has, registry, number), "the queue", pause=0.001)
        threads.append(thread)
    assert registry.exit("k") == 0
    registry.unclaim("k")
    for thread in threads:
        thread.join(10)
    assert order == list(range(1, 9))
    assert len(registry) == 0


def test_timed_out_waiter_leaves_the_queue() -> None:
    registry: Registry[str, None] = Registry(Counters())
    started = threading.Event()
    holder = threading.Thread(target=_hold_in_thread, args=(registry, "k", started))
    holder.start()
    assert started.wait(5)
    holder.join(5)
    assert registry.claim("k", 0, None) is False
    assert registry.claim("k", 0.05, None) is False
    assert _queue_length(registry, "k") == 0


def test_keys_never_share_an_entry() -> None:
    registry: Registry[str, None] = Registry(Counters())
    assert registry.claim("a", None, None)
    assert registry.claim("b", 0, None)  # a different key is free even while "a" is claimed
    assert len(registry) == 2


def test_memory_stays_flat_over_many_keys() -> None:
    registry: Registry[int, None] = Registry(Counters())
    tracemalloc.start()
    try:
        for number in range(20_000):
            key = f"user:{number}"
            assert registry.claim(key, None, None)
            registry.settle(key, number)
            assert registry.exit(key) == number
            registry.unclaim(key)
        baseline, _ = tracemalloc.get_traced_memory()
        for number in range(20_000, 220_000):
            key = f"user:{number}"
            assert registry.claim(key, None, None)
            registry.settle(key, number)
            assert registry.exit(key) == number
            registry.unclaim(key)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(registry) == 0
    assert after - baseline < 64 * 1024


def test_reset_forgets_everything() -> None:
    registry: Registry[str, None] = Registry(Counters())
    assert registry.claim("k", None, None)
    registry.settle("k", "h")
    registry.reset()
    assert registry.hold("k") is None
    assert len(registry) == 0
    assert registry.claim("k", 0, None)


def _queue_has(registry: Registry[Any, Any], length: int) -> bool:
    return _queue_length(registry, "k") == length


def _queue_length(registry: Registry[Any, Any], key: str) -> int:
    entry = registry._entries.get(key)
    return 0 if entry is None else len(entry.waiters)
