"""What only the lock-file engine shows: takeovers and releases racing in many
processes, the file's stamp deciding expiry, files half written or guards held by
killed processes, keys that are no file names, counters lost, the reaper, and one
directory reached through two mount points.

The shared contract suite runs on this engine too (the ``db`` fixture's ``file``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import string
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import procs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polling import wait_until

import tierlock
from tierlock.backends.basics import Record
from tierlock.backends.files import wanting
from tierlock.backends.files.holdfile import CREATE_GRACE, PROVISIONAL, Stored
from tierlock.backends.files.names import COUNTER, HOLD, PLAIN_NAME_LIMIT, WAITING, key_name
from tierlock.backends.files.reaping import COUNTER_LIFE
from tierlock.keys import MAX_KEY_LENGTH
from tierlock.records import Owner

pytestmark = pytest.mark.file

MakeManager = Callable[[], tierlock.LockManager]

RACERS = 8
ROUNDS = 12
SECTIONS = 20  # per thread, through the two mount points
RACE_TRY = 0.2  # seconds a racer tries for the expired hold


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The lock directory (``file:///...``); each test's table is a directory in it."""
    return tmp_path / "locks"


@pytest.fixture
def url(root: Path) -> str:
    return f"file://{root}"


@pytest.fixture
def table() -> str:
    return f"tl_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def locks(url: str, table: str) -> Iterator[tierlock.LockManager]:
    with tierlock.LockManager(url, table=table, reaper_interval=None) as manager:
        yield manager


def hold_file(root: Path, table: str, key: str) -> Path:
    return root / table / (key_name(key) + HOLD)


def backdate(path: Path, seconds: float) -> None:
    """Move a file's stamp ``seconds`` into the past, as if that long had passed on the
    file server since it was last written."""
    stamp = path.stat().st_mtime_ns - int(seconds * 1e9)
    os.utime(path, ns=(stamp, stamp))


# -- races -----------------------------------------------------------------------------


def race_for_expired_holds(
    *, url: str, table: str, key: str, ready: Barrier, tried: Barrier, wins: Any, me: int
) -> None:
    """Each round: try ``key`` at ``ready`` for a moment, together with the other
    racers; a winner keeps it until everyone has tried, then lets it go. (The try
    waits a little: one without waiting may fail at once, from the memory of earlier
    rounds that the key is fought over.)"""
    with procs.open_manager(url, table) as manager:
        lock = manager.lock(key, ttl=30, renew=False)
        for round_ in range(ROUNDS):
            ready.wait(procs.WAIT_LIMIT)
            if lock.acquire(timeout=RACE_TRY):
                wins[round_ * RACERS + me] = lock.token
            tried.wait(procs.WAIT_LIMIT)
            if lock.owned():
                lock.release()
            tried.wait(procs.WAIT_LIMIT)  # released: the next expired hold may be set up


@pytest.mark.slow
@pytest.mark.multiprocess
def test_eight_processes_racing_for_one_expired_file_leave_one_winner(
    locks: tierlock.LockManager, root: Path, table: str, children: procs.Children
) -> None:
    """Eight processes try one expired hold file at once, round after round: exactly
    one takes it over, and its token is above the expired hold's."""
    key = "race:expired"
    ready = procs.CTX.Barrier(RACERS + 1)
    tried = procs.CTX.Barrier(RACERS + 1)
    wins = procs.CTX.RawArray("q", ROUNDS * RACERS)
    for me in range(RACERS):
        children.start(
            race_for_expired_holds,
            **{"url": f"file://{root}", "table": table, "key": key},
            **{"ready": ready, "tried": tried, "wins": wins, "me": me},
        )
    for round_ in range(ROUNDS):
        expired = locks.lock(key, ttl=30, renew=False)
        expired.acquire()
        backdate(hold_file(root, table, key), 60)
        ready.wait(procs.WAIT_LIMIT)
        tried.wait(procs.WAIT_LIMIT)
        winners = [token for token in wins[round_ * RACERS : (round_ + 1) * RACERS] if token]
        assert len(winners) == 1, f"round {round_}: tokens of the winners {winners}"
        assert winners[0] > expired.token
        with pytest.raises(tierlock.LockLostError):
            expired.release()
        tried.wait(procs.WAIT_LIMIT)
    children.join()
    assert locks.holders() == []


