"""A holder never believes longer than its store promises: the heartbeat survives races
and errors, the lease clock reports a hold at the moment its lease runs out
unconfirmed, and threads passing a key in memory notice a row taken from them within
``passing.CONFIRMED_WITHIN``."""

from __future__ import annotations

import contextlib
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import procs
import pytest
from conftest import SERVERS, SQL_DATABASES, MakeManager
from polling import wait_until
from proxy import Proxy
from sqlalchemy import text
from sqlalchemy.engine import Engine

import tierlock
from tierlock.backends.sql.notify import channel_name
from tierlock.tier1.passing import CONFIRMED_WITHIN

# Whether a session of the server runs (or last ran) the given LISTEN.
LISTENING = text("SELECT count(*) FROM pg_stat_activity WHERE query = :query")

# How long the heartbeat races hand-offs between renewed and fixed leases.
RACE_TIME = 60.0
# The leases in that race: a long job's is lost within the race if the heartbeat dies,
# yet each leaves room after its due renewal (at a third) for a statement on a loaded
# machine, where a 1 s lease can truly run out between a beat and its commit.
RACE_TTL = 5.0
# What a thread may take, on a loaded machine, between a decision in tier 1 and the
# next line of its own code, or a statement's round trip: far below what the bounds
# under test replaced (a heartbeat's third of a 30 s lease).
SCHEDULING_SLACK = 1.0


