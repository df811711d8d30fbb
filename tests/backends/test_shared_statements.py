"""Statements shared between threads on the SQL databases: acquires (and releases) of
different keys that meet in one process travel in one multi-row statement, and every
thread still gets exactly what its own statement would have given it: its row, its
token, its answer, and no row left behind when it is interrupted, forks or meets a
dropped statement.

A lane lets ``WIDTH`` statements go alone before threads share one: the tests hold
those (``Gate``) so that the next threads queue behind them; the counts of queued
threads are read from the lane.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import procs
import pytest
from aiohelpers import Gate
from conftest import SERVERS, SQL_DATABASES, MakeManager
from counting import DriverStatements
from interrupts import Interrupted, Steps, interrupting
from polling import wait_until
from proxy import Proxy
from sqlalchemy import Engine, text

import tierlock
from tierlock.backends.sql import SQLBackend
from tierlock.backends.sql.batches import WIDTH


class Holder(threading.Thread):
    """A thread that acquires ``key`` and holds it until ``let_go``."""

    def __init__(self, locks: tierlock.LockManager, key: str) -> None:
        super().__init__(daemon=True)
        self.lock = locks.lock(key)
        self.held = threading.Event()
        self.go = threading.Event()
        self.token: int | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        assert self.lock.acquire(timeout=procs.WAIT_LIMIT)
        self.token = self.lock.token
        self.held.set()
        assert self.go.wait(procs.WAIT_LIMIT)
        try:
            self.lock.release()
        except BaseException as exc:
            self.error = exc

    def hold(self) -> int:
        assert self.held.wait(procs.WAIT_LIMIT), "never acquired"
        assert self.token is not None
        return self.token

    def let_go(self) -> None:
        self.go.set()
        self.join(procs.WAIT_LIMIT)
        assert not self.is_alive() and self.error is None


def backend(locks: tierlock.LockManager) -> SQLBackend:
    sql = locks._backend
    assert isinstance(sql, SQLBackend)
    return sql


def queued(locks: tierlock.LockManager, lane: str, count: int) -> Callable[[], bool]:
    """Whether ``count`` threads wait in ``locks``'s ``lane`` ("inserts" or "releases")."""
    return lambda: len(getattr(backend(locks)._batches, lane)._queue) == count


def keys(count: int) -> list[str]:
    return [f"shared:{os.getpid()}:{index}:{threading.get_ident()}" for index in range(count)]


def under_way(gate: Gate, start: Callable[[], object]) -> None:
    """``start()`` a thread ``WIDTH`` times, each to send a statement alone that ``gate``
    holds, and wait until all are held: the lane is full."""
    for _ in range(WIDTH):
        start()
    wait_until(lambda: gate.calls == WIDTH, "the lane's statements to be under way")


def meet(locks: tierlock.LockManager, names: list[str]) -> list[Holder]:
    """Holders of ``names``: the inserts of the first ``WIDTH`` held until the others
    have queued behind them, then all holding."""
    gate = Gate(backend(locks)._batches, "_insert_rows")
    holders: list[Holder] = []
    under_way(gate, lambda: holders.append(Holder(locks, names[len(holders)])))
    holders += [Holder(locks, name) for name in names[WIDTH:]]
    wait_until(queued(locks, "inserts", len(names) - WIDTH), "the others to queue")
    gate.open()
    for holder in holders:
        holder.hold()
    return holders


def let_go_together(locks: tierlock.LockManager, holders: list[Holder]) -> Gate:
    """The DELETEs of the first ``WIDTH`` holders held until the others' releases have
    queued behind them; the gate that holds them, to ``open()``."""
    gate = Gate(backend(locks)._batches, "_delete_rows")
    going = iter(holders)

    def let_one_go() -> None:
        next(going).go.set()

    under_way(gate, let_one_go)
    for holder in going:
        holder.go.set()
    wait_until(queued(locks, "releases", len(holders) - WIDTH), "the other releases to queue")
    return gate


def releases_meet(locks: tierlock.LockManager, names: list[str]) -> tuple[list[Holder], Gate]:
    """Holders of ``names``, whose releases then meet (see ``let_go_together``)."""
    holders = [Holder(locks, name) for name in names]
    for holder in holders:
        holder.hold()
    return holders, let_go_together(locks, holders)


@SQL_DATABASES
def test_acquires_that_meet_share_one_insert_and_each_gets_its_row(
    make_manager: MakeManager, driver_statements: DriverStatements
) -> None:
    locks, other = make_manager(), make_manager()
    names = keys(WIDTH + 3)
    before = locks.stats()
    sent = driver_statements.count()
    holders = meet(locks, names)
    assert driver_statements.count() - sent == WIDTH + 1  # (the last three share one)
    after = locks.stats()
    assert after.shared_statements - before.shared_statements == 1
    assert after.inserts - before.inserts == len(names)
    for name, holder in zip(names, holders, strict=True):
        row = other.info(name)
        assert row is not None and row.token == holder.token
        assert row.thread_name == holder.name and row.pid == os.getpid()
        assert not other.lock(name).acquire(blocking=False)
    assert len({holder.token for holder in holders}) == len(names)
    for holder in holders:
        holder.let_go()
    assert other.holders() == []


