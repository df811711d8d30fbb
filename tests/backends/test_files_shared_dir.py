"""One lock directory shared by several users: whoever comes first, the directories and
files the lock-file engine makes take the group and other permissions of the lock
directory (and its setgid group), whatever the umask, so that the next user opens a
manager on it and locks the same keys, and takes over what a dead holder of another
user left.

Each user is a forked child that drops root after everything is imported: an
unprivileged user may be unable to read this Python's installation.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import procs
import pytest

import tierlock
from tierlock.backends.files.names import HOLD, MAKING, key_name
from tierlock.backends.files.reaping import MAKING_LIFE

pytestmark = [pytest.mark.file, pytest.mark.multiprocess]

TABLE = "tierlock_locks"  # (the default)
TEAM = 4242  # a group with no name, shared by the team's users
LEFT = "left"  # each user dies holding it; the next takes it over
LEFT_WITHIN = 10.0  # seconds: a dead holder on this host is taken over at once


class User(NamedTuple):
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


ROOT = User(0, 0)
NOBODY = User(65534, 65534)
OTHER = User(65533, 65533)  # a second unprivileged user, with no name
NOBODY_IN_TEAM = NOBODY._replace(groups=(TEAM,))
OTHER_IN_TEAM = OTHER._replace(groups=(TEAM,))


class Case(NamedTuple):
    mode: int  # of the lock directory
    group: int  # of the lock directory
    users: tuple[User, ...]  # in turn
    directory_mode: int  # expected of the directory the engine makes in it
    file_mode: int  # expected of every file the engine makes


CASES = {
    "0777-root-first": Case(0o777, 0, (ROOT, NOBODY, ROOT), 0o777, 0o666),
    "0777-unprivileged-first": Case(0o777, 0, (NOBODY, ROOT, NOBODY), 0o777, 0o666),
    # A team's directory: the setgid bit and the group go on down, others get nothing.
    "2770-setgid-team": Case(
        0o2770, TEAM, (NOBODY_IN_TEAM, OTHER_IN_TEAM, NOBODY_IN_TEAM), 0o2770, 0o660
    ),
    # As /tmp: the sticky bit stays on the lock directory, or nobody could take over
    # another user's hold.
    "1777-sticky": Case(0o1777, 0, (NOBODY, OTHER, NOBODY), 0o777, 0o666),
}


@pytest.fixture
def lock_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own are root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    path = Path(tempfile.mkdtemp(prefix="tierlock-shared-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def become(user: User) -> None:
    """Go on as ``user``, with the usual umask 022."""
    codecs.lookup("ascii")  # (loaded on first use, from the installation)
    os.setgroups(list(user.groups))
    os.setgid(user.gid)
    os.setuid(user.uid)
    os.umask(0o022)


def take_turn(user: User, url: str, keys: list[str]) -> None:
    """As ``user``: open a manager, take and release each of ``keys``, take over
    ``LEFT`` from the dead holder before (if any), then die holding it."""
    become(user)
    locks = tierlock.LockManager(url, reaper_interval=None, poll_interval=0.01)
    for key in keys:
        with locks.lock(key) as lock:
            assert lock.owned()
    assert locks.lock(LEFT).acquire(timeout=LEFT_WITHIN)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_users_in_turn_share_one_lock_directory(
    case: Case, lock_dir: Path, children: procs.Children
) -> None:
    """Each user in turn locks a key all share and the keys of every user before, so
    each writes counters others made, and takes over the hold the one before left."""
    os.chown(lock_dir, 0, case.group)
    os.chmod(lock_dir, case.mode)
    url = f"file://{lock_dir}"
    for turn, user in enumerate(case.users):
        keys = ["shared", *(f"own:{each}" for each in range(turn + 1))]
        child = children.start(take_turn, user=user, url=url, keys=keys)
        child.join(procs.WAIT_LIMIT)
        failures = children.failures()
        assert not failures, f"user {user.uid}:\n" + "\n".join(failures)
        assert child.exitcode == -signal.SIGKILL, f"user {user.uid}: {child.exitcode}"
        children.forget(child)
    table = lock_dir / TABLE
    status = table.stat()
    assert oct(stat.S_IMODE(status.st_mode)) == oct(case.directory_mode)
    assert status.st_gid == case.group or not case.mode & stat.S_ISGID
    files = list(table.iterdir())
    assert len(files) > len(case.users)  # counters, the clock, the last hold
    for path in files:
        status = path.lstat()
        assert stat.S_ISREG(status.st_mode), path
        assert oct(stat.S_IMODE(status.st_mode)) == oct(case.file_mode), path
        assert status.st_gid == case.group or not case.mode & stat.S_ISGID, path
    assert {path.lstat().st_uid for path in files} == {user.uid for user in case.users}


def try_unreadable(user: User, url: str, key: str) -> None:
    """As ``user``: a try for ``key``, whose hold file this user may not read, fails
    with the reason instead of taking the file for one left half written."""
    become(user)
    with (
        tierlock.LockManager(url, reaper_interval=None) as locks,
        pytest.raises(tierlock.BackendError, match="Permission denied"),
    ):
        locks.lock(key).acquire(blocking=False)


def test_a_hold_file_another_user_may_not_read_is_never_taken_over(
    lock_dir: Path, children: procs.Children
) -> None:
    """One that stays unreadable (its mode set by hand, say) past the wait for its
    maker to give it its mode is an error, even once its lease has ended."""
    os.chmod(lock_dir, 0o777)
    url = f"file://{lock_dir}"
    with tierlock.LockManager(url, reaper_interval=None) as locks:
        lock = locks.lock("hidden", ttl=30, renew=False)
        assert lock.acquire()
        hold = lock_dir / TABLE / (key_name("hidden") + HOLD)
        hold.chmod(0o600)
        stamp = hold.stat().st_mtime_ns - 60 * 10**9  # (its lease ended 30 s ago)
        os.utime(hold, ns=(stamp, stamp))
        children.start(try_unreadable, user=NOBODY, url=url, key="hidden")
        children.join()
        assert hold.stat().st_mtime_ns == stamp
        lock.release()


def test_the_reaper_removes_files_whose_making_was_cut_short(lock_dir: Path) -> None:
    """A file being made is linked into place at once: one left an hour is debris."""
    with tierlock.LockManager(f"file://{lock_dir}", reaper_interval=None) as locks:
        left, young = (lock_dir / TABLE / (MAKING + name) for name in ("left", "young"))
        left.touch()
        young.touch()
        stamp = left.stat().st_mtime_ns - (MAKING_LIFE + 60_000) * 1_000_000
        os.utime(left, ns=(stamp, stamp))
        locks.reap()
        assert not left.exists()
        assert young.exists()
