"""Watching the lock table: ``tierlock ls --json`` as a script reads it, and
``tierlock top`` in a pseudo-terminal, as a person runs it: rich draws as it does on a
screen, and Ctrl-C reaches the command through the terminal."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pexpect
import procs
import pytest
from conftest import SERVERS, MakeManager
from engines import keeps_expired
from polling import wait_until
from proxy import Proxy
from sqlalchemy import text
from sqlalchemy.engine import Engine, make_url
from test_cli import invoke
from test_cli_program import console_script

import tierlock
from tierlock.process import host_identity, own_start_time

Spawn = Callable[..., pexpect.spawn]

# Rich's control sequences: colours and styles, cursor moves and visibility.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RED = "\x1b[31m"
SHOW_CURSOR = "\x1b[?25h"
# Wide enough that no row folds.
SIZE = (50, 250)


@pytest.fixture
def spawn_top() -> Iterator[Spawn]:
    """Start ``tierlock --url URL --table NAME top ARGS...`` in a pseudo-terminal;
    whatever the test leaves running is killed."""
    started: list[pexpect.spawn] = []

    def spawn(url: str, table: str, *args: str) -> pexpect.spawn:
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")
        }
        env["TERM"] = "xterm-256color"
        child = pexpect.spawn(
            console_script(),
            ["--url", url, "--table", table, "top", *args],
            env=env,
            dimensions=SIZE,
            encoding="utf-8",
            # Ctrl-C makes the terminal drop the output it has not delivered yet, which
            # may cut a character of the table's lines in two.
            codec_errors="replace",
            timeout=procs.WAIT_LIMIT,
        )
        started.append(child)
        return child

    yield spawn
    for child in started:
        if child.isalive():
            child.terminate(force=True)


def finish(child: pexpect.spawn) -> str:
    """What ``child`` printed until it exited, which it must have done with 0."""
    child.expect(pexpect.EOF)
    child.close()
    assert (child.exitstatus, child.signalstatus) == (0, None), child.before
    assert "Traceback" not in child.before
    before: str = child.before
    return before


def expired(locks: tierlock.LockManager, key: str) -> bool:
    info = locks.info(key)
    return info is not None and info.expired


def shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def test_ls_json_gives_every_field_of_every_row(
    make_manager: MakeManager, db_url: str, table: str, key: str, db: str
) -> None:
    locks = make_manager()
    target = ("--url", db_url, "--table", table)
    empty = invoke(*target, "ls", "--json")
    assert empty.exit_code == 0, empty.output
    assert json.loads(empty.stdout) == []

    shown_expired = keeps_expired(db)  # (Redis deletes a hold when its lease ends)
    live = locks.lock(key + ":live", ttl=30)
    stale = locks.lock(key + ":stale", ttl=0.2 if shown_expired else 30, renew=False)
    assert live.acquire(timeout=procs.WAIT_LIMIT)
    assert stale.acquire(timeout=procs.WAIT_LIMIT)
    if shown_expired:
        wait_until(lambda: expired(locks, stale.key), "the fixed lease to end")
    result = invoke(*target, "ls", "--json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [record["key"] for record in records] == [live.key, stale.key]
    for record, lock, lease in zip(records, (live, stale), (30.0, None), strict=True):
        info = locks.info(lock.key)
        assert info is not None
        assert set(record) == {
            *("key", "token", "owner", "host", "pid", "thread_id", "thread_name"),
            *("acquired_at", "expires_at", "expired", "lease", "host_id", "process_start"),
            *("mode", "holder_gone"),
        }
        assert record["token"] == lock.token
        assert record["owner"] == info.owner
        assert record["host"] == socket.gethostname()
        assert record["pid"] == os.getpid()
        assert record["thread_id"] == threading.get_ident()
        assert record["thread_name"] == threading.current_thread().name
        for name in ("acquired_at", "expires_at"):
            moment = datetime.fromisoformat(record[name])
            assert moment == getattr(info, name)
            assert moment.utcoffset() == timedelta(0)
        assert record["expired"] is (lock is stale and shown_expired)
        assert record["lease"] == lease
        assert record["host_id"] == host_identity()
        assert record["process_start"] == own_start_time()
        assert record["holder_gone"] is False  # (this process)
    live.release()
    if shown_expired:
        with pytest.raises(tierlock.LockLostError):  # its lease ran out: reported as lost
            stale.release()
    else:
        stale.release()


@pytest.mark.keeps_expired
@pytest.mark.multiprocess
def test_once_shows_the_holders_and_marks_expired_rows(
    make_manager: MakeManager, spawn_top: Spawn, db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    live = locks.lock(key + ":live", ttl=30)
    stale = locks.lock(key + ":stale", ttl=0.2, renew=False)  # as a dead holder leaves it
    assert live.acquire(timeout=procs.WAIT_LIMIT)
    assert stale.acquire(timeout=procs.WAIT_LIMIT)
    wait_until(lambda: expired(locks, stale.key), "the fixed lease to end")

    out = finish(spawn_top(db_url, table, "--once"))
    plain = ANSI.sub("", out)
    header = plain.splitlines()[0]
    assert header.startswith(f"tierlock top · 2 lock(s) in {table} at {shown(db_url)} · ")
    assert re.search(r" · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$", header), header
    assert "Ctrl-C" not in plain  # one frame: nothing to quit
    host, pid, thread = socket.gethostname(), os.getpid(), threading.current_thread().name
    for lock, lease, renewal in ((live, r"\d+\.\d s", "30.0 s"), (stale, "expired", "fixed")):
        cells_shown = (lock.key, "exclusive", str(lock.token), host, str(pid), thread)
        cells = [*map(re.escape, cells_shown), r"[\d.]+ s"]
        assert re.search("│ +" + " +│ +".join([*cells, lease, renewal]) + " +│", plain), plain
    assert "1 expired: free to take" in plain
    assert RED + stale.key in out
    assert RED + live.key not in out
    live.release()
    with pytest.raises(tierlock.LockLostError):  # its lease ran out: reported as lost
        stale.release()


@pytest.mark.multiprocess
def test_live_view_shows_new_holds_and_quits_on_ctrl_c(
    make_manager: MakeManager, spawn_top: Spawn, db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    first = locks.lock(key + ":first")
    assert first.acquire(timeout=procs.WAIT_LIMIT)
    child = spawn_top(db_url, table, "--interval", "0.1")
    child.expect_exact(f"1 lock(s) in {table}")
    child.expect_exact("every 0.1 s, Ctrl-C quits")
    child.expect_exact(first.key)

    second = locks.lock(key + ":second")  # taken once the view is up
    assert second.acquire(timeout=procs.WAIT_LIMIT)
    child.expect_exact(f"2 lock(s) in {table}")
    child.expect_exact(second.key)

    child.sendintr()
    out = finish(child)
    assert out.rstrip("\r\n").endswith(SHOW_CURSOR), repr(out[-200:])  # the cursor is back
    first.release()
    second.release()


@pytest.mark.multiprocess
def test_live_view_shows_a_dropped_table_and_carries_on(
    make_manager: MakeManager, spawn_top: Spawn, engine: Engine, db_url: str, table: str
) -> None:
    make_manager()  # makes the table
    child = spawn_top(db_url, table, "--interval", "0.1")
    child.expect_exact(f"0 lock(s) in {table}")

    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE {table}"))
    child.expect_exact(f"table {table} does not exist in {shown(db_url)}; run `tierlock init`")
    child.expect_exact("trying again every 0.1 s; last read at ")

    assert invoke("--url", db_url, "--table", table, "init").exit_code == 0
    child.expect_exact(f"0 lock(s) in {table}")
    child.kill(signal.SIGTERM)
    finish(child)


@pytest.mark.multiprocess
@SERVERS
def test_live_view_outlives_the_server(
    proxy: Proxy,
    make_manager: MakeManager,
    spawn_top: Spawn,
    db_url: str,
    table: str,
    key: str,
) -> None:
    locks = make_manager()
    lock = locks.lock(key)
    assert lock.acquire(timeout=procs.WAIT_LIMIT)
    url = make_url(db_url).set(host="127.0.0.1", port=proxy.port)
    if url.get_backend_name() == "postgresql":
        url = url.update_query_dict({"sslmode": "disable"})
    child = spawn_top(url.render_as_string(hide_password=False), table, "--interval", "0.1")
    child.expect_exact(key)

    proxy.refuse_all()
    child.expect_exact("cannot reach the database")
    child.expect_exact("trying again every 0.1 s")

    proxy.accept_new()
    child.expect_exact(f"1 lock(s) in {table}")
    child.expect_exact(key)
    child.sendintr()
    finish(child)
    lock.release()


@pytest.mark.postgresql
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_once_hides_the_password(make_manager: MakeManager, db_url: str, table: str) -> None:
    make_manager()
    # The server trusts local connections, so any password will do.
    url = make_url(db_url).set(password="secret").render_as_string(hide_password=False)
    result = invoke("--url", url, "--table", table, "top", "--once")
    assert result.exit_code == 0, result.output
    assert f"0 lock(s) in {table} at {shown(url)}" in result.stdout
    assert ":***@" in result.stdout
    assert "secret" not in result.stdout