def release_late(*, url: str, table: str, key: str, expired: Event, go: Barrier, lost: Any) -> None:
    """Each round: hold ``key`` on a short fixed lease, wait until it has ended by the
    file's stamp, and release it at ``go``."""
    with procs.open_manager(url, table) as manager:
        lock = manager.lock(key, ttl=0.05, renew=False)
        for round_ in range(ROUNDS * 2):
            lock.acquire()
            wait_until(lambda: manager.info(key).expired, "the lease's end")  # type: ignore[union-attr]
            expired.set()
            go.wait(procs.WAIT_LIMIT)
            try:
                lock.release()
            except tierlock.LockLostError:
                lost[round_] = 1
            go.wait(procs.WAIT_LIMIT)  # released: the parent looks at the new holder's file


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_late_release_never_deletes_the_new_holders_file(
    locks: tierlock.LockManager, root: Path, table: str, children: procs.Children
) -> None:
    """A holder whose lease has ended releases just as another process takes the key
    over (even rounds), or just after (odd rounds): the new holder's file stays, and
    the late release is told its hold was lost when it was."""
    key = "race:release"
    expired, go = procs.CTX.Event(), procs.CTX.Barrier(2)
    lost = procs.CTX.RawArray("b", ROUNDS * 2)
    children.start(
        release_late, url=f"file://{root}", table=table, key=key, expired=expired, go=go, lost=lost
    )
    taker = locks.lock(key, ttl=30)
    for round_ in range(ROUNDS * 2):
        expired.wait(procs.WAIT_LIMIT)
        expired.clear()
        if round_ % 2:
            assert taker.acquire(timeout=procs.WAIT_LIMIT)
            go.wait(procs.WAIT_LIMIT)
        else:
            go.wait(procs.WAIT_LIMIT)
            assert taker.acquire(timeout=procs.WAIT_LIMIT)
        go.wait(procs.WAIT_LIMIT)
        held = locks.info(key)
        assert held is not None and (held.pid, held.token) == (os.getpid(), taker.token)
        assert hold_file(root, table, key).exists()
        taker.release()
    children.join()
    assert list(lost[1::2]) == [1] * ROUNDS  # (taken over before the release, every time)
    assert locks.holders() == []


# -- time, half-written files and guards ---------------------------------------------


def test_the_files_stamp_decides_when_a_lease_ends(
    make_file_managers: MakeManager, root: Path, table: str
) -> None:
    """A hold whose file was stamped longer ago than its lease is over, whatever the
    holder's own clock says; one stamped just now is held."""
    holder, waiter = make_file_managers(), make_file_managers()
    lock = holder.lock("stamp", ttl=30, renew=False)
    lock.acquire()
    assert not waiter.lock("stamp").acquire(blocking=False)
    backdate(hold_file(root, table, "stamp"), 31)
    other = waiter.lock("stamp")
    assert other.acquire(blocking=False)
    assert waiter.stats().takeovers == 1
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    other.release()


@pytest.fixture
def make_file_managers(url: str, table: str) -> Iterator[MakeManager]:
    made: list[tierlock.LockManager] = []

    def make() -> tierlock.LockManager:
        made.append(tierlock.LockManager(url, table=table, reaper_interval=None))
        return made[-1]

    yield make
    for manager in made:
        manager.close()


