"""The exclusive insert with the process's own values written into its SQL: it stores
the same row as the insert that sends them all, for any host name (those that are not
plain text still go as parameters), and a forked child's rows name the child."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import procs
import pytest
from conftest import SQL_DATABASES, MakeManager

import tierlock
from tierlock import process
from tierlock.backends.sql.columns import plain
from tierlock.records import _hostname

# Host names that must reach the row as they are: plain text, and text with a quote, a
# percent sign, a backslash, a question mark, a named placeholder or non-ASCII.
HOSTS = [
    "build-7.example_org",
    "o'brien",
    "100%s%%",
    "back\\slash",
    "why?",
    ":key",
    "hôte",
]


@pytest.fixture
def fresh_hostname() -> Iterator[None]:
    """The host name is read once per process; read it again in this test and after."""
    _hostname.cache_clear()
    yield
    _hostname.cache_clear()


@pytest.mark.parametrize("text", ["", "host-1.example", "a/b:c_d"])
def test_plain_text_is_written_into_the_sql(text: str) -> None:
    assert str(plain(text)) == f"'{text}'"


@pytest.mark.parametrize("text", ["o'brien", "100%", "a\\b", "why?", "hôte", "a b", "x\x00"])
def test_other_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not plain text"):
        plain(text)


@SQL_DATABASES
@pytest.mark.usefixtures("fresh_hostname")
@pytest.mark.parametrize("host", HOSTS)
def test_a_hold_s_row_names_its_host_and_process(
    make_manager: MakeManager, key: str, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    manager = make_manager()
    with manager.lock(key):
        info = manager.info(key)
        assert info is not None
        assert (info.host, info.pid, info.mode) == (host, os.getpid(), "exclusive")
        assert (info.host_id, info.process_start) == (
            process.host_identity(),
            process.own_start_time(),
        )
    assert manager.info(key) is None


def _hold_and_tell(
    *, manager: tierlock.LockManager, key: str, told: Connection[Any, Any], go: Event
) -> None:
    """In a forked child: hold ``key`` with the inherited ``manager`` until ``go``,
    having sent this process's start time."""
    with manager.lock(key, timeout=procs.WAIT_LIMIT):
        told.send(process.own_start_time())
        assert go.wait(procs.HOLD_LIMIT)


@SQL_DATABASES
@pytest.mark.multiprocess
def test_a_forked_child_s_rows_name_the_child(
    make_manager: MakeManager, key: str, children: procs.Children
) -> None:
    """The parent's insert, with its pid in the SQL, is not the child's."""
    manager = make_manager()
    with manager.lock(key + ":parent"):  # (the parent's statement is made now)
        pass
    reader, writer = procs.CTX.Pipe(duplex=False)
    go = procs.CTX.Event()
    child = children.start(_hold_and_tell, manager=manager, key=key + ":child", told=writer, go=go)
    try:
        assert reader.poll(procs.WAIT_LIMIT), "the child did not take its lock"
        started = reader.recv()
        info = manager.info(key + ":child")
        assert info is not None
        assert (info.pid, info.process_start) == (child.pid, started)
    finally:
        go.set()
    children.join()
    assert manager.info(key + ":child") is None
