"""Same-host reclaim only on proof of death, with real holder processes.

A waiter on its holder's host takes a row over before the lease ends only when it can
prove the holder process gone. A live holder whose ``/proc`` entry looks odd to the
waiter keeps its row: hidden by ``hidepid`` from a waiter of another user, with a start
time that the holder's time namespace shifts, or a zombie leader whose other threads run
on. A killed holder's row is still taken at once, long before its lease ends. Holders,
and the waiter that cannot see them, are programs of their own (see reclaim_peers),
started in namespaces of their own.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import procs
import pytest
from conftest import SQL_DATABASES, MakeManager
from polling import wait_until
from reclaim_peers import MOUNT_HIDDEN_PROC

import tierlock
from tierlock import process

pytestmark = pytest.mark.multiprocess


PEERS = Path(__file__).with_name("reclaim_peers.py")
LEASE = 30.0  # a holder's: no test waits it out
# How long a waiter tries to take a live holder's key: far below the lease, and far
# above the milliseconds a reclaim takes.
GIVE_UP = 1.5
# How soon a dead holder's key must be taken: at once, with room for a loaded machine.
RECLAIM_LIMIT = 5.0
SHIFT = 100000  # seconds, how far a time namespace's clocks are ahead
IN_A_TIME_NAMESPACE = ("unshare", "--time", "--boottime", str(SHIFT), "--monotonic", str(SHIFT))
# unshare(2)'s flag for a new time namespace, which the caller's children are born into.
CLONE_NEWTIME = 0x80


@functools.cache
def _runs(command: tuple[str, ...]) -> bool:
    try:
        done = subprocess.run(command, capture_output=True, check=False, timeout=procs.WAIT_LIMIT)
    except OSError:
        return False
    return done.returncode == 0


def require(what: str, command: tuple[str, ...]) -> None:
    """Skip the test unless this machine, as root, runs ``command``; under CI=true, fail."""
    if os.geteuid() == 0 and _runs(command):
        return
    reason = f"this machine cannot {what} (as root: {' '.join(command)})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def read(program: subprocess.Popen[str]) -> dict[str, Any]:
    """The next report (a JSON line) of ``program``; a hang or an early end fails."""
    assert program.stdout is not None
    ready, _, _ = select.select([program.stdout], [], [], procs.WAIT_LIMIT)
    assert ready, f"no report from program {program.pid} in {procs.WAIT_LIMIT:g} s"
    line = program.stdout.readline()
    assert line, f"program {program.pid} ended with {program.wait(procs.WAIT_LIMIT)}"
    report: dict[str, Any] = json.loads(line)
    return report


class Holder:
    """A running ``reclaim_peers.py hold``, inside its critical section."""

    def __init__(self, program: subprocess.Popen[str]) -> None:
        self.program = program
        report = read(program)
        self.pid: int = report["pid"]
        self.token: int = report["token"]
        assert self.pid == program.pid  # (the program holds, not a child of it)

    def owns(self) -> bool:
        """What ``owned()`` says in the holder now."""
        assert self.program.stdin is not None
        self.program.stdin.write("\n")
        self.program.stdin.flush()
        return bool(read(self.program)["owned"])


class Programs:
    """The programs of one test; any still running at the end are killed."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *command: str) -> subprocess.Popen[str]:
        program = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.started.append(program)
        return program

    def hold(
        self, url: str, table: str, key: str, *prefix: str, leader_exits: bool = False
    ) -> Holder:
        """A holder of ``key``, run after ``prefix`` (``unshare ...``)."""
        options = ["--leader-exits"] if leader_exits else []
        return Holder(
            self.start(
                *prefix, sys.executable, str(PEERS), "hold", url, table, key, str(LEASE), *options
            )
        )

    def end_all(self) -> None:
        for program in self.started:
            if program.poll() is None:
                program.kill()
            program.communicate(timeout=procs.WAIT_LIMIT)


@pytest.fixture
def programs() -> Iterator[Programs]:
    started = Programs()
    try:
        yield started
    finally:
        started.end_all()


@pytest.fixture
def open_url(db: str, db_url: str) -> Iterator[str]:
    """``db_url``, where user nobody may take locks too: on SQLite, a database file
    that anyone may write, in a directory that anyone may write (for its journal)."""
    if db != "sqlite":
        yield db_url
        return
    directory = Path(tempfile.mkdtemp(prefix="tierlock-open-"))
    try:
        directory.chmod(0o777)
        database = directory / "locks.db"
        database.touch()
        database.chmod(0o666)  # (its journal files get its mode)
        yield f"sqlite:///{database}"
    finally:
        shutil.rmtree(directory)


def assert_lives_on(manager: tierlock.LockManager, key: str, holder: Holder) -> None:
    """A waiter here cannot take ``key`` from ``holder``, who still holds it."""
    assert not manager.lock(key).acquire(timeout=GIVE_UP), "a live holder's row was taken"
    assert_still_held(manager, key, holder)


def assert_still_held(manager: tierlock.LockManager, key: str, holder: Holder) -> None:
    row = manager.info(key)
    assert row is not None and (row.pid, row.token) == (holder.pid, holder.token)
    assert holder.owns()


