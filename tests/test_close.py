"""``close()`` ends everything: waiting threads leave with ``LockError`` at once, a try
under way does not turn into a hold, every later call raises ``LockError``, and no
connection stays open."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from conftest import SERVERS, MakeManager
from polling import wait_until
from proxy import Proxy

import tierlock

# Generous bounds for what happens at once when close() works; before, waiting
# threads went on waiting for as long as the key stayed held.
PROMPTLY = 5.0


class Outcome:
    """Runs ``call`` in a thread and keeps what it returned or raised."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.value = call()
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(PROMPTLY)
        assert not self._thread.is_alive(), "still running"


def waiting(locks: tierlock.LockManager, key: str, count: int) -> Callable[[], bool]:
    """Whether ``count`` threads of ``locks`` queue in tier 1 behind its poller of ``key``."""

    def check() -> bool:
        entry = locks._tiers.registry._entries.get(key)
        return entry is not None and len(entry.waiters) == count

    return check


def test_close_sends_the_poller_and_the_queue_away(make_manager: MakeManager, key: str) -> None:
    locks, other = make_manager(), make_manager()
    assert other.lock(key).acquire()  # (held by this thread until the end)
    poller = Outcome(lambda: locks.lock(key).acquire())
    wait_until(lambda: locks.stats().insert_conflicts, "the poller to meet the holder")
    queued = Outcome(lambda: locks.lock(key).acquire())
    wait_until(waiting(locks, key, 1), "a second thread to queue")
    locks.close()
    for outcome in (poller, queued):
        outcome.join()
        assert isinstance(outcome.error, tierlock.LockError), outcome.error
    other.lock(key).release()
    assert other.holders() == []  # nothing was acquired after close


def test_every_call_after_close_raises_lock_error(make_manager: MakeManager, key: str) -> None:
    locks = make_manager()
    held, other = locks.lock(key), locks.lock(f"{key}:other")
    assert held.acquire()
    locks.close()
    calls: dict[str, Callable[[], object]] = {
        "acquire": other.acquire,
        "locked": other.locked,
        "info": lambda: locks.info(key),
        "holders": locks.holders,
        "force_release": lambda: locks.force_release(key),
        "reap": locks.reap,
        "start_reaper": lambda: locks.start_reaper(1),
        "lock": lambda: locks.lock(key),
    }
    for name, call in calls.items():
        with pytest.raises(tierlock.LockError, match="closed"):
            call()
        assert not locks.reaper_running, name
    with pytest.raises(tierlock.LockError, match="closed"):
        held.release()  # the row is left to its lease
    assert not held.owned()
    locks.close()  # again: nothing happens


@SERVERS
def test_no_connection_stays_open(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str, db: str
) -> None:
    """Pooled connections, the PostgreSQL listener, MariaDB doorbells (a poller's and a
    holder's) and their spares are all closed by the time close() returns."""
    locks = proxied()
    ringing = f"{key}:ringing"
    held = threading.Event()

    def hold_until_polled() -> None:
        with direct.lock(ringing):
            held.set()
            wait_until(lambda: locks.stats().insert_conflicts, "a poll")

    holder = Outcome(hold_until_polled)
    assert held.wait(PROMPTLY)
    assert locks.lock(ringing).acquire(timeout=PROMPTLY)  # won after polling: keeps a ring
    holder.join()
    assert direct.lock(key).acquire()
    poller = Outcome(lambda: locks.lock(key).acquire())
    wait_until(lambda: locks.stats().insert_conflicts >= 2, "the poller to meet the holder")
    assert proxy.open_connections > 0
    locks.close()
    poller.join()
    assert isinstance(poller.error, tierlock.LockError), poller.error
    # The proxy sees each close a moment after the client makes it.
    wait_until(lambda: proxy.open_connections == 0, "the connections to close", limit=2)
    direct.lock(key).release()


@SERVERS
def test_a_try_under_way_at_close_does_not_become_a_hold(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    """The poller's INSERT is on its way when close() begins and wins the free key:
    the row is deleted before close() returns, and the poller gets LockError."""
    locks = proxied()
    holder = direct.lock(key)
    assert holder.acquire()
    poller = Outcome(lambda: locks.lock(key).acquire())
    wait_until(lambda: locks.stats().insert_conflicts, "the poller to meet the holder")
    proxy.stall_at(b"INSERT")
    wait_until(lambda: proxy.held(b"INSERT"), "the poller's next insert")
    holder.release()
    closing = Outcome(locks.close)
    wait_until(lambda: locks._backend.closed, "close to begin")  # type: ignore[attr-defined]
    proxy.resume()
    closing.join()
    poller.join()
    assert isinstance(poller.error, tierlock.LockError), poller.error
    assert direct.info(key) is None


def test_close_while_the_listener_starts_joins_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() racing the first doorbell found a listening thread created but not yet
    started, and raised "cannot join thread before it is started"."""
    from tierlock.backends.sql.notify import Listener

    starting = threading.Event()
    start = threading.Thread.start

    def slow_start(thread: threading.Thread) -> None:
        if thread.name == "tierlock-listener":
            starting.set()
            time.sleep(0.2)  # holds the window open; close() comes in during it
        start(thread)

    def unreachable() -> object:
        raise OSError("no server in this test")

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    listener = Listener(unreachable, "tierlock_race")
    ringer = threading.Thread(target=listener.doorbell, args=("k",))
    ringer.start()
    assert starting.wait(PROMPTLY)
    listener.close()
    ringer.join()
    thread = listener._thread
    assert thread is not None and not thread.is_alive()
