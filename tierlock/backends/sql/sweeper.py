"""Rows that no thread will use: deleted once nothing can bring them back.

An acquire that is interrupted (a signal handler raised in it) or gives up after its
connection failed may have left a row behind under its owner id, and so may a release
whose statement never confirmed. Its thread is gone from the lock by then, so the row
would block the key for its whole lease. The sweeper deletes such rows by owner id, in
a thread of its own, so that the interrupted caller is not held up.

Deleting at once is not enough when the statement may still be on its way: the insert
sent on a connection that the client has given up on can reach the server after a
cleanup sent on a new connection. So a sweep waits until the server sessions that
carried such statements have ended (a server runs a session's statements in order, so
nothing of it can arrive later), and deletes then; after ``give_up`` it deletes anyway
and a late row can only hold the key for its lease.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from ...errors import LockError

__all__ = ["Sweep", "Sweeper"]

logger = logging.getLogger(__name__)

# Pauses between looks at sweeps still waiting: short at first, since the usual wait
# is for one statement to finish.
FIRST_PAUSE = 0.02
LONGEST_PAUSE = 1.0


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Delete ``owner_id``'s row of ``key`` once none of ``sessions`` (server session
    ids whose statements for it may still run) is alive, or at ``give_up`` at the latest
    (a ``time.monotonic()`` reading)."""

    key: str
    owner_id: str
    sessions: tuple[object, ...]
    give_up: float


class Sweeper:
    """Runs ``sweep(item) -> bool`` (``True``: done) for each item until it is done.

    The thread exists only while sweeps are pending.
    """

    def __init__(self, sweep: Callable[[Sweep], bool]) -> None:
        self._sweep = sweep
        self.forget()

    def forget(self) -> None:
        """Drop every pending sweep: used in a forked child, whose parent sweeps its own."""
        self._mutex = threading.Lock()
        self._pending: list[Sweep] = []
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._wake = threading.Event()  # cuts the thread's pause short at close

    def add(self, item: Sweep) -> None:
        with self._mutex:
            if self._stopped:
                logger.debug("not sweeping %r after close; its lease will end", item.key)
                return
            self._pending.append(item)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tierlock-sweeper", daemon=True
                )
                self._thread.start()

    def finish(self, timeout: float) -> None:
        """Stop the thread and run what is pending in the calling thread, for up to
        ``timeout`` seconds; what is left after that expires with its lease."""
        with self._mutex:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        self._drain(until=deadline)
        if self._pending:
            logger.warning("%d lock row(s) left to their leases at close", len(self._pending))

    def _run(self) -> None:
        pause = FIRST_PAUSE
        while True:
            with self._mutex:
                if not self._pending or self._stopped:
                    self._thread = None
                    return
            self._drain(until=None)
            self._wake.wait(pause)
            pause = min(pause * 2, LONGEST_PAUSE)

    def _drain(self, until: float | None) -> None:
        """One pass over the pending sweeps (repeated until ``until``, if given)."""
        while True:
            with self._mutex:
                pending = list(self._pending)
            for item in pending:
                try:
                    done = self._sweep(item)
                except LockError as exc:
                    logger.debug("sweeping %r failed, will try again: %s", item.key, exc)
                    done = False
                if done:
                    with self._mutex:
                        self._pending.remove(item)
            if until is None or not self._pending or time.monotonic() >= until:
                return
            time.sleep(FIRST_PAUSE)