@SQL_DATABASES
def test_a_shared_insert_that_finds_keys_held_sends_those_threads_their_own_way(
    make_manager: MakeManager,
) -> None:
    locks, other = make_manager(), make_manager()
    names = keys(WIDTH + 3)
    taken = other.lock(names[WIDTH + 1])
    assert taken.acquire(blocking=False)
    gate = Gate(backend(locks)._batches, "_insert_rows")
    holders: list[Holder] = []
    under_way(gate, lambda: holders.append(Holder(locks, names[len(holders)])))
    holders += [Holder(locks, name) for name in names[WIDTH:]]
    wait_until(queued(locks, "inserts", 3), "the others to queue")
    gate.open()
    waiting = holders.pop(WIDTH + 1)
    for holder in holders:
        holder.hold()
    assert not waiting.held.is_set()  # (its key is another manager's)
    taken.release()
    assert waiting.hold() > (taken.token or 0)
    for holder in (*holders, waiting):
        holder.let_go()
    assert other.holders() == []


@SQL_DATABASES
def test_releases_that_meet_share_one_delete(
    make_manager: MakeManager, driver_statements: DriverStatements
) -> None:
    locks, other = make_manager(), make_manager()
    holders, gate = releases_meet(locks, keys(WIDTH + 3))
    sent = driver_statements.count()
    shared = locks.stats().shared_statements
    gate.open()
    for holder in holders:
        holder.let_go()
    assert driver_statements.count() - sent == WIDTH + 1
    assert locks.stats().shared_statements - shared == 1
    assert other.holders() == []


@SQL_DATABASES
def test_a_shared_release_of_a_row_no_longer_ours_tells_that_thread_it_was_lost(
    make_manager: MakeManager, engine: Engine, table: str
) -> None:
    locks, other = make_manager(), make_manager()
    names = keys(WIDTH + 2)
    holders = [Holder(locks, name) for name in names]
    for holder in holders:
        holder.hold()
    lost = holders[WIDTH + 1]  # (one of those that share a statement)
    with engine.begin() as connection:  # (as a reaper elsewhere would, unannounced)
        connection.execute(
            text(f"DELETE FROM {table} WHERE lock_key = :key"), {"key": lost.lock.key}
        )
    gate = let_go_together(locks, holders)
    shared = locks.stats().shared_statements
    gate.open()
    for holder in holders:
        holder.join(procs.WAIT_LIMIT)
    assert locks.stats().shared_statements - shared == 1
    assert isinstance(lost.error, tierlock.LockLostError)
    assert all(holder.error is None for holder in holders if holder is not lost)
    assert other.holders() == []


@pytest.fixture
def interrupt() -> Iterator[Callable[[Steps], None]]:
    """``interrupt(steps)``: see ``interrupts.interrupting``."""
    yield from interrupting(Interrupted)


class Stops:
    """Holds each of the first ``count`` calls of ``_insert_rows`` of ``locks`` until
    that call is let ``go``."""

    def __init__(self, locks: tierlock.LockManager, count: int) -> None:
        batches = backend(locks)._batches
        real = batches._insert_rows
        self.entered = [threading.Event() for _ in range(count)]
        self.go = [threading.Event() for _ in range(count)]
        calls = iter(range(count))

        def stopped(*args: Any) -> Any:
            index = next(calls, None)
            if index is not None:
                self.entered[index].set()
                assert self.go[index].wait(procs.WAIT_LIMIT)
            return real(*args)

        batches._insert_rows = stopped  # type: ignore[method-assign, assignment]


@SQL_DATABASES
@pytest.mark.parametrize("when", ["queued", "under-way"])
def test_an_acquire_interrupted_in_a_shared_insert_leaves_no_row(
    make_manager: MakeManager, interrupt: Callable[[Callable[[], Any]], None], when: str
) -> None:
    """Interrupted while its insert waits to be sent (``queued``), or once another
    thread sends it with its own (``under-way``): the other threads get their keys, and
    the interrupted one's key is free at once, with no row of its owner left."""
    locks, other = make_manager(ttl=30), make_manager()
    *alone, mine, theirs = keys(WIDTH + 2)
    stops = Stops(locks, WIDTH + 1)
    firsts = [Holder(locks, name) for name in alone]
    for entered in stops.entered[:WIDTH]:
        assert entered.wait(procs.WAIT_LIMIT)
    later: list[Holder] = []

    def steps() -> None:
        later.append(Holder(locks, theirs))
        wait_until(queued(locks, "inserts", 2), "the main thread and another to queue")
        if when == "under-way":
            stops.go[0].set()
            assert stops.entered[WIDTH].wait(procs.WAIT_LIMIT)

    interrupt(steps)
    with pytest.raises(Interrupted):
        locks.lock(mine).acquire()
    # The interrupted acquire's own sweep is over before its row can be inserted: only
    # the sender's undo can take that row away.
    wait_until(lambda: not backend(locks)._sweeper._pending, "the acquire's sweep")
    for go in stops.go:
        go.set()
    for holder in (*firsts, *later):
        holder.hold()
    lock = other.lock(mine)
    assert lock.acquire(timeout=5), "the interrupted acquire's row still holds the key"
    lock.release()
    assert not locks.lock(mine).owned()
    for holder in (*firsts, *later):
        holder.let_go()
    wait_until(lambda: other.holders() == [], "every row to go")


