"""The lock's life cycle against a reference model, driven by a Hypothesis state machine.

Three worker threads own holds: workers 0 and 1 share one manager (so tier 1 stands
between them), worker 2 has a manager of its own (so only the table does). Rules run
acquire, release and extend on a chosen worker's thread, let a hold's (fixed) lease run
out by the database's clock, reap, and force-release; the model says what each must return or
raise (reentrancy depth, NotHeldError, LockLostError after a takeover, reap or
force-release) and what the table must hold after every step.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import engines
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import tierlock

T = TypeVar("T")

WORKERS = 3
MANAGER_OF = (0, 0, 1)  # worker -> manager
KEYS = 2
TTL = 60.0  # never runs out by itself during a run; the "expire" rule ends leases
SHORT_TTL = 0.05
WAIT = 10.0  # bound on a step that normally takes milliseconds

LIVE, EXPIRED, LOST = "live", "expired", "lost"  # a hold's row: ours, ours but over, gone


class Worker:
    """A thread that runs the functions it is given, so that holds belong to it."""

    def __init__(self, name: str) -> None:
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (task := self._inbox.get()) is not None:
            task()

    def run(self, function: Callable[[], T]) -> T:
        """``function()`` on this worker's thread: its result, or its exception raised."""
        outcome: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def task() -> None:
            try:
                outcome.put((True, function()))
            except BaseException as exc:
                outcome.put((False, exc))

        self._inbox.put(task)
        succeeded, value = outcome.get(timeout=WAIT)
        if not succeeded:
            raise value
        result: T = value
        return result

    def stop(self) -> None:
        self._inbox.put(None)
        self.thread.join(WAIT)


def _ownership(lock: tierlock.Lock) -> tuple[bool, int | None]:
    return lock.owned(), lock.token


@dataclasses.dataclass
class ModelHold:
    depth: int
    token: int
    row: str  # LIVE, EXPIRED or LOST
    lease_ended: bool = False  # as its thread can tell (a force-release it learns late)


