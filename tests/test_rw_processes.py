"""Read/write locks and semaphores across processes: who may be inside together, a
waiting writer's place ahead of later readers, tier 1 for readers, and dead holders'
read holds and permits coming back.

Every child builds its own ``LockManager`` on the test's database and table, exactly
as another program would; what the children run is in ``rwsoak``, and what the tests
check lives in shared memory (``rwboard``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable

import procs
import pytest
import rwboard
import rwsoak
from conftest import SHARED_HOLDS, MakeManager
from counting import DriverStatements
from polling import wait_until

import tierlock

pytestmark = [pytest.mark.multiprocess, SHARED_HOLDS]

SOAK_SECONDS = 6.0
CONTROL_SECONDS = 1.0
PERMITS = 3
# The longest a call that never waits for another holder (a try without waiting, a
# release, closing a manager that holds nothing) may take: far more than a few round
# trips on a loaded machine.
STALL_LIMIT = 5.0
DEAD_TTL = 30.0  # the lease of a holder that gets killed: a reclaim must not wait it out
RECLAIM_LIMIT = 5.0  # how long a reclaim of a dead holder's hold on this host may take
# Writer preference.
READER_PROCESSES = 3
READER_THREADS = 2
READ_HOLD = (0.02, 0.04)  # how long a reader keeps its hold, seconds
BUSY_BEFORE = 0.5  # the readers kept the key held for this long before the writer asked
WRITER_LIMIT = 5.0  # how long the writer may wait for the write hold
WRITER_HOLD = 0.2
# A reader that asks for its hold later than this after the writer's wait showed in the
# database (a new reader process was refused) must not get in before the writer. The
# room is for an answer "the readers' group is open" that was under way at that moment:
# the readers of a process that read-holds the key may join its hold with no statement
# for a moment after such an answer (tierlock.tier1.readholds.JOIN_WINDOW, 0.05 s).
VISIBLE_AFTER = 0.1
PROBE_PAUSE = 0.002  # how often the test tries a new reader while the writer waits
READERS_SHARING = 8


# -- 1. the soak -----------------------------------------------------------------------


@pytest.mark.slow
def test_soak_readers_writers_and_permits_with_kills(
    manager: tierlock.LockManager, db_url: str, table: str
) -> None:
    """Four processes of four threads take read holds and write holds of two keys and
    permits of a semaphore of three at random for a few seconds, while the parent
    SIGKILLs a process inside a read hold, a write hold and a permit in turn (leases of
    30 s: what frees their holds is that the process is gone). No writer is ever beside
    anyone on its key, never more than three hold permits at once, every write hold's
    token is above the tokens of earlier holds of its key, no acquire waits long and
    no call that waits for nobody stalls.
    Readers did share keys and permits were held side by side, and afterwards every
    key can be taken whole."""
    load = rwsoak.RWLoad(db_url, table, permits=PERMITS, ttl=DEAD_TTL)
    report = load.run(SOAK_SECONDS)
    summary = report.summary()
    print(summary)
    assert not report.failures, summary
    assert all(count == 0 for count in report.violations.values()), summary
    assert report.timeouts == 0, summary
    assert report.slowest_call < STALL_LIMIT, summary
    assert all(count > 0 for count in report.sections.values()), summary
    assert all(count > 0 for count in report.kills.values()), summary
    assert report.most_readers >= 2, summary  # read holds are shared...
    assert 2 <= report.most_permits <= PERMITS, summary  # ...and so are permits

    # What the killed processes held came back: each key whole, all permits at once.
    writers = [manager.write_lock(key) for key in load.rw_keys]
    for writer in writers:
        assert writer.acquire(timeout=RECLAIM_LIMIT), f"{writer.key!r} not free"
    for key in load.sem_keys:
        semaphore = manager.semaphore(key, PERMITS)
        for _ in range(PERMITS):
            assert semaphore.acquire(timeout=RECLAIM_LIMIT), f"a permit of {key!r} not free"
        assert not semaphore.acquire(blocking=False)
        for _ in range(PERMITS):
            semaphore.release()
    for writer in writers:
        writer.release()
    assert manager.holders() == []


def test_control_without_locks_violates_every_rule() -> None:
    """The soak's load with holds that lock nothing shows every kind of violation the
    soak checks for (but stale tokens: there are none): the checks can fail."""
    report = rwsoak.RWLoad(None, "unused", permits=PERMITS).run(CONTROL_SECONDS)
    summary = report.summary()
    assert not report.failures, summary
    for kind in ("read beside write", "write beside write", "over permits"):
        assert report.violations[kind] > 0, summary
    assert all(count > 0 for count in report.kills.values()), summary


# -- 2. writer preference --------------------------------------------------------------


@pytest.mark.slow
def test_waiting_writer_goes_before_later_readers(
    manager: tierlock.LockManager,  # (which makes the table before the children start)
    make_manager: MakeManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
) -> None:
    """Three processes of two threads take read holds of a key one after another with
    overlap, so that the key is never free of readers. A writer in another process gets
    the write hold within a few seconds all the same; no reader is inside with it, and
    no reader that asked after the writer's wait showed in the database got in before
    it. The test sees the wait show as a reader of its own is refused."""
    timeline = rwboard.Timeline(READER_PROCESSES * READER_THREADS)
    stop, go = procs.CTX.Event(), procs.CTX.Event()
    for number in range(READER_PROCESSES):
        children.start(
            rwsoak.read_continuously,
            url=db_url,
            table=table,
            key=key,
            timeline=timeline,
            first_slot=number * READER_THREADS,
            threads=READER_THREADS,
            hold_for=READ_HOLD,
            stop=stop,
        )
    least = round(BUSY_BEFORE / READ_HOLD[0])  # holds each slot makes in BUSY_BEFORE, at most
    wait_until(lambda: min(timeline.count) >= least, "readers at work", limit=procs.WAIT_LIMIT)
    results, sender = procs.CTX.Pipe(duplex=False)
    children.start(
        rwsoak.write_once,
        url=db_url,
        table=table,
        key=key,
        limit=WRITER_LIMIT,
        hold_for=WRITER_HOLD,
        go=go,
        results=sender,
    )
    sender.close()
    probe = make_manager().read_lock(key)  # a reader process of its own, as the database sees

    def refused() -> float:
        """When a try of the probe was refused, or 0.0 if it got in."""
        if probe.acquire(blocking=False):
            probe.release()
            return 0.0
        return time.monotonic()

    go.set()
    visible = wait_until(
        refused, "a new reader to be refused", limit=WRITER_LIMIT + 5.0, pause=PROBE_PAUSE
    )
    assert results.poll(procs.WAIT_LIMIT), "the writer sent nothing"
    writer = results.recv()
    asked, entered, left = writer["asked"], writer["entered"], writer["left"]
    if writer["got"]:  # every reader thread goes on until it has had a hold after it
        wait_until(
            lambda: (
                {hold[0] for hold in timeline.holds() if hold[2] > left}
                == set(range(timeline.slots))
            ),
            "every reader thread to get in after the writer",
            limit=procs.WAIT_LIMIT,
        )
    stop.set()
    children.join()
    holds = timeline.holds()

    gap = rwboard.uncovered(holds, asked - BUSY_BEFORE, asked)
    assert gap < BUSY_BEFORE / 5, f"the key was free of readers for {gap:.3f} s: load too thin"
    assert writer["got"], f"no write hold in {WRITER_LIMIT} s under a stream of readers"
    waited = entered - asked
    print(f"the writer waited {waited:.3f} s; its wait showed after {visible - asked:.3f} s")
    assert visible > asked, "a new reader was refused before the writer asked"
    beside = [hold for hold in holds if hold[2] < left and hold[3] > entered]
    assert not beside, f"readers inside with the writer ({entered:.3f}-{left:.3f}): {beside}"
    before = [hold for hold in holds if hold[1] > visible + VISIBLE_AFTER and hold[2] < entered]
    assert not before, (
        f"the writer asked at {asked:.3f}, its wait showed at {visible:.3f} and it got in at "
        f"{entered:.3f}; readers that asked more than {VISIBLE_AFTER} s after it showed got in "
        f"first (slot, asked, entered, left): {sorted(before, key=lambda hold: hold[1])}"
    )
    kept_back = [hold for hold in holds if asked < hold[1] < entered < hold[2]]
    assert kept_back, "no reader asked while the writer waited: nothing was checked"


# -- 3. tier 1 for readers -------------------------------------------------------------


def run_threads(count: int, target: Callable[[], None]) -> None:
    """Run ``target`` in ``count`` threads; fail with their tracebacks if any failed."""
    failures: list[str] = []

    def run() -> None:
        try:
            target()
        except BaseException:
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run, name=f"reader-{n}") for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * procs.WAIT_LIMIT)
    assert not any(thread.is_alive() for thread in threads), "a thread hangs"
    assert not failures, "\n".join(failures)


def test_overlapping_readers_of_a_process_share_one_database_hold(
    make_manager: MakeManager,
    key: str,
    driver_statements: DriverStatements,
) -> None:
    """Eight reader threads of one manager, all inside their read holds of one key at
    once (a barrier inside the hold), insert one hold's rows, not eight."""
    manager = make_manager()
    inside = threading.Barrier(READERS_SHARING)

    def read() -> None:
        reader = manager.read_lock(key)
        assert reader.acquire(timeout=procs.WAIT_LIMIT)
        try:
            inside.wait(procs.WAIT_LIMIT)  # all eight are inside at once
        finally:
            reader.release()

    before = len(driver_statements.sent)
    run_threads(READERS_SHARING, read)
    sent = [sent for sent in driver_statements.sent[before:] if "INSERT" in sent[1].upper()]
    assert 1 <= len(sent) <= 2, f"{len(sent)} INSERTs (thread, statement): {sent}"
    assert manager.holders() == []


