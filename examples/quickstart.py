"""tierlock in one page: a lock, its fencing token, threads taking turns, a decorator,
and what the lock table says about its holders.

Run it against any supported database (SQLite by default)::

    python examples/quickstart.py
    python examples/quickstart.py postgresql+psycopg://postgres@127.0.0.1:5432/test
    python examples/quickstart.py mysql+pymysql://root@127.0.0.1:3306/test
"""

from __future__ import annotations

import itertools
import sys
import threading
import time

import tierlock

THREADS = 4
INCREMENTS = 25  # per thread


def try_elsewhere(lock: tierlock.Lock) -> bool:
    """Whether another thread can take ``lock`` right now."""
    got: list[bool] = []

    def attempt() -> None:
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    thread = threading.Thread(target=attempt, name="other")
    thread.start()
    thread.join()
    return got[0]


def show_one_lock(locks: tierlock.LockManager) -> None:
    print("1. One lock")
    with locks.lock(("user", 42)) as lock:  # the key is "user:42"
        print(f"   holding {lock.key!r}, fencing token {lock.token}")
        info = locks.info(lock.key)
        assert info is not None
        lease = (info.expires_at - info.acquired_at).total_seconds()
        print(f"   held by {info.thread_name} (pid {info.pid} on {info.host}), lease {lease:.0f} s")
        print(f"   another thread trying it without waiting gets it: {try_elsewhere(lock)}")
    print(f"   released; locked now: {lock.locked()}")


def show_threads_taking_turns(locks: tierlock.LockManager) -> None:
    """Each increment reads, pauses and writes back: without a lock, threads overwrite
    each other's updates; holding the lock, none is lost."""
    print(f"\n2. {THREADS} threads each add 1 to a shared int {INCREMENTS} times")
    counter = 0
    tokens: list[int] = []

    def read_pause_write() -> None:
        nonlocal counter
        value = counter
        time.sleep(0.001)  # other threads read the same value meanwhile
        counter = value + 1

    def without_lock() -> None:
        for _ in range(INCREMENTS):
            read_pause_write()

    def with_lock() -> None:
        for _ in range(INCREMENTS):
            with locks.lock("counter") as lock:
                assert lock.token is not None
                tokens.append(lock.token)
                read_pause_write()

    for label, work in (("without a lock", without_lock), ("with the lock", with_lock)):
        counter = 0
        threads = [threading.Thread(target=work) for _ in range(THREADS)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        print(f"   {label + ':':<16} {counter:3d} of {THREADS * INCREMENTS} ({elapsed:.2f} s)")
    rising = all(a < b for a, b in itertools.pairwise(tokens))
    print(f"   fencing tokens {tokens[0]} .. {tokens[-1]}, rising with every hold: {rising}")


def show_synchronized(locks: tierlock.LockManager) -> None:
    print("\n3. A decorated function: one call at a time per user")
    balances = {42: 100, 7: 100}

    @locks.synchronized("user:{user_id}")
    def withdraw(user_id: int, amount: int) -> None:
        balance = balances[user_id]
        time.sleep(0.001)  # the read-modify-write the lock protects
        balances[user_id] = balance - amount

    threads = [
        threading.Thread(target=withdraw, args=(user_id, 10))
        for user_id in (42, 7)
        for _ in range(5)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for user_id, balance in balances.items():
        print(f"   user {user_id}: 100 - 5 x 10 = {balance}")


def show_holders(locks: tierlock.LockManager) -> None:
    print("\n4. Who holds what, from the lock table")
    with locks.lock("order:7"), locks.lock(("user", 42, "pay"), ttl=10):
        for info in locks.holders():
            lease = (info.expires_at - info.acquired_at).total_seconds()
            print(
                f"   {info.key:<12} token {info.token:<6} {info.thread_name} "
                f"(pid {info.pid}), lease {lease:.0f} s"
            )
    print(f"   after release: {len(locks.holders())} holders")


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else "sqlite:///tierlock.db"
    with tierlock.LockManager(url) as locks:
        print(f"tierlock {tierlock.__version__} on {url.partition('://')[0]}\n")
        show_one_lock(locks)
        show_threads_taking_turns(locks)
        show_synchronized(locks)
        show_holders(locks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
