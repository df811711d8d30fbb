"""What tier 1 of read holds and of permits share: the one poller of a key's read
holds in a process, which tries the backend until it grants or the deadline passes,
pausing between tries on the key's doorbell; and small helpers.

(The exclusive hold's poller, in ``tiers``, and the permits' head of the line, in
``permits``, also take holds passed on by threads of the process.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..backends import Doorbell, LockBackend, SharedHolds
from ..errors import LockError
from .tiers import FIRST_POLL

if TYPE_CHECKING:
    from .tiers import OnLost

__all__ = ["poll", "reporting", "shared_holds", "unlocked"]

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
            if not doorbell.pause(pause, deadline):
                return None
            pause = min(pause * 2, poll_interval)
    finally:
        if doorbell is not None:
            doorbell.close()


def shared_holds(backend: LockBackend, key: str) -> SharedHolds:
    """The backend's read holds and permits, or ``LockError`` if it has none."""
    if backend.shared is None:
        raise LockError("this lock store has no read holds or semaphores", key)
    return backend.shared


class unlocked:
    """``with unlocked(mutex):`` runs its body with ``mutex``, held, released."""

    __slots__ = ("_mutex",)

    def __init__(self, mutex: threading.Lock) -> None:
        self._mutex = mutex

    def __enter__(self) -> None:
        self._mutex.release()

    def __exit__(self, *exc_info: object) -> None:
        self._mutex.acquire()


def reporting(key: str, on_lost: OnLost | None) -> OnLost | None:
    """``on_lost`` for a hold kept under a row key of its own, told the user's key."""
    if on_lost is None:
        return None
    return lambda _row, token: on_lost(key, token)