def _threads(prefix: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


@SQL_DATABASES
@pytest.mark.slow
def test_the_heartbeat_survives_hand_offs_between_renewed_and_fixed_leases(
    make_manager: MakeManager, key: str
) -> None:
    """Two threads pass a key back and forth, one with a renewed lease and one with a
    fixed one, so that a hand-off's UPDATE keeps changing the hold's lease while
    renewals are in flight (a beat renews the passed key too while the renewed thread
    holds it); meanwhile a long job holds another key. The heartbeat lives on, and the
    job keeps its hold throughout."""
    manager, rival = make_manager(ttl=RACE_TTL), make_manager()
    job = manager.lock(f"{key}:job")
    assert job.acquire()
    stop = threading.Event()
    failures: list[BaseException] = []

    def pass_the_key(renew: bool) -> None:
        lock = manager.lock(f"{key}:passed", renew=renew)
        try:
            while not stop.is_set():
                with lock:
                    pass
        except BaseException as exc:
            failures.append(exc)

    passers = [threading.Thread(target=pass_the_key, args=(renew,)) for renew in (True, False)]
    for thread in passers:
        thread.start()
    try:
        until = time.monotonic() + RACE_TIME
        tries = 0
        while time.monotonic() < until and not failures:
            assert not rival.lock(f"{key}:job").acquire(blocking=False), "the job's hold was lost"
            tries += 1
            time.sleep(0.05)  # (a rival's try now and then; the race runs meanwhile)
    finally:
        stop.set()
        for thread in passers:
            thread.join(procs.WAIT_LIMIT)
    assert failures == []
    stats = manager.stats()
    assert stats.handoffs > 100, "the hand-offs never raced the heartbeat"
    # The job's, three a lease when on time (the passed key's mostly find it handed on
    # meanwhile, and count for nothing).
    assert stats.renewals >= RACE_TIME / RACE_TTL * 2
    assert (stats.heartbeat_errors, stats.lost_holds) == (0, 0)
    assert job.owned() and len(_threads("tierlock-heartbeat")) >= 1
    job.release()


def test_an_error_in_a_beat_is_counted_and_the_next_beat_runs(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, rival = make_manager(ttl=2.0), make_manager()
    backend = manager._backend
    renew = backend.renew
    failed = threading.Event()

    def failing_once(holds: Any) -> set[str]:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a bug in a beat")
        return renew(holds)

    monkeypatch.setattr(backend, "renew", failing_once)
    lock = manager.lock(key)
    assert lock.acquire()
    assert failed.wait(procs.WAIT_LIMIT)
    renewed = manager.stats().renewals
    wait_until(lambda: manager.stats().renewals > renewed + 2, "beats after the failed one")
    assert manager.stats().heartbeat_errors == 1
    assert lock.owned()
    assert not rival.lock(key).acquire(blocking=False)
    lock.release()
    assert manager.stats().lost_holds == 0


def test_a_fixed_lease_that_runs_out_is_reported_at_its_end(
    make_manager: MakeManager, key: str
) -> None:
    """Belief in a fixed lease ends with it: ``on_lost`` comes then, once, and the
    release raises ``LockLostError`` (and takes the row along if it is still there)."""
    calls: list[tuple[str, int, float]] = []
    told = threading.Event()

    def on_lost(lost_key: str, token: int) -> None:
        calls.append((lost_key, token, time.monotonic()))
        told.set()

    manager = make_manager()
    lock = manager.lock(key, ttl=0.5, renew=False, on_lost=on_lost)
    sent = time.monotonic()
    assert lock.acquire()
    taken = time.monotonic()
    assert told.wait(procs.WAIT_LIMIT)
    assert not lock.owned()
    (lost_key, token, at) = calls[0]
    assert (lost_key, token) == (key, lock.token)
    assert sent + 0.49 < at < taken + 0.5 + SCHEDULING_SLACK
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    assert len(calls) == 1
    assert manager.info(key) is None


@SERVERS
@pytest.mark.slow
@pytest.mark.parametrize("outage", ["refused", "stalled"])
def test_on_lost_comes_as_belief_ends_while_the_database_is_out_of_reach(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str, outage: str
) -> None:
    """With the database refusing connections (as when it was killed) or silent (as when
    it was stopped), the heartbeat's renewal waits for ``database_timeout``; the hold's
    belief still ends at its lease, and ``on_lost`` comes at that moment, not when the
    renewal gives up."""
    ttl = 1.0
    lost = threading.Event()
    told_at: list[float] = []

    def on_lost(lost_key: str, token: int) -> None:
        told_at.append(time.monotonic())
        lost.set()

    locks = proxied(ttl=ttl, database_timeout=20.0, on_lost=on_lost)
    lock = locks.lock(key)
    assert lock.acquire()
    cut = time.monotonic()
    if outage == "refused":
        proxy.refuse_all()
    else:
        proxy.stall()
    try:
        while lock.owned():  # (the moment owned() turns False is what is measured)
            time.sleep(0.005)
        not_owned_at = time.monotonic()
        assert lost.wait(procs.WAIT_LIMIT), "on_lost was never called"
    finally:
        proxy.resume()
        proxy.accept_new()
    assert not_owned_at < cut + ttl + SCHEDULING_SLACK
    assert told_at[0] - not_owned_at < ttl / 3  # within a beat, not database_timeout
    assert locks.stats().lost_holds == 1
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    taker = direct.lock(key)
    assert taker.acquire(timeout=procs.WAIT_LIMIT)
    taker.release()
    assert len(told_at) == 1


def _pass_in_memory(
    *,
    url: str,
    table: str,
    key: str,
    ready: Event,
    stop: Event,
    results: Connection[Any, Any],
) -> None:
    """Threads of this process pass ``key`` among themselves (a renewed 30 s lease, so
    that no heartbeat comes while the test runs) until ``stop``; send back each
    section's start and whether it believed it held the key, and when ``on_lost`` came."""
    sections: list[tuple[float, bool]] = []
    told: list[float] = []
    mutex = threading.Lock()

    def on_lost(lost_key: str, token: int) -> None:
        told.append(time.monotonic())

    with procs.open_manager(url, table) as manager:

        def work() -> None:
            lock = manager.lock(key, ttl=30.0, on_lost=on_lost)
            while not stop.is_set():
                if not lock.acquire(timeout=0.2):
                    continue
                began, owned = time.monotonic(), lock.owned()
                with mutex:
                    sections.append((began, owned))
                ready.set()
                with contextlib.suppress(tierlock.LockLostError):
                    lock.release()

        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    results.send({"sections": sections, "told": told})


@SQL_DATABASES
@pytest.mark.multiprocess
def test_force_release_ends_in_memory_hand_offs_within_the_bound(
    manager: tierlock.LockManager, db_url: str, table: str, key: str, children: procs.Children
) -> None:
    """Another process force-releases a key that the threads of a holder process pass
    among themselves with no statement, and takes it: no section of the old holder that
    believes it holds the key begins later than ``CONFIRMED_WITHIN`` after that, and
    the old holder's ``on_lost`` comes within the same bound."""
    ready, stop = procs.CTX.Event(), procs.CTX.Event()
    reader, writer = procs.CTX.Pipe(duplex=False)
    children.start(
        _pass_in_memory, url=db_url, table=table, key=key, ready=ready, stop=stop, results=writer
    )
    writer.close()
    assert ready.wait(procs.WAIT_LIMIT)
    lock = manager.lock(key)
    try:
        # (the holder's threads may be between a release and the next insert just then)
        wait_until(lambda: manager.force_release(key), "a row of the holder to delete")
        assert lock.acquire(timeout=procs.WAIT_LIMIT)
        taken = time.monotonic()
        time.sleep(3 * SCHEDULING_SLACK)  # (the old holder's threads go on meanwhile)
    finally:
        stop.set()
    assert reader.poll(procs.WAIT_LIMIT), "the holder process sent no report"
    report = reader.recv()
    children.join()
    believed = [began for began, owned in report["sections"] if owned]
    late = [began - taken for began in believed if began > taken + CONFIRMED_WITHIN]
    assert max(late, default=0.0) < SCHEDULING_SLACK, f"believed {late[-1]:.3f} s after"
    assert len(report["told"]) == 1
    assert report["told"][0] < taken + CONFIRMED_WITHIN + SCHEDULING_SLACK
    assert lock.owned() and manager.info(key) is not None
    lock.release()


@SQL_DATABASES
def test_a_reader_never_joins_a_read_hold_whose_lease_ran_out(
    make_manager: MakeManager, key: str
) -> None:
    manager = make_manager()
    first = manager.read_lock(key, ttl=0.3, renew=False)
    assert first.acquire()
    first_token = first.token
    wait_until(lambda: not first.owned(), "the read hold's lease to run out")
    second = manager.read_lock(key)
    joined: list[bool] = []
    thread = threading.Thread(target=lambda: joined.append(second.acquire(timeout=0.2)))
    thread.start()
    thread.join()
    assert joined == [False]  # (its process's read hold is out of lease, and still held)
    with pytest.raises(tierlock.LockLostError):
        first.release()
    assert second.acquire(timeout=procs.WAIT_LIMIT)
    assert second.owned() and second.token != first_token
    second.release()


def test_force_release_is_noticed_at_the_next_renewal(make_manager: MakeManager, key: str) -> None:
    ttl = 1.5
    told = threading.Event()
    manager, admin = make_manager(ttl=ttl, on_lost=lambda *_: told.set()), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    assert admin.force_release(key)
    released = time.monotonic()
    assert told.wait(procs.WAIT_LIMIT)
    assert time.monotonic() - released < ttl / 3 + SCHEDULING_SLACK
    assert not lock.owned()
    with pytest.raises(tierlock.LockLostError):
        lock.release()


@pytest.mark.parametrize(
    "db", [pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)
def test_force_release_reaches_a_postgresql_holder_at_once(
    make_manager: MakeManager, engine: Engine, table: str, key: str
) -> None:
    """PostgreSQL announces a forced release: the holder's process renews at once and
    learns that its row is gone, long before its next renewal (a third of 30 s)."""
    told = threading.Event()
    manager, admin = make_manager(ttl=30.0, on_lost=lambda *_: told.set()), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    listen = f"LISTEN {channel_name(table)}"
    with engine.connect() as connection:
        wait_until(
            lambda: connection.execute(LISTENING, {"query": listen}).scalar_one() > 0,
            "the holder's process to listen",
        )
    assert admin.force_release(key)
    released = time.monotonic()
    assert told.wait(procs.WAIT_LIMIT)
    assert time.monotonic() - released < SCHEDULING_SLACK
    assert not lock.owned()
    with pytest.raises(tierlock.LockLostError):
        lock.release()
