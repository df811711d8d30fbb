"""Who else wants a key that this process holds: the mark that lost tries leave.

A try that finds a key held elsewhere, and ``want``, make the key's mark file
(``names.WAITING``) if there is none. The holder's ``others_waiting`` takes the mark
away, one system call, and from then counts the key wanted for ``WANTED_MEMORY``: tier 1
asks at the end of a cohort of hand-offs and again as it lets the key go (whether its
next thread should let others try first), and the second answer must not undo the
first. Once nobody tried for that long, a hold passes on within its process again.
"""

from __future__ import annotations

import logging
import time

from ...memories import remember
from .holdfile import Directory
from .names import WAITING, key_name

__all__ = ["WANTED_MEMORY", "Wanting"]

logger = logging.getLogger(__name__)

# How long a mark taken away counts, in seconds: a default poll interval, within which
# a poller that left it tries (and marks) again, and as long as tier 1 asks ``want`` to
# mark a key for (``cohorts.WANTED_FOR``).
WANTED_MEMORY = 0.1


class Wanting:
    """One backend's marks, and its memory of the marks it took away."""

    def __init__(self, files: Directory) -> None:
        self._files = files
        self.forget()

    def forget(self) -> None:
        """Start afresh (in a forked child)."""
        self._taken_at: dict[str, float] = {}  # by key (time.monotonic())

    def mark(self, key: str) -> None:
        """Mark ``key`` wanted by this process (a no-op if it is marked already). A
        mark that cannot be made is only logged: it costs the process a turn, while
        a failure would turn a lost try into an error."""
        try:
            self._files.mark(self._path(key))
        except OSError as exc:
            logger.debug("marking %r wanted failed: %s", key, exc)

    def others_waiting(self, key: str) -> bool:
        """Whether a mark of ``key`` was there, now or within ``WANTED_MEMORY``."""
        now = time.monotonic()
        if self._files.remove(self._path(key)):
            remember(self._taken_at, key, now)
            return True
        taken_at = self._taken_at.get(key)
        return taken_at is not None and now - taken_at < WANTED_MEMORY

    def _path(self, key: str) -> str:
        return self._files.path(key_name(key) + WAITING)
