"""Read/write locks: readers of a document share it, a writer has it alone.

A document store updates a document in two steps: the new text, then (after a pause,
as a slow disk would make) its version number. A reader in the middle of a write would
see a torn document: the text of one version under the number of another. Readers take
``locks.read_lock(key)``, which they share with each other, anywhere; the writer takes
``locks.lock(key)`` (``locks.write_lock(key)`` is the same), which waits for the readers
inside to leave and keeps new ones out until it is done.

Eight reader threads and one writer share one manager here, as the threads of one
process would; other processes on the same database would be excluded alike::

    python examples/read_write.py
    python examples/read_write.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import tierlock

KEY = "doc:readme"
READERS = 8
READS = 15  # per reader
WRITES = 5
READ_TIME = 0.005  # seconds a read takes inside the lock
WRITE_TIME = 0.02  # seconds between a write's two steps
WAIT_LIMIT = 30.0  # only a broken lock waits this long


class DocumentStore:
    """One document, written in two steps, and a count of who is inside it.

    The count is bookkeeping for this demonstration; the document itself has no guard
    but the lock.
    """

    def __init__(self) -> None:
        self.version = 0
        self.text = "text of version 0"
        self._count = threading.Lock()
        self.readers_inside = 0
        self.most_readers_inside = 0
        self.writes_beside_readers = 0

    def read(self) -> tuple[int, str]:
        with self._count:
            self.readers_inside += 1
            self.most_readers_inside = max(self.most_readers_inside, self.readers_inside)
        version = self.version
        time.sleep(READ_TIME)
        text = self.text
        with self._count:
            self.readers_inside -= 1
        return version, text

    def write(self) -> int:
        readers_seen = self.readers_inside
        version = self.version + 1
        self.text = f"text of version {version}"
        time.sleep(WRITE_TIME)
        self.version = version
        if readers_seen or self.readers_inside:
            self.writes_beside_readers += 1
        return version


def reader(locks: tierlock.LockManager, store: DocumentStore, torn: list[int]) -> None:
    for _ in range(READS):
        with locks.read_lock(KEY, timeout=WAIT_LIMIT):
            version, text = store.read()
        if text != f"text of version {version}":
            torn.append(version)


def writer(locks: tierlock.LockManager, store: DocumentStore) -> None:
    for _ in range(WRITES):
        time.sleep(WRITE_TIME)  # the writer is occasional
        with locks.lock(KEY, timeout=WAIT_LIMIT) as lock:
            version = store.write()
            print(f"wrote version {version} alone, fencing token {lock.token}")


def show_modes(locks: tierlock.LockManager) -> None:
    """What the lock table says while two threads read."""
    both_in, leave = threading.Barrier(3), threading.Event()

    def hold() -> None:
        with locks.read_lock(KEY, timeout=WAIT_LIMIT):
            both_in.wait(WAIT_LIMIT)
            leave.wait(WAIT_LIMIT)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    both_in.wait(WAIT_LIMIT)
    modes = sorted({info.mode for info in locks.holders() if info.key == KEY})
    print(f"two readers inside; the lock table shows {KEY!r} held in mode {', '.join(modes)}")
    writer_lock = locks.lock(KEY)
    got = writer_lock.acquire(blocking=False)
    print(f"a writer trying without waiting meanwhile gets it: {got}")
    if got:
        writer_lock.release()
    leave.set()
    for thread in threads:
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description="Many readers, one writer at a time.")
    parser.add_argument("--url", help="lock database (default: SQLite in a temp dir)")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    args = parser.parse_args()
    store = DocumentStore()
    torn: list[int] = []
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'locks.db'}"
        with tierlock.LockManager(url, table=args.table) as locks:
            show_modes(locks)
            threads = [
                threading.Thread(target=reader, args=(locks, store, torn)) for _ in range(READERS)
            ]
            threads.append(threading.Thread(target=writer, args=(locks, store)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    print(f"{READERS} readers made {READERS * READS} reads; torn reads: {len(torn)}")
    print(f"most readers inside at once: {store.most_readers_inside}")
    print(f"writes while a reader was inside: {store.writes_beside_readers}")
    print(f"final version {store.version}: {store.text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
