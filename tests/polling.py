"""Waiting in tests for a condition that other threads, processes or servers bring about."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], what: str, *, limit: float = 20.0, pause: float = 0.01
) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail with
    ``what`` after ``limit`` seconds. The bound turns a hang into a failure."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"still waiting after {limit:g} s for {what}"
        time.sleep(pause)
