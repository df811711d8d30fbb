"""Wake-ups from PostgreSQL: a released hold is announced with NOTIFY, so a poller
waiting for the key tries again at once instead of at its next pause; a forced release
(``force_release``) is announced too, so that a holder process learns at once that
its row is gone.

Each manager keeps one extra connection, opened when some thread first has to wait
for a key held elsewhere or first holds a key, that LISTENs on the table's channel.
The notifications only save time: a poller still tries again after each pause, and a
holder's heartbeat still finds a deleted row, so a lost notification (the connection
dropped, the server restarted) costs at most a pause or a beat.

Who waits for a key is told on the same channel, so that a holder can tell whether
other processes want the key it passes between its threads (``waiting``), and a
process that keeps a read hold learns at once that a writer waits (``watch_wanted``;
a writer's mark on a group of readers goes out with it, ``WRITER``). A poller
marks its key wanted while it waits, for ``POLLER_MARK`` at a time, marking again
before the mark ends; a try without waiting marks it for the seconds tier 1 asks
(``want``). Marks go out on a second connection, whose own marks the listener ignores.
A release of a key answers every poller's mark of it heard before, which then ends
soon: a poller that won leaves no mark behind for long, and one that lost marks again
as it goes back to waiting (a try's mark lasts its seconds: the process tries again,
and tier 1 marks at most so often). So a listener that has listened for longer than
any mark lasts and heard none knows that nobody waits; before that, it cannot tell.

A release announces itself only while the process cannot tell that nobody waits for
its key (``WakeUps.announced``): on keys nobody waits for, no listener of any process
wakes for it. A poller whose first mark is still on its way when the key is released
misses that release until its pause ends; its pauses begin at 2 ms and double, and
its mark is heard after about a round trip, so the miss costs a few milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...keys import user_key
from ...memories import remember, remember_later
from .. import Doorbell

__all__ = ["FORCED", "POLLING", "WANTED", "WRITER", "Listener", "channel_name"]

logger = logging.getLogger(__name__)

# Seconds between checks whether the listener should stop, and between reconnections.
LISTEN_SLICE = 1.0
# What a forced release's notification carries before the key. A key that begins so
# and is released in the ordinary way costs its holder one early renewal, nothing more.
FORCED = "\x1bforced:"
# What a mark's notification carries before "<milliseconds>:<key>": a try without
# waiting, or a poller, wants the key. (A key that begins so and is released wakes no
# poller: they try again after their pauses.)
WANTED = "\x1bwanted:"
POLLING = "\x1bpolling:"
# What a writer's mark on a group of readers sends before the key (``writer_waits``):
# heard by every process, the writer's own too, as a mark for ``watch_wanted``.
WRITER = "\x1bwriter:"
# How long a poller's mark lasts: long enough that a poller that waits long sends few
# marks, short enough that a listener soon knows that nobody waits (KNOWN_AFTER).
POLLER_MARK = 0.5
# A waiting poller marks again this long before its mark ends (delivery on a loaded
# machine), and no mark lasts longer than POLLER_MARK.
MARK_AHEAD = 0.1
# A poller's mark heard before a release of its key ends this long after it at most:
# time for the pollers that lost to mark again, on a loaded machine too (they took 20-60
# ms with four busy processes on two cores), not so long that the one that won stays
# marked for long.
ANSWERED_WITHIN = 0.1
# A listener that has listened this long has heard a mark of everyone who waits.
KNOWN_AFTER = POLLER_MARK + MARK_AHEAD
# How long a thread waits for the connection that sends marks, busy with another's: a
# mark must not hold up a try (a lost mark costs a turn, no more).
MARK_WAIT = 0.01


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
        self._wanted_told: Callable[[str], None] | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._listening_since: float | None = None  # (time.monotonic())
        self._wanted: dict[str, float] = {}  # key -> until when others' tries' marks last
        self._polled: dict[str, float] = {}  # key -> until when others' pollers' marks last
        self._marked: dict[str, float] = {}  # key -> until when this process's own lasts
        self._sending = threading.Lock()
        self._sender: Any = None  # the connection that sends marks
        self._sender_pid: int | None = None  # its server process, whose marks are ours
        self._resend_after = 0.0  # (time.monotonic()) no mark before, after a failed one

    def doorbell(self, key: str) -> Doorbell:
        with self._mutex:
            # Registered before the listener starts, so that its first ring reaches it.
            bell = self._bells[key] = threading.Event()
            self._start()
        return _Bell(self, key, bell)

    def waiting(self, key: str) -> bool | None:
        """Whether another process marked ``key`` wanted, and the mark lasts; ``False``
        if none did while this listener listened long enough to know; else ``None``."""
        now = time.monotonic()
        if self._wanted.get(key, 0.0) > now or self._polled.get(key, 0.0) > now:
            return True
        since = self._listening_since  # (it listens once the process held or polled)
        return None if since is None or now - since < KNOWN_AFTER else False

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` wanted by this process for ``seconds`` (at most POLLER_MARK)."""
        self._mark(WANTED, key, min(seconds, POLLER_MARK))

    def poll_marked(self, key: str, seconds: float) -> None:
        """A poller of ``key`` waits ``seconds`` (at most POLLER_MARK - MARK_AHEAD):
        mark the key wanted, unless this process's mark lasts past the wait already."""
        now = time.monotonic()
        if self._marked.get(key, 0.0) >= now + seconds + MARK_AHEAD:
            return
        # Noted before it goes out, so that a release heard meanwhile voids it.
        remember(self._marked, key, now + POLLER_MARK)
        if not self._mark(POLLING, key, POLLER_MARK):
            self._marked.pop(key, None)

    def _mark(self, kind: str, key: str, seconds: float) -> bool:
        """Send a mark of ``key`` for ``seconds``; ``False`` if it could not go."""
        payload = f"{kind}{round(seconds * 1000)}:{key}"
        if not self._sending.acquire(timeout=MARK_WAIT):
            return False
        try:
            if self._stopped.is_set() or time.monotonic() < self._resend_after:
                return False
            if self._sender is None:
                self._sender = self._connect()
                self._sender_pid = self._sender.info.backend_pid
            self._sender.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
            return True
        except Exception as exc:
            logger.debug("marking %r wanted failed: %s", key, exc)
            self._close_sender()
            self._resend_after = time.monotonic() + LISTEN_SLICE  # (no connect per try)
            return False
        finally:
            self._sending.release()

    def _close_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            with contextlib.suppress(Exception):  # already broken
                sender.close()

    def watch_forced(self, told: Callable[[str], None]) -> None:
        """Call ``told(key)`` for every forced release heard from now on."""
        with self._mutex:
            self._forced = told
            self._start()

    def watch_wanted(self, told: Callable[[str], None]) -> None:
        """Call ``told(key)`` for every mark of another process, and every writer's
        mark on a group of readers, heard from now on."""
        with self._mutex:
            self._wanted_told = told
            self._start()

    def marks_heard_since(self) -> float | None:
        """Since when every writer's mark has been told to ``watch_wanted``'s callback:
        since LISTEN took effect on the connection that listens now."""
        return None if self._wanted_told is None else self._listening_since

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
        if self._sending.acquire(timeout=LISTEN_SLICE):  # (a mark on its way ends first)
            try:
                self._close_sender()
            finally:
                self._sending.release()

    def _listen(self) -> None:
        while not self._stopped.is_set():
            try:
                connection = self._connect()
                try:
                    connection.execute(f"LISTEN {self._channel}")
                    self._listening_since = time.monotonic()
                    self._ring_all()  # releases before LISTEN took effect went unheard
                    while not self._stopped.is_set():
                        for notification in connection.notifies(timeout=LISTEN_SLICE):
                            self._heard(notification.payload, notification.pid)
                finally:
                    self._listening_since = None  # (marks go unheard from now on)
                    connection.close()
            except Exception as exc:  # pollers fall back on their pauses meanwhile
                logger.debug("listening for released locks failed, retrying: %s", exc)
                self._stopped.wait(LISTEN_SLICE)

    def _heard(self, payload: str, pid: int) -> None:
        if payload.startswith(WRITER):
            told = self._wanted_told
            if told is not None:
                told(user_key(payload[len(WRITER) :]))
            return
        for kind, marks in ((WANTED, self._wanted), (POLLING, self._polled)):
            if payload.startswith(kind):
                if pid != self._sender_pid:  # (this process's own say nothing of others)
                    key = _heard_mark(marks, payload[len(kind) :])
                    told = self._wanted_told
                    if key is not None and told is not None:
                        told(key)
                return
        if payload.startswith(FORCED):
            payload = payload[len(FORCED) :]  # (pollers of the key may go now too)
            told = self._forced
            if told is not None:
                told(payload)
        key = user_key(payload)  # (a read hold's or permit's row rings its key's bell)
        # A release answers every poller's mark of its key heard so far (see the
        # docstring): it ends soon, and this process's own poller marks again.
        answered = time.monotonic() + ANSWERED_WITHIN
        if self._polled.get(key, 0.0) > answered:
            self._polled[key] = answered
        self._marked.pop(key, None)
        bell = self._bells.get(key)
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
        # In slices that a mark of the key covers, sent before each (see the docstring).
        end = time.monotonic() + seconds
        while True:
            remaining = end - time.monotonic()
            part = max(0.0, min(remaining, POLLER_MARK - MARK_AHEAD))
            self._listener.poll_marked(self._key, part)
            if self._event.wait(part):
                return True
            if part >= remaining:
                return False

    def close(self) -> None:
        bells = self._listener._bells
        if bells.get(self._key) is self._event:
            del bells[self._key]


def _heard_mark(marks: dict[str, float], text: str) -> str | None:
    """Another process marked a key wanted: ``<milliseconds>:<key>``; the key."""
    milliseconds, _, key = text.partition(":")
    if not milliseconds.isdigit():
        return None
    until = time.monotonic() + min(int(milliseconds) / 1000, POLLER_MARK)
    key = user_key(key)
    remember_later(marks, key, until)
    return key
