"""The lock contract on every database, seen from threads of one process."""

from __future__ import annotations

import concurrent.futures
import gc
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from engines import keeps_expired
from polling import wait_until
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url

import tierlock
from tierlock.backends.basics import MAX_HANDOFFS
from tierlock.tier1.passing import CONFIRMED_WITHIN

MakeManager = Callable[..., tierlock.LockManager]

# What a try that does not wait takes at most, on a loaded machine: a bound that only a
# try that waited for a holder would pass.
NO_WAIT = 5.0


def test_acquire_release_roundtrip(manager: tierlock.LockManager, key: str) -> None:
    lock = manager.lock(key)
    assert not lock.locked()
    assert lock.acquire()
    assert lock.locked()
    assert lock.owned()
    assert isinstance(lock.token, int)
    lock.release()
    assert not lock.locked()
    assert not lock.owned()
    assert lock.token is None
    assert manager.info(key) is None


def test_tuple_key_is_joined(manager: tierlock.LockManager) -> None:
    with manager.lock(("user", 42, "pay")) as lock:
        assert lock.key == "user:42:pay"
        info = manager.info("user:42:pay")
        assert info is not None
        assert info.token == lock.token


def test_info_describes_the_holder(manager: tierlock.LockManager, key: str) -> None:
    import os
    import socket

    with manager.lock(key, ttl=20) as lock:
        info = manager.info(key)
        assert info is not None
        assert (info.key, info.token, info.pid) == (key, lock.token, os.getpid())
        assert info.host == socket.gethostname()
        assert info.thread_id == threading.get_ident()
        assert info.thread_name == threading.current_thread().name
        assert info.acquired_at.utcoffset() == timedelta(0)
        # (Redis sets the expiry by its clock at the SET, which may have turned a
        # millisecond past the TIME its script read for the record before.)
        lease = info.expires_at - info.acquired_at
        assert timedelta(seconds=20) <= lease <= timedelta(seconds=20, milliseconds=1)
        assert not info.expired
        assert [holder.key for holder in manager.holders()] == [key]


def test_reentrant_only_last_release_touches_the_database(
    make_manager: MakeManager, counting_engine: tuple[Engine, list[str]], key: str
) -> None:
    engine, checkouts = counting_engine
    manager = make_manager(engine=engine)
    lock = manager.lock(key)
    with lock:
        token = lock.token
        checkouts.clear()
        before = manager.stats()
        assert lock.acquire()
        with manager.lock(key) as again:  # another handle on the same key is the same lock
            assert again.token == token
        lock.release()
        assert checkouts == []
        after = manager.stats()
        assert after.statements == before.statements
        assert after.reentrant_acquisitions - before.reentrant_acquisitions == 2
        assert lock.owned()
    assert not lock.owned()
    assert manager.info(key) is None


def test_release_without_hold_raises_not_held(manager: tierlock.LockManager, key: str) -> None:
    lock = manager.lock(key)
    with pytest.raises(tierlock.NotHeldError) as caught:
        lock.release()
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.key == key
    with pytest.raises(tierlock.NotHeldError):
        lock.extend()


def test_other_thread_cannot_release_or_extend(manager: tierlock.LockManager, key: str) -> None:
    lock = manager.lock(key)
    errors: list[BaseException] = []

    def intruder() -> None:
        for action in (lock.release, lock.extend):
            try:
                action()
            except tierlock.NotHeldError as exc:
                errors.append(exc)

    with lock:
        thread = threading.Thread(target=intruder)
        thread.start()
        thread.join(10)
        assert len(errors) == 2
        assert lock.owned()
        assert lock.locked()


def test_nonblocking_and_timeout_against_another_manager(
    make_manager: MakeManager, key: str
) -> None:
    holder, waiter = make_manager(), make_manager()
    with holder.lock(key):
        lock = waiter.lock(key)
        started = time.monotonic()
        assert lock.acquire(blocking=False) is False
        assert lock.acquire(timeout=0) is False
        # Neither waited for the holder, which holds until the block ends: a try that
        # waited would not return at all. (Two tries took 0.38 s on a loaded machine.)
        assert time.monotonic() - started < NO_WAIT
        started = time.monotonic()
        assert lock.acquire(timeout=0.3) is False
        assert 0.3 <= time.monotonic() - started < 3
        assert not lock.owned()
    assert lock.acquire(blocking=False)
    lock.release()


