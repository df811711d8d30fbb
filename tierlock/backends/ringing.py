"""A doorbell rung through an event, by a thread that hears of releases (Redis pub/sub,
inotify on a lock directory)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from . import Doorbell

__all__ = ["EventBell"]


class EventBell(Doorbell):
    """Rung by setting ``event``; ``leave`` is called once its poller is done. A set
    ``closing`` (the backend's) ends every wait at once."""

    def __init__(
        self, event: threading.Event, closing: threading.Event, leave: Callable[[], None]
    ) -> None:
        super().__init__(closing)
        self._event = event
        self._stopping = closing
        self._leave = leave

    def arm(self) -> None:
        self._event.clear()

    def wait(self, seconds: float) -> bool:
        if self._stopping.is_set():
            return False
        return self._event.wait(seconds)

    def close(self) -> None:
        self._leave()
