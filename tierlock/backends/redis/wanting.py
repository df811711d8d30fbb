"""Who else wants a key that this process holds: pollers listening on its channel
(``wakeups``), and tries that lost it lately.

A poller of another process subscribes to the key's channel while it waits, which the
server counts. A process that only tries without waiting subscribes to nothing, and
without a trace of its tries a process that passes the key between its own threads
would never give it up to them. So a try that finds the key held elsewhere marks it
wanted, in the same script and round trip (``scripts.ACQUIRE``): the key's mark
(``layout``) names the trying backend's tag for ``MARK_LIFE``. The holder asks for
both in one round trip (``scripts.WANTED``) when a cohort of its threads ends.

A cluster node counts only the listeners connected to it, so there the mark alone
tells: without one, whether pollers wait is not known.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ...memories import remember_later
from ...stats import Counters
from .layout import Names, milliseconds
from .scripts import WANTED, Scripts
from .wakeups import WakeUps

__all__ = ["MARK_LIFE", "Wanting"]

# How long the mark of a lost try lasts, in seconds: twice the default poll interval,
# so that a poller's tries keep its mark up; and longer than tier 1 asks ``want`` to
# mark a key for after a lost try (``cohorts.WANTED_FOR``), so that ``want`` has
# nothing to add to the try's own mark and costs no round trip.
MARK_LIFE = 0.2


class Wanting:
    """One backend's marks, and its census of who else wants a key."""

    def __init__(
        self, scripts: Scripts, counters: Counters, wakeups: WakeUps, *, cluster: bool
    ) -> None:
        self._scripts = scripts
        self._counters = counters
        self._wakeups = wakeups
        self._cluster = cluster
        self.forget()

    def forget(self) -> None:
        """Start afresh: a forked child is another process, with a tag of its own."""
        self.tag = secrets.token_hex(8)  # what this backend's marks hold
        self._marked_until: dict[str, float] = {}  # by mark key (time.monotonic())

    def acquire_args(self) -> tuple[str, int]:
        """ACQUIRE's last arguments: this backend's tag and the mark's life in ms."""
        return self.tag, milliseconds(MARK_LIFE)

    def lost(self, where: Names, sent: float) -> None:
        """A try sent at ``sent`` (``time.monotonic()``) found the key held: it marked it."""
        remember_later(self._marked_until, where.want, sent + MARK_LIFE)

    def want(self, client: Any, where: Names, seconds: float) -> None:
        """Mark the key wanted for ``seconds``, unless a lost try marked it for as long."""
        until = time.monotonic() + seconds
        if self._marked_until.get(where.want, 0.0) >= until:
            return
        self._counters.add("statements")
        client.set(where.want, self.tag, px=milliseconds(seconds))
        remember_later(self._marked_until, where.want, until)

    def others_waiting(self, client: Any, where: Names) -> bool | None:
        """Whether another backend marked the key or listens on its channel (``None``:
        no mark, and a cluster cannot tell who listens)."""
        channel = "" if self._cluster else where.channel
        marked, listeners = self._scripts.run(client, WANTED, (where.want,), (self.tag, channel))
        if marked:
            return True
        if listeners < 0:
            return None
        return int(listeners) > self._wakeups.listening(where.channel)