# -- 4, 5. dead holders on this host ---------------------------------------------------


class Waiter(threading.Thread):
    """A thread that waits up to ``RECLAIM_LIMIT`` for ``hold``; once it has it, notes
    when, and whether ``shut_out()`` (another manager's try) failed, then releases."""

    def __init__(self, hold: rwsoak.Hold, shut_out: Callable[[], bool]) -> None:
        super().__init__(name="waiter")
        self.hold, self.shut_out = hold, shut_out
        self.got_at: float | None = None
        self.others_shut_out: bool | None = None
        self.failure: str | None = None

    def run(self) -> None:
        try:
            if self.hold.acquire(timeout=RECLAIM_LIMIT):
                self.got_at = time.monotonic()
                try:
                    self.others_shut_out = self.shut_out()
                finally:
                    self.hold.release()
        except BaseException:
            self.failure = traceback.format_exc()


def tried(hold: rwsoak.Hold) -> bool:
    """Whether a try without waiting got ``hold`` (released again at once)."""
    if hold.acquire(blocking=False):
        hold.release()
        return True
    return False


def kill_while_waited_for(
    children: procs.Children,
    db_url: str,
    table: str,
    key: str,
    *,
    permits: int | None,
    waiter: Waiter,
    kept: bool = False,
) -> float:
    """Start a child that takes a read hold of ``key`` (``permits=None``) or a permit of
    its semaphore of ``permits``, with a lease of ``DEAD_TTL``. Once it holds and the
    waiter's hold has been refused, start the waiter and SIGKILL the child; return how
    long after the kill the waiter got its hold. ``kept``: the child's process keeps its
    read hold with no thread in it; the waiter starts after the kill (a living keeper
    gives its hold back to a writer that waits, on PostgreSQL at once)."""
    held = procs.CTX.Event()
    holder = children.start(
        rwsoak.hold_shared,
        url=db_url,
        table=table,
        key=key,
        permits=permits,
        ttl=DEAD_TTL,
        held=held,
        kept=kept,
    )
    assert held.wait(procs.WAIT_LIMIT)
    assert not tried(waiter.hold), "the child's hold kept nobody out"
    if not kept:
        waiter.start()  # (it may be waiting in the database already when the child dies)
    assert holder.pid is not None
    killed_at = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    if kept:
        waiter.start()
    waiter.join(RECLAIM_LIMIT + procs.WAIT_LIMIT)
    holder.join(procs.WAIT_LIMIT)
    assert holder.exitcode == -signal.SIGKILL
    assert waiter.failure is None, waiter.failure
    assert waiter.got_at is not None, f"still held {RECLAIM_LIMIT} s after the kill"
    assert waiter.got_at > killed_at, "taken from a live holder"
    assert waiter.others_shut_out, "the hold taken over did not keep others out"
    return waiter.got_at - killed_at


