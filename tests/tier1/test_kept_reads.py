"""A process that reads a key again and again keeps its read hold between its readers:
the next read costs no statement. A writer of the process ends the kept hold before it
asks; a writer elsewhere ends it at once on PostgreSQL, whose listener hears the
writer's mark, and within the join window elsewhere, as the hold then goes back by
itself; closing the manager gives it back.

Most tests stretch the join window (``readholds.JOIN_WINDOW``), within which a kept hold
is joined and after which it goes back, so that a loaded machine's pauses cannot end it
before the test looks; the window's own bound is what ``test_rw_processes``'s writer
preference test checks, with the real window."""

from __future__ import annotations

import os
import threading
import time

import procs
import pytest
from conftest import SHARED_HOLDS, MakeManager
from counting import HEARTBEAT, DriverStatements
from polling import wait_until
from rwhelpers import Holder
from sqlalchemy import text
from sqlalchemy.engine import Engine

import tierlock
from tierlock.backends.sql import takeover
from tierlock.backends.sql.notify import channel_name
from tierlock.tier1 import readholds

pytestmark = SHARED_HOLDS

LISTENERS = text("SELECT pid FROM pg_stat_activity WHERE query = :query")
# A join window no test outlasts: a kept hold stays kept unless something ends it.
LONG_WINDOW = 4 * procs.WAIT_LIMIT


@pytest.fixture
def long_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readholds, "JOIN_WINDOW", LONG_WINDOW)
    monkeypatch.setattr(readholds, "READ_AGAIN", LONG_WINDOW)


def read_twice(reader: tierlock.ReadLock) -> int:
    """Read ``reader``'s key twice, so that the process reads it again soon after its
    last hold of it ended, and keeps the second hold; that hold's token."""
    for _ in range(2):
        with reader:
            token = reader.token
    assert token is not None
    return token


def kept_rows(manager: tierlock.LockManager) -> list[tuple[int, str]]:
    return [(info.pid, info.mode) for info in manager.holders()]


def test_a_read_of_the_hold_its_process_keeps_sends_no_statement(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements, long_window: None
) -> None:
    manager, other = make_manager(), make_manager()
    reader = manager.read_lock(key)
    token = read_twice(reader)
    assert kept_rows(manager) == [(os.getpid(), "shared")], "the hold was not kept"
    before = len(driver_statements.sent)
    tokens = []
    for _ in range(3):
        with reader:
            assert reader.owned()
            tokens.append(reader.token)
    sent = [sent for name, sent in driver_statements.sent[before:] if name != HEARTBEAT]
    assert sent == [], "reads of a kept hold sent statements"
    assert tokens == [token] * 3
    assert not other.lock(key).acquire(blocking=False), "the kept hold let a writer in"
    manager.close()
    assert other.holders() == [], "closing the manager left its kept hold behind"


def test_a_writer_of_the_process_ends_its_kept_read_hold_first(
    make_manager: MakeManager, key: str, long_window: None
) -> None:
    manager, other = make_manager(), make_manager()
    token = read_twice(manager.read_lock(key))
    writer = manager.lock(key)
    assert writer.acquire(timeout=procs.WAIT_LIMIT), "the writer waited for its own process"
    assert writer.token is not None and writer.token > token
    assert not other.read_lock(key).acquire(blocking=False)
    writer.release()


@pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)
def test_a_writer_whose_process_left_a_group_others_read_marks_it_first(
    make_manager: MakeManager, key: str, driver_statements: DriverStatements, long_window: None
) -> None:
    """A writer whose own process gives back a kept read hold while another process
    still reads the key marks the group at once: no insert, no read of the holder's
    row before its mark. (Where the leave says how many readers remain: PostgreSQL and
    SQLite, whose UPDATE ... RETURNING MariaDB lacks.)"""
    manager, other = make_manager(), make_manager()
    token = read_twice(manager.read_lock(key))
    read_twice(other.read_lock(key))
    got: list[int | None] = []

    def write() -> None:
        writer = manager.lock(key)
        if writer.acquire(timeout=procs.WAIT_LIMIT):
            got.append(writer.token)
            writer.release()

    thread = threading.Thread(target=write, name="writer")
    thread.start()
    wait_until(lambda: _marks(driver_statements), "the writer's mark")
    other.close()  # (gives its kept hold back, if the mark did not end it already)
    thread.join(procs.WAIT_LIMIT)
    assert got and got[0] is not None and got[0] > token, "the writer did not get the key"
    sent = [sent for name, sent in driver_statements.sent if name == "writer"]
    before_mark = sent[: next(at for at, one in enumerate(sent) if "SET waiting" in one)]
    assert before_mark and not any("INSERT" in one for one in before_mark), sent
    assert not any("SELECT" in one and "DELETE" not in one for one in before_mark), sent


@pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)
def test_a_writer_that_marks_a_group_gone_since_inserts_in_the_same_try(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group its process left has ended since (its last reader left too): the
    writer's mark finds no group, and the same try inserts and wins, with no pause."""
    monkeypatch.setattr(takeover, "HOLDER_MEMORY", LONG_WINDOW)  # (the left group's memory)
    manager, other = make_manager(), make_manager()
    kept_open = other.read_lock(key)
    assert kept_open.acquire()
    with manager.read_lock(key):  # (one read: its process leaves as it ends, not keeping)
        pass
    kept_open.release()
    assert other.holders() == [], "a read hold stayed"
    before = len(driver_statements.sent)
    writer = manager.lock(key)
    assert writer.acquire(timeout=procs.WAIT_LIMIT)
    sent = driver_statements.by_this_thread(before)
    assert len(sent) == 2 and "SET waiting" in sent[0] and "INSERT" in sent[1], sent
    writer.release()


def _marks(statements: DriverStatements) -> bool:
    return any(name == "writer" and "SET waiting" in one for name, one in statements.sent)


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_a_writer_elsewhere_ends_a_kept_read_hold_at_once_on_postgresql(
    make_manager: MakeManager, key: str, long_window: None
) -> None:
    """The writer's mark on the group goes out on the listeners' channel, and the
    keeping process gives its hold back when it hears it, not at the window's end."""
    manager, other = make_manager(), make_manager()
    reader = manager.read_lock(key)
    read_twice(reader)
    assert kept_rows(manager) == [(os.getpid(), "shared")]
    writer = other.lock(key)
    assert writer.acquire(timeout=procs.WAIT_LIMIT), "the kept hold was not given back"
    assert not reader.acquire(blocking=False), "a reader joined the hold given back"
    writer.release()


def test_a_kept_read_hold_goes_back_when_its_window_ends(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no writer to end it (nothing marks the key), the manager's own thread gives
    a kept hold back once the group is no longer known open."""
    monkeypatch.setattr(readholds, "JOIN_WINDOW", 1.0)  # (room for the two reads)
    monkeypatch.setattr(readholds, "READ_AGAIN", 1.0)
    manager, other = make_manager(), make_manager()
    read_twice(manager.read_lock(key))
    assert kept_rows(manager) == [(os.getpid(), "shared")], "the hold was not kept"
    wait_until(lambda: manager.holders() == [], "the kept hold to go back", limit=procs.WAIT_LIMIT)
    writer = other.lock(key)
    assert writer.acquire(blocking=False)
    writer.release()


def listening(engine: Engine, table: str) -> list[int]:
    """The server processes of the sessions that LISTEN on the table's channel."""
    with engine.connect() as connection:
        return list(
            connection.execute(LISTENERS, {"query": f"LISTEN {channel_name(table)}"}).scalars()
        )


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_while_the_listener_hears_every_mark_readers_join_past_the_join_window(
    make_manager: MakeManager,
    key: str,
    engine: Engine,
    table: str,
    driver_statements: DriverStatements,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no join window at all, a reader joins the process's hold with no statement
    while the listener has heard every writer's mark since the database said the group
    open; a writer's mark, heard, closes it (nothing else could within the test: the
    heard window outlasts it); and once the listener's connection was lost, the next
    reader asks the database again."""
    monkeypatch.setattr(readholds, "JOIN_WINDOW", 0.0)
    monkeypatch.setattr(readholds, "HEARD_WINDOW", LONG_WINDOW)
    manager, other = make_manager(), make_manager()
    backend = manager._backend
    with manager.read_lock(key):  # (the process's first hold starts its listener)
        pass
    wait_until(lambda: backend.marks_heard_since() is not None, "the listener to listen")
    first = Holder(manager.read_lock(key)).start()

    def statements_of_a_read() -> list[str]:
        before = len(driver_statements.sent)
        with manager.read_lock(key):
            pass
        return driver_statements.by_this_thread(before)

    assert statements_of_a_read() == []
    writer = Holder(other.lock(key)).start(wait=False)

    def refused() -> bool:
        reader = manager.read_lock(key)
        if reader.acquire(blocking=False):
            reader.release()
            return False
        return True

    wait_until(refused, "the writer's mark to close the process's hold")
    assert not writer.held.is_set()
    first.finish()
    writer.wait_held()
    writer.finish()

    second = Holder(manager.read_lock(key)).start()
    assert statements_of_a_read() == []
    lost = time.monotonic()
    with engine.connect() as connection:
        for pid in listening(engine, table):
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    wait_until(lambda: (backend.marks_heard_since() or 0.0) > lost, "the listener to listen again")
    assert statements_of_a_read() != [], "a reader joined with no statement, unheard"
    second.finish()