def test_a_half_written_file_is_held_for_its_grace_then_taken_over(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    """A hold file left empty by a creator that died between its first two system
    calls holds the key for ``CREATE_GRACE`` from its creation, then is taken over."""
    path = hold_file(root, table, "half")
    path.touch()
    lock = locks.lock("half")
    assert not lock.acquire(blocking=False)
    assert locks.info("half") is None  # (nothing to show: no holder is known)
    backdate(path, CREATE_GRACE / 1000 + 1)
    assert lock.acquire(blocking=False)
    assert locks.stats().takeovers == 1
    lock.release()
    assert not path.exists()


def tell_who_i_am(*, owners: Any) -> None:
    owners.put(Owner.current())


@pytest.mark.multiprocess
def test_a_creator_that_died_before_numbering_its_hold_is_reclaimed_at_once(
    locks: tierlock.LockManager, root: Path, table: str, children: procs.Children
) -> None:
    """A hold file with only its first, provisional record (its creator died before it
    took the guard) names its process: a waiter on the same host reclaims it at once,
    and nothing shows it as a hold meanwhile."""
    owners = procs.CTX.SimpleQueue()
    children.start(tell_who_i_am, owners=owners)
    dead: Owner = owners.get()
    children.join()
    record = Record.of(dead, 0, 30.0)
    hold_file(root, table, "orphan").write_bytes(
        Stored(PROVISIONAL, 30_000, "orphan", record).dumps()
    )
    assert locks.info("orphan") is None and locks.holders() == []
    lock = locks.lock("orphan")
    assert lock.acquire(blocking=False)
    assert locks.stats().reclaims == 1
    lock.release()


def test_a_record_with_the_tail_of_a_longer_one_still_counts(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    """A rewrite cut short between its write and its truncation (its process killed
    there) leaves the old record's tail after the new one: the file still names its
    holder, and holds."""
    lock = locks.lock("tail")
    lock.acquire()
    with hold_file(root, table, "tail").open("ab") as file:
        file.write(b',"the tail of a longer record"]]')
    held = locks.info("tail")
    assert held is not None and held.token == lock.token
    with tierlock.LockManager(f"file://{root}", table=table, reaper_interval=None) as other:
        assert not other.lock("tail").acquire(blocking=False)
    lock.release()


def hold_the_guard(*, path: str, holding: Event) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    holding.set()
    signal.pause()  # until killed


@pytest.mark.multiprocess
def test_a_guard_held_by_a_killed_process_is_free(
    make_file_managers: MakeManager, root: Path, table: str, children: procs.Children
) -> None:
    """A process SIGKILLed while it holds a key's guard (a few system calls long in
    real use) leaves nothing stale: the kernel drops its flock, and the takeover that
    needs the guard goes ahead."""
    holder, waiter = make_file_managers(), make_file_managers()
    lock = holder.lock("guarded", ttl=0.05, renew=False)
    lock.acquire()
    wait_until(lambda: holder.info("guarded").expired, "the lease's end")  # type: ignore[union-attr]
    holding = procs.CTX.Event()
    counter = root / table / (key_name("guarded") + COUNTER)
    child = children.start(hold_the_guard, path=str(counter), holding=holding)
    assert holding.wait(procs.WAIT_LIMIT)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    other = waiter.lock("guarded")
    assert other.acquire(timeout=procs.WAIT_LIMIT)
    assert waiter.stats().takeovers == 1
    other.release()
    with pytest.raises(tierlock.LockLostError):
        lock.release()


def test_a_try_that_created_its_file_waits_for_the_guard_and_wins(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    """A try without waiting that has created the key's file while another holds the
    key's guard (for a few system calls, in real use) waits for the guard and takes the
    key: giving up then would leave its file behind, blocking the key for a lease."""
    counter = root / table / (key_name("busy") + COUNTER)
    guard = os.open(counter, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(guard, fcntl.LOCK_EX)
    lock = locks.lock("busy")
    outcome: list[tuple[bool, int | None]] = []
    checked = threading.Event()

    def try_once() -> None:
        outcome.append((lock.acquire(blocking=False), lock.token))
        if lock.owned():
            checked.wait(procs.WAIT_LIMIT)
            lock.release()

    trying = threading.Thread(target=try_once)
    trying.start()
    try:
        wait_until(hold_file(root, table, "busy").exists, "the try's file")
    finally:
        os.close(guard)
    wait_until(lambda: outcome, "the try's outcome")
    held = locks.info("busy")
    assert outcome == [(True, held and held.token)]
    checked.set()
    trying.join(procs.WAIT_LIMIT)
    assert not hold_file(root, table, "busy").exists()


def test_a_release_on_this_host_rings_a_waiting_pollers_doorbell(
    make_file_managers: MakeManager,
) -> None:
    """A poller's pause ends when the hold file of its key is deleted on this host (by
    inotify), not at its end."""
    holder, waiter = make_file_managers(), make_file_managers()
    lock = holder.lock("bell")
    lock.acquire()
    bell = waiter._backend.doorbell("bell")
    try:
        assert bell.wait(procs.WAIT_LIMIT)  # the watch is on: it rings once for a start
        bell.arm()
        lock.release()
        assert bell.wait(procs.WAIT_LIMIT)
    finally:
        bell.close()
    waiter.close()
    assert "tierlock-watcher" not in {thread.name for thread in threading.enumerate()}


def test_a_holder_learns_that_a_try_elsewhere_wants_its_key(
    make_file_managers: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost try marks the key as wanted; the holder's look takes the mark away and
    says so for ``WANTED_MEMORY`` (tier 1 asks again as the cohort ends), then nothing
    when nobody tried since: a hold then passes on within its process."""
    monkeypatch.setattr(wanting, "WANTED_MEMORY", 1.0)  # (outlasts a loaded machine's pause)
    holder, waiter = make_file_managers(), make_file_managers()
    backend = holder._backend
    with holder.lock("wanted"):
        assert backend.others_waiting("wanted", False) is False
        assert not waiter.lock("wanted").acquire(blocking=False)
        assert backend.others_waiting("wanted", False) is True
        assert backend.others_waiting("wanted", False) is True
        wait_until(lambda: backend.others_waiting("wanted", False) is False, "the memory to end")


def test_want_marks_a_key_for_its_holder(
    make_file_managers: MakeManager, root: Path, table: str
) -> None:
    """``want`` leaves the mark a lost try leaves, even after the holder took that away."""
    holder, trier = make_file_managers(), make_file_managers()
    mark = root / table / (key_name("wanted") + WAITING)
    with holder.lock("wanted"):
        assert not trier.lock("wanted").acquire(blocking=False)
        assert holder._backend.others_waiting("wanted", False) is True
        assert not mark.exists()
        trier._backend.want("wanted", 0.1)
        assert mark.exists()
        wait_until(lambda: holder._backend.others_waiting("wanted", False) is True, "a look")
        assert not mark.exists()


# -- keys and names --------------------------------------------------------------------


@given(st.text(min_size=1, max_size=MAX_KEY_LENGTH), st.text(min_size=1, max_size=MAX_KEY_LENGTH))
def test_distinct_keys_get_distinct_safe_names(first: str, second: str) -> None:
    """Names keep to lowercase letters, digits and ``-_.%``, never start with a dot,
    stay short, and differ for keys that differ (so they differ after case folding)."""
    for key in (first, second):
        name = key_name(key)
        assert set(name) <= set(string.ascii_lowercase + string.digits + "-_.%")
        assert not name.startswith(".")
        assert len(name) <= PLAIN_NAME_LIMIT
    if first != second:
        assert key_name(first) != key_name(second)


def test_keys_that_are_no_file_names_stay_inside_the_directory(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    """Keys that try path traversal, absolute paths, dots, case twins and long twins are
    all held at once, each in a file of its own inside the table's directory."""
    long = "x" * (MAX_KEY_LENGTH - 1)
    keys = [
        "../../escape",
        "/etc/passwd",
        "a/b",
        ".",
        "..",
        ".hidden",
        "Key",
        "key",
        "KEY",
        "%41",
        "A",
        "\\windows\\path",
        "ünïcödé ключ 鍵",
        long + "a",
        long + "b",
        long + "A",
    ]
    held = [locks.lock(key) for key in keys]
    for lock in held:
        assert lock.acquire(blocking=False), lock.key
    assert sorted(info.key for info in locks.holders()) == sorted(keys)
    holds = [name for name in os.listdir(root / table) if name.endswith(HOLD)]
    assert len(holds) == len(keys)
    assert sorted(os.listdir(root)) == [table]  # nothing landed beside it
    for lock in held:
        lock.release()
    assert locks.holders() == []


@pytest.mark.parametrize(
    "url",
    [
        "file://otherhost/locks",
        "file:relative/locks",
        "file:///locks?mode=x",
        "file:///locks#part",
    ],
)
def test_urls_that_name_no_local_directory_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="file://"):
        tierlock.LockManager(url, reaper_interval=None)


def test_a_missing_directory_is_not_made_when_told_not_to(url: str, table: str) -> None:
    with pytest.raises(tierlock.BackendError, match="no lock directory: make it"):
        tierlock.LockManager(url, table=table, create_table=False, reaper_interval=None)


# -- counters and the reaper ----------------------------------------------------------


def test_tokens_rise_after_the_counter_file_is_lost(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    """A key's counter lost (a restart before it reached the disk, or the reaper) does
    not let tokens go down: they also follow the file server's clock."""
    tokens: list[int] = []
    for round_ in range(4):
        if round_ == 3:
            (root / table / (key_name("counted") + COUNTER)).unlink()
        with locks.lock("counted") as lock:
            assert lock.token is not None
            tokens.append(lock.token)
    assert tokens == sorted(set(tokens)), tokens


def test_the_reaper_removes_ended_holds_and_idle_counters(
    locks: tierlock.LockManager, root: Path, table: str
) -> None:
    ended = locks.lock("ended", ttl=0.05, renew=False)
    ended.acquire()
    kept = locks.lock("kept", ttl=30)
    kept.acquire()
    with locks.lock("idle"):
        pass
    wait_until(lambda: locks.info("ended").expired, "the lease's end")  # type: ignore[union-attr]
    directory = root / table
    idle_counter = directory / (key_name("idle") + COUNTER)
    backdate(idle_counter, COUNTER_LIFE / 1000 + 60)
    assert locks.reap() == 1
    assert not hold_file(root, table, "ended").exists()
    assert not idle_counter.exists()
    assert hold_file(root, table, "kept").exists()
    assert (directory / (key_name("kept") + COUNTER)).exists()
    with pytest.raises(tierlock.LockLostError):
        ended.release()
    kept.release()


# -- one directory, two mount points -------------------------------------------------


@contextlib.contextmanager
def second_mount(directory: Path, mount_point: Path) -> Iterator[None]:
    """``directory`` also reachable at ``mount_point`` (a bind mount: this kernel has
    no NFS client to mount a share through a network namespace)."""
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "--bind", str(directory), str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        reason = f"cannot bind-mount a directory here: {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    try:
        yield
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_processes_through_two_mount_points_of_one_directory_exclude_each_other(
    tmp_path: Path, table: str, children: procs.Children
) -> None:
    """Four processes of four threads on a few keys, two processes naming the directory
    by one mount point and two by another: no section overlaps another, and a hold
    taken through one mount point shows through the other."""
    shared, other = tmp_path / "shared", tmp_path / "other"
    shared.mkdir()
    with second_mount(shared, other):
        urls = [f"file://{shared}", f"file://{other}"]
        keys = [f"key:{n}" for n in range(3)]
        tally = procs.Tally(len(keys))
        start = procs.CTX.Barrier(4 * 4)
        for number in range(4):
            children.start(
                procs.hammer,
                url=urls[number % 2],
                table=table,
                keys=keys,
                tally=tally,
                threads=4,
                sections=SECTIONS,
                start=start,
            )
        children.join()
        assert sum(tally.entries) == 4 * 4 * SECTIONS
        assert list(tally.most_inside) == [1 if entries else 0 for entries in tally.entries]
        assert list(tally.counters) == list(tally.entries)
        with (
            tierlock.LockManager(urls[0], table=table, reaper_interval=None) as one,
            tierlock.LockManager(urls[1], table=table, reaper_interval=None) as two,
            one.lock("seen"),
        ):
            assert [info.key for info in two.holders()] == ["seen"]
            assert not two.lock("seen").acquire(blocking=False)
