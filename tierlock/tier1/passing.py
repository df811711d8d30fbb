"""A hold passed between threads of the process in memory: what a waiter asks for, and
when the hold may go to it with no statement."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..records import Hold, Owner

__all__ = ["CONFIRMED_WITHIN", "Asking", "OnLost", "Request", "pass_locally", "passes_locally"]

OnLost = Callable[[str, int], None]

# A hold passes between threads in memory only within this many seconds of the last
# statement that proved its row ours (an acquire, a renewal, a hand-off's UPDATE); after
# that, the next hand-off sends its UPDATE, which finds a row deleted or taken over. So
# no section begins, believing it holds the key, later than this after another process
# took the row (by force_release or a takeover); at one UPDATE per hot key per period.
CONFIRMED_WITHIN = 0.1


class Request:
    """What a waiting thread asks for, for a releasing thread to act on."""

    __slots__ = ("courteous", "on_lost", "owner", "renew", "ttl")

    def __init__(self, owner: Owner, ttl: float, renew: bool, on_lost: OnLost | None) -> None:
        self.owner = owner
        self.ttl = ttl
        self.renew = renew
        self.on_lost = on_lost
        self.courteous = False  # let other processes try first


class Asking(Protocol):
    """What a waiter asks for, as a hand-off in memory needs it."""

    owner: Owner
    ttl: float
    renew: bool
    on_lost: OnLost | None


def passes_locally(hold: Hold, request: Asking) -> bool:
    """Whether ``hold`` may go to a waiter asking for ``request`` with no statement:
    both renew their leases, the lease surely runs, and a statement proved the row ours
    within ``CONFIRMED_WITHIN`` (else the hand-off's own statement proves it)."""
    return (
        hold.lease is not None
        and request.renew
        and hold.alive()
        and time.monotonic() - hold.confirmed < CONFIRMED_WITHIN
    )


def pass_locally(hold: Hold, request: Asking) -> None:
    """Make ``hold`` the successor's: one more hand-off, in memory."""
    hold.token += 1
    hold.handoffs += 1
    hold.cohort += 1
    hold.holder = request.owner
    hold.ttl = request.ttl
    hold.on_lost = request.on_lost
    hold.recorded = False
