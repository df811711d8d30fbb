"""Which wake-up a database gets, in one place: LISTEN/NOTIFY on PostgreSQL
(``notify``), named locks on MariaDB/MySQL (``bells``), named pipes beside the file on
SQLite (``fifos``), plain pauses where none applies (an in-memory SQLite database)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL

from ...stats import Counters
from .. import Doorbell
from .bells import Bells
from .columns import MYSQL_FAMILY
from .fifos import FifoBells
from .notify import Listener

__all__ = ["WakeUps"]

logger = logging.getLogger(__name__)


class WakeUps:
    """The wake-ups of one backend's table."""

    def __init__(
        self,
        dialect: str,
        url: URL,
        table: str,
        channel: str | None,
        connect: Callable[[], Any],
        counters: Counters,
    ) -> None:
        """``connect``: a new autocommit driver connection, outside the pool."""
        self._closing = threading.Event()  # cuts plain pauses short at close
        self._listener = Listener(connect, channel) if channel is not None else None
        self._bells = Bells(connect, table, counters) if dialect in MYSQL_FAMILY else None
        self._fifos = FifoBells.for_url(url, table, counters) if dialect == "sqlite" else None

    def doorbell(self, key: str) -> Doorbell:
        if self._listener is not None:
            return self._listener.doorbell(key)
        if self._bells is not None:
            return self._bells.doorbell(key)
        if self._fifos is not None and (bell := self._fifos.doorbell(key)) is not None:
            return bell
        return Doorbell(self._closing)

    def watch_forced(self, told: Callable[[str], None]) -> None:
        if self._listener is not None:
            self._listener.watch_forced(told)

    def watch_wanted(self, told: Callable[[str], None]) -> bool:
        if self._listener is None:
            return False
        self._listener.watch_wanted(told)
        return True

    def marks_heard_since(self) -> float | None:
        return None if self._listener is None else self._listener.marks_heard_since()

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        if self._listener is not None:
            return self._listener.waiting(key)
        if self._bells is not None:
            return self._bells.waiting(key, ringing)
        if self._fifos is not None:
            return self._fifos.waiting(key)
        return None

    def announced(self, key: str) -> bool:
        """Whether a release of ``key`` must announce itself: unless the listener
        knows that nobody waits for it (PostgreSQL; elsewhere nothing to announce)."""
        return self._listener is not None and self._listener.waiting(key) is not False

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` wanted by this process for ``seconds``, for its holder's
        ``others_waiting``; where nothing can carry the mark, nothing happens."""
        try:
            if self._listener is not None:
                self._listener.want(key, seconds)
            elif self._bells is not None:
                self._bells.want(key, seconds)
            elif self._fifos is not None:
                self._fifos.want(key, seconds)
        except Exception as exc:  # a lost mark costs a turn: never the try's failure
            logger.debug("marking %r wanted failed: %s", key, exc)

    def released(self, key: str) -> None:
        """``key``'s row was deleted: wake a poller elsewhere where nothing else does
        (a NOTIFY goes with PostgreSQL's DELETE; a named lock is freed by its holder)."""
        if self._fifos is not None:
            self._fifos.notify(key)

    def after_fork(self) -> None:
        """Drop the parent's connections and pipes in a forked child, untouched."""
        for part in (self._listener, self._bells, self._fifos):
            if part is not None:
                part.forget()

    def wake_all(self) -> None:
        """Send every poller of this process away (the backend is closing)."""
        self._closing.set()
        if self._fifos is not None:
            self._fifos.close()
        if self._listener is not None:
            self._listener.close()

    def close(self) -> None:
        """Close what is left, once no statement runs any more."""
        if self._bells is not None:
            self._bells.close()