class LockMachine(RuleBasedStateMachine):
    url: str
    table: str
    keeps_expired: bool  # (Redis deletes a hold when its lease ends: it is lost at once)

    def __init__(self) -> None:
        super().__init__()
        self.managers = [
            tierlock.LockManager(
                self.url, table=self.table, reaper_interval=None, ttl=TTL, renew=False
            )
            for _ in range(max(MANAGER_OF) + 1)
        ]
        self.workers = [Worker(f"worker-{index}") for index in range(WORKERS)]
        self.keys = [f"sm:{uuid.uuid4().hex}:{index}" for index in range(KEYS)]
        self.holds: list[dict[int, ModelHold]] = [{} for _ in range(KEYS)]  # per key
        self.highest_token = [0] * KEYS

    def lock(self, worker: int, key: int) -> tierlock.Lock:
        return self.managers[MANAGER_OF[worker]].lock(self.keys[key])

    def row_holder(self, key: int) -> int | None:
        """The worker whose hold the key's row is, expired or not."""
        for worker, hold in self.holds[key].items():
            if hold.row != LOST:
                return worker
        return None

    @initialize()
    def table_starts_empty_for_these_keys(self) -> None:
        for key in self.keys:
            assert self.managers[0].info(key) is None

    @rule(worker=st.integers(0, WORKERS - 1), key=st.integers(0, KEYS - 1))
    def acquire(self, worker: int, key: int) -> None:
        self.try_acquire(worker, key)

    def takeovers(self) -> list[tuple[int, int]]:
        """(worker, key) pairs where the worker can take over an expired row."""
        return [
            (worker, key)
            for key, holds in enumerate(self.holds)
            for worker in range(WORKERS)
            if (holder := self.row_holder(key)) is not None
            and holds[holder].row == EXPIRED
            and all(MANAGER_OF[other] != MANAGER_OF[worker] for other in holds)
        ]

    @precondition(lambda self: self.takeovers())
    @rule(data=st.data())
    def take_over(self, data: st.DataObject) -> None:
        """Acquire where only a row whose lease has ended stands in the way (a plain
        acquire gets there too, but rarely)."""
        self.try_acquire(*data.draw(st.sampled_from(self.takeovers())))

    def try_acquire(self, worker: int, key: int) -> None:
        lock = self.lock(worker, key)
        got = self.workers[worker].run(lambda: lock.acquire(blocking=False))
        holds = self.holds[key]
        if worker in holds:
            assert got, "a reentrant acquire failed"
            holds[worker].depth += 1
            return
        local_rival = any(MANAGER_OF[other] == MANAGER_OF[worker] for other in holds)
        holder = self.row_holder(key)
        if local_rival or (holder is not None and holds[holder].row == LIVE):
            assert not got, "acquired a key held by another"
            return
        assert got, "could not acquire a free key or one whose lease had ended"
        if holder is not None:
            holds[holder].row = LOST  # taken over
        token = self.workers[worker].run(lambda: lock.token)
        assert token is not None and token > self.highest_token[key]
        self.highest_token[key] = token
        holds[worker] = ModelHold(depth=1, token=token, row=LIVE)

    @rule(worker=st.integers(0, WORKERS - 1), key=st.integers(0, KEYS - 1))
    def release(self, worker: int, key: int) -> None:
        lock = self.lock(worker, key)
        hold = self.holds[key].get(worker)
        if hold is None:
            with pytest.raises(tierlock.NotHeldError):
                self.workers[worker].run(lock.release)
            return
        hold.depth -= 1
        if hold.depth:
            self.workers[worker].run(lock.release)  # an inner release never asks the table
            return
        del self.holds[key][worker]
        if hold.row == LIVE:
            self.workers[worker].run(lock.release)
        else:  # (an expired row, still its own, goes with it)
            with pytest.raises(tierlock.LockLostError):
                self.workers[worker].run(lock.release)

    @rule(worker=st.integers(0, WORKERS - 1), key=st.integers(0, KEYS - 1))
    def extend(self, worker: int, key: int) -> None:
        lock = self.lock(worker, key)
        hold = self.holds[key].get(worker)
        if hold is None:
            with pytest.raises(tierlock.NotHeldError):
                self.workers[worker].run(lock.extend)
        elif hold.row != LIVE:  # (a lease that ran out is never revived)
            with pytest.raises(tierlock.LockLostError):
                self.workers[worker].run(lock.extend)
            hold.lease_ended = True  # now its thread knows
        else:
            self.workers[worker].run(lock.extend)
            hold.row = LIVE
            hold.lease_ended = False

    @precondition(
        lambda self: any(hold.row == LIVE for holds in self.holds for hold in holds.values())
    )
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """A live hold's lease runs out, by the database's clock."""
        worker, key = data.draw(
            st.sampled_from(
                [
                    (worker, key)
                    for key, holds in enumerate(self.holds)
                    for worker, hold in holds.items()
                    if hold.row == LIVE
                ]
            )
        )
        lock = self.lock(worker, key)
        self.workers[worker].run(lambda: lock.extend(SHORT_TTL))
        deadline = time.monotonic() + WAIT
        while not self.row_expired(key):
            assert time.monotonic() < deadline, "the lease never ran out"
            time.sleep(SHORT_TTL / 2)
        self.holds[key][worker].row = EXPIRED if self.keeps_expired else LOST
        self.holds[key][worker].lease_ended = True

    def row_expired(self, key: int) -> bool:
        info = self.managers[0].info(self.keys[key])
        if info is None:
            assert not self.keeps_expired
            return True
        return info.expired

    @rule(manager=st.integers(0, max(MANAGER_OF)))
    def reap(self, manager: int) -> None:
        expired = [hold for holds in self.holds for hold in holds.values() if hold.row == EXPIRED]
        assert self.managers[manager].reap() == len(expired)
        for hold in expired:
            hold.row = LOST

    @rule(manager=st.integers(0, max(MANAGER_OF)), key=st.integers(0, KEYS - 1))
    def force_release(self, manager: int, key: int) -> None:
        holder = self.row_holder(key)
        assert self.managers[manager].force_release(self.keys[key]) == (holder is not None)
        if holder is not None:
            self.holds[key][holder].row = LOST

    @invariant()
    def table_matches_the_model(self) -> None:
        for key, name in enumerate(self.keys):
            info = self.managers[0].info(name)
            holder = self.row_holder(key)
            if holder is None:
                assert info is None
                continue
            assert info is not None
            hold = self.holds[key][holder]
            assert info.token == hold.token
            assert info.thread_id == self.workers[holder].thread.ident
            assert info.expired == (hold.row == EXPIRED)

    @invariant()
    def each_thread_knows_what_it_holds(self) -> None:
        for worker in range(WORKERS):
            for key in range(KEYS):
                lock = self.lock(worker, key)
                hold = self.holds[key].get(worker)
                owned, token = self.workers[worker].run(functools.partial(_ownership, lock))
                # A thread owns a hold only while its lease surely runs.
                expected = (not hold.lease_ended, hold.token) if hold else (False, None)
                assert (owned, token) == expected

    def teardown(self) -> None:
        for worker in self.workers:
            worker.stop()
        for key in self.keys:
            self.managers[0].force_release(key)  # expired rows would count in the next reap
        for manager in self.managers:
            manager.close()


@pytest.mark.slow
def test_lock_life_cycle_matches_the_model(db_url: str, table: str, db: str) -> None:
    tierlock.LockManager(db_url, table=table, reaper_interval=None).close()  # the table
    table_name = table

    class Machine(LockMachine):
        url = db_url
        table = table_name
        keeps_expired = engines.keeps_expired(db)

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=8, stateful_step_count=25, deadline=None, database=None),
    )