@pytest.fixture
def others(make_manager: MakeManager) -> tierlock.LockManager:
    """Another manager of this process: another process, as the database sees it."""
    return make_manager()


@pytest.mark.slow
def test_permit_of_killed_holder_comes_back_at_once(
    manager: tierlock.LockManager,
    others: tierlock.LockManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
) -> None:
    """The only permit of a semaphore, held by a process killed with SIGKILL, goes to a
    waiter on this host within seconds, not at the end of the holder's 30 s lease; and
    it is still the only one."""
    waiter = Waiter(manager.semaphore(key, 1), lambda: not tried(others.semaphore(key, 1)))
    took = kill_while_waited_for(children, db_url, table, key, permits=1, waiter=waiter)
    print(f"the permit came back {took:.3f} s after the kill")


@pytest.mark.slow
@pytest.mark.parametrize("kept", [False, True], ids=["held", "kept"])
def test_read_hold_of_killed_holder_does_not_keep_a_writer_out(
    manager: tierlock.LockManager,
    others: tierlock.LockManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
    kept: bool,
) -> None:
    """A read hold of a process killed with SIGKILL (lease 30 s), held by a thread or
    kept by the process with no thread in it, keeps a writer on this host out for no
    more than a few seconds; the writer's hold then keeps readers out."""
    waiter = Waiter(manager.write_lock(key), lambda: not tried(others.read_lock(key)))
    took = kill_while_waited_for(
        children, db_url, table, key, permits=None, waiter=waiter, kept=kept
    )
    print(f"the writer got in {took:.3f} s after the kill")