def assert_reclaimed_at_once(manager: tierlock.LockManager, key: str, holder: Holder) -> None:
    """A waiter here takes ``key`` from the dead ``holder`` long before its lease ends."""
    lock = manager.lock(key)
    assert lock.acquire(timeout=RECLAIM_LIMIT), "a dead holder's row was not taken at once"
    row = manager.info(key)
    lock.release()
    assert row is not None and row.pid == os.getpid() and row.token > holder.token
    assert manager.stats().reclaims == 1


@SQL_DATABASES
def test_a_holder_in_another_time_namespace_is_judged_by_its_pid_alone(
    make_manager: MakeManager, db_url: str, table: str, key: str, programs: Programs
) -> None:
    """Its start time as it reads it (and records it) is not what a waiter outside its
    time namespace reads: that is no sign of a reused pid. Its death still is proof."""
    require("start a process in a time namespace", (*IN_A_TIME_NAMESPACE, "true"))
    manager = make_manager()
    holder = programs.hold(db_url, table, key, *IN_A_TIME_NAMESPACE)
    row = manager.info(key)
    assert row is not None and row.process_start is not None
    assert row.process_start != process.start_time(holder.pid)  # (shifted by SHIFT)
    assert_lives_on(manager, key, holder)
    holder.program.kill()
    holder.program.wait(procs.WAIT_LIMIT)
    assert_reclaimed_at_once(manager, key, holder)


@SQL_DATABASES
def test_a_holder_whose_main_thread_ended_lives_on_in_its_other_threads(
    make_manager: MakeManager, db_url: str, table: str, key: str, programs: Programs
) -> None:
    """Its leader is a zombie while its holding thread runs: it is alive. Killed, it is
    gone at once, before anyone reaps it."""
    manager = make_manager()
    holder = programs.hold(db_url, table, key, leader_exits=True)
    wait_until(lambda: procs.process_state(holder.pid) == "Z", "the holder's main thread to end")
    assert_lives_on(manager, key, holder)
    holder.program.kill()
    os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)  # (a zombie, not yet reaped)
    assert_reclaimed_at_once(manager, key, holder)


@SQL_DATABASES
def test_a_holder_hidden_by_hidepid_is_not_taken_for_dead(
    make_manager: MakeManager, open_url: str, table: str, key: str, programs: Programs
) -> None:
    """A waiter of another user, whose ``/proc`` hides the holder, takes nothing from a
    live holder; once the holder is dead, it takes the row at once."""
    require(
        "mount /proc with hidepid=2 in a mount namespace",
        ("unshare", "--mount", *MOUNT_HIDDEN_PROC),
    )
    manager = make_manager(url=open_url)
    holder = programs.hold(open_url, table, key)

    def hidden_waiter() -> dict[str, Any]:
        waiter = programs.start(
            "unshare", "--mount", sys.executable, str(PEERS), "wait",
            open_url, table, key, str(GIVE_UP), str(holder.pid),
        )  # fmt: skip
        report = read(waiter)
        assert waiter.wait(procs.WAIT_LIMIT) == 0
        return report

    assert hidden_waiter() == {"acquired": False, "reclaims": 0, "sees_holder": False}
    assert_still_held(manager, key, holder)
    holder.program.kill()
    holder.program.wait(procs.WAIT_LIMIT)  # (reaped: a zombie would still answer kill())
    assert hidden_waiter() == {"acquired": True, "reclaims": 1, "sees_holder": False}


def _fork_in_a_new_time_namespace(results: Connection[Any, Any], release: Event) -> None:
    """In a child: make a time namespace whose boot-time clock is ``SHIFT`` seconds
    ahead, fork into it, and have the grandchild send back its identity, pid and own
    start time; it exits once ``release`` is set."""
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWTIME) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWTIME) failed")
    with open("/proc/self/timens_offsets", "w", encoding="ascii") as offsets:
        offsets.write(f"boottime {SHIFT} 0\n")
    grandchild = os.fork()
    if grandchild == 0:
        try:
            results.send((process.host_identity(), os.getpid(), process.own_start_time()))
            release.wait(procs.HOLD_LIMIT)
        finally:
            os._exit(0)  # (never back into the child's own code)
    os.waitpid(grandchild, 0)


def test_a_child_forked_into_another_time_namespace_names_that_one(
    children: procs.Children,
) -> None:
    """The identity is this process's own, not its parent's: a child born into another
    time namespace records that one, and so its start time as it reads it, shifted,
    is never compared with what this process reads."""
    require("start a process in a time namespace", (*IN_A_TIME_NAMESPACE, "true"))
    here = process.host_identity()  # (the forked children inherit it, worked out)
    assert here is not None
    received, sent = procs.CTX.Pipe(duplex=False)
    release = procs.CTX.Event()
    children.start(_fork_in_a_new_time_namespace, results=sent, release=release)
    assert received.poll(procs.WAIT_LIMIT), "no word from the grandchild"
    identity, pid, started = received.recv()
    assert identity.split("/")[:2] == here.split("/")[:2]
    assert identity != here
    assert started != process.start_time(pid)  # (as it reads it: SHIFT seconds more)
    assert not process.is_gone(identity, pid, started)
    release.set()
    children.join()
    assert process.is_gone(identity, pid, started)
