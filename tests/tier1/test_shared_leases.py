"""Read holds and permits have leases exactly as exclusive holds do: renewed by the
heartbeat, reported lost through ``on_lost`` and ``LockLostError``, freed by the reaper
(each reader counted out of its group), and kept in tables of earlier versions."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from conftest import SHARED_HOLDS, MakeManager
from polling import wait_until
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

import tierlock
from tierlock.backends.sql.layout import lock_table

pytestmark = SHARED_HOLDS

# The columns that came with read holds and semaphores.
NEW_COLUMNS = ("mode", "members", "waiting", "permits", "parent")


def _rows(engine: Engine, table: str) -> list[tuple[str, str | None, int | None]]:
    """Every row of the table, group rows included: key, mode, members."""
    with engine.connect() as connection:
        result = connection.execute(text(f"SELECT lock_key, mode, members FROM {table}"))
        return [(row[0], row[1], row[2]) for row in result]


def _key_length(engine: Engine, table: str) -> int | None:
    columns = {column["name"]: column for column in inspect(engine).get_columns(table)}
    return getattr(columns["lock_key"]["type"], "length", None)


def _handle(
    manager: tierlock.LockManager, key: str, kind: str, **options: object
) -> tierlock.ReadLock | tierlock.Semaphore:
    if kind == "read":
        return manager.read_lock(key, **options)  # type: ignore[arg-type]
    return manager.semaphore(key, 1, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["read", "permit"])
def test_a_renewed_hold_outlives_its_ttl(make_manager: MakeManager, key: str, kind: str) -> None:
    # (A lease with room for a loaded machine's scheduling after each due renewal: a
    # shorter one may truly run out, and then its holder is told.)
    holder, other = make_manager(ttl=2.0), make_manager()
    handle = _handle(holder, key, kind)
    assert handle.acquire()
    blocked = other.lock(key) if kind == "read" else _handle(other, key, kind)
    time.sleep(5.0)  # the work: two and a half leases
    assert handle.owned()
    assert not blocked.acquire(timeout=0.3)
    handle.release()
    assert blocked.acquire(timeout=5)
    blocked.release()


@pytest.mark.parametrize("kind", ["read", "permit"])
def test_a_force_released_hold_is_reported_lost(
    make_manager: MakeManager, key: str, kind: str
) -> None:
    lost: queue.Queue[tuple[str, int]] = queue.Queue()
    holder, admin = make_manager(ttl=0.6), make_manager()
    handle = _handle(holder, key, kind, on_lost=lambda *told: lost.put(told))
    assert handle.acquire()
    token = handle.token
    assert admin.force_release(key) is True
    assert lost.get(timeout=5) == (key, token)  # the user's key, not a row's
    assert not handle.owned()
    with pytest.raises(tierlock.LockLostError):
        handle.release()
    assert admin.lock(key).acquire(timeout=2)
    admin.lock(key).release()


def test_the_reaper_counts_an_expired_reader_out_of_its_group(
    make_manager: MakeManager, engine: Engine, table: str, key: str
) -> None:
    """A reader whose fixed lease ended is deleted by the reaper and counted out, so the
    group goes with its last live reader and a writer gets the key at once."""
    stalled, live, admin = make_manager(renew=False, ttl=0.5), make_manager(), make_manager()
    stale = stalled.read_lock(key)
    assert stale.acquire()
    reader = live.read_lock(key)
    assert reader.acquire()
    group = [row for row in _rows(engine, table) if row[0] == key]
    assert group == [(key, "group", 2)]
    wait_until(lambda: not stale.owned(), "the stalled lease to end")
    wait_until(lambda: admin.reap() == 1, "the reaper to delete it")  # (by the database's clock)
    assert [row for row in _rows(engine, table) if row[0] == key] == [(key, "group", 1)]
    reader.release()
    assert _rows(engine, table) == []  # the group went with its last reader
    writer = admin.lock(key)
    assert writer.acquire(blocking=False)
    writer.release()
    with pytest.raises(tierlock.LockLostError):
        stale.release()


def test_a_waiting_writer_closes_the_key_to_new_readers(
    make_manager: MakeManager, key: str
) -> None:
    first, writing, late = make_manager(), make_manager(), make_manager()
    reader = first.read_lock(key)
    assert reader.acquire()
    got: queue.Queue[bool] = queue.Queue()
    writer = threading.Thread(target=lambda: got.put(writing.lock(key).acquire(timeout=10)))
    writer.start()
    wait_until(late.read_lock(key).locked, "the writer's mark")
    assert not late.read_lock(key).acquire(timeout=0.3)  # a reader after the writer waits
    reader.release()
    assert got.get(timeout=10) is True
    writer.join()


def test_a_table_of_an_earlier_version_takes_read_holds_and_permits(
    make_manager: MakeManager, engine: Engine, table: str
) -> None:
    """A table made before read holds existed (a 255-character key column, none of their
    columns) is brought up to date, and the longest keys work in every mode."""
    lock_table(table).create(engine)
    narrow = {
        "postgresql": 'ALTER TABLE {} ALTER COLUMN lock_key TYPE VARCHAR(255) COLLATE "C"',
        "mysql": "ALTER TABLE {} MODIFY lock_key VARCHAR(255) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL",
    }.get(engine.dialect.name)
    with engine.begin() as connection:
        for column in NEW_COLUMNS:
            connection.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        if narrow is not None:  # (SQLite enforces no VARCHAR length)
            connection.execute(text(narrow.format(table)))
    if narrow is not None:
        assert _key_length(engine, table) == 255
    locks = make_manager()
    columns = {column["name"] for column in inspect(engine).get_columns(table)}
    assert set(NEW_COLUMNS) <= columns
    assert _key_length(engine, table) == 300
    longest = "k" * tierlock.MAX_KEY_LENGTH
    with locks.read_lock(longest), locks.read_lock(longest) as reader:
        assert reader.owned()
    with locks.semaphore(longest, 3) as permit:
        assert permit.owned()
    with locks.lock(longest) as lock:
        assert lock.owned()
    assert locks.holders() == []
