"""Hostile input and foreign owners: what reaches the database is data, and only the
owner (or an explicit ``force_release``) ever removes a hold.

Beside ``test_input.py`` (bad arguments) and ``test_lock.py`` (another thread of the
same manager): table names built to inject SQL, keys and thread names that carry SQL or
LIKE wildcards, thread and host names no database can store as they are, and a second
manager trying to release, extend or reap a live hold.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
from polling import wait_until
from sqlalchemy import Column, Integer, MetaData, Table, inspect
from sqlalchemy.engine import Engine

import tierlock
from tierlock.records import _hostname
from tierlock.tier1 import passing

MakeManager = Callable[..., tierlock.LockManager]


@pytest.fixture
def canary(engine: Engine, table: str) -> str:
    """A table of the test's own that an injected ``DROP TABLE`` would remove."""
    Table(table, MetaData(), Column("id", Integer, primary_key=True)).create(engine)
    return table


@pytest.mark.parametrize(
    "template",
    [
        "t; DROP TABLE {canary}",
        "{canary}; DROP TABLE {canary}",
        "{canary} --",
        "'{canary}'",
        '"{canary}"',
        "`{canary}`",
        "{canary}\n",
        "{canary}\x00",
        "l\u00f6cks",  # a letter, but not a plain one
        "locks\uff11",  # a full-width digit
        "x" * 41,
    ],
    ids=repr,
)
def test_injected_table_names_reach_no_database(
    db_url: str, engine: Engine, canary: str, template: str
) -> None:
    name = template.format(canary=canary)
    with pytest.raises(ValueError, match="plain identifier"):
        tierlock.LockManager(db_url, table=name, reaper_interval=None)
    tables = inspect(engine).get_table_names()
    assert canary in tables
    assert name not in tables


def test_another_manager_cannot_release_extend_or_reap_a_live_hold(
    make_manager: MakeManager, key: str
) -> None:
    owner, other = make_manager(), make_manager()
    held = owner.lock(key)
    assert held.acquire(blocking=False)
    row = owner.info(key)
    assert row is not None

    foreign = other.lock(key)
    with pytest.raises(tierlock.NotHeldError):
        foreign.release()
    with pytest.raises(tierlock.NotHeldError):
        foreign.extend(3600)
    assert foreign.acquire(blocking=False) is False
    assert other.reap() == 0
    assert owner.info(key) == row  # same token, owner and lease

    assert other.force_release(key)  # the one explicit way in
    assert owner.info(key) is None
    with pytest.raises(tierlock.LockLostError):
        held.release()


def test_keys_carrying_sql_or_wildcards_are_plain_data(
    make_manager: MakeManager, table: str
) -> None:
    """Keys are bound parameters, never SQL and never patterns: each locks only itself,
    and removing one leaves every other row alone."""
    manager = make_manager()
    bystander = manager.lock(f"order:{uuid.uuid4().hex}")
    assert bystander.acquire(blocking=False)
    hostile = [
        f"x'; DELETE FROM {table}; --",
        f'x"); DROP TABLE {table}; --',
        "' OR '1'='1",
        "%",
        "_",
        "order:%",
        "\\",
    ]
    locks = [manager.lock(key) for key in hostile]
    for lock in locks:
        assert lock.acquire(blocking=False), f"{lock.key!r} matched another key"
    assert sorted(info.key for info in manager.holders()) == sorted([*hostile, bystander.key])
    assert manager.info("order:") is None  # no prefix or pattern match
    for lock in locks:
        lock.release()
    assert [info.key for info in manager.holders()] == [bystander.key]
    assert manager.force_release("%") is False
    assert manager.force_release("order:%") is False
    bystander.release()


def test_thread_names_are_stored_verbatim(manager: tierlock.LockManager, key: str) -> None:
    name = "'); DROP TABLE x; -- \u00e9 \U0001f600"
    seen: list[tierlock.LockInfo | None] = []

    def hold() -> None:
        with manager.lock(key):
            seen.append(manager.info(key))

    thread = threading.Thread(target=hold, name=name)
    thread.start()
    thread.join(10)
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].thread_name == name


# Names that only describe a holder, as given and as they are stored: a lone surrogate
# (what os.fsdecode makes of undecodable bytes) cannot be encoded, PostgreSQL refuses
# NUL in text, and an escaped name may outgrow the 255-character column.
ODD_NAMES = [
    pytest.param("\udc80", "\\udc80", id="lone-surrogate"),
    pytest.param("nul\x00inside", "nulinside", id="nul"),
    pytest.param("\udc80" * 100, ("\\udc80" * 100)[:255], id="long-once-escaped"),
]


@pytest.mark.parametrize(("name", "stored"), ODD_NAMES)
def test_odd_thread_names_are_stored_safely(
    manager: tierlock.LockManager, key: str, name: str, stored: str
) -> None:
    seen: list[tierlock.LockInfo | None] = []
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with manager.lock(key):
                seen.append(manager.info(key))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=hold, name=name)
    thread.start()
    thread.join(20)
    assert errors == []
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].thread_name == stored
    assert manager.info(key) is None


@pytest.mark.parametrize("renew", [False, True], ids=["fixed", "renewed"])
@pytest.mark.parametrize(("name", "stored"), ODD_NAMES)
def test_odd_thread_name_of_a_waiter_survives_the_hand_off(
    manager: tierlock.LockManager,
    key: str,
    name: str,
    stored: str,
    renew: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fixed-lease hand-off UPDATE is sent by the releasing thread with the waiter's
    name, and a renewed hold's heartbeat writes it after a hand-off that sent nothing:
    a name the database cannot take would break the holder's release or the beat."""
    # A renewed hold passes in memory only within CONFIRMED_WITHIN (0.1 s) of its last
    # statement; a waiter's thread may take longer than that to start and queue.
    monkeypatch.setattr(passing, "CONFIRMED_WITHIN", 60.0)
    lock = manager.lock(key, ttl=1.5, renew=renew)
    assert lock.acquire()
    seen: list[tierlock.LockInfo | None] = []
    errors: list[BaseException] = []

    def named_holder() -> tierlock.LockInfo | None:
        info = manager.info(key)
        return info if info is not None and info.thread_name == stored else None

    def wait_in_line() -> None:
        try:
            assert lock.acquire(timeout=20)
            seen.append(named_holder() if not renew else wait_until(named_holder, "the beat"))
            lock.release()
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_in_line, name=name)
    waiter.start()
    wait_until(lambda: manager.stats().local_waits == 1, "the waiter to queue")
    lock.release()
    waiter.join(20)
    assert errors == []
    stats = manager.stats()
    assert (stats.handoffs, stats.local_handoffs) == ((0, 1) if renew else (1, 0))
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].thread_name == stored
    assert manager.info(key) is None


@pytest.fixture
def fresh_hostname() -> Iterator[None]:
    """The host name is read once per process; read it again in this test and after."""
    _hostname.cache_clear()
    yield
    _hostname.cache_clear()


@pytest.mark.usefixtures("fresh_hostname")
@pytest.mark.parametrize(
    ("host", "stored"),
    [
        pytest.param("host\x00name", "hostname", id="nul"),
        pytest.param("host\udcff", "host\\udcff", id="lone-surrogate"),
    ],
)
def test_odd_host_names_are_stored_safely(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch, host: str, stored: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    manager = make_manager()
    with manager.lock(key):
        info = manager.info(key)
        assert info is not None
        assert info.host == stored
    assert manager.info(key) is None