STOPPED_TTL = 1.0  # the lease of a reader process that gets stopped past it


@pytest.mark.slow
def test_a_read_hold_kept_by_a_process_stopped_past_its_lease_is_not_joined_after(
    manager: tierlock.LockManager,
    db_url: str,
    table: str,
    key: str,
    children: procs.Children,
) -> None:
    """A process keeps its read hold (lease 1 s) with no thread in it and is stopped
    with SIGSTOP; a writer takes the key over once the lease has ended. When the
    process goes on, its next reader does not join the hold it kept, whose lease
    ended while it was stopped: a try without waiting is refused while the writer
    holds, and the hold it waits for comes after the writer's, with a higher token."""
    kept, go, tried = procs.CTX.Event(), procs.CTX.Event(), procs.CTX.Event()
    results, sender = procs.CTX.Pipe(duplex=False)
    reader = children.start(
        rwsoak.keep_then_read_again,
        url=db_url,
        table=table,
        key=key,
        ttl=STOPPED_TTL,
        kept=kept,
        go=go,
        tried=tried,
        results=sender,
    )
    sender.close()
    assert kept.wait(procs.WAIT_LIMIT)
    assert reader.pid is not None
    writer = manager.write_lock(key)
    os.kill(reader.pid, signal.SIGSTOP)
    try:
        assert writer.acquire(timeout=procs.WAIT_LIMIT), "the expired kept hold was not taken over"
    finally:
        os.kill(reader.pid, signal.SIGCONT)
    go.set()
    assert tried.wait(procs.WAIT_LIMIT)
    token = writer.token
    writer.release()
    assert results.poll(procs.WAIT_LIMIT), "the reader process sent nothing"
    outcome = results.recv()
    children.join()
    assert not outcome["got_in"], "the reader joined the hold it kept, which had expired"
    assert token is not None and outcome["token"] > token
