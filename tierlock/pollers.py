"""The one poller of a key in a process, for read holds and permits: tries the backend
until it grants or the deadline passes, pausing between tries on the key's doorbell.

(The exclusive hold's poller, in ``tiers``, also lets other processes go first after a
cohort of local hand-offs; read holds and permits are not handed off.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from .backends import Doorbell, LockBackend
from .tiers import FIRST_POLL

__all__ = ["poll"]

T = TypeVar("T")


def poll(
    backend: LockBackend,
    key: str,
    try_once: Callable[[float | None], T | None],
    deadline: float | None,
    poll_interval: float,
    check_open: Callable[[], None],
) -> T | None:
    """``try_once(limit)`` until it returns a result, or ``None`` once ``deadline``
    (``time.monotonic()``; ``None``: never) has passed. ``limit``: the seconds left.

    No connection is held between tries; ``check_open`` raises if the manager closed.
    """
    doorbell: Doorbell | None = None
    pause = FIRST_POLL
    try:
        while True:
            check_open()
            if doorbell is not None:
                doorbell.arm()
            limit = None if deadline is None else max(0.0, deadline - time.monotonic())
            result = try_once(limit)
            if result is not None:
                return result
            check_open()
            if doorbell is None:
                doorbell = backend.doorbell(key)
            delay = random.uniform(pause / 2, pause)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                delay = min(delay, remaining)
            doorbell.wait(delay)
            pause = min(pause * 2, poll_interval)
    finally:
        if doorbell is not None:
            doorbell.close()
