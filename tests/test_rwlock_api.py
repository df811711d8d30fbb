"""Read/write locks on every database: ``locks.read_lock(key)`` shares a key with other
readers and is excluded by ``locks.lock(key)`` (``write_lock``).

Semaphores' own rules are tested in ``test_semaphore_api``, and what every kind of
handle does alike in ``test_handle_api``; the helpers these share are in ``rwhelpers``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
from conftest import SHARED_HOLDS, MakeManager
from counting import DriverStatements
from polling import wait_until
from rwhelpers import (
    LONG,
    SPREAD,
    Handle,
    Holder,
    hold_fixture,  # noqa: F401 (the fixture hold)
    in_thread,
    rows,
    takes,
    times_out,
)
from sqlalchemy import Engine, text

import tierlock
from tierlock.backends.basics import fencing_token
from tierlock.backends.sql import SQLBackend, takeover

pytestmark = SHARED_HOLDS

# How soon a refused upgrade must fail: "at once", with room for a slow machine.
AT_ONCE = 1.0


# -- readers and writers -------------------------------------------------------------


def test_readers_share_across_threads_and_managers(make_manager: MakeManager, key: str) -> None:
    first, second, outsider = make_manager(), make_manager(), make_manager()
    readers = [first, first, second, second]
    holding = threading.Barrier(len(readers) + 1, timeout=LONG)
    done = threading.Barrier(len(readers) + 1, timeout=LONG)
    tokens: list[int | None] = []
    errors: list[BaseException] = []

    def read(manager: tierlock.LockManager) -> None:
        try:
            with manager.read_lock(key, timeout=LONG) as lock:
                assert lock.owned()
                tokens.append(lock.token)
                holding.wait()  # all readers pass only while all of them hold
                done.wait()
        except BaseException as exc:
            errors.append(exc)
            holding.abort()
            done.abort()

    threads = [threading.Thread(target=read, args=(manager,)) for manager in readers]
    for thread in threads:
        thread.start()
    try:
        holding.wait()
        assert not outsider.lock(key).acquire(blocking=False)
        infos = [info for info in outsider.holders() if info.key == key]
        # (readers of one manager may share one row where they overlap)
        assert 2 <= len(infos) <= 4
        assert {info.mode for info in infos} == {"shared"}
        assert {info.key for info in outsider.holders()} == {key}
        done.wait()
    except threading.BrokenBarrierError:
        pass  # a reader failed: its error is raised below
    except BaseException:
        done.abort()  # (lets the readers go: this thread failed)
        raise
    finally:
        for thread in threads:
            thread.join(LONG)
    if errors:
        raise errors[0]
    assert all(isinstance(token, int) for token in tokens)
    assert len(tokens) == 4
    assert outsider.holders() == []
    assert takes(outsider.lock(key), timeout=0)


@SPREAD
def test_nonblocking_readers_all_get_in(make_manager: MakeManager, key: str, spread: str) -> None:
    """With no writer, a reader never has to wait, so ``acquire(blocking=False)`` of
    readers starting together all succeed, also while others are still getting in."""
    count = 6
    one = make_manager()
    managers = [one] * count if spread == "one-manager" else [make_manager() for _ in range(count)]
    start = threading.Barrier(count, timeout=LONG)
    tried = threading.Barrier(count, timeout=LONG)

    def read(index: int) -> bool:
        reader = managers[index].read_lock(key)
        start.wait()
        got = reader.acquire(blocking=False)
        tried.wait()  # nobody lets go before everyone tried
        if got:
            reader.release()
        return got

    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda i=index: results.append(read(i)), daemon=True)
        for index in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LONG)
    assert results == [True] * count
    assert one.holders() == []


def test_a_writer_excludes_readers(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    with manager.write_lock(key):
        assert times_out(other.read_lock(key))
        assert not other.read_lock(key).acquire(blocking=False)
        assert in_thread(lambda: times_out(manager.read_lock(key)))  # (another thread)
        assert rows(other, key) == [(key, "exclusive")]
    reader = other.read_lock(key)
    assert reader.acquire(blocking=False)
    reader.release()
    assert other.holders() == []


def test_readers_exclude_a_writer(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    reader = manager.read_lock(key)
    assert reader.acquire()
    assert times_out(other.lock(key))
    assert not other.write_lock(key).acquire(blocking=False)
    assert in_thread(lambda: times_out(manager.lock(key)))  # (another thread)
    # Writers that gave up leave nothing behind to keep new readers out.
    assert takes(other.read_lock(key))
    assert in_thread(lambda: takes(manager.read_lock(key)))
    assert rows(other, key) == [(key, "shared")]
    reader.release()
    assert takes(other.lock(key))
    assert other.holders() == []


def test_upgrade_is_refused_at_once_and_changes_nothing(
    make_manager: MakeManager, key: str
) -> None:
    manager, other = make_manager(), make_manager()
    reader = manager.read_lock(key)
    assert reader.acquire()
    attempts: list[Callable[[], object]] = [
        lambda: manager.lock(key).acquire(blocking=False),
        lambda: manager.write_lock(key).acquire(timeout=LONG),
        lambda: manager.lock(key).acquire(),
    ]
    for attempt in attempts:
        started = time.monotonic()
        with pytest.raises(tierlock.LockError) as caught:
            attempt()
        assert time.monotonic() - started < AT_ONCE
        assert not isinstance(caught.value, (tierlock.LockTimeout, tierlock.NotHeldError))
        assert caught.value.key == key
    with pytest.raises(tierlock.LockError), manager.lock(key, timeout=LONG):
        pytest.fail("entered a write hold while holding a read hold")

    # Nothing is held wrongly: the read hold alone, once; no writer holds or waits.
    assert not manager.lock(key).owned()
    assert reader.owned()
    assert rows(other, key) == [(key, "shared")]
    assert not other.read_lock(key).locked()
    assert takes(other.read_lock(key))
    reader.release()
    assert not reader.owned()
    with pytest.raises(tierlock.NotHeldError):
        reader.release()
    assert other.holders() == []
    assert takes(other.lock(key), timeout=0)


def test_downgrade_then_release_the_write_hold_first(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    writer, reader = manager.lock(key), manager.read_lock(key)
    assert writer.acquire()
    write_token = writer.token
    assert write_token is not None
    assert reader.acquire(blocking=False)  # at once: this thread holds the write hold
    assert writer.owned() and reader.owned()
    assert in_thread(lambda: times_out(manager.read_lock(key)))  # still a write hold
    writer.release()
    assert not writer.owned()
    assert reader.owned()
    # The read hold still keeps writers out, and now lets readers in.
    assert rows(other, key) == [(key, "shared")]
    assert times_out(other.lock(key))
    assert in_thread(lambda: times_out(manager.lock(key)))
    assert takes(other.read_lock(key))
    reader.release()
    assert not reader.owned()
    late = other.lock(key)
    assert late.acquire(timeout=5)
    assert late.token is not None and late.token > write_token
    late.release()
    assert other.holders() == []


def test_downgrade_then_release_the_read_hold_first(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    writer, reader = manager.write_lock(key), manager.read_lock(key)
    assert writer.acquire()
    assert reader.acquire(blocking=False)
    reader.release()
    assert not reader.owned()
    assert writer.owned()
    # Still the write hold: readers and writers elsewhere wait.
    assert rows(other, key) == [(key, "exclusive")]
    assert times_out(other.read_lock(key))
    assert in_thread(lambda: times_out(manager.read_lock(key)))
    assert times_out(other.lock(key))
    writer.release()
    assert not writer.owned()
    with pytest.raises(tierlock.NotHeldError):
        reader.release()
    assert takes(other.read_lock(key))
    assert takes(other.lock(key))
    assert other.holders() == []


def test_read_holds_are_reentrant_per_thread(make_manager: MakeManager, key: str) -> None:
    manager, other = make_manager(), make_manager()
    reader = manager.read_lock(key)
    assert reader.acquire()
    assert reader.acquire(blocking=False)
    with manager.read_lock(key) as again:  # another handle: the same thread's hold
        assert again.owned()
    assert not in_thread(reader.owned)
    reader.release()
    assert reader.owned()
    assert not other.lock(key).acquire(blocking=False)
    reader.release()
    assert not reader.owned()
    with pytest.raises(tierlock.NotHeldError) as caught:
        reader.release()
    assert caught.value.key == key
    assert other.holders() == []
    assert takes(other.lock(key), timeout=0)


# -- tokens --------------------------------------------------------------------------


def test_a_write_hold_after_read_holds_has_a_higher_token(
    make_manager: MakeManager, key: str, hold: Callable[[Handle], Holder]
) -> None:
    first, second, writer = make_manager(), make_manager(), make_manager()
    # One round with the read holds released before the writer asks, one with the writer
    # waiting behind them.
    read_tokens: list[int] = []
    readers = [first.read_lock(key), second.read_lock(key)]
    for reader in readers:
        assert reader.acquire()
        assert reader.token is not None
        read_tokens.append(reader.token)
    for reader in readers:
        reader.release()
    lock = writer.lock(key)
    assert lock.acquire(timeout=5)
    assert lock.token is not None and lock.token > max(read_tokens)
    write_token = lock.token
    lock.release()

    holders = [hold(first.read_lock(key)).start(), hold(second.read_lock(key)).start()]
    tokens = [holder.token for holder in holders]
    assert all(isinstance(token, int) for token in tokens)
    read_tokens.extend(token for token in tokens if token is not None)
    waiting = hold(writer.lock(key)).start(wait=False)
    wait_until(lambda: first.read_lock(key).locked(), "the writer to wait")
    for holder in holders:
        holder.finish()
    waiting.wait_held()
    assert waiting.token is not None
    assert waiting.token > max(read_tokens)
    assert waiting.token > write_token
    waiting.finish()
    assert writer.holders() == []


@pytest.mark.parametrize(
    "db", [pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)
def test_a_reader_joins_only_after_a_writers_insert_that_drew_its_token(
    make_manager: MakeManager,
    key: str,
    table: str,
    engine: Engine,
    hold: Callable[[Handle], Holder],
) -> None:
    """PostgreSQL draws an insert's token before it checks the key, under the key's
    advisory lock. A reader joining a group between a writer's draw and its check, and
    the group ending, would let the writer in with a token below that reader's. Here a
    writer's insert is played in its steps, paused after the draw while a reader holds
    the key: another reader's join waits for it, and gets a token above the draw."""
    first, second = make_manager(), make_manager()
    reading = hold(first.read_lock(key)).start()
    with engine.connect() as writer, engine.connect() as watcher:
        writer.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:table), hashtext(:key))"),
            {"table": table, "key": key},
        )
        sequence = text("SELECT nextval(pg_get_serial_sequence(:table, 'token'))")
        drawn = writer.execute(sequence, {"table": table}).scalar_one()
        joining = hold(second.read_lock(key)).start(wait=False)
        stuck = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")

        def waits_or_joined() -> bool:
            return joining.held.is_set() or watcher.execute(stuck).scalar_one() > 0

        wait_until(waits_or_joined, "the second reader to join or wait")
        assert not joining.held.is_set(), "joined while the writer's insert was between steps"
        writer.commit()  # (its check found the group: the writer's insert does nothing)
    joining.wait_held()
    assert joining.token is not None and joining.token > fencing_token(drawn, 0)
    joining.finish()
    reading.finish()


