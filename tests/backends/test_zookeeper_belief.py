"""How late a ZooKeeper holder learns that its holds are gone, and what a server
restart costs it.

Belief in a hold ends with its session's promise (the last request the server
answered, sent then, plus the session's timeout), whatever the hold's lease: a holder
cut off from the server, or stopped, stops believing before the server expires its
session and another process can take the key. A handshake that the server never
answers (ZooKeeper takes connections while it starts) is abandoned for another
connection within seconds, so a restart costs seconds and a session that survives it
keeps its holds.

On real servers: the shared one at 127.0.0.1:2181, and private ones (``zk_servers``)
for restarts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import procs
import pytest
from conftest import managers
from engines import drop_namespace, require_server
from polling import wait_until
from proxy import Proxy
from servers import ServerUnavailable
from zk_servers import ZooKeeperServer

import tierlock

pytestmark = pytest.mark.zookeeper

MakeManager = Callable[..., tierlock.LockManager]

HOSTS = "127.0.0.1:2181"
URL = f"zookeeper://{HOSTS}/tierlock"
# The shortest session the server grants (two ticks of 2 s).
SESSION = 4.0
# The server expires sessions at its ticks: up to one tick after their timeout.
TICK = 2.0
SLACK = 5.0  # room for a loaded machine in upper bounds
# Leases longer than the session, renewed and fixed: the session bounds both.
LONG_LEASES = pytest.mark.parametrize(
    "lease", [{"ttl": 30.0}, {"ttl": 15.0, "renew": False}], ids=["renewed", "fixed"]
)
# The longest a handshake waits for its answer before it is tried again elsewhere.
HANDSHAKE = 2.0
# A session that outlives any restart of a private server (which takes a second or
# two) plus a handshake tried again.
RESTART_SESSION = 20.0
# Restarts under one hold.
RESTARTS = 30


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def namespace() -> Iterator[str]:
    """A table of this test's own on the shared server, deleted afterwards."""
    require_server(URL)
    table = f"tl_{uuid.uuid4().hex[:16]}"
    yield table
    drop_namespace(URL, table)


@pytest.fixture
def make_manager(namespace: str) -> Iterator[MakeManager]:
    """Make managers on this test's namespace; all are closed afterwards."""
    with managers(URL, namespace) as make:
        yield make


@pytest.fixture
def zk_proxy(namespace: str) -> Iterator[Proxy]:
    """The fault proxy in front of the shared server (closed after the managers)."""
    proxy = Proxy(("127.0.0.1", 2181))
    yield proxy
    proxy.close()


def _private_server(root: Path) -> ZooKeeperServer:
    try:
        return ZooKeeperServer(root)
    except ServerUnavailable as exc:
        _fail_or_skip(str(exc))
        raise


def _taken(manager: tierlock.LockManager, key: str) -> float:
    """Hold ``key`` through ``manager`` as soon as the server lets it: the
    ``time.monotonic()`` reading once it is held (the hold stays until the manager
    closes)."""
    assert manager.lock(key).acquire(timeout=SESSION + TICK + SLACK)
    return time.monotonic()


# -- belief ends with the session -------------------------------------------------------


@pytest.mark.slow
@LONG_LEASES
def test_a_cut_off_holder_stops_believing_before_another_process_holds(
    zk_proxy: Proxy, make_manager: MakeManager, key: str, lease: dict[str, Any]
) -> None:
    """The hold's lease would run for 15 or 30 s; the session's 4 s end it, and
    ``on_lost`` is called before the server frees the key for another process."""
    lost_at: list[float] = []
    holder = make_manager(
        f"zookeeper://127.0.0.1:{zk_proxy.port}/tierlock",
        ttl=SESSION,
        on_lost=lambda *_: lost_at.append(time.monotonic()),
    )
    lock = holder.lock(key, **lease)
    assert lock.acquire(timeout=SLACK)
    zk_proxy.stall()
    try:
        taken_at = _taken(make_manager(), key)
        believed = lock.owned()
    finally:
        zk_proxy.resume()
    assert not believed
    assert lost_at, "on_lost was not called before another process held the key"
    assert lost_at[0] < taken_at
    with holder.lock(f"{key}:next", timeout=SLACK) as again:  # in a new session
        assert again.owned()
        assert not lock.owned()  # (the new session's promise is not the old one's)
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    assert holder.stats().lost_holds == 1


def _hold_and_be_stopped(
    *,
    table: str,
    key: str,
    lease: dict[str, Any],
    held: Event,
    resumed: Event,
    results: Connection[Any, Any],
) -> None:
    """Hold ``key`` in a session of 4 s and set ``held``; the parent stops this process
    past the session, and sets ``resumed`` once it has continued it. Send back whether
    the hold was still believed then, and whether ``on_lost`` was called soon after."""
    lost = threading.Event()
    with tierlock.LockManager(
        URL, table=table, ttl=SESSION, reaper_interval=None, on_lost=lambda *_: lost.set()
    ) as manager:
        lock = manager.lock(key, **lease)
        assert lock.acquire(timeout=procs.WAIT_LIMIT)
        held.set()
        assert resumed.wait(procs.HOLD_LIMIT)
        believed = lock.owned()
        results.send({"believed": believed, "told": lost.wait(SLACK)})


