"""Wake-ups from PostgreSQL: a released hold is announced with NOTIFY, so a poller
waiting for the key tries again at once instead of at its next pause; a forced release
(``force_release``) is announced too, so that a holder process learns at once that
its row is gone.

Each manager keeps one extra connection, opened when some thread first has to wait
for a key held elsewhere or first holds a key, that LISTENs on the table's channel.
The notifications only save time: a poller still tries again after each pause, and a
holder's heartbeat still finds a deleted row, so a lost notification (the connection
dropped, the server restarted) costs at most a pause or a beat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ...keys import user_key
from .. import Doorbell

__all__ = ["FORCED", "Listener", "channel_name"]

logger = logging.getLogger(__name__)

# Seconds between checks whether the listener should stop, and between reconnections.
LISTEN_SLICE = 1.0
# What a forced release's notification carries before the key. A key that begins so
# and is released in the ordinary way costs its holder one early renewal, nothing more.
FORCED = "\x1bforced:"


def channel_name(table: str) -> str:
    # LISTEN folds an unquoted name to lower case; pg_notify takes it as given.
    return f"tierlock_{table.lower()}"


class Listener:
    """LISTENs for released keys on a connection of its own, in a daemon thread."""

    def __init__(self, connect: Callable[[], Any], channel: str) -> None:
        self._connect = connect  # a new autocommit psycopg connection
        self._channel = channel
        self.forget()

    def forget(self) -> None:
        """Start afresh; used in a forked child, where the listening thread is gone."""
        self._mutex = threading.Lock()
        self._bells: dict[str, threading.Event] = {}
        self._forced: Callable[[str], None] | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def doorbell(self, key: str) -> Doorbell:
        with self._mutex:
            # Registered before the listener starts, so that its first ring reaches it.
            bell = self._bells[key] = threading.Event()
            self._start()
        return _Bell(self, key, bell)

    def watch_forced(self, told: Callable[[str], None]) -> None:
        """Call ``told(key)`` for every forced release heard from now on."""
        with self._mutex:
            self._forced = told
            self._start()

    def _start(self) -> None:
        """(With the mutex held.)"""
        if self._thread is None and not self._stopped.is_set():
            self._thread = threading.Thread(
                target=self._listen, name="tierlock-listener", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        with self._mutex:  # a thread being started in doorbell() is started by now
            self._stopped.set()
            thread = self._thread
        self._ring_all()  # pollers try once more, and see that the manager is closed
        if thread is not None and thread is not threading.current_thread():
            thread.join(2 * LISTEN_SLICE)

    def _listen(self) -> None:
        while not self._stopped.is_set():
            try:
                connection = self._connect()
                try:
                    connection.execute(f"LISTEN {self._channel}")
                    self._ring_all()  # releases before LISTEN took effect went unheard
                    while not self._stopped.is_set():
                        for notification in connection.notifies(timeout=LISTEN_SLICE):
                            self._heard(notification.payload)
                finally:
                    connection.close()
            except Exception as exc:  # pollers fall back on their pauses meanwhile
                logger.debug("listening for released locks failed, retrying: %s", exc)
                self._stopped.wait(LISTEN_SLICE)

    def _heard(self, payload: str) -> None:
        if payload.startswith(FORCED):
            told = self._forced
            if told is not None:
                told(payload[len(FORCED) :])
            payload = payload[len(FORCED) :]  # (pollers of the key may go now too)
        # (a read hold's or permit's row rings its key's bell)
        bell = self._bells.get(user_key(payload))
        if bell is not None:
            bell.set()

    def _ring_all(self) -> None:
        for bell in list(self._bells.values()):
            bell.set()


class _Bell(Doorbell):
    def __init__(self, listener: Listener, key: str, event: threading.Event) -> None:
        self._listener = listener
        self._key = key
        self._event = event

    def arm(self) -> None:
        self._event.clear()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def close(self) -> None:
        bells = self._listener._bells
        if bells.get(self._key) is self._event:
            del bells[self._key]
