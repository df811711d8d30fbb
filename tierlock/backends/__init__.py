"""Tier 2: what a backend must do, and how one is chosen.

A backend knows nothing of threads, reentrancy or queueing (tier 1 does that); it
only takes, releases and inspects holds of keys, deciding expiry by its own clock.
"""

from __future__ import annotations

import abc
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..records import NO_BOUND, LockInfo, Owner, Promise

__all__ = [
    "Doorbell",
    "LockBackend",
    "Share",
    "SharedHolds",
]


class LockBackend(abc.ABC):
    """Holds of keys with leases. Methods raise only tierlock errors.

    What an engine can do beyond exclusive holds shows in its class: ``shared`` (read
    holds and semaphore permits, or ``None``), ``MAX_HANDOFFS`` (passes between threads
    with no request; 0: none), ``doorbell`` (wake-ups instead of sleeps) and
    ``others_waiting`` (whether other processes want a key). The engines: ``sql``,
    ``redis``, ``zookeeper``, ``files``, one sub-package each, chosen by ``open_backend``.
    """

    #: How many hand-offs between threads of a process one hold may have; each adds one
    #: to its fencing token, which must stay below the token of any later hold.
    MAX_HANDOFFS = 0

    #: Where the locks live, as a URL with any password hidden.
    location: str

    #: How long the store surely keeps every hold of this backend, whatever their
    #: leases say (a ZooKeeper session); no bound by default.
    promise: Promise = NO_BOUND

    #: Read holds and semaphore permits, if the backend has them.
    shared: SharedHolds | None = None

    @abc.abstractmethod
    def try_acquire(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None = None,
        limit: float | None = None,
    ) -> int | None:
        """Take ``key`` for ``owner`` for ``ttl`` seconds if it is free, its lease has
        ended, or its holder process is proven gone; return the hold's fencing token,
        or ``None`` if someone holds it.

        ``lease``: what the manager's heartbeat will renew the hold by (``None``: a
        fixed lease). ``limit``: seconds the try may wait for the database's own locks
        (``None``: the backend's usual bound).
        """

    @abc.abstractmethod
    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        """No thread will use ``owner_id``'s hold of ``key``: make sure its row goes,
        now or once the database can say that no statement for it is still under way.

        ``certain``: a row may exist even if no try failed (the acquire was cut short
        by an interrupt, or the hold was given up as lost); otherwise only an owner id
        in doubt is swept.
        """

    @abc.abstractmethod
    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        """End ``owner_id``'s hold of ``key``; ``False`` if it was no longer theirs.

        ``live_until`` (``time.monotonic()``) is when the hold's lease may first end:
        before then nobody else can have removed the row.
        """

    @abc.abstractmethod
    def handoff(
        self,
        key: str,
        owner_id: str,
        handoffs: int,
        successor: Owner,
        ttl: float,
        lease: float | None,
    ) -> bool:
        """Pass ``owner_id``'s hold of ``key`` to ``successor``, a thread of the same
        process, recording ``handoffs`` (the hold's count so far) and a lease of ``ttl``
        seconds from now, renewed by ``lease`` if given; ``False`` if the hold was no
        longer ``owner_id``'s."""

    @abc.abstractmethod
    def renew(self, holds: Sequence[tuple[str, str]]) -> set[str]:
        """Renew each of ``holds`` (``(key, owner_id)`` pairs of renewed holds) by its
        lease, from now, with as few statements as the backend can; return the owner
        ids renewed. A hold left out was lost: its row is gone or its lease had ended.

        :raises PartialRenewal: only part of the store answered (a cluster's node): the
            holds in its ``renewed`` were renewed, those in ``unreached`` are neither
            renewed nor lost, and are tried again soon."""

    @abc.abstractmethod
    def record_holder(
        self, key: str, owner_id: str, holder: Owner, handoffs: int, lease: float | None
    ) -> bool:
        """Make ``owner_id``'s row of ``key`` name ``holder`` (a thread it passed to
        without a statement), ``handoffs`` and ``lease``; ``False`` if it is not ours."""

    @abc.abstractmethod
    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        """Move the hold's lease end to now + ``ttl``, renewed by ``lease`` from then on
        if given; ``False`` if it is not theirs."""

    def doorbell(self, key: str) -> Doorbell:
        """A way for the one poller of ``key`` in this process to wait between tries.

        This one sleeps; a backend whose database can say when a hold ends wakes the
        poller early instead. Either way the poller tries again after the pause, so
        a missed wake-up only costs time.
        """
        return Doorbell()

    def ask_for_renewals(self, renew_now: Callable[[str | None], None]) -> None:
        """From now on call ``renew_now(key)``, in a thread of the backend's, when another
        process force-releases ``key``, and ``renew_now(None)`` when the store can be
        reached again after the connection was lost, where the backend can tell at once
        (else never: the holder learns at its next renewal). It must be quick."""
        return None

    def watch_wanted(self, told: Callable[[str], None]) -> bool:
        """From now on call ``told(key)``, in a thread of the backend's, when another
        process's poller or try without waiting marks ``key`` wanted, or a writer marks
        a group of its readers, where the store carries such marks to this process at
        once; ``False`` where it does not. It must be quick."""
        return False

    def marks_heard_since(self) -> float | None:
        """Since when (``time.monotonic()``) every writer's mark has reached the
        ``watch_wanted`` callback as it came, with no gap; ``None`` if that is not so
        now (no such callback, or the store does not carry marks)."""
        return None

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        """Whether pollers in other processes wait for ``key``, which this process
        holds (``ringing``: with a doorbell kept by its poller), or tries without waiting
        left their mark (``want``); ``None``: cannot tell."""
        return None

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` as wanted by this process for ``seconds``: a try without waiting
        found it held elsewhere. The holder's ``others_waiting`` then says so, which ends
        its cohort, so that a process that only tries gets its turn too. Must be quick
        and never raise: a lost mark costs only that turn."""
        return None

    @abc.abstractmethod
    def is_locked(self, key: str) -> bool:
        """Whether an unexpired hold of ``key`` exists."""

    @abc.abstractmethod
    def info(self, key: str) -> LockInfo | None:
        """The hold of ``key``, expired or not, if there is one."""

    @abc.abstractmethod
    def holders(self) -> list[LockInfo]:
        """Every hold, expired or not, ordered by key."""

    @abc.abstractmethod
    def force_release(self, key: str) -> bool:
        """Delete whatever hold ``key`` has; ``False`` if there was none."""

    @abc.abstractmethod
    def reap(self) -> int:
        """Delete holds whose lease has ended; return how many."""

    @abc.abstractmethod
    def after_fork(self) -> None:
        """Drop connections inherited from the parent process, without closing them."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the backend opened."""


class Share(NamedTuple):
    """A process's read hold of a key: its fencing token, and the group it joined."""

    token: int
    group: int


class SharedHolds(abc.ABC):
    """Read holds and semaphore permits: a backend's capability (``LockBackend.shared``).

    A process has at most one read hold of a key per manager, which its reading threads
    share (tier 1 counts them). A permit is a hold of a slot key of its own, released,
    extended and renewed as any hold of that key.
    """

    @abc.abstractmethod
    def try_share(
        self, key: str, owner: Owner, ttl: float, lease: float | None, limit: float | None
    ) -> Share | None:
        """Take a read hold of ``key`` for ``owner`` as ``try_acquire`` takes a hold;
        ``None`` while a writer holds the key or waits for it."""

    @abc.abstractmethod
    def unshare(self, key: str, owner_id: str, group: int, live_until: float) -> bool:
        """End a read hold; ``False`` if it was no longer ``owner_id``'s."""

    @abc.abstractmethod
    def still_open(self, key: str, group: int) -> bool:
        """Whether ``group`` still takes readers (no writer waits for the key)."""

    @abc.abstractmethod
    def downgrade(
        self, key: str, owner_id: str, reader: Owner, ttl: float, lease: float | None
    ) -> Share | None:
        """Turn ``owner_id``'s exclusive hold of ``key`` into a read hold of
        ``reader``'s, with no moment in which the key is free; ``None`` if the hold was
        no longer ``owner_id``'s."""

    @abc.abstractmethod
    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        """``LockBackend.extend`` for a read hold of ``key``."""

    @abc.abstractmethod
    def read_blocked(self, key: str) -> bool:
        """Whether a read hold of ``key`` would have to wait now: a writer holds the
        key (with an unexpired lease) or waits for it."""

    @abc.abstractmethod
    def permits_taken(self, key: str) -> int:
        """How many permits of semaphore ``key`` are held (with unexpired leases)."""

    @abc.abstractmethod
    def try_permit(
        self,
        key: str,
        permits: int,
        owner: Owner,
        ttl: float,
        lease: float | None,
        limit: float | None,
    ) -> tuple[str, int] | None:
        """Take one of ``key``'s ``permits``: the slot key it is held under and its
        fencing token, or ``None`` if all are held.

        :raises ValueError: a holder of the key counts another number of permits.
        """


class Doorbell:
    """Pauses of one poller of one key: ``arm()`` before each try, ``wait()`` after a
    failed one; when the poller wins, ``keep()``; ``close()`` when done.

    This one only sleeps, cut short when ``closing`` (the backend's) is set.
    """

    #: Whether a released hold wakes this doorbell's poller when its turn comes (the
    #: poller that has waited longest is woken first). Its poller then pauses whole poll
    #: intervals once the doorbell is armed: short, doubling pauses would only let it
    #: race the poller woken ahead of it, and win at random.
    wakes_in_turn = False

    def __init__(self, closing: threading.Event | None = None) -> None:
        self._closing = closing

    def arm(self) -> None:
        pass

    def wait(self, seconds: float) -> bool:
        """Pause up to ``seconds``; ``True`` if woken early because the key may be free."""
        if self._closing is None:
            time.sleep(seconds)
        else:
            self._closing.wait(seconds)
        return False

    def pause(self, seconds: float, deadline: float | None) -> bool:
        """``wait`` a jittered ``seconds`` (from half of it to all), so that pollers of
        several processes do not try in step, cut short at ``deadline``
        (``time.monotonic()``); ``False`` if the deadline has passed already."""
        delay = random.uniform(seconds / 2, seconds)
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            delay = min(delay, remaining)
        self.wait(delay)
        return True

    def keep(self) -> Callable[[], None] | None:
        """For a poller that won the key: what to call once its process has released
        the row, to wake pollers elsewhere (``None``: nothing to do)."""
        return None

    def close(self) -> None:
        pass