@pytest.mark.slow
@pytest.mark.multiprocess
@LONG_LEASES
def test_a_stopped_holder_no_longer_believes_once_it_runs_again(
    make_manager: MakeManager,
    namespace: str,
    key: str,
    lease: dict[str, Any],
    children: procs.Children,
) -> None:
    """Stopped past its session, the holder process cannot be told while another takes
    the key; the moment it runs again, its belief is over (no reply needed) and it is
    told."""
    held, resumed = procs.CTX.Event(), procs.CTX.Event()
    receiver, sender = procs.CTX.Pipe(duplex=False)
    child = children.start(
        _hold_and_be_stopped,
        table=namespace,
        key=key,
        lease=lease,
        held=held,
        resumed=resumed,
        results=sender,
    )
    assert held.wait(procs.WAIT_LIMIT)
    assert child.pid is not None
    other = make_manager()
    os.kill(child.pid, signal.SIGSTOP)
    try:
        _taken(other, key)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        resumed.set()
    assert receiver.poll(procs.WAIT_LIMIT)
    assert receiver.recv() == {"believed": False, "told": True}
    children.join()


# -- a bounded handshake ------------------------------------------------------------------


class _SilentDoor:
    """A loopback server in front of ``upstream`` that takes every connection but
    leaves the next ``silent`` ones unread and unanswered, as ZooKeeper may while it
    starts; it forwards the others. ``cut_all()`` closes what it forwards."""

    def __init__(self, upstream: tuple[str, int], silent: int = 0) -> None:
        self.upstream = upstream
        self.silent = silent
        self.ignored = 0  # connections taken and left unanswered
        self.forwarded = 0  # connections forwarded
        self._mutex = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="silent-door", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                accepted, _ = self._listener.accept()
            except OSError:
                return  # (closed)
            with self._mutex:
                self._sockets.append(accepted)
                if self.silent:
                    self.silent -= 1
                    self.ignored += 1
                    continue
                try:
                    server = socket.create_connection(self.upstream)
                except OSError:
                    accepted.close()
                    continue
                self._sockets.append(server)
                self.forwarded += 1
            for source, target in ((accepted, server), (server, accepted)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for one in (source, target):
            _shut(one)

    def cut_all(self, then_silent: int = 0) -> None:
        """Close every connection now; leave the next ``then_silent`` unanswered."""
        with self._mutex:
            self.silent = then_silent
            sockets, self._sockets = self._sockets, []
        for one in sockets:
            _shut(one)

    def close(self) -> None:
        _shut(self._listener)  # (the shutdown wakes the accept)
        self._thread.join(procs.WAIT_LIMIT)
        assert not self._thread.is_alive(), "the silent door did not stop"
        self.cut_all()


def _shut(one: socket.socket) -> None:
    """End ``one`` both ways (which wakes a thread reading it), then close it."""
    with contextlib.suppress(OSError):
        one.shutdown(socket.SHUT_RDWR)
    one.close()


@pytest.fixture
def door(namespace: str) -> Iterator[_SilentDoor]:
    """A silent door in front of the shared server (closed after the managers)."""
    door = _SilentDoor(("127.0.0.1", 2181))
    yield door
    door.close()


@pytest.mark.slow
def test_a_first_handshake_left_unanswered_is_tried_again_at_once(
    door: _SilentDoor, make_manager: MakeManager, key: str
) -> None:
    """kazoo alone would wait the whole session (30 s) for the answer; the manager
    connects again and is ready within seconds."""
    door.silent = 1
    began = time.monotonic()
    manager = make_manager(f"zookeeper://127.0.0.1:{door.port}/tierlock", ttl=30.0)
    assert time.monotonic() - began < HANDSHAKE + SLACK
    assert (door.ignored, door.forwarded) == (1, 1)
    with manager.lock(key, timeout=SLACK) as lock:
        assert lock.owned()


@pytest.mark.slow
def test_a_reconnect_left_unanswered_keeps_the_session_and_its_holds(
    door: _SilentDoor, make_manager: MakeManager, key: str
) -> None:
    """The connection drops and the first reconnection goes unanswered: the next one
    finds the session alive within seconds, long before it (or the hold's belief)
    could end, and the hold goes on."""
    lost: list[tuple[str, int]] = []
    manager = make_manager(
        f"zookeeper://127.0.0.1:{door.port}/tierlock",
        ttl=RESTART_SESSION,
        on_lost=lambda *hold: lost.append(hold),
    )
    lock = manager.lock(key)
    assert lock.acquire(timeout=SLACK)
    door.cut_all(then_silent=1)
    began = time.monotonic()
    wait_until(lambda: door.ignored == 1, "the reconnection to go unanswered", limit=SLACK)
    assert lock.locked()  # (it waits for the connection)
    assert time.monotonic() - began < HANDSHAKE + SLACK
    assert door.forwarded == 2
    assert lock.owned()
    lock.release()  # (it raises LockLostError if the hold was given up)
    assert not lost
    assert manager.stats().lost_holds == 0


@pytest.mark.slow
def test_server_restarts_cost_seconds_and_keep_the_session(tmp_path: Path) -> None:
    """Restarted again and again under a renewed hold, the server is found again
    within seconds each time (an operation waits for that), and the session with its
    hold lives through it all."""
    with _private_server(tmp_path) as server:
        url = f"{server.url}/tierlock"
        with tierlock.LockManager(
            url, table="locks", ttl=RESTART_SESSION, reaper_interval=None
        ) as manager:
            lock = manager.lock("key")
            assert lock.acquire(timeout=SLACK)
            token = lock.token
            waits: list[float] = []
            for _ in range(RESTARTS):
                server.restart()
                served = time.monotonic()
                assert lock.locked()
                waits.append(time.monotonic() - served)
            assert max(waits) < HANDSHAKE + SLACK, [round(wait, 2) for wait in waits]
            assert manager.stats().lost_holds == 0
            assert lock.owned() and lock.token == token
            info = manager.info("key")
            assert info is not None and info.token == token
            lock.release()
