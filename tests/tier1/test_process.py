"""What makes a holder process provably gone: its pid and start time on this host."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from multiprocessing.synchronize import Event

import procs
import pytest
from polling import wait_until

from tierlock import process


def test_a_live_process_is_not_gone() -> None:
    started = process.own_start_time()
    assert started is not None
    assert process.start_time(os.getpid()) == started
    assert not process.is_gone(process.host_identity(), os.getpid(), started)


def test_an_exited_process_is_gone_even_before_it_is_reaped(
    children: procs.Children,
) -> None:
    child = children.start(procs.CTX.Event().wait)  # (waits until killed)
    assert child.pid is not None
    started = process.start_time(child.pid)
    assert started is not None
    host = process.host_identity()
    assert not process.is_gone(host, child.pid, started)
    assert not process.is_gone(host, child.pid, None)  # unknown start: never judged
    assert not process.is_gone("another host", child.pid, started + 1)
    assert process.is_gone(host, child.pid, started + 1)  # the pid of a younger one
    os.kill(child.pid, signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not yet reaped
    assert process.start_time(child.pid) is None
    assert process.is_gone(host, child.pid, started)
    child.join()
    assert process.is_gone(host, child.pid, started)


def test_a_failed_read_proves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a missing process counts as gone: a read that fails (too many open files,
    say) must never let a waiter take a live holder's row."""

    def no_files(*args: object, **kwargs: object) -> object:
        raise OSError(24, "Too many open files")

    started = process.own_start_time()
    monkeypatch.setattr("builtins.open", no_files)
    with pytest.raises(process.Unknown):
        process.start_time(os.getpid())
    assert not process.is_gone(process.host_identity(), os.getpid(), started)


def test_the_identity_names_the_boot_and_the_pid_and_time_namespaces() -> None:
    """Start times are read through the reader's time namespace: the identity says
    which one read the row's."""
    with open(process.BOOT_ID, encoding="ascii") as file:
        boot = file.read().strip()
    pids = os.stat(process.PID_NAMESPACE).st_ino
    clocks = os.stat(process.TIME_NAMESPACE).st_ino
    identity = process.host_identity()
    assert identity == f"{boot}/{pids}/{clocks}"
    assert len(identity) <= 64  # (the host_id column's size)


def test_a_start_time_is_compared_only_within_one_time_namespace(
    children: procs.Children,
) -> None:
    """From another time namespace, or from a row of a version that did not name one,
    a start time that differs proves nothing; a pid that no process has still does.
    A row of another pid namespace proves nothing either way."""
    child = children.start(procs.CTX.Event().wait)  # (waits until killed)
    assert child.pid is not None
    started = process.start_time(child.pid)
    assert started is not None
    here = process.host_identity()
    assert here is not None
    boot, pids, clocks = here.split("/")
    elsewhen, older, elsewhere = f"{boot}/{pids}/1", f"{boot}/{pids}", f"{boot}/1/{clocks}"
    for host in (elsewhen, older, elsewhere):
        assert not process.is_gone(host, child.pid, started + 1)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert process.is_gone(elsewhen, child.pid, started)
    assert process.is_gone(older, child.pid, started)
    assert not process.is_gone(elsewhere, child.pid, started)


def _end_the_main_thread(may_end: Event) -> None:
    """In a child: another thread waits until killed; the main thread ends once
    ``may_end`` is set (ctypes lets go of the interpreter for the call)."""
    threading.Thread(target=threading.Event().wait).start()
    may_end.wait(procs.HOLD_LIMIT)
    ctypes.CDLL(None).pthread_exit(None)


def test_a_process_whose_main_thread_ended_lives_on_in_its_other_threads(
    children: procs.Children,
) -> None:
    """Its leader is a zombie, which alone proves nothing: the process is gone once
    no thread of it is left, even before it is reaped."""
    may_end = procs.CTX.Event()
    pid = children.start(_end_the_main_thread, may_end=may_end).pid
    assert pid is not None
    started = process.start_time(pid)
    assert started is not None
    host = process.host_identity()
    may_end.set()
    wait_until(lambda: procs.process_state(pid) == "Z", "the child's main thread to end")
    assert process.start_time(pid) == started
    assert not process.is_gone(host, pid, started)
    os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie, not yet reaped
    assert process.start_time(pid) is None
    assert process.is_gone(host, pid, started)
