"""One try of the backend for a task waiting for a read hold or a permit, as the key's
poller in the event loop (``shared``) runs it in a statement thread, and the sweep of
what such a try may have left when its outcome went unseen."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..backends import Doorbell, LockBackend, SharedHolds
from ..keys import permit_key, reader_key
from ..records import Hold, Owner
from ..tier1.pollers import reporting
from .waiters import Waiter

__all__ = ["Got", "one_try", "sweeper"]

# What the poller gets for a waiter: its hold, and the group a read hold joined.
Got = tuple[Hold, int]


def one_try(
    shared: SharedHolds,
    key: str,
    permits: int,
    waiter: Waiter,
    doorbell: Doorbell | None,
    limit: float | None,
) -> Callable[[], Got | None]:
    """One try for ``waiter`` (a permit of ``permits`` if given, else a read hold)."""
    owner, ttl, renew = waiter.owner, waiter.ttl, waiter.renew
    lease = ttl if renew else None
    on_lost = reporting(key, waiter.on_lost)

    def attempt() -> Got | None:
        if doorbell is not None:
            doorbell.arm()
        sent = time.monotonic()
        if permits:
            taken = shared.try_permit(key, permits, owner, ttl, lease, limit)
            if taken is None:
                return None
            slot, token = taken
            return Hold(slot, owner, token, ttl, renew, sent, on_lost), 0
        share = shared.try_share(key, owner, ttl, lease, limit)
        if share is None:
            return None
        row = reader_key(key, owner.owner_id)
        return Hold(row, owner, share.token, ttl, renew, sent, on_lost), share.group

    return attempt


def sweeper(backend: LockBackend, key: str, permits: int, owner: Owner) -> Callable[[], None]:
    """Make sure no row of ``owner`` stays, after a try whose outcome went unseen."""
    rows = [permit_key(key, slot) for slot in range(permits)] or [reader_key(key, owner.owner_id)]

    def sweep() -> None:
        for row in rows:
            backend.discard(row, owner.owner_id, certain=True)

    return sweep
