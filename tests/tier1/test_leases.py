"""Leases that live with the process: the heartbeat renews every renewed hold with one
statement per table, a hold is lost only when its process stops or loses the database
for about its lease, and a lost hold is reported through ``on_lost`` and
``LockLostError``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import procs
import pytest
from conftest import SERVERS, MakeManager
from counting import HEARTBEAT, DriverStatements
from polling import wait_until
from proxy import Proxy

import tierlock
from tierlock.tier1 import cohorts


@pytest.mark.slow
def test_renewed_hold_outlives_five_times_its_ttl(make_manager: MakeManager, key: str) -> None:
    """While its process runs, a renewed hold keeps its row: the lease end moves on and
    nobody else can take the key, long after the ttl it was taken with."""
    ttl = 0.6
    manager, rival = make_manager(ttl=ttl), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    first = manager.info(key)
    assert first is not None and first.lease == ttl
    until = time.monotonic() + 5 * ttl
    while time.monotonic() < until:  # the time passing is what this test is about
        assert not rival.lock(key).acquire(blocking=False)
        time.sleep(ttl / 4)
    last = manager.info(key)
    assert last is not None and not last.expired
    assert last.token == first.token and last.expires_at > first.expires_at
    assert lock.owned()
    assert manager.stats().heartbeats >= 5  # (one every ttl/3 at least)
    lock.release()  # no LockLostError: the hold was never lost
    assert manager.stats().lost_holds == 0


def test_one_statement_renews_a_hundred_holds(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    manager = make_manager(ttl=30.0)  # (no beat is due while the holds are taken)
    locks = [manager.lock(f"{key}:{index}") for index in range(100)]
    for lock in locks:
        assert lock.acquire()
    assert manager.stats().heartbeats == 0
    locks[0].extend(1.5)  # a shorter lease: beats every 0.5 s from now, for all 100
    wait_until(lambda: manager.stats().renewals >= 200, "two heartbeats")
    manager.close()  # (which stops the heartbeat: no beat is under way while counting)
    stats = manager.stats()
    assert stats.heartbeats >= 2
    assert driver_statements.count(thread=HEARTBEAT) == stats.heartbeats  # one per beat
    assert stats.renewals == 100 * stats.heartbeats
    assert stats.lost_holds == 0


def test_local_hand_offs_send_no_statement(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewed hold passes between the threads of a process with no statement at all;
    each holder's fencing token is one above its predecessor's."""
    waiters = 6
    # No cohort ends here for its length in time: the waiters' wake-ups may be slow.
    monkeypatch.setattr(cohorts, "COHORT_TIME", procs.WAIT_LIMIT)
    manager = make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    tokens: list[int] = []
    errors: list[BaseException] = []

    def wait_in_line() -> None:
        try:
            assert lock.acquire(timeout=procs.WAIT_LIMIT)
            assert lock.token is not None
            tokens.append(lock.token)
            lock.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait_in_line) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    wait_until(lambda: manager.stats().local_waits == waiters, "the waiters to queue")
    first = lock.token
    assert first is not None
    before = driver_statements.count(but=HEARTBEAT)
    lock.release()
    for thread in threads:
        thread.join(procs.WAIT_LIMIT)
    assert errors == []
    assert tokens == [first + step for step in range(1, waiters + 1)]
    assert driver_statements.count(but=HEARTBEAT) == before + 1  # the last one's DELETE
    assert manager.stats().local_handoffs == waiters
    assert manager.info(key) is None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_stopped_holder_loses_the_hold_and_is_told(
    manager: tierlock.LockManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
) -> None:
    """A holder process stopped with SIGSTOP past its lease loses the hold: another
    process takes it with a higher token; once continued, the stopped process's
    ``on_lost`` fires and its release raises ``LockLostError``."""
    ttl = 1.0
    held, resumed = procs.CTX.Event(), procs.CTX.Event()
    reader, writer = procs.CTX.Pipe(duplex=False)
    child = children.start(
        procs.hold_through_a_stop,
        url=db_url,
        table=table,
        key=key,
        ttl=ttl,
        held=held,
        resumed=resumed,
        results=writer,
    )
    writer.close()
    assert held.wait(procs.WAIT_LIMIT)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGSTOP)
    try:
        lock = manager.lock(key)
        assert lock.acquire(timeout=procs.WAIT_LIMIT)  # once the stopped lease ended
    finally:
        os.kill(child.pid, signal.SIGCONT)
    resumed.set()
    assert reader.poll(procs.WAIT_LIMIT), "the stopped holder sent no report"
    report = reader.recv()
    children.join()
    assert lock.token is not None and lock.token > report["token"]
    assert report == {
        "token": report["token"],
        "told": True,
        "calls": [(key, report["token"])],
        "owned": False,
        "raised": "LockLostError",
    }
    info = manager.info(key)
    assert info is not None and info.token == lock.token  # untouched by the old holder
    lock.release()


@SERVERS
@pytest.mark.slow
def test_database_out_of_reach_past_the_lease_loses_the_hold(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, key: str
) -> None:
    lost = threading.Event()
    calls: list[tuple[str, int]] = []

    def on_lost(lost_key: str, token: int) -> None:
        calls.append((lost_key, token))
        lost.set()

    locks = proxied(ttl=1.0, database_timeout=0.5, on_lost=on_lost)
    lock = locks.lock(key)
    assert lock.acquire()
    assert lock.owned()
    token = lock.token
    proxy.refuse_all()
    assert lost.wait(procs.WAIT_LIMIT), "on_lost was never called"
    assert calls == [(key, token)]
    assert not lock.owned()
    taker = direct.lock(key)
    assert taker.acquire(timeout=procs.WAIT_LIMIT)  # the lease has ended in the database
    proxy.accept_new()
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    taker.release()
    assert calls == [(key, token)]  # once


@SERVERS
@pytest.mark.slow
def test_short_outage_within_the_lease_loses_nothing(
    proxied: MakeManager,
    direct: tierlock.LockManager,
    proxy: Proxy,
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[str, int]] = []
    locks = proxied(ttl=3.0, database_timeout=0.5, on_lost=lambda *call: calls.append(call))
    lock = locks.lock(key)
    assert lock.acquire()
    caplog.set_level(logging.WARNING, logger="tierlock.tier1.leases")
    proxy.refuse_all()
    wait_until(lambda: "renewing 1 lock(s) failed" in caplog.text, "a failed renewal")
    proxy.accept_new()
    renewed = locks.stats().renewals
    wait_until(lambda: locks.stats().renewals > renewed, "a renewal once the database is back")
    assert lock.owned()
    assert not direct.lock(key).acquire(blocking=False)
    lock.release()
    assert calls == [] and locks.stats().lost_holds == 0
    assert direct.info(key) is None
