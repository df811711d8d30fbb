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

import procs
import pytest
from conftest import SHARED_HOLDS, MakeManager
from counting import HEARTBEAT, DriverStatements
from polling import wait_until

import tierlock
from tierlock.tier1 import readholds

pytestmark = SHARED_HOLDS

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
