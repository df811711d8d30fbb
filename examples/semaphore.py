"""A semaphore: at most 3 calls at once to a payment provider, from any thread or process.

The provider allows an account 3 connections at a time and refuses a fourth. Every call
is made holding one permit of ``locks.semaphore("provider:payments", permits=3)``, so
however many threads (here 10 of one process; on more hosts, as many managers) want to
pay, no more than 3 calls are in flight. A thread may hold several permits: each
``acquire`` takes one more, each ``release`` returns one::

    python examples/semaphore.py
    python examples/semaphore.py --url mysql+pymysql://root@127.0.0.1:3306/test
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import tierlock

KEY = "provider:payments"
PERMITS = 3  # connections the provider allows at once
THREADS = 10
PAYMENTS = 4  # per thread
AMOUNT = 5
CALL_TIME = 0.02  # seconds a call to the provider takes
WAIT_LIMIT = 30.0  # only a broken semaphore waits this long


class PaymentProvider:
    """Refuses a call while ``limit`` others are in flight, as a real provider would."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._mutex = threading.Lock()  # guards the provider's own counts, not the calls
        self.in_flight = 0
        self.most_in_flight = 0
        self.refused = 0
        self.charged = 0

    def charge(self, amount: int) -> bool:
        with self._mutex:
            if self.in_flight >= self.limit:
                self.refused += 1
                return False
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(CALL_TIME)  # the network call
        with self._mutex:
            self.in_flight -= 1
            self.charged += amount
        return True


def pay(locks: tierlock.LockManager, provider: PaymentProvider) -> None:
    permit = locks.semaphore(KEY, permits=PERMITS, timeout=WAIT_LIMIT)
    for _ in range(PAYMENTS):
        with permit:
            provider.charge(AMOUNT)


def show_full(locks: tierlock.LockManager) -> None:
    """One thread takes every permit; one more try without waiting fails."""
    permit = locks.semaphore(KEY, permits=PERMITS)
    taken = sum(permit.acquire(timeout=WAIT_LIMIT) for _ in range(PERMITS))
    print(f"one thread holds {taken} of {PERMITS} permits")
    more = permit.acquire(blocking=False)
    print(f"one more without waiting: {more}")
    for _ in range(taken + more):
        permit.release()
    print("all returned")


def main() -> int:
    parser = argparse.ArgumentParser(description="At most 3 calls at once to a provider.")
    parser.add_argument("--url", help="lock database (default: SQLite in a temp dir)")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    args = parser.parse_args()
    provider = PaymentProvider(PERMITS)
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'locks.db'}"
        with tierlock.LockManager(url, table=args.table) as locks:
            show_full(locks)
            threads = [threading.Thread(target=pay, args=(locks, provider)) for _ in range(THREADS)]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            took = time.monotonic() - started
    payments = THREADS * PAYMENTS
    print(f"{payments} payments from {THREADS} threads in {took:.1f} s")
    print(f"most calls in flight at once: {provider.most_in_flight} (limit {PERMITS})")
    print(f"refused by the provider: {provider.refused}")
    print(f"charged {provider.charged} of {payments * AMOUNT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
