"""What makes a holder process provably gone: its pid and start time on this host."""

from __future__ import annotations

import os
import signal

import procs
import pytest

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