# -- locked() ------------------------------------------------------------------------


def test_locked_says_whether_an_acquire_would_wait(
    make_manager: MakeManager, key: str, hold: Callable[[Handle], Holder]
) -> None:
    manager, other, third = make_manager(), make_manager(), make_manager()
    read, write = manager.read_lock(key), manager.lock(key)
    assert not read.locked() and not write.locked()

    # Another manager's reader: a reader would not wait, a writer would.
    other_reader = other.read_lock(key)
    assert other_reader.acquire()
    assert not read.locked()
    assert write.locked()

    # A writer waiting behind it: now readers arriving would wait too (no starvation).
    waiting = hold(third.lock(key)).start(wait=False)
    wait_until(read.locked, "the waiting writer to show")
    assert write.locked()
    assert times_out(manager.read_lock(key))
    assert not waiting.held.is_set()
    # ... but not the thread that holds a read hold: waiting would deadlock it.
    assert other_reader.acquire(timeout=5)
    other_reader.release()
    other_reader.release()

    waiting.wait_held()
    assert read.locked() and write.locked()
    assert other.read_lock(key).locked()
    waiting.finish()
    assert not read.locked() and not write.locked()

    # A write hold of this manager's other thread: both would wait.
    writer = hold(manager.lock(key)).start()
    assert read.locked() and write.locked()
    assert not read.owned() and not write.owned()
    writer.finish()
    assert not read.locked() and not write.locked()


