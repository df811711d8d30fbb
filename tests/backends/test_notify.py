"""PostgreSQL's release announcements: a release sends ``NOTIFY`` only while its process
cannot tell that nobody waits for the key. Where the listener knows that nobody does,
no process wakes for it; where a poller's mark was heard, the release wakes the poller
at once, long before its next try."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import procs
import psycopg
import pytest
from conftest import MakeManager
from counting import DriverStatements
from polling import wait_until
from sqlalchemy.engine import Engine

import tierlock
from tierlock.backends.sql import sharing
from tierlock.backends.sql.notify import channel_name
from tierlock.tier1 import tiers

pytestmark = pytest.mark.parametrize(
    "db", [pytest.param("postgresql", marks=pytest.mark.postgresql)], indirect=True
)

RELEASES = 5
# The end of what a test listens for, sent after what it looks at.
SENTINEL = "sentinel"
# Far longer than a woken poller takes to try again on a loaded machine.
SCHEDULING_SLACK = 2.0


class Heard:
    """A connection that LISTENs on the table's channel, and one that sends to it."""

    def __init__(self, engine: Engine, table: str) -> None:
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.channel = channel_name(table)
        self.listening = psycopg.connect(dsn, autocommit=True)
        self.listening.execute(f"LISTEN {self.channel}")
        self.sending = psycopg.connect(dsn, autocommit=True)

    def close(self) -> None:
        self.listening.close()
        self.sending.close()


@pytest.fixture
def heard(engine: Engine, table: str) -> Iterator[Heard]:
    heard = Heard(engine, table)
    yield heard
    heard.close()


def announced(heard: Heard) -> list[str]:
    """What was announced on the channel since the last call: everything up to a
    sentinel sent now (delivery keeps the order of commits)."""
    heard.sending.execute("SELECT pg_notify(%s, %s)", (heard.channel, SENTINEL))
    keys: list[str] = []
    for notification in heard.listening.notifies(timeout=procs.WAIT_LIMIT):
        if notification.payload == SENTINEL:
            return keys
        keys.append(notification.payload)
    raise AssertionError(f"no sentinel within {procs.WAIT_LIMIT} s; heard {keys}")


def knows_nobody_waits(manager: tierlock.LockManager) -> None:
    """Hold a key until the manager's listener knows that nobody waits for it."""
    with manager.lock("warm-up"):
        wait_until(
            lambda: manager._backend.others_waiting("warm-up", False) is False,
            "the manager to know that nobody else waits",
        )


def test_a_release_nobody_waits_for_is_not_announced(
    make_manager: MakeManager,
    key: str,
    heard: Heard,
) -> None:
    manager = make_manager()
    knows_nobody_waits(manager)
    announced(heard)  # (the warm-up's own release may have been announced)
    lock = manager.lock(key)
    for _ in range(RELEASES):
        assert lock.acquire(blocking=False)
        lock.release()
    assert announced(heard) == []


def test_a_release_wakes_a_poller_whose_mark_was_heard_at_once(
    make_manager: MakeManager,
    key: str,
    heard: Heard,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poller's next try is half a minute away: only the announcement wakes it."""
    monkeypatch.setattr(tiers, "FIRST_POLL", 30.0)
    holder, waiter = make_manager(), make_manager(poll_interval=60.0)
    knows_nobody_waits(holder)
    knows_nobody_waits(waiter)  # (its listener rings every bell when it starts)
    lock = holder.lock(key)
    assert lock.acquire()
    took: list[float] = []

    def wait() -> None:
        mine = waiter.lock(key)
        if mine.acquire(timeout=procs.WAIT_LIMIT):
            took.append(time.monotonic())
            mine.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(
        lambda: holder._backend.others_waiting(key, False), "the holder to hear the poller's mark"
    )
    announced(heard)  # (the poller's marks)
    released = time.monotonic()
    lock.release()
    thread.join(procs.WAIT_LIMIT)
    assert took, "the poller did not get the key"
    assert took[0] - released < SCHEDULING_SLACK
    assert key in announced(heard)


def test_the_last_readers_leave_wakes_the_waiting_writer_at_once(
    make_manager: MakeManager,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    driver_statements: DriverStatements,
) -> None:
    """The one statement of the last reader's leave reserves the key for the writer
    that waits and announces it: the writer's next try is half a minute away (and its
    mark lasts a minute), so only that announcement wakes it. Its try then replaces the
    reserved row of the group it marked in one statement, without looking first."""
    monkeypatch.setattr(tiers, "FIRST_POLL", 30.0)
    monkeypatch.setattr(sharing, "WRITER_WAIT", 60.0)
    holder, waiter = make_manager(), make_manager(poll_interval=60.0)
    knows_nobody_waits(waiter)  # (its listener rings every bell when it starts)
    reader = holder.read_lock(key)
    assert reader.acquire()
    took: list[float] = []

    def write() -> None:
        mine = waiter.lock(key)
        if mine.acquire(timeout=procs.WAIT_LIMIT):
            took.append(time.monotonic())
            mine.release()

    thread = threading.Thread(target=write, name="writer")
    thread.start()
    # (its first try: the insert, the holder's row, the mark, the readers' rows)
    wait_until(lambda: driver_statements.count(thread="writer") >= 4, "the writer's mark")
    before = len(driver_statements.sent)
    released = time.monotonic()
    reader.release()
    assert len(driver_statements.by_this_thread(before)) == 1
    thread.join(procs.WAIT_LIMIT)
    assert took, "the writer did not get the key"
    assert took[0] - released < SCHEDULING_SLACK
    wrote = [sent for name, sent in driver_statements.sent[before:] if name == "writer"]
    assert len(wrote) == 2, wrote  # (the replace, and the release)
    assert "DELETE" in wrote[0] and "INSERT" in wrote[0], wrote
