"""``Later``: calls made when their time comes, by one daemon thread of their own."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Later"]

logger = logging.getLogger(__name__)

# How long ``stop`` waits for a call being made (a statement, which a database that
# stopped answering may hold up until its own timeout) before it goes on without it.
STOP_WAIT = 5.0


class Later:
    """Runs each call given to ``at`` once its time has come, in the order of their
    times; the thread starts with the first call."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.forget()

    def forget(self) -> None:
        """Start afresh: a forked child has no calls due, and the parent's thread is gone."""
        self._changed = threading.Condition(threading.Lock())
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # (calls due at one time go in the order given)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def at(self, when: float, call: Callable[[], None]) -> bool:
        """Call ``call()`` at ``when`` (``time.monotonic()``); ``False`` once stopped."""
        with self._changed:
            if self._stopped:
                return False
            heapq.heappush(self._due, (when, next(self._order), call))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._due[0][2] is call:
                self._changed.notify()  # (due before what the thread waits for)
        return True

    def stop(self) -> None:
        """Drop the calls not yet made, and wait a little for one being made to end."""
        with self._changed:
            self._stopped = True
            self._due.clear()
            thread = self._thread
            self._changed.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_WAIT)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped:
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        break
                    self._changed.wait(self._due[0][0] - now if self._due else None)
                if self._stopped:
                    return
                call = heapq.heappop(self._due)[2]
            try:
                call()
            except Exception:
                logger.exception("%s: a call failed", self._name)
