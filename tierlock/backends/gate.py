"""The door every backend operation passes: counted, so that ``close()`` and ``fork()``
can wait for the operations under way and keep new ones out."""

from __future__ import annotations

import logging
import threading

from ..errors import LockError

__all__ = ["Gate"]

logger = logging.getLogger(__name__)

NOBODY = -1  # no thread has this ident


class Gate:
    """Counts operations under way. ``shut`` refuses new ones for good (except in the
    thread that shut it, which finishes the backend's work); ``pause`` holds new ones
    back until ``resume``. Both wait, up to a bound, for those under way to end."""

    def __init__(self, *, shut: bool = False) -> None:
        # Entering and leaving take the plain lock (no Python-level call of the
        # condition's); only close, pause and what waits on them use the condition.
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._busy = 0
        self._paused = False
        # The thread that shut the gate (NOBODY: shut, and no thread may pass).
        self._shut_by: int | None = NOBODY if shut else None

    @property
    def shut(self) -> bool:
        return self._shut_by is not None

    def enter(self) -> None:
        """:raises LockError: the gate is shut (the backend is closed)."""
        with self._mutex:
            while self._paused:
                self._changed.wait()
            if self._shut_by is not None and self._shut_by != threading.get_ident():
                raise LockError("this LockManager is closed")
            self._busy += 1

    def leave(self) -> None:
        with self._mutex:
            self._busy -= 1
            # Only close and pause wait for the count to reach nought.
            if not self._busy and (self._paused or self._shut_by is not None):
                self._changed.notify_all()

    def close(self, timeout: float) -> None:
        """Refuse new operations and wait up to ``timeout`` seconds for the rest."""
        with self._changed:
            self._shut_by = threading.get_ident()
            if not self._changed.wait_for(lambda: not self._busy, timeout):
                logger.warning("closing while %d database operation(s) still run", self._busy)

    def seal(self) -> None:
        """Refuse the thread that shut the gate too: its work is done."""
        with self._changed:
            self._shut_by = NOBODY

    def pause(self, timeout: float) -> None:
        """Hold new operations back and wait up to ``timeout`` seconds for the rest."""
        with self._changed:
            self._paused = True
            if not self._changed.wait_for(lambda: not self._busy, timeout):
                logger.warning("forking while %d database operation(s) still run", self._busy)

    def resume(self) -> None:
        with self._changed:
            self._paused = False
            self._changed.notify_all()
