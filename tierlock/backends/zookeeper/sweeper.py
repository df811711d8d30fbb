"""Deleting, in a thread of its own, what an operation that failed may have left, and
what is to go later.

A hold node whose create went unanswered, a hold given up as lost, or a mark of a key
that could not be deleted lives on with the session, which lives as long as the
process: nothing else would ever delete it. The sweeper keeps trying until the node is
gone. It stops with the backend, whose closing session takes every such node along.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import BackendError, LockError

__all__ = ["Sweeper", "unless_unreachable"]

logger = logging.getLogger(__name__)

# Pauses between tries of one sweep, doubling from the first to the last.
FIRST_PAUSE = 0.05
LAST_PAUSE = 2.0


class _Sweep(NamedTuple):
    job: Callable[[], bool]  # True: done
    pending: Any  # a request whose outcome must be known first (IAsyncResult), or None
    due: float
    pause: float


class Sweeper:
    """Runs sweeps (``job() -> bool``) until each says it is done."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start afresh: in a forked child, the parent sweeps its own nodes."""
        self._changed = threading.Condition(threading.Lock())
        self._sweeps: list[_Sweep] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, job: Callable[[], bool], pending: Any = None, delay: float = 0.0) -> None:
        """Run ``job`` in ``delay`` seconds (once ``pending``, a request in doubt, has
        its answer), and again after pauses until it returns True."""
        with self._changed:
            if self._stopped:
                return
            self._sweeps.append(_Sweep(job, pending, time.monotonic() + delay, FIRST_PAUSE))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tierlock-zookeeper-sweeper", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            thread = self._thread
            self._changed.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(LAST_PAUSE * 2)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped:
                    now = time.monotonic()
                    ready = [sweep for sweep in self._sweeps if sweep.due <= now]
                    if ready:
                        break
                    due = min((sweep.due for sweep in self._sweeps), default=now + LAST_PAUSE)
                    self._changed.wait(due - now)
                if self._stopped:
                    return
                for sweep in ready:
                    self._sweeps.remove(sweep)
            later = [again for sweep in ready if (again := self._attempt(sweep)) is not None]
            with self._changed:
                self._sweeps.extend(later)

    @staticmethod
    def _attempt(sweep: _Sweep) -> _Sweep | None:
        """Run ``sweep``; ``None`` if it is done, else the same sweep for later."""
        pending = sweep.pending
        try:
            if (pending is None or pending.ready()) and sweep.job():
                return None
        except Exception:  # (a sweep must never end the thread)
            logger.exception("a ZooKeeper clean-up failed; trying again")
        pause = min(sweep.pause * 2, LAST_PAUSE)
        return sweep._replace(due=time.monotonic() + pause, pause=pause)


def unless_unreachable(sweep: Callable[[], object]) -> Callable[[], bool]:
    """``sweep`` as a sweeper's job: done unless the server could not be reached."""

    def job() -> bool:
        try:
            sweep()
        except BackendError as exc:
            logger.debug("a clean-up will be tried again: %s", exc)
            return False
        except LockError:  # closed: the session's end takes the node along
            pass
        return True

    return job