# -- leases --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fixed_lease_read_hold_expires(make_manager: MakeManager, key: str) -> None:
    readers, writers = make_manager(), make_manager()
    reader = readers.read_lock(key, ttl=1, renew=False)
    assert reader.acquire()
    read_token = reader.token
    assert read_token is not None
    started = time.monotonic()
    writer = writers.lock(key)
    assert writer.acquire(timeout=15)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 8, f"took the key after {elapsed:.2f} s"
    assert writer.token is not None and writer.token > read_token
    assert rows(writers, key) == [(key, "exclusive")]
    with pytest.raises(tierlock.LockLostError):
        reader.release()
    assert not reader.owned()
    writer.release()
    assert writers.holders() == []


def test_a_reader_joins_an_open_group_in_as_few_statements_as_its_database_allows(
    make_manager: MakeManager, key: str, db: str, driver_statements: DriverStatements
) -> None:
    """A reader of another process joining an open group counts itself in with the
    group's UPDATE, which returns the group's token where UPDATE ... RETURNING exists
    (PostgreSQL, SQLite); MariaDB reads it with a SELECT after. On PostgreSQL the
    join, or the founding of the group, and the reader's row are one statement; on
    MariaDB the reader's row is a plain insert of values."""
    first, other = make_manager(), make_manager()
    for manager in (first, other):
        with manager.lock(f"{key}:warm"):  # (the manager's first statements are behind it)
            pass

    before = len(driver_statements.sent)
    with first.read_lock(key):
        founded = driver_statements.by_this_thread(before)
        before = len(driver_statements.sent)
        with other.read_lock(key):
            joined = driver_statements.by_this_thread(before)
    selects = [sent for sent in joined if sent.lstrip().upper().startswith("SELECT")]
    assert len(selects) == (1 if db == "mariadb" else 0), joined
    if db == "postgresql":
        assert len(founded) == len(joined) == 1, (founded, joined)
    if db == "mariadb":
        # The reader's row goes in with VALUES: InnoDB draws its token under a mutex, not
        # under the table's AUTO-INC lock that an INSERT ... SELECT holds to its end,
        # which deadlocked readers joining other keys (half of their retries).
        inserts = [sent for sent in joined if sent.upper().startswith("INSERT")]
        assert len(inserts) == 1 and " VALUES " in inserts[0].upper(), joined
        # Every insert-if-absent locks a duplicate exclusively (ON DUPLICATE KEY UPDATE,
        # not INSERT IGNORE, whose shared locks deadlocked inserts of a key whose row
        # was just deleted): the founder's, the reader's, and a writer's.
        founding = [sent for sent in founded if sent.upper().startswith("INSERT")]
        before = len(driver_statements.sent)
        with first.lock(f"{key}:written"):
            written = driver_statements.by_this_thread(before)
        for sent in [*founding, *inserts, *written[:1]]:
            assert "ON DUPLICATE KEY UPDATE" in sent.upper() and "IGNORE" not in sent, sent
    assert first.holders() == []


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_a_reader_refused_by_a_writer_on_postgresql_is_told_so_by_its_join(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    """The one-statement join answers "a writer holds the key or waits" with a row of
    its own, so a refused reader does not go on to the long way (a transaction of four
    statements more), only to the holder's row, for a takeover."""
    writers, readers = make_manager(), make_manager()
    with writers.lock(key):
        reader = readers.read_lock(key)
        before = len(driver_statements.sent)
        assert not reader.acquire(blocking=False)
        sent = driver_statements.by_this_thread(before)
    assert len(sent) == 2, sent
    assert "pg_advisory_xact_lock" in sent[0] and sent[1].lstrip().upper().startswith("SELECT")


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_a_reader_refused_for_a_waiting_writer_on_postgresql_sends_only_its_join(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    """When the join says that a writer waits (its mark on the group), there is no
    holder whose row a reader could take over, and the reader reads none."""
    readers, writers, late = make_manager(), make_manager(), make_manager()
    first = readers.read_lock(key)
    assert first.acquire()
    waiting = Holder(writers.lock(key)).start(wait=False)
    wait_until(lambda: late.read_lock(key).locked(), "the writer's mark")
    reader = late.read_lock(key)
    before = len(driver_statements.sent)
    assert not reader.acquire(blocking=False)
    sent = driver_statements.by_this_thread(before)
    assert len(sent) == 1 and "pg_advisory_xact_lock" in sent[0], sent
    first.release()
    waiting.wait_held()
    waiting.finish()


def test_a_reader_refused_lately_asks_again_in_one_statement(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader whose process found the key closed to readers a moment ago (a writer
    holds it) asks again in one statement: PostgreSQL's join says "closed" itself;
    elsewhere, where a refused join is a transaction of five, the reader looks first.
    Once the writer has gone, the look lets it join."""
    monkeypatch.setattr(takeover, "HOLDER_MEMORY", 60.0)  # ("a moment ago", however loaded)
    writers, readers = make_manager(), make_manager()
    reader = readers.read_lock(key)
    with writers.lock(key):
        assert not reader.acquire(blocking=False)
        before = len(driver_statements.sent)
        assert not reader.acquire(blocking=False)
        sent = driver_statements.by_this_thread(before)
    assert len(sent) == 1, sent
    assert reader.acquire(blocking=False), "the reader was kept out after the writer left"
    reader.release()


def test_a_writer_that_finds_live_readers_opens_no_transaction_for_them(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    """A writer's try looks through the readers' rows for dead ones to free; a live
    reader's row needs no transaction, which would be two statements for nothing."""
    readers, writers = make_manager(), make_manager()
    with readers.read_lock(key):
        writer = writers.lock(key)
        before = len(driver_statements.sent)
        assert not writer.acquire(blocking=False)
        sent = driver_statements.by_this_thread(before)
    assert not [statement for statement in sent if statement.upper().startswith("BEGIN")], sent


def test_a_reader_leaves_in_as_few_statements_as_its_database_allows(
    make_manager: MakeManager, key: str, db: str, driver_statements: DriverStatements
) -> None:
    """A reader leaving a group that others still read deletes its row and counts
    itself out in one statement on PostgreSQL (a transaction of two elsewhere), and,
    where the count-out says how many remain (PostgreSQL, SQLite), sends nothing to
    end the group; MariaDB, which cannot say, looks for an empty group after."""
    first, other = make_manager(), make_manager()
    with first.read_lock(key):
        other_read = other.read_lock(key)
        other_read.acquire()
        before = len(driver_statements.sent)
        other_read.release()
        left = driver_statements.by_this_thread(before)
        assert [(info.pid, info.mode) for info in other.holders()] == [(os.getpid(), "shared")]
    if db == "postgresql":
        assert len(left) == 1, left
    assert bool(ends_a_group(left)) == (db == "mariadb"), left
    assert first.holders() == []  # the last reader ended the group


def writer_that_marked(
    manager: tierlock.LockManager, key: str, driver_statements: DriverStatements
) -> tuple[threading.Thread, list[bool]]:
    """A thread named "writer" that waits up to 30 s for the write hold of ``key``
    (whether it got it goes in the list), and releases it; once its first try has
    marked the group: the insert, the holder's row, the mark, the readers' rows."""
    got: list[bool] = []

    def write() -> None:
        writer = manager.write_lock(key)
        got.append(writer.acquire(timeout=30))
        if got[-1]:
            writer.release()

    waiting = threading.Thread(target=write, name="writer")
    waiting.start()
    wait_until(lambda: driver_statements.count(thread="writer") >= 4, "the writer's try")
    return waiting, got


def ends_a_group(statements: list[str]) -> list[str]:
    """Those of ``statements`` that end an empty group: they look at its members
    without counting one out."""
    return [sent for sent in statements if "members <=" in sent and "members -" not in sent]


def test_the_last_reader_reserves_the_key_for_a_waiting_writer_as_it_leaves(
    make_manager: MakeManager, key: str, db: str, driver_statements: DriverStatements
) -> None:
    """Where the count-out says what it did (PostgreSQL, SQLite), the last reader's
    leave reserves the row for the writer that waits in the same statement (PostgreSQL:
    the one statement of the leave, which also announces it): no statement after it
    ends the group. MariaDB ends it after the leave. The writer then replaces the
    reserved row with its own (PostgreSQL: in one statement, no transaction)."""
    manager, other = make_manager(), make_manager()
    reader = other.read_lock(key)
    assert reader.acquire(timeout=5)
    waiting, got = writer_that_marked(manager, key, driver_statements)
    before = len(driver_statements.sent)
    reader.release()
    left = driver_statements.by_this_thread(before)
    waiting.join(30)
    assert got == [True]
    if db == "postgresql":
        assert len(left) == 1, left
    assert bool(ends_a_group(left)) == (db == "mariadb"), left
    took = [sent for name, sent in driver_statements.sent[before:] if name == "writer"]
    assert any("DELETE" in sent for sent in took), took  # (it replaced the reserved row)
    if db == "postgresql":
        assert not [sent for sent in took if sent.startswith("BEGIN")], took
    if db == "mariadb":
        # Its token drawn first, under a key of its own, and only then the reserved row
        # deleted and its row moved there: an insert that waited for InnoDB's AUTO-INC
        # lock while the transaction held the key's row could close a deadlock.
        last_begin = max(index for index, sent in enumerate(took) if sent == "BEGIN")
        replaced = [sent.split()[0].upper() for sent in took[last_begin + 1 :]]
        assert replaced[:4] == ["INSERT", "DELETE", "UPDATE", "COMMIT"], took


@pytest.mark.mariadb
@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
def test_a_join_on_mariadb_looks_its_key_up(make_manager: MakeManager, key: str) -> None:
    """MariaDB planned the join's UPDATE (``lock_key = ? AND expires_at > now``) as a
    range scan of the ``expires_at`` index, which locked every live key's entries and
    deadlocked with other keys' statements, and a statement of one row of a key
    (``lock_key = ? AND token = ?``) through the primary key, which locks the row before
    its ``lock_key`` entry, where the key's other statements lock the entry first (a
    deadlock of a group's count-out with a join): each must look the key up instead."""
    manager = make_manager()
    with manager.read_lock(key):
        pass
    backend = manager._backend
    assert isinstance(backend, SQLBackend)
    shared, plain = backend._shared_queries, backend.queries
    assert shared.join_this_group is not None
    this_row = {"key": key, "ttl": 30.0, "group": 1, "row": 1, "k0": key, "o0": "o"}
    connection = backend._engine.raw_connection()
    try:
        cursor = connection.cursor()
        for query in (
            shared.join_this_group,
            shared.count_out,
            shared.delete_empty_group,
            plain.delete_row,
            plain.delete_expired_row,
            plain.listed("renew_owned", 1)[0],
        ):
            cursor.execute("EXPLAIN " + query.sql, query.arguments(this_row))
            names = [column[0] for column in cursor.description]
            row = cursor.fetchone()
            assert row is not None
            plan = dict(zip(names, row, strict=True))
            assert plan["key"] == f"uq_{backend.table.name}_lock_key", (query.sql, plan)
    finally:
        connection.close()


def test_a_writer_takes_the_row_reserved_for_it_whatever_readers_of_its_process_saw(
    make_manager: MakeManager, key: str, engine: Engine, table: str
) -> None:
    """A group whose last reader leaves while a writer waits becomes a row reserved for
    writers. A reader of the writer's own process that meets that row remembers the key
    as closed to readers for a moment, and the writer must take the row at its next try
    all the same: it used to wait until that memory ended, which a polling reader kept
    renewing, so that reads of a key stalled for 0.2-0.7 s behind a single writer."""
    manager, other = make_manager(), make_manager()
    backend = manager._backend
    assert isinstance(backend, SQLBackend)
    takeover = backend.takeover

    def writer_tries() -> object:
        return backend.run("acquire", key, lambda link, _: takeover.free_held_row(link, key))

    def reader_tries() -> object:
        return backend.run(
            "acquire", key, lambda link, _: takeover.free_held_row(link, key, writer=False)
        )

    reader = other.read_lock(key)
    assert reader.acquire(timeout=5)
    assert writer_tries() is False  # the group's reader is alive: marked, for 1 s
    reader.release()  # the last reader, while the writer waits
    with engine.connect() as connection:
        modes = connection.execute(
            text(f"SELECT mode FROM {table} WHERE lock_key = :key"), {"key": key}
        ).all()
    assert modes == [("reserved",)]
    assert reader_tries() is False  # closed to readers
    reserved = writer_tries()
    assert type(reserved).__name__ == "Reserved", reserved


def test_a_writer_leaves_a_group_that_still_counts_readers_to_them(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements
) -> None:
    """A writer that finds readers in a group marks it and sends nothing to end it
    while it counts live readers: the last of them ends it, leaving the row to the
    writer, which then gets in."""
    manager, other = make_manager(), make_manager()
    reader = other.read_lock(key)
    assert reader.acquire(timeout=5)
    before = len(driver_statements.sent)
    assert not manager.write_lock(key).acquire(timeout=0.1)
    tried = driver_statements.by_this_thread(before)
    assert tried, "the writer asked"
    assert ends_a_group(tried) == [], tried
    waiting, got = writer_that_marked(manager, key, driver_statements)
    reader.release()
    waiting.join(30)
    assert got == [True]
    assert other.holders() == []
