"""The service layer: moving money between two accounts, one transfer per account at a
time, across threads and processes."""

from __future__ import annotations

import time

from tierlock.contrib.django import synchronized

from .models import Account, Transfer

# Between reading and writing the balances: long enough that two transfers of one
# account that overlap lose an update. It synchronises nothing.
PAUSE = 0.002


def transfer(src: int, dst: int, amount: int) -> None:
    """Move ``amount`` from account ``src`` to ``dst``; both accounts are locked, the
    lower id first, so that two transfers never wait for each other in a circle."""
    if src == dst:
        raise ValueError("a transfer needs two accounts")
    low, high = sorted((src, dst))
    _move(low, high, src, dst, amount)


@synchronized("account:{low}")
@synchronized("account:{high}")
def _move(low: int, high: int, src: int, dst: int, amount: int) -> None:
    source = Account.objects.get(pk=src)
    target = Account.objects.get(pk=dst)
    time.sleep(PAUSE)
    source.balance -= amount
    target.balance += amount
    source.save(update_fields=["balance"])
    target.save(update_fields=["balance"])
    Transfer.objects.create(src=src, dst=dst, amount=amount)


@synchronized("hold:{name}")
def hold(name: str) -> None:
    """Hold ``hold:<name>`` for the call (and, in a transaction, until it ends)."""
