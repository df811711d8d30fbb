"""Wake-ups in a lock directory: where inotify can see it (Linux, with ``inotify_simple``,
the ``files`` extra), a deleted hold file wakes the pollers of its key in this process
at once, instead of at their next pause.

One daemon thread per backend watches the directory while pollers wait (it ends once
none has for a while). inotify sees what this host's kernel does to the directory: on a local
disk every release, on a network filesystem only this host's own. Wake-ups only save
time: a poller still tries again after each pause, so one that inotify never reports
costs at most one pause.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .. import Doorbell
from ..ringing import EventBell

try:
    import inotify_simple
except ImportError:  # (not Linux, or the extra is not installed: pollers only poll)
    inotify_simple = None

__all__ = ["WakeUps"]

logger = logging.getLogger(__name__)

# Milliseconds between the watching thread's checks whether it should stop.
WATCH_SLICE = 200


class WakeUps:
    """The doorbells of one lock directory, and the thread that rings them."""

    def __init__(self, root: str, closing: threading.Event) -> None:
        self._root = root
        self.forget(closing)

    def forget(self, closing: threading.Event) -> None:
        """Start afresh; in a forked child, the watching thread is the parent's."""
        self._closing = closing
        self._mutex = threading.Lock()
        self._bells: dict[str, set[threading.Event]] = {}  # by hold file name
        self._thread: threading.Thread | None = None

    def doorbell(self, name: str) -> Doorbell:
        """A doorbell that rings when hold file ``name`` is deleted."""
        if inotify_simple is None:
            return Doorbell(self._closing)
        event = threading.Event()
        with self._mutex:
            self._bells.setdefault(name, set()).add(event)
            if self._thread is None and not self._closing.is_set():
                self._thread = threading.Thread(
                    target=self._watch, name="tierlock-watcher", daemon=True
                )
                self._thread.start()
        return EventBell(event, self._closing, lambda: self._leave(name, event))

    def close(self) -> None:
        """Stop the watching thread (``closing`` is set) and send every poller away."""
        self._ring_all()
        with self._mutex:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2 * WATCH_SLICE / 1000)

    def _leave(self, name: str, event: threading.Event) -> None:
        with self._mutex:
            events = self._bells.get(name)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._bells[name]

    def _watch(self) -> None:
        assert inotify_simple is not None
        flags = inotify_simple.flags
        try:
            with inotify_simple.INotify() as watcher:
                watcher.add_watch(self._root, flags.DELETE | flags.MOVED_FROM)
                self._ring_all()  # releases before the watch went unseen
                while self._watched():
                    self._heard(watcher.read(timeout=WATCH_SLICE))
        except OSError as exc:  # (no inotify here, or too many watches): pollers poll
            logger.debug("watching %s for released locks failed: %s", self._root, exc)
            with self._mutex:
                self._thread = None

    def _watched(self) -> bool:
        """Whether to go on watching: pollers wait and the backend is open. If not,
        the thread is done (the next poller starts another)."""
        with self._mutex:
            if self._bells and not self._closing.is_set():
                return True
            self._thread = None
            return False

    def _heard(self, events: list[Any]) -> None:
        with self._mutex:
            woken = [bell for event in events for bell in self._bells.get(event.name, ())]
        for bell in woken:
            bell.set()

    def _ring_all(self) -> None:
        with self._mutex:
            events = [event for events in self._bells.values() for event in events]
        for event in events:
            event.set()
