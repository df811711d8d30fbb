"""Wake-ups on Redis: a released hold is announced on its key's channel (the release
script PUBLISHes), so a poller waiting for the key tries again at once instead of at
its next pause.

Each backend keeps one extra connection, opened when some thread first has to wait for
a key held elsewhere, that a daemon thread reads. A poller subscribes to its key's
channel while it polls (pollers of one key in the process share the subscription) and
unsubscribes when it is done. Pollers only send on that connection, and only once the
reading thread has connected it: a poller never waits for a connection to be made.
Wake-ups only save time: a poller still tries again after each pause, so one lost to a
dropped connection or a restarted server costs at most one pause.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .. import Doorbell
from ..ringing import EventBell

__all__ = ["WakeUps"]

logger = logging.getLogger(__name__)

# Seconds between the reading thread's checks whether it should stop, and between its
# tries to connect again after a failure.
LISTEN_SLICE = 1.0


class WakeUps:
    """The doorbells of one backend, and the connection that rings them."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        """``connect``: a new connection, not yet connected, outside any pool."""
        self._connect = connect
        self.forget()

    def forget(self) -> None:
        """Start afresh; in a forked child, the reading thread and its connection are
        the parent's, and are left alone."""
        self._mutex = threading.Lock()
        self._bells: dict[str, set[threading.Event]] = {}  # by channel
        self._connection: Any = None  # while connected and read
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def doorbell(self, channel: str) -> Doorbell:
        event = threading.Event()
        with self._mutex:
            events = self._bells.setdefault(channel, set())
            events.add(event)
            if len(events) == 1:
                self._send("SUBSCRIBE", channel)
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._listen, name="tierlock-listener", daemon=True
                )
                self._thread.start()
        return EventBell(event, self._stopped, lambda: self._leave(channel, event))

    def listening(self, channel: str) -> int:
        """How many of the server's subscribers of ``channel`` are this backend's."""
        return 1 if channel in self._bells and self._connection is not None else 0

    def close(self) -> None:
        """Stop the reading thread and send every poller away (they try once more,
        and see that the backend is closed)."""
        with self._mutex:
            self._stopped.set()
            thread, connection = self._thread, self._connection
            self._connection = None
        if connection is not None:
            connection.disconnect()  # (ends the reading thread's wait at once)
        self._ring_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(2 * LISTEN_SLICE)

    def _leave(self, channel: str, event: threading.Event) -> None:
        with self._mutex:
            events = self._bells.get(channel)
            if events is None:
                return
            events.discard(event)
            if not events:
                del self._bells[channel]
                self._send("UNSUBSCRIBE", channel)

    def _send(self, *command: str) -> None:
        """Send ``command`` if the connection is up (else the reading thread subscribes
        when it connects); holding ``_mutex``."""
        if self._connection is None:
            return
        try:
            self._connection.send_command(*command, check_health=False)
        except Exception as exc:  # the reading thread sees it too, and connects again
            logger.debug("%s failed: %s", command[0], exc)

    def _listen(self) -> None:
        while not self._stopped.is_set():
            connection = self._connect()
            try:
                connection.connect()
                with self._mutex:
                    if self._stopped.is_set():
                        return
                    self._connection = connection
                    if self._bells:
                        self._send("SUBSCRIBE", *self._bells)
                self._ring_all()  # releases before the subscription went unheard
                while not self._stopped.is_set():
                    if connection.can_read(timeout=LISTEN_SLICE):
                        self._heard(connection.read_response(push_request=True))
            except Exception as exc:  # pollers fall back on their pauses meanwhile
                logger.debug("listening for released locks failed, retrying: %s", exc)
            finally:
                with self._mutex:
                    if self._connection is connection:
                        self._connection = None
                connection.disconnect()
            self._ring_all()
            self._stopped.wait(LISTEN_SLICE)

    def _heard(self, reply: Any) -> None:
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == "message":
            with self._mutex:
                events = list(self._bells.get(reply[1], ()))
            for event in events:
                event.set()

    def _ring_all(self) -> None:
        with self._mutex:
            events = [event for events in self._bells.values() for event in events]
        for event in events:
            event.set()
