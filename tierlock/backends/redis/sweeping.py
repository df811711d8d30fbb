"""Holds that no thread will use: deleted by owner id, in a thread of their own, so that
an interrupted caller is not held up.

An acquire cut short (by an interrupt, or after its connection failed) may have left a
hold under its owner id, which would block the key for its whole lease. Deleting it at
once is not enough when the acquire may still be on its way: a script sent on a
connection that the client gave up on can reach the server after a delete sent on
another. So a hold in doubt is deleted at once and again once its command can no longer
run (``Sweep.again``); what still arrives later only holds the key for its lease.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from ...errors import LockError

__all__ = ["Sweeper"]

logger = logging.getLogger(__name__)

# The pause before a failed delete is tried again.
RETRY_PAUSE = 0.2


class Sweeper:
    """Runs ``delete(key, owner_id)`` (raising ``LockError`` on failure) at given times,
    retrying failures until a bound. The thread exists only while deletes are pending."""

    def __init__(self, delete: Callable[[str, str], None], give_up_after: float) -> None:
        self._delete = delete
        self._give_up_after = give_up_after
        self.forget()

    def forget(self) -> None:
        """Drop every pending delete: used in a forked child, whose parent sweeps its own."""
        self._changed = threading.Condition(threading.Lock())
        # (when, serial, key, owner id, give up at), soonest first
        self._pending: list[tuple[float, int, str, str, float]] = []
        self._serials = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, key: str, owner_id: str, *, again_after: float | None) -> None:
        """Delete ``owner_id``'s hold of ``key`` now, and again ``again_after`` seconds
        from now if given."""
        now = time.monotonic()
        times = [now] if again_after is None else [now, now + again_after]
        with self._changed:
            if self._stopped:
                logger.debug("not sweeping %r after close; its lease will end", key)
                return
            for when in times:
                item = (when, next(self._serials), key, owner_id, when + self._give_up_after)
                heapq.heappush(self._pending, item)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tierlock-sweeper", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def finish(self, timeout: float) -> None:
        """Stop the thread and delete what is pending now, in the calling thread, for up
        to ``timeout`` seconds; what is left after that expires with its lease."""
        with self._changed:
            self._stopped = True
            thread = self._thread
            self._changed.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._changed:
            pending, self._pending = self._pending, []
        for _, _, key, owner_id, _ in sorted(pending):
            if time.monotonic() >= deadline:
                logger.warning("lock %r left to its lease at close", key)
                continue
            try:
                self._delete(key, owner_id)
            except LockError as exc:
                logger.warning("lock %r left to its lease at close: %s", key, exc)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and self._pending:
                    wait = self._pending[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._changed.wait(wait)
                if self._stopped or not self._pending:
                    self._thread = None
                    return
                _, serial, key, owner_id, give_up = heapq.heappop(self._pending)
            try:
                self._delete(key, owner_id)
            except LockError as exc:
                retry_at = time.monotonic() + RETRY_PAUSE
                if retry_at >= give_up:
                    logger.warning("lock %r left to its lease: %s", key, exc)
                    continue
                logger.debug("sweeping %r failed, will try again: %s", key, exc)
                with self._changed:
                    heapq.heappush(self._pending, (retry_at, serial, key, owner_id, give_up))
