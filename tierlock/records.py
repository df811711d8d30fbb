"""The values passed between the manager and a backend, and the public ``LockInfo``."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import NamedTuple

from . import process

__all__ = ["DRIFT", "NO_BOUND", "Hold", "LockInfo", "Owner", "Promise", "lease_end"]

# Host and thread names are stored in VARCHAR(255) columns; longer ones are cut here
# rather than refused by the server, since they only describe the holder.
MAX_LABEL_LENGTH = 255

# Two machines' clocks may disagree on how fast time passes, though not by much: NTP
# slews a clock by at most 500 ppm. A holder believes in a lease for this share less
# than its length.
DRIFT = 0.001


def lease_end(sent: float, length: float) -> float:
    """The ``time.monotonic()`` reading before which a lease of ``length`` seconds, set
    by a statement sent at ``sent``, surely has not ended by the store's clock."""
    return sent + length * (1 - DRIFT)


def _label(name: str) -> str:
    """``name`` as every database can store it. Names only describe a holder, so an odd
    one is mended rather than refused: a lone surrogate (what ``os.fsdecode`` makes of
    undecodable bytes) cannot be encoded and becomes its escape, and PostgreSQL's text
    cannot hold NUL, which is dropped."""
    if not name.isascii() or "\x00" in name:  # (ordinary names skip the copies)
        name = name.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "")
    return name[:MAX_LABEL_LENGTH]


@functools.cache
def _hostname() -> str:
    return _label(socket.gethostname())


class Owner(NamedTuple):
    """Who asks for a hold: the thread, its process and host, and a fresh owner id, the
    row's for its whole life, which release and extend compare, so that a stale or
    foreign holder can never touch the row."""

    owner_id: str
    host: str
    host_id: str | None  # see tierlock.process.host_identity
    pid: int
    proc_start: int | None  # see tierlock.process.own_start_time
    thread_id: int
    thread_name: str

    @classmethod
    def current(cls, name: str | None = None) -> Owner:
        """A new owner for the calling thread, or for ``name`` (an asyncio task's) in it."""
        ids = _ids.get()
        return cls(
            f"{ids.prefix}{next(ids.counter):012x}",
            _hostname(),
            ids.host_id,
            ids.pid,
            ids.proc_start,
            threading.get_ident(),
            _label(threading.current_thread().name if name is None else name),
        )


class _Ids(NamedTuple):
    """Owner ids of one process: a random prefix and a counter, cheaper than 16 random
    bytes per acquire and as unique (the prefix is new in every process), and what
    identifies the process."""

    pid: int
    prefix: str
    counter: Iterator[int]
    host_id: str | None
    proc_start: int | None


class _ProcessIds:
    """This process's :class:`_Ids`, made by the first thread that asks in a process.

    They are made whole and put in place by one assignment, so that a thread never sees
    a set half-made by another. Threads that race to make them (after a fork, say) may
    each make a set: one of them stays, and each ever used keeps its own prefix, so
    owner ids stay unique without a mutex (which a fork could leave held).
    """

    def __init__(self) -> None:
        self._ids: _Ids | None = None

    def get(self) -> _Ids:
        ids = self._ids
        pid = os.getpid()
        if ids is None or ids.pid != pid:
            ids = _Ids(
                pid,
                secrets.token_hex(10),
                itertools.count(),
                process.host_identity(),
                process.own_start_time(),
            )
            self._ids = ids
        return ids


_ids = _ProcessIds()


class Promise:
    """How long a store surely keeps every hold of one backend, whatever their leases
    say: ``until``, a ``time.monotonic()`` reading that the backend moves on as the
    store confirms it (a ZooKeeper session: the last request the server answered, sent
    then, plus the session's timeout). Infinite where the store gives no such bound."""

    __slots__ = ("until",)

    def __init__(self, until: float = float("inf")) -> None:
        self.until = until


NO_BOUND = Promise()  # (never moved on: shared by every backend without a bound)


class Hold:
    """One row of this process: a hold of one key, which may pass between its threads.

    ``token`` is the fencing token of the thread holding it now: a hand-off adds one, in
    memory, and counts in ``handoffs``. ``live_until`` is a ``time.monotonic()``
    reading before which the lease surely has not ended (see ``lease_end``): the lease
    was set (or renewed) to ``lease`` from a moment after the statement was sent at
    ``confirmed``, the last time the store proved the row ours; clocks may disagree on
    the time but hardly on how fast it passes. Belief in the hold ends at
    ``live_until`` or at its backend's ``promise`` (``alive``), or earlier when it is
    found ``lost``. ``version`` counts changes of the lease made by other threads than
    the heartbeat's, so that a renewal in flight never writes an older lease over a
    newer one. ``recorded`` is false while
    the row still names an earlier holder thread or hand-off count; the heartbeat
    writes the change. A hold released while threads of the process want its key may be
    *kept* for a moment (``keep_until``) for the next of them.
    """

    __slots__ = (
        "cohort",
        "cohort_began",
        "confirmed",
        "contended",
        "handoffs",
        "holder",
        "keep_until",
        "key",
        "lease",
        "live_until",
        "lost",
        "on_lost",
        "owner_id",
        "promise",
        "recorded",
        "ring",
        "token",
        "ttl",
        "version",
    )

    def __init__(
        self,
        key: str,
        holder: Owner,
        token: int,
        ttl: float,
        renew: bool,
        sent: float,
        on_lost: Callable[[str, int], None] | None = None,
        *,
        contended: bool = False,
        ring: Callable[[], None] | None = None,
    ) -> None:
        self.key = key
        self.owner_id = holder.owner_id
        self.holder = holder
        self.token = token
        self.handoffs = 0  # hand-offs of the row so far, each adding one to the token
        self.ttl = ttl  # the lease its holder asked for
        self.lease: float | None = ttl if renew else None  # the row's renewal (None: fixed)
        self.confirmed = sent
        self.live_until = lease_end(sent, ttl)
        self.version = 0
        self.promise = NO_BOUND  # (the heartbeat gives it its backend's)
        self.on_lost = on_lost
        self.contended = contended  # another process held the key when it was won
        self.ring = ring  # wakes pollers elsewhere once the row is released (Doorbell.keep)
        self.recorded = True
        self.lost = False
        self.cohort = 0  # hand-offs in a row within this process (lock cohorting)
        self.cohort_began = 0.0
        self.keep_until = 0.0  # released, kept for the process's threads until then

    def alive(self) -> bool:
        """Whether its holder may still believe in it: not lost, and its lease surely runs."""
        now = time.monotonic()
        return not self.lost and now < self.live_until and now < self.promise.until


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """A lock row as the database has it.

    ``acquired_at`` and ``expires_at`` are timezone-aware UTC datetimes from the
    database's clock; ``expired`` says whether, by that clock, the lease had ended
    when the row was read (such a row no longer counts as held). ``lease`` is what the
    holder's heartbeat renews the row by (``None``: a fixed lease); ``host_id`` and
    ``process_start`` identify the holder process (see ``tierlock.process``). ``mode``
    is ``"exclusive"``, ``"shared"`` (a read hold) or ``"permit"`` (a semaphore's). After
    hand-offs between threads of the holder process, ``thread_id``, ``thread_name``
    and ``token`` name the current holder within one heartbeat.
    """

    key: str
    token: int
    owner: str
    host: str
    pid: int
    thread_id: int
    thread_name: str
    acquired_at: datetime
    expires_at: datetime
    expired: bool
    lease: float | None = None
    host_id: str | None = None
    process_start: int | None = None
    mode: str = "exclusive"
