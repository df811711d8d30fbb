"""MariaDB: a reader's join does not wait for InnoDB's AUTO-INC lock while it holds a
row lock.

An ``INSERT ... SELECT`` holds the table's AUTO-INC lock to its end, also while it waits
for a row; any insert of the table then waits for it. A transaction that locked a row
and then inserts therefore closes a cycle with such an insert that waits for something
that row's lock holds up, and InnoDB breaks it by rolling one back (a deadlock, which
tierlock retries). The test builds the other side of that cycle by hand, lets a join
reach its insert, and then locks the group's row, which the join would hold if it
counted itself in before it drew its token: with the draw first, nothing waits there.
(A writer taking a reservation draws first too: ``test_rwlock_api`` checks the order of
its statements.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import MakeManager
from polling import wait_until
from sqlalchemy import Engine

import tierlock

pytestmark = [pytest.mark.mariadb, pytest.mark.parametrize("db", ["mariadb"], indirect=True)]

WAITING = (
    "SELECT trx_mysql_thread_id, trx_query FROM information_schema.innodb_trx"
    " WHERE trx_state = 'LOCK WAIT'"
)
# InnoDB refreshes what information_schema.innodb_trx shows only when it was last read
# over 0.1 s ago: a faster poll would read the same old rows for ever.
TRX_POLL = 0.2


def driver(engine: Engine, *, autocommit: bool) -> Any:
    """A session of its own (the pool's proxy, which must be kept while in use)."""
    connection = engine.raw_connection()
    assert connection.dbapi_connection is not None
    connection.dbapi_connection.autocommit(autocommit)
    return connection


def run(connection: Any, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return list(cursor.fetchall())


def waiting_inserts(monitor: Any, besides: int) -> list[tuple[Any, ...]]:
    """The inserts of other sessions than ``besides`` that wait for a lock."""
    return [
        row
        for row in run(monitor, WAITING)
        if row[0] != besides and (row[1] or "").upper().startswith("INSERT")
    ]


@contextlib.contextmanager
def auto_inc_held(
    engine: Engine, table: str, manager: tierlock.LockManager
) -> Iterator[tuple[Any, Any, int]]:
    """Inside, an ``INSERT ... SELECT`` of a key held by ``manager`` waits for that key's
    row, locked by another session, holding the table's AUTO-INC lock; gives the session
    that holds the row (whose commit ends it), a monitor session, and the inserting
    session's id. The inserting transaction inserted rows before, so that InnoDB, which
    rolls back the lighter side of a deadlock, never picks it."""
    held = manager.lock("auto-inc:held")
    assert held.acquire()
    inserter = driver(engine, autocommit=False)
    inserter_id = run(inserter, "SELECT CONNECTION_ID()")[0][0]
    columns = "lock_key, owner_id, host, pid, thread_id, thread_name, acquired_at, expires_at"
    ballast = ", ".join(
        f"('auto-inc:ballast:{index}', 'x', 'h', 1, 1, 't', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        for index in range(50)
    )
    run(inserter, f"INSERT INTO {table} ({columns}) VALUES {ballast}")
    row_holder = driver(engine, autocommit=False)
    run(row_holder, f"SELECT token FROM {table} WHERE lock_key = %s FOR UPDATE", "auto-inc:held")
    insert = (
        f"INSERT IGNORE INTO {table} ({columns}) SELECT %s, 'x', 'h', 1, 1, 't',"
        " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)"
    )
    inserting = threading.Thread(target=run, args=(inserter, insert, "auto-inc:held"))
    inserting.start()
    monitor = driver(engine, autocommit=True)
    wait_until(
        lambda: any(row[0] == inserter_id for row in run(monitor, WAITING)),
        "the INSERT ... SELECT to wait for the held row",
        pause=TRX_POLL,
    )
    try:
        yield row_holder, monitor, inserter_id
    finally:
        row_holder.rollback()
        inserting.join(timeout=30)
        inserter.rollback()
        held.release()
        for connection in (row_holder, inserter, monitor):
            connection.close()


def warm_up(*managers: tierlock.LockManager) -> None:
    """Put each manager's first statements (its look at the table) behind it."""
    for manager in managers:
        with manager.lock("warm-up"):
            pass


def lock_once_an_insert_waits(held: tuple[Any, Any, int], table: str, key: str) -> None:
    """Once an insert of tierlock's waits behind ``auto_inc_held``'s, lock ``key``'s row
    in the transaction of the session that holds the other row; a deadlock raises."""
    row_holder, monitor, inserter_id = held
    wait_until(lambda: waiting_inserts(monitor, inserter_id), "the insert to wait", pause=TRX_POLL)
    run(row_holder, "SET SESSION innodb_lock_wait_timeout = 30")
    run(row_holder, f"SELECT token FROM {table} WHERE lock_key = %s FOR UPDATE", key)


def test_a_reader_draws_its_token_before_it_locks_the_group(
    make_manager: MakeManager, table: str, key: str, engine: Engine
) -> None:
    founder, joiner = make_manager(), make_manager()
    warm_up(founder, joiner)
    read = founder.read_lock(key)
    assert read.acquire()
    joined = threading.Event()
    reading = joiner.read_lock(key)

    def join() -> None:
        if reading.acquire(timeout=60):
            joined.set()
            reading.release()

    joining = threading.Thread(target=join)
    with auto_inc_held(engine, table, founder) as held:
        joining.start()
        # Were the group's row the reader's already, this would close the cycle.
        lock_once_an_insert_waits(held, table, key)
    joining.join(timeout=60)
    assert joined.is_set()
    assert joiner.stats().contention_retries == 0
    read.release()


def test_a_writer_that_keeps_reading_draws_its_token_before_it_turns_its_row_to_a_group(
    make_manager: MakeManager, table: str, key: str, engine: Engine
) -> None:
    """Releasing a write hold under a read hold of the same thread turns the writer's
    row into a group and inserts the reader's row: the insert comes first."""
    manager = make_manager()
    warm_up(manager)
    write, read = manager.lock(key), manager.read_lock(key)
    downgraded = threading.Event()
    took = threading.Barrier(2)

    def downgrade() -> None:
        assert write.acquire() and read.acquire()
        took.wait()
        took.wait()
        write.release()  # (the thread reads on)
        downgraded.set()
        read.release()

    downgrading = threading.Thread(target=downgrade)
    downgrading.start()
    took.wait()
    with auto_inc_held(engine, table, make_manager()) as held:
        took.wait()
        # Were the writer's row a group already, this would close the cycle.
        lock_once_an_insert_waits(held, table, key)
    downgrading.join(timeout=60)
    assert downgraded.is_set()
    assert manager.stats().contention_retries == 0