def drop(proxy: Proxy, fault: str, pattern: bytes) -> None:
    """Arm ``proxy`` to drop the next ``fault`` ("request" or "reply") of ``pattern``."""
    if fault == "request":
        proxy.drop_request(pattern)
    else:
        proxy.drop_reply(pattern)


@SERVERS
@pytest.mark.parametrize("fault", ["request", "reply"])
def test_a_dropped_shared_insert_leaves_each_thread_with_its_own_row(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, fault: str
) -> None:
    """The shared insert never reaches the server (``request``), or runs and its answer
    is lost (``reply``): each thread finds out by its owner id and holds its key once,
    with the token of its row."""
    locks = proxied(ttl=30)
    names = keys(WIDTH + 3)
    assert locks.info(names[0]) is None  # (a pooled connection: no new one is needed)
    gate = Gate(backend(locks)._batches, "_insert_rows")
    holders: list[Holder] = []
    under_way(gate, lambda: holders.append(Holder(locks, names[len(holders)])))
    holders += [Holder(locks, name) for name in names[WIDTH:]]
    wait_until(queued(locks, "inserts", 3), "the others to queue")
    drop(proxy, fault, b"UNION ALL")  # (only a shared insert has it)
    gate.open()
    for holder in holders:
        holder.hold()
    assert proxy.fired == 1
    for name, holder in zip(names, holders, strict=True):
        row = direct.info(name)
        assert row is not None and row.token == holder.token
    for holder in holders:
        holder.let_go()
    assert direct.holders() == []


@SQL_DATABASES
def test_a_child_forked_while_a_thread_sends_acquires_at_once(make_manager: MakeManager) -> None:
    """The parent's lane is full at the fork (its senders stopped before the database);
    the child's starts free, not behind statements that no thread of it will send."""
    locks = make_manager(ttl=30)
    *held, mine = keys(WIDTH + 1)
    gate = Gate(backend(locks)._runner, "once")
    firsts: list[Holder] = []
    under_way(gate, lambda: firsts.append(Holder(locks, held[len(firsts)])))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            gate.open()  # (the child's own sends go straight through)
            lock = locks.lock(mine)
            if lock.acquire(timeout=5):
                lock.release()
                code = 0
        finally:
            os._exit(code)
    status: list[int] = []

    def child_ended() -> bool:
        ended, code = os.waitpid(pid, os.WNOHANG)
        if ended:
            status.append(code)
        return bool(ended)

    try:
        wait_until(child_ended, "the child to acquire and exit")
    finally:
        gate.open()
        if not status:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    for holder in firsts:
        holder.hold()
    assert os.waitstatus_to_exitcode(status[0]) == 0
    for holder in firsts:
        holder.let_go()


@SERVERS
@pytest.mark.parametrize("fault", ["request", "reply"])
def test_a_dropped_shared_release_leaves_each_thread_released_and_no_row(
    proxied: MakeManager, direct: tierlock.LockManager, proxy: Proxy, fault: str
) -> None:
    """The shared DELETE never reaches the server, or runs and its answer is lost: each
    thread releases on its own, none is told its hold was lost, and no row is left."""
    locks = proxied(ttl=30)
    holders, gate = releases_meet(locks, keys(WIDTH + 3))
    drop(proxy, fault, b"owner_id IN (")  # (only the shared release lists owners)
    gate.open()
    for holder in holders:
        holder.let_go()
    assert proxy.fired == 1
    assert direct.holders() == []


@SQL_DATABASES
def test_close_while_a_shared_insert_waits_answers_every_thread(
    make_manager: MakeManager,
) -> None:
    """``close()`` comes while inserts are under way and others queue behind them: each
    acquire ends (won just as the manager closed counts as not won, and what queued
    meets the closed manager), and no row is left."""
    locks, other = make_manager(ttl=30), make_manager()
    names = keys(WIDTH + 2)
    gate = Gate(backend(locks)._batches, "_insert_rows")
    outcomes: list[object] = []

    def acquire(name: str) -> None:
        try:
            outcomes.append(locks.lock(name).acquire(timeout=5))
        except tierlock.LockError as exc:
            outcomes.append(type(exc))

    threads = [threading.Thread(target=acquire, args=(name,)) for name in names]
    going = iter(threads)
    under_way(gate, lambda: next(going).start())
    for thread in going:
        thread.start()
    wait_until(queued(locks, "inserts", 2), "the others to queue")
    closing = threading.Thread(target=locks.close)
    closing.start()
    wait_until(lambda: backend(locks).closed, "close to begin")
    gate.open()
    for thread in [*threads, closing]:
        thread.join(procs.WAIT_LIMIT)
        assert not thread.is_alive()
    assert outcomes == [tierlock.LockError] * len(names)
    assert other.holders() == []
