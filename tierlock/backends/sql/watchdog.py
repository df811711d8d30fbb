"""A time limit for each try on PostgreSQL, whose driver has no read timeout.

libpq's ``tcp_user_timeout`` fires only while sent data goes unacknowledged, so a
server (or a middlebox) that accepts a statement and never answers would block its
caller for good. The watchdog shuts down the socket of a try that outlives its limit;
the driver then fails the try as a lost connection, which is retried or reported as
``BackendError`` within ``database_timeout``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

__all__ = ["Watchdog"]

logger = logging.getLogger(__name__)

# The longest the watchdog sleeps between looks, in seconds.
LOOK_INTERVAL = 0.1


class Watchdog:
    """Cuts the connection of any try still running ``limit`` seconds after it began."""

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self.forget()

    def forget(self) -> None:
        """Start afresh; used in a forked child, where the watching thread is gone."""
        self._mutex = threading.Lock()
        self._tries: dict[int, tuple[float, int]] = {}  # try number -> (deadline, socket fd)
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def close(self) -> None:
        self._stopped.set()

    @contextlib.contextmanager
    def watch(self, fileno: int) -> Iterator[None]:
        """Watch the try running on socket ``fileno`` while the block runs."""
        number = next(self._numbers)
        with self._mutex:
            self._tries[number] = (time.monotonic() + self._limit, fileno)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._look, name="tierlock-watchdog", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._mutex:
                del self._tries[number]

    def _look(self) -> None:
        while not self._stopped.wait(LOOK_INTERVAL):
            now = time.monotonic()
            with self._mutex:
                for deadline, fd in self._tries.values():
                    if deadline <= now:
                        _shut_down(fd)


def _shut_down(fd: int) -> None:
    """End the TCP connection on ``fd`` both ways; the owner's pending read then fails."""
    try:
        with socket.socket(fileno=os.dup(fd)) as duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
        logger.warning("cut a database connection that did not answer in time")
    except OSError:  # already closed
        pass