def test_with_timeout_raises_lock_timeout(make_manager: MakeManager, key: str) -> None:
    holder, waiter = make_manager(), make_manager()
    with holder.lock(key):
        with pytest.raises(tierlock.LockTimeout) as caught, waiter.lock(key, timeout=0.2):
            pytest.fail("entered a lock held by another manager")
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.key == key
        assert caught.value.timeout == 0.2


def test_local_waiter_does_not_touch_the_database(
    make_manager: MakeManager, counting_engine: tuple[Engine, list[str]], key: str
) -> None:
    engine, checkouts = counting_engine
    manager = make_manager(engine=engine)
    results: list[bool] = []
    with manager.lock(key):
        checkouts.clear()
        before = manager.stats()
        thread = threading.Thread(
            target=lambda: results.extend(
                [manager.lock(key).acquire(blocking=False), manager.lock(key).acquire(timeout=0.2)]
            )
        )
        thread.start()
        thread.join(10)
        assert results == [False, False]
        assert checkouts == []
        assert manager.stats().statements == before.statements


@pytest.mark.parametrize("renew", [True, False], ids=["renewed", "fixed"])
def test_hot_key_passes_between_threads_within_the_cohort_bound(
    make_manager: MakeManager, counting_engine: tuple[Engine, list[str]], key: str, renew: bool
) -> None:
    """8 threads on one key: a hold passes from thread to thread at most COHORT_LIMIT
    times in a row unless the backend can tell that no other process waits, each time
    with a higher fencing token; with renewed leases a pass sends no statement (but
    one UPDATE once the row was last proved ours over CONFIRMED_WITHIN ago), with
    fixed ones one UPDATE; otherwise a section costs
    the insert and the delete."""
    engine, checkouts = counting_engine
    manager = make_manager(engine=engine, renew=renew)  # (ttl 30: no renewal meanwhile)
    threads_count, rounds = 8, 15
    counter = [0]
    tokens: list[int] = []
    start = threading.Barrier(threads_count)

    def work() -> None:
        start.wait()
        for _ in range(rounds):
            with manager.lock(key) as lock:
                value = counter[0]
                assert lock.token is not None
                tokens.append(lock.token)
                time.sleep(0.0005)
                counter[0] = value + 1

    checkouts.clear()
    threads = [threading.Thread(target=work) for _ in range(threads_count)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - began
    sections = threads_count * rounds
    assert counter[0] == sections
    assert tokens == sorted(set(tokens))  # strictly increasing, hand-offs included
    # Where the database can tell that nobody waits elsewhere (SQLite's FIFOs, MariaDB's
    # named locks, PostgreSQL's listener once it has listened long enough), a cohort that
    # reaches its bound begins again instead of ending; never past MAX_HANDOFFS.
    assert max(token & 0xFFFF for token in tokens) <= MAX_HANDOFFS
    stats = manager.stats()
    assert stats.releases == stats.inserts + stats.handoffs + stats.local_handoffs == sections
    assert stats.heartbeats == 0
    if renew:
        # Passes send none, but for one UPDATE once the row was last proved ours over
        # CONFIRMED_WITHIN ago.
        assert stats.local_handoffs > 0
        assert stats.handoffs <= elapsed / CONFIRMED_WITHIN + 1
    else:
        assert stats.handoffs > 0 and stats.local_handoffs == 0
    assert stats.statements == 2 * stats.inserts + stats.handoffs  # and an update each
    # One pooled connection per statement, counted apart; on MariaDB one more, taken out
    # of the pool once for the doorbell's named-lock queries at the ends of cohorts; on
    # PostgreSQL one more for renewed holds, the connection that listens for a forced
    # release.
    listening = renew and engine.dialect.name == "postgresql"
    if listening:  # (it connects in a thread of its own, as soon as a hold is renewed)
        wait_until(lambda: "tierlock-listener" in checkouts, "the listener to connect")
    extra = (1 if stats.doorbell_queries else 0) + (1 if listening else 0)
    assert len(checkouts) == stats.statements + extra
    assert stats.local_waits > 0


def test_threads_of_two_managers_exclude_each_other(make_manager: MakeManager, key: str) -> None:
    managers = [make_manager(), make_manager()]
    counter = [0]
    inside = [0]
    overlaps: list[int] = []
    rounds = 10
    start = threading.Barrier(6)

    def work(manager: tierlock.LockManager) -> None:
        start.wait()
        for _ in range(rounds):
            with manager.lock(key):
                inside[0] += 1
                if inside[0] != 1:
                    overlaps.append(inside[0])
                value = counter[0]
                time.sleep(0.001)
                counter[0] = value + 1
                inside[0] -= 1

    threads = [threading.Thread(target=work, args=(managers[i % 2],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert overlaps == []
    assert counter[0] == 6 * rounds


def test_lease_expiry_lets_a_waiter_take_over(make_manager: MakeManager, key: str) -> None:
    first, second = make_manager(), make_manager()
    old = first.lock(key, ttl=0.5, renew=False)
    assert old.acquire()
    old_token = old.token
    assert old_token is not None
    new = second.lock(key)
    assert new.acquire(timeout=10)
    new_token = new.token
    assert new_token is not None and new_token > old_token
    with pytest.raises(tierlock.LockLostError) as lost:
        old.extend()
    assert lost.value.token == old_token
    with pytest.raises(tierlock.LockLostError):
        old.release()
    assert not old.owned()
    info = second.info(key)
    assert info is not None and info.token == new_token and not info.expired
    new.release()
    assert second.info(key) is None


def test_expired_row_is_not_locked_until_reaped(
    make_manager: MakeManager, key: str, db: str
) -> None:
    manager = make_manager()
    other = make_manager()
    lock = manager.lock(key, ttl=0.3, renew=False)
    assert lock.acquire()
    if not keeps_expired(db):  # the hold is gone with its lease: nothing is left to reap
        wait_until(lambda: other.info(key) is None, "the lease to end")
        assert not other.lock(key).locked()
        assert (other.holders(), other.reap()) == ([], 0)
        with pytest.raises(tierlock.LockLostError):
            lock.release()
        return
    info = wait_until(lambda: _expired_info(other, key), "the lease to end")
    assert isinstance(info, tierlock.LockInfo)
    assert not other.lock(key).locked()
    assert info.expires_at - info.acquired_at == timedelta(seconds=0.3)
    assert [holder.key for holder in other.holders()] == [key]
    assert other.reap() == 1
    assert other.info(key) is None
    assert other.reap() == 0
    with pytest.raises(tierlock.LockLostError):
        lock.release()


def test_extend_pushes_the_lease_by_the_database_clock(
    manager: tierlock.LockManager, key: str
) -> None:
    with manager.lock(key, ttl=1) as lock:
        before = manager.info(key)
        lock.extend(60)
        after = manager.info(key)
        assert before is not None and after is not None
        assert after.expires_at - before.expires_at > timedelta(seconds=58)
        lock.extend()  # the handle's ttl
        again = manager.info(key)
        assert again is not None
        assert again.expires_at < after.expires_at


def test_force_release_makes_the_holder_lose(make_manager: MakeManager, key: str) -> None:
    manager, admin = make_manager(), make_manager()
    lock = manager.lock(key)
    assert lock.acquire()
    assert admin.force_release(key) is True
    assert not lock.locked()
    assert admin.force_release(key) is False
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    assert lock.acquire(blocking=False)  # released locally despite the error
    lock.release()


def test_fencing_tokens_increase_across_holds(make_manager: MakeManager, key: str) -> None:
    managers = [make_manager(), make_manager()]
    tokens: list[int] = []
    for round_ in range(6):
        with managers[round_ % 2].lock(key) as lock:
            assert lock.token is not None
            tokens.append(lock.token)
    assert tokens == sorted(set(tokens))


def test_skewed_client_clock_changes_nothing(
    make_manager: MakeManager, engine: Engine, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases are computed and compared by the database: move the client an hour."""
    holder, waiter = make_manager(), make_manager()
    real_time, real_time_ns = time.time, time.time_ns
    for skew in (3600.0, -3600.0):
        monkeypatch.setattr(time, "time", lambda skew=skew: real_time() + skew)
        monkeypatch.setattr(time, "time_ns", lambda skew=skew: real_time_ns() + int(skew * 1e9))
        lock = holder.lock(key, ttl=0.6, renew=False)
        assert lock.acquire()
        info = holder.info(key)
        assert info is not None
        assert info.expires_at - info.acquired_at == timedelta(seconds=0.6)
        assert abs((info.acquired_at - _database_now(engine)).total_seconds()) < 5
        assert lock.locked()
        assert not waiter.lock(key).acquire(blocking=False)
        assert waiter.lock(key).acquire(timeout=10)  # after the lease, by the DB's clock
        with pytest.raises(tierlock.LockLostError):
            lock.release()
        waiter.lock(key).release()
        monkeypatch.undo()


@pytest.mark.sql_only("counts a SQLAlchemy pool's connections")
def test_waiting_does_not_pin_a_connection(
    make_manager: MakeManager, db_url: str, key: str
) -> None:
    """With a pool of one connection, a thread waiting for a lock held elsewhere
    leaves that connection free for other work."""
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=2)
    tried = threading.Event()

    @event.listens_for(engine, "checkout")
    def seen(*args: object) -> None:
        if threading.current_thread().name == "waiter":
            tried.set()

    try:
        small = make_manager(engine=engine)
        holder = make_manager()
        result: list[bool] = []

        def wait_then_release() -> None:
            lock = small.lock(key)
            result.append(lock.acquire(timeout=4))
            lock.release()

        with holder.lock(key):
            waiter = threading.Thread(target=wait_then_release, name="waiter")
            waiter.start()
            assert tried.wait(10)
            for round_ in range(20):
                with small.lock(f"{key}:other:{round_}"):
                    pass
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
            assert waiter.is_alive()  # still waiting while all that ran
        waiter.join(20)
        assert result == [True]
    finally:
        engine.dispose()


def test_reaper_job_deletes_expired_rows(make_manager: MakeManager, key: str) -> None:
    manager = make_manager()
    lock = manager.lock(key, ttl=0.2, renew=False)
    assert lock.acquire()
    assert not manager.reaper_running
    manager.start_reaper(0.1)
    assert manager.reaper_running
    wait_until(lambda: manager.info(key) is None, "the reaper to delete the row")
    manager.stop_reaper()
    assert not manager.reaper_running
    with pytest.raises(tierlock.LockLostError):
        lock.release()


def test_reaper_runs_by_default(db_url: str, table: str) -> None:
    with tierlock.LockManager(db_url, table=table) as manager:
        assert manager.reaper_running
    assert not manager.reaper_running
    with tierlock.LockManager(db_url, table=table, reaper_interval=None) as manager:
        assert not manager.reaper_running


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_manager_opened_while_another_connection_writes_waits_for_it(
    db_url: str, table: str
) -> None:
    """SQLite has one writer. A manager whose table is created while another connection
    writes for longer than one statement waits for the file tries again, as operations
    do, until ``database_timeout``: the managers of several processes open at once."""
    path = make_url(db_url).database
    assert path is not None
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode = WAL")
    creates: list[str] = []

    def seen(connection: object, cursor: object, statement: str, *rest: object) -> None:
        if statement.lstrip().startswith("CREATE TABLE") and table in statement:
            creates.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            writer.execute("BEGIN IMMEDIATE")
            opening = pool.submit(tierlock.LockManager, db_url, table=table, reaper_interval=None)
            wait_until(lambda: len(creates) >= 2 or opening.done(), "a second try")
            assert not opening.done(), f"gave up at once: {opening.exception()!r}"
            writer.execute("COMMIT")
            with opening.result(timeout=60) as manager, manager.lock("key") as lock:
                assert lock.token is not None
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
        writer.close()


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_statement_refused_for_contention_is_sent_again_and_counted(
    make_manager: MakeManager, key: str, tmp_path: Path
) -> None:
    """A release that meets another connection's write (SQLite's busy file; on a server,
    a deadlock the database broke) is sent again until it goes through, and
    ``stats().contention_retries`` counts each time."""
    path = tmp_path / "locks.sqlite3"
    manager = make_manager(f"sqlite:///{path}")
    holding, release = threading.Event(), threading.Event()
    released: list[bool] = []

    def hold() -> None:
        with manager.lock(key):
            holding.set()
            release.wait(60)
        released.append(True)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    before = manager.stats().contention_retries
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the file's one write lock, held
        release.set()
        wait_until(lambda: manager.stats().contention_retries > before, "a retry")
        assert not released
        writer.execute("COMMIT")
    finally:
        writer.close()
        release.set()
        holder.join(60)
    assert released == [True]
    assert not manager.lock(key).locked()


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_try_refused_for_contention_is_counted(
    make_manager: MakeManager, key: str, tmp_path: Path
) -> None:
    """A try to acquire that meets another connection's write (SQLite's busy file; on a
    server, a deadlock the database broke) is a miss, tried again at the next try, and
    ``stats().contention_retries`` counts it as it counts a statement sent again."""
    path = tmp_path / "locks.sqlite3"
    manager = make_manager(f"sqlite:///{path}")
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the file's one write lock, held throughout
        before = manager.stats().contention_retries
        assert not manager.lock(key).acquire(timeout=0.5)
        assert manager.stats().contention_retries > before
    finally:
        writer.close()
    assert manager.lock(key).acquire(timeout=10)


def test_synchronized_formats_the_key_from_arguments(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    seen: list[tuple[str, bool]] = []

    @manager.synchronized(key + ":{user_id}:{kind}", ttl=5)
    def transfer(user_id: int, amount: int, kind: str = "pay") -> int:
        lock = manager.lock(f"{key}:{user_id}:{kind}")
        seen.append((lock.key, lock.owned()))
        return amount * 2

    assert transfer(42, 10) == 20
    assert transfer(amount=1, user_id=7, kind="refund") == 2
    assert seen == [(f"{key}:42:pay", True), (f"{key}:7:refund", True)]
    assert transfer.__name__ == "transfer"

    @manager.synchronized(key + ":{user_id}", timeout=0.2)
    def guarded(user_id: int) -> None:
        pytest.fail("ran while another manager held the key")

    with other.lock(f"{key}:5"), pytest.raises(tierlock.LockTimeout):
        guarded(5)


def test_synchronized_rejects_unknown_fields(manager: tierlock.LockManager) -> None:
    with pytest.raises(ValueError, match="user"):

        @manager.synchronized("user:{user}")
        def transfer(user_id: int) -> None: ...


def test_handles_are_cheap_weakrefable_and_readable(
    manager: tierlock.LockManager, key: str
) -> None:
    lock = manager.lock(key)
    assert repr(lock).startswith(f"<unlocked tierlock.Lock object key={key!r} at 0x")
    with lock:
        assert repr(lock).startswith(f"<locked tierlock.Lock object key={key!r} at 0x")
        reference = weakref.ref(manager.lock(key))
        gc.collect()
        assert reference() is None  # the manager keeps no handle alive
        assert lock.owned()


def test_body_exception_wins_over_a_lost_release(
    make_manager: MakeManager, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager, admin = make_manager(), make_manager()
    with pytest.raises(KeyError), manager.lock(key):
        admin.force_release(key)
        raise KeyError("body")
    assert "releasing" in caplog.text
    assert not manager.lock(key).owned()


def test_closed_manager_refuses_to_acquire(make_manager: MakeManager, key: str) -> None:
    manager = make_manager()
    manager.close()
    with pytest.raises(tierlock.LockError, match="closed"):
        manager.lock(key).acquire()


# -- helpers -----------------------------------------------------------------------


@pytest.fixture
def counting_engine(db_url: str) -> Iterator[tuple[Engine, list[str]]]:
    """An engine that records the name of the thread behind each connection checkout:
    tierlock takes a pooled connection for each operation and nothing else."""
    engine = create_engine(db_url)
    checkouts: list[str] = []

    @event.listens_for(engine, "checkout")
    def record(*args: object) -> None:
        checkouts.append(threading.current_thread().name)

    yield engine, checkouts
    engine.dispose()


def _database_now(engine: Engine) -> datetime:
    query = {
        "sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
        "postgresql": "SELECT statement_timestamp()",
    }.get(engine.dialect.name, "SELECT UTC_TIMESTAMP(6)")
    with engine.connect() as connection:
        value = connection.execute(text(query)).scalar_one()
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _expired_info(manager: tierlock.LockManager, key: str) -> tierlock.LockInfo | None:
    info = manager.info(key)
    return info if info is not None and info.expired else None


def test_manager_names_its_database_and_table(
    make_manager: Callable[..., tierlock.LockManager], db_url: str, table: str
) -> None:
    """``url`` and ``table`` for scripts and logs."""
    manager = make_manager()
    assert (manager.table, manager.url) == (table, db_url)
    assert repr(manager) == f"<tierlock.LockManager url={db_url!r} table={table!r}>"


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # (it lets any password in)
def test_manager_url_hides_the_password(
    make_manager: Callable[..., tierlock.LockManager], db_url: str
) -> None:
    secret = "s3cret-pw"
    manager = make_manager(url=db_url.replace("//root@", f"//root:{secret}@"))
    assert manager.url == db_url.replace("//root@", "//root:***@")
    assert secret not in repr(manager)
