"""The bounded memories of keys: a full one starts afresh, except that one of end
times first drops those that passed, keeping what still lasts."""

from __future__ import annotations

import time

import pytest

from tierlock import memories

MOST = 4


@pytest.fixture(autouse=True)
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memories, "REMEMBERED_KEYS", MOST)


def test_a_full_memory_starts_afresh() -> None:
    memory: dict[str, int] = {}
    for number in range(MOST):
        memories.remember(memory, f"k{number}", number)
    memories.remember(memory, "k0", 10)  # (a key it holds: nothing is forgotten)
    assert len(memory) == MOST and memory["k0"] == 10
    memories.remember(memory, "new", 1)
    assert memory == {"new": 1}


def test_a_later_time_is_kept() -> None:
    memory: dict[str, float] = {}
    memories.remember_later(memory, "k", 5.0)
    memories.remember_later(memory, "k", 3.0)
    assert memory == {"k": 5.0}
    memories.remember_later(memory, "k", 7.0)
    assert memory == {"k": 7.0}


def test_a_full_memory_of_times_drops_only_those_past() -> None:
    now = time.monotonic()
    memory = {"past": now - 1.0, "lasting": now + 60.0, "gone": now - 2.0, "also": now + 60.0}
    memories.remember_later(memory, "new", now + 60.0)
    assert memory == {"lasting": now + 60.0, "also": now + 60.0, "new": now + 60.0}
