"""The values passed between the manager and a backend, and the public ``LockInfo``."""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import socket
import threading
from collections.abc import Callable
from datetime import datetime

__all__ = ["LockInfo", "Owner"]

# Host and thread names are stored in VARCHAR(255) columns; longer ones are cut here
# rather than refused by the server, since they only describe the holder.
MAX_LABEL_LENGTH = 255


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


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who asks for a hold; ``owner_id`` is fresh for every hold and is what release
    and extend compare, so a stale or foreign holder can never touch the row."""

    owner_id: str
    host: str
    pid: int
    thread_id: int
    thread_name: str

    @classmethod
    def current(cls) -> Owner:
        return cls(
            owner_id=secrets.token_hex(16),
            host=_hostname(),
            pid=os.getpid(),
            thread_id=threading.get_ident(),
            thread_name=_label(threading.current_thread().name),
        )


@dataclasses.dataclass
class Hold:
    """A hold of one key won in the backend.

    ``live_until`` is a ``time.monotonic()`` reading before which the lease surely
    has not ended: the lease was set to ``ttl`` from a moment after the request was
    sent, and clocks may disagree on the time but not on how fast it passes.
    """

    token: int
    owner_id: str
    live_until: float
    handoffs: int = 0  # how many hand-offs in a row, within the process, led to it
    contended: bool = False  # whether another process held the key when it was won
    # What wakes pollers elsewhere once the row is released (see Doorbell.keep).
    ring: Callable[[], None] | None = None


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """A lock row as the database has it.

    ``acquired_at`` and ``expires_at`` are timezone-aware UTC datetimes from the
    database's clock; ``expired`` says whether, by that clock, the lease had ended
    when the row was read (such a row no longer counts as held).
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
