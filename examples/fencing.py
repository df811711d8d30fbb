"""Fencing tokens: a holder that stalls past its lease cannot overwrite newer work.

A lease keeps a dead holder from blocking everyone, but a holder that is only paused (a
long GC pause, a stopped VM) wakes up believing it still holds the lock. Its writes are
stopped by the storage, not by the lock: every write carries ``lock.token``, and the
store refuses a token lower than the highest it has accepted.

Here holder A takes the lock with a fixed one-second lease (``renew=False``; a renewed
lease ends only when the whole process stops or loses the database) and stalls; B waits, takes the
lock over once A's lease has ended, and writes; then A wakes up, its write is refused,
and its release raises ``LockLostError``. A and B use separate managers, as two
processes would::

    python examples/fencing.py
    python examples/fencing.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import tierlock

KEY = "report:42"
TTL = 1.0  # A's lease, in seconds
WAIT_LIMIT = 30.0  # only a broken lock makes B wait this long


class FencedStore:
    """Storage that refuses writes with a fencing token older than one it accepted."""

    def __init__(self) -> None:
        self.value = ""
        self.highest_token = 0
        self._mutex = threading.Lock()

    def write(self, value: str, token: int) -> bool:
        """Store ``value`` unless ``token`` is stale; return whether it was stored."""
        with self._mutex:
            if token < self.highest_token:
                return False
            self.value, self.highest_token = value, token
            return True


def holder_a(
    locks: tierlock.LockManager, store: FencedStore, held: threading.Event, b_done: threading.Event
) -> None:
    lock = locks.lock(KEY, ttl=TTL, renew=False)  # a fixed lease, so that a stall can outlast it
    lock.acquire()
    token = lock.token
    assert token is not None
    print(f"A holds {KEY!r} with token {token} and a {TTL:g} s lease, then stalls")
    held.set()
    b_done.wait(WAIT_LIMIT)  # the stall: it lasts until B has taken over and written
    accepted = store.write("written by A", token)
    print(f"A wakes up and writes with token {token}: {'accepted' if accepted else 'refused'}")
    try:
        lock.release()
    except tierlock.LockLostError as exc:
        print(f"A releases: LockLostError: {exc}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Fencing tokens stop a stalled holder.")
    parser.add_argument("--url", help="lock database (default: SQLite in a temp dir)")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    args = parser.parse_args()
    store = FencedStore()
    held, b_done = threading.Event(), threading.Event()
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'locks.db'}"
        with (
            tierlock.LockManager(url, table=args.table) as manager_a,
            tierlock.LockManager(url, table=args.table) as manager_b,
        ):
            a = threading.Thread(target=holder_a, args=(manager_a, store, held, b_done))
            a.start()
            held.wait(WAIT_LIMIT)
            started = time.monotonic()
            with manager_b.lock(KEY, timeout=WAIT_LIMIT) as lock:  # waits out A's lease
                waited = time.monotonic() - started
                assert lock.token is not None
                print(
                    f"B waits {waited:.1f} s, until A's lease ends, and takes the lock over "
                    f"with token {lock.token}"
                )
                accepted = store.write("written by B", lock.token)
                print(f"B writes with token {lock.token}: {'accepted' if accepted else 'refused'}")
            b_done.set()
            a.join()
    print(f"the store keeps {store.value!r} (token {store.highest_token})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
