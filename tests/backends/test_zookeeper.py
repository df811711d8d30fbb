"""What only the ZooKeeper engine shows: the session as the lease of renewed holds,
fixed leases by the server's clock, dead and stopped holders, tokens across a server
restart, wake-ups and marks of who waits, URLs with several hosts, a chroot or
credentials, and keys that are no node names.

On real servers: the shared one at 127.0.0.1:2181, and a private one (``zk_servers``)
for the restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
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
from engines import require_server
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from polling import wait_until
from proxy import Proxy
from servers import ServerUnavailable
from zk_servers import ZooKeeperServer

import tierlock
from tierlock.backends.zookeeper.nodes import Paths
from tierlock.backends.zookeeper.waiting import FRESH
from tierlock.tier1 import tiers

pytestmark = pytest.mark.zookeeper

MakeManager = Callable[..., tierlock.LockManager]

HOSTS = "127.0.0.1:2181"
CHROOT = "/tierlock"
URL = f"zookeeper://{HOSTS}{CHROOT}"
# The shortest session the server grants (two ticks of 2 s): the shortest lease a
# stopped or cut-off holder can have.
SHORTEST_SESSION = 4.0
# The longest (twenty ticks): a session that outlives a slow restart.
LONGEST_SESSION = 40.0
# The server expires sessions at its ticks: up to one tick after their timeout.
TICK = 2.0
SLACK = 5.0  # room for a loaded machine in upper bounds


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def zk() -> Iterator[KazooClient]:
    """A plain client of the shared server, to look at the nodes directly."""
    require_server(URL)
    client = KazooClient(hosts=HOSTS)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def _delete_tree(zk: KazooClient, path: str) -> None:
    with contextlib.suppress(NoNodeError):
        zk.delete(path, recursive=True)


@pytest.fixture
def namespace(zk: KazooClient) -> Iterator[str]:
    """A table of this test's own, whose nodes are deleted afterwards."""
    table = f"tl_{uuid.uuid4().hex[:16]}"
    yield table
    _delete_tree(zk, f"{CHROOT}/{table}")


@pytest.fixture
def zk_proxy(zk: KazooClient) -> Iterator[Proxy]:
    """The fault proxy in front of the shared server (closed after the managers)."""
    proxy = Proxy(("127.0.0.1", 2181))
    yield proxy
    proxy.close()


@pytest.fixture
def make_manager(namespace: str) -> Iterator[MakeManager]:
    """Make managers on this test's namespace; all are closed afterwards."""
    with managers(URL, namespace) as make:
        yield make


def _token(lock: tierlock.Lock) -> int:
    token = lock.token
    assert token is not None
    return token


@pytest.fixture
def proxied(zk_proxy: Proxy, make_manager: MakeManager) -> MakeManager:
    """Make managers whose connections go through ``zk_proxy``."""

    def make(**options: Any) -> tierlock.LockManager:
        return make_manager(f"zookeeper://127.0.0.1:{zk_proxy.port}{CHROOT}", **options)

    return make


# The kinds of a transaction's operations, as the protocol numbers them.
CREATE, DELETE = 1, 2


def _operation(kind: int, path: str) -> bytes:
    """How a transaction's operation of ``kind`` on node ``path`` begins on the wire:
    what the fault proxy looks for."""
    encoded = path.encode()
    return struct.pack("!iBii", kind, False, -1, len(encoded)) + encoded


def _private_server(root: Path) -> ZooKeeperServer:
    try:
        return ZooKeeperServer(root)
    except ServerUnavailable as exc:
        _fail_or_skip(str(exc))
        raise


@pytest.mark.slow
def test_tokens_increase_across_a_server_restart(tmp_path: Path) -> None:
    """Tokens are creation ids, which the server keeps on disk: they go on growing after
    a restart. The session survives the restart too, and the hold in it."""
    with _private_server(tmp_path) as server:
        url = f"{server.url}/tierlock"
        tokens: list[int] = []
        with tierlock.LockManager(
            url, table="locks", ttl=LONGEST_SESSION, reaper_interval=None
        ) as first:
            for _ in range(3):
                with first.lock("key") as lock:
                    tokens.append(_token(lock))
            kept = first.lock("kept")
            assert kept.acquire(timeout=5)
            server.restart()
            for _ in range(3):
                with first.lock("key", timeout=procs.WAIT_LIMIT) as lock:
                    tokens.append(_token(lock))
            kept.release()  # (it would raise LockLostError had the session ended)
            assert first.stats().lost_holds == 0
        second = tierlock.LockManager(url, table="locks", reaper_interval=None)
        with second, second.lock("key") as lock:
            tokens.append(_token(lock))
    assert len(tokens) == 7
    assert tokens == sorted(set(tokens))


@pytest.mark.slow
def test_an_expired_session_loses_every_hold(
    zk_proxy: Proxy, make_manager: MakeManager, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off from the server for longer than its session, a manager is told that
    every hold is lost, while the server frees the keys for others; the manager goes on
    in a new session."""
    lost: list[tuple[str, int]] = []
    told = threading.Event()

    def on_lost(lost_key: str, token: int) -> None:
        lost.append((lost_key, token))
        if len(lost) == 2:
            told.set()

    url = f"zookeeper://127.0.0.1:{zk_proxy.port}{CHROOT}"
    holder = make_manager(url, ttl=SHORTEST_SESSION, on_lost=on_lost)
    other = make_manager()
    keys = [f"{key}:{n}" for n in range(2)]
    locks = [holder.lock(one) for one in keys]
    for lock in locks:
        assert lock.acquire(timeout=SLACK)
    tokens = [_token(lock) for lock in locks]
    zk_proxy.stall()
    try:
        assert told.wait(SHORTEST_SESSION + TICK + SLACK), "on_lost was not called"
        assert sorted(lost) == sorted(zip(keys, tokens, strict=True))
        assert not any(lock.owned() for lock in locks)
        taken = other.lock(keys[0])
        assert taken.acquire(timeout=SHORTEST_SESSION + TICK + SLACK)  # the nodes went
        assert _token(taken) > max(tokens)
        taken.release()
        assert any("lost the connection" in record.getMessage() for record in caplog.records)
    finally:
        zk_proxy.resume()
    for lock in locks:
        with pytest.raises(tierlock.LockLostError):
            lock.release()
    wait_until(
        lambda: any("expired" in record.getMessage() for record in caplog.records),
        "the session's end to be reported",
    )
    with holder.lock(keys[0], timeout=SLACK) as again:  # in a new session
        assert _token(again) > max(tokens)
    assert holder.stats().lost_holds == 2


def test_a_fixed_lease_ends_by_the_server_clock_and_is_taken_over(
    make_manager: MakeManager, key: str
) -> None:
    holder, waiter = make_manager(), make_manager()
    lock = holder.lock(key, ttl=1, renew=False)
    assert lock.acquire()
    first = lock.token
    assert first is not None
    assert not waiter.lock(key).acquire(blocking=False)
    lock.extend(3)  # now 3 s from the server's time of the extend
    info = waiter.info(key)
    assert info is not None and info.lease is None and not info.expired
    assert (info.expires_at - info.acquired_at).total_seconds() >= 3
    began = time.monotonic()
    taker = waiter.lock(key)
    assert taker.acquire(timeout=3 + SLACK)
    assert time.monotonic() - began > 2.5  # (the first lease alone ended after 1 s)
    assert taker.token is not None and taker.token > first
    assert waiter.stats().takeovers == 1
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    taker.release()


def test_only_one_of_many_waiters_takes_an_ended_lease_over(
    make_manager: MakeManager, key: str
) -> None:
    """Waiters that all found the same hold's lease ended race to replace it: the
    replacement deletes the old hold with its owner node, whose name is never used
    again, so only one can succeed (a compare-and-set on the data version alone would
    let a second one delete the first one's new node, which has the same version)."""
    holder = make_manager()
    lock = holder.lock(key, ttl=0.3, renew=False)
    assert lock.acquire()
    waiters = [make_manager() for _ in range(4)]

    def ended() -> bool:
        info = waiters[0].info(key)
        return info is not None and info.expired

    wait_until(ended, "the lease to end")
    start = threading.Barrier(len(waiters))
    won: list[int] = []

    def race(manager: tierlock.LockManager) -> None:
        mine = manager.lock(key)
        start.wait(procs.WAIT_LIMIT)
        if mine.acquire(blocking=False):
            won.append(_token(mine))  # (held until the managers close)

    threads = [threading.Thread(target=race, args=(waiter,)) for waiter in waiters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(procs.WAIT_LIMIT)
    assert len(won) == 1
    assert sum(waiter.stats().takeovers for waiter in waiters) == 1
    with pytest.raises(tierlock.LockLostError):
        lock.release()


def test_a_killed_holder_on_this_host_is_reclaimed_at_once(
    make_manager: MakeManager, namespace: str, key: str, children: procs.Children
) -> None:
    """Its session would keep the node for 30 s; a waiter that sees its process gone
    takes it over now."""
    held, may_release = procs.CTX.Event(), procs.CTX.Event()
    holder = children.start(
        procs.hold,
        url=URL,
        table=namespace,
        key=key,
        ttl=30.0,
        held=held,
        may_release=may_release,
    )
    assert held.wait(procs.WAIT_LIMIT)
    manager = make_manager()
    dead = manager.info(key)
    assert dead is not None and dead.pid == holder.pid
    holder.kill()
    holder.join(procs.WAIT_LIMIT)
    children.forget(holder)
    began = time.monotonic()
    lock = manager.lock(key)
    assert lock.acquire(timeout=SLACK)
    assert time.monotonic() - began < SHORTEST_SESSION
    assert lock.token is not None and lock.token > dead.token
    assert manager.stats().reclaims == 1
    lock.release()


def _hold_in_a_short_session(
    *, url: str, table: str, key: str, held: Event, resumed: Event, results: Connection[Any, Any]
) -> None:
    """Take ``key`` in a session of the shortest timeout and set ``held``; the parent
    then stops this process past it, and sets ``resumed`` once it has continued it.
    Send back whether ``on_lost`` was called and what ``release`` raised."""
    lost = threading.Event()
    with tierlock.LockManager(
        url, table=table, ttl=SHORTEST_SESSION, reaper_interval=None, on_lost=lambda *_: lost.set()
    ) as manager:
        lock = manager.lock(key)
        assert lock.acquire(timeout=procs.WAIT_LIMIT)
        held.set()
        resumed.wait(procs.HOLD_LIMIT)
        told = lost.wait(procs.WAIT_LIMIT)
        try:
            lock.release()
            raised = None
        except tierlock.LockError as exc:
            raised = type(exc).__name__
        results.send({"told": told, "raised": raised})


@pytest.mark.slow
def test_a_stopped_holder_keeps_its_key_until_its_session_expires(
    make_manager: MakeManager, namespace: str, key: str, children: procs.Children
) -> None:
    """A stopped process is not gone: its key frees itself when the server expires its
    session, and the waiter is woken by the node's deletion."""
    held, resumed = procs.CTX.Event(), procs.CTX.Event()
    receiver, sender = procs.CTX.Pipe(duplex=False)
    child = children.start(
        _hold_in_a_short_session,
        url=URL,
        table=namespace,
        key=key,
        held=held,
        resumed=resumed,
        results=sender,
    )
    assert held.wait(procs.WAIT_LIMIT)
    assert child.pid is not None
    waiter = make_manager(poll_interval=60.0).lock(key)  # (so only a wake-up is in time)
    os.kill(child.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert waiter.acquire(timeout=SHORTEST_SESSION + TICK + SLACK)
        waited = time.monotonic() - began
    finally:
        os.kill(child.pid, signal.SIGCONT)
        resumed.set()
    assert waited > SHORTEST_SESSION * 0.75
    assert receiver.poll(procs.WAIT_LIMIT + SLACK)
    assert receiver.recv() == {"told": True, "raised": "LockLostError"}
    waiter.release()
    children.join()


def test_a_release_wakes_the_waiting_processes_at_once(
    make_manager: MakeManager,
    zk: KazooClient,
    namespace: str,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Processes waiting for a key mark it, and each release wakes them, long before
    their next try (half a minute away)."""
    monkeypatch.setattr(tiers, "FIRST_POLL", 30.0)
    holder = make_manager()
    waiters = [make_manager(poll_interval=60.0) for _ in range(2)]
    lock = holder.lock(key)
    assert lock.acquire()
    served: list[int] = []
    failures: list[str] = []

    def wait(number: int) -> None:
        mine = waiters[number].lock(key)
        if mine.acquire(timeout=procs.WAIT_LIMIT):
            served.append(number)
            mine.release()
        else:
            failures.append(f"waiter {number} timed out")

    threads = [threading.Thread(target=wait, args=(number,)) for number in range(2)]
    for thread in threads:
        thread.start()
    queue = Paths(CHROOT, namespace).queue(key)

    def marked() -> bool:  # (a poller marks the key, then arms its watch at once)
        return zk.exists(queue) is not None and len(zk.get_children(queue)) == 2

    wait_until(marked, "both waiters to mark the key")
    assert holder._backend.others_waiting(key, False) is True
    began = time.monotonic()
    lock.release()
    for thread in threads:
        thread.join(procs.WAIT_LIMIT)
    assert not failures
    assert sorted(served) == [0, 1]
    assert time.monotonic() - began < SLACK


def test_a_hot_key_stays_in_its_process_until_another_process_wants_it(
    make_manager: MakeManager, key: str
) -> None:
    """The threads of one process pass a hot key on, cohort after cohort, with no
    request while no other process wants it; one that does gets it soon."""
    busy, other = make_manager(), make_manager()
    stop = threading.Event()

    def work() -> None:
        lock = busy.lock(key)
        while not stop.is_set():
            with lock:
                time.sleep(0.0002)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: busy.stats().local_handoffs >= 500, "hand-offs")
        # Cohorts of at most COHORT_LIMIT hand-offs ended among those, each asking who
        # else waits; for FRESH after the first ask, no mark of another process only
        # means that none has appeared yet, and cohorts go back to the server.
        time.sleep(FRESH)
        before = busy.stats()
        wait_until(lambda: busy.stats().local_handoffs >= before.local_handoffs + 500, "more")
        # (Cohorts end after 5 ms: had each gone back to the server, 20 or more.)
        assert busy.stats().inserts <= before.inserts + 2
        rival = other.lock(key)
        assert rival.acquire(timeout=SLACK)
        rival.release()
    finally:
        stop.set()
        for thread in threads:
            thread.join(procs.WAIT_LIMIT)


def test_want_marks_a_key_for_its_time(
    make_manager: MakeManager, key: str, zk: KazooClient, namespace: str
) -> None:
    """A try without waiting leaves no poller behind: ``want`` marks the key as a poller
    would, the holder learns it, and the mark goes once its time is up."""
    holder, trier = make_manager(), make_manager()
    census = holder._backend
    assert holder.lock(key).acquire()
    trier._backend.want(key, 2.0)  # (a loaded machine's holder sees it within that)
    wait_until(lambda: census.others_waiting(key, False) is True, "the holder to see it")
    wait_until(lambda: census.others_waiting(key, False) is False, "the mark to go")
    queue = Paths(CHROOT, namespace).queue(key)
    wait_until(lambda: not _children(zk, queue), "the mark's node to go")


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        children: list[str] = zk.get_children(path)
    except NoNodeError:
        return []
    return children


def test_a_url_of_several_hosts_and_a_chroot(zk: KazooClient) -> None:
    """The chroot is made if missing; the same server twice is a list of two hosts."""
    top = f"/tl_chroot_{uuid.uuid4().hex[:8]}"
    chroot = f"{top}/some/chroot"
    url = f"zookeeper://{HOSTS},{HOSTS}{chroot}"
    try:
        with tierlock.LockManager(url, table="locks", reaper_interval=None) as manager:
            assert manager.url == url
            assert zk.exists(f"{chroot}/locks")
            with manager.lock("key") as lock:
                assert [holder.key for holder in manager.holders()] == ["key"]
                assert zk.exists(f"{chroot}/locks/key")
                assert lock.locked()
            assert manager.holders() == []
    finally:
        _delete_tree(zk, top)


def test_credentials_are_never_shown(
    zk: KazooClient, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"zookeeper://alice:s3cret@{HOSTS}{CHROOT}"
    with tierlock.LockManager(url, table=namespace, reaper_interval=None) as manager:
        assert manager.url == f"zookeeper://alice:***@{HOSTS}{CHROOT}"
        with manager.lock("key"):
            pass
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(tierlock.BackendError) as raised:
        tierlock.LockManager(
            f"zookeeper://alice:s3cret@127.0.0.1:{port}/x", table=namespace, database_timeout=1
        )
    assert time.monotonic() - began < 1 + SLACK
    assert "alice:***@" in str(raised.value) and "s3cret" not in str(raised.value)
    assert "s3cret" not in caplog.text


def test_keys_that_are_no_node_names_stay_distinct(make_manager: MakeManager) -> None:
    keys = [
        "/",
        "a/b",
        ".",
        "..",
        "./..",
        "%2E",
        "#clock",
        "#owners",
        "zookeeper",
        "a",
        "A",
        "a ",
        "\U0001f512 lock",
        "x" * 255,
        "\U0001f600" * 255,
    ]
    manager, other = make_manager(), make_manager()
    locks = [manager.lock(one) for one in keys]
    for lock in locks:
        assert lock.acquire(blocking=False)
    assert len({lock.token for lock in locks}) == len(keys)
    assert sorted(holder.key for holder in other.holders()) == sorted(keys)
    for one in keys:
        info = other.info(one)
        assert info is not None and info.key == one
        assert not other.lock(one).acquire(blocking=False)
    for lock in locks:
        lock.release()
    assert other.holders() == []


def test_a_session_shorter_than_the_server_grants_is_reported(
    make_manager: MakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        make_manager(ttl=1.0)
    assert any("grants sessions of 4 s" in record.getMessage() for record in caplog.records)


def test_a_create_whose_reply_is_lost_is_found_by_owner_id(
    proxied: MakeManager, make_manager: MakeManager, zk_proxy: Proxy, namespace: str, key: str
) -> None:
    """The node was made but the client never heard: the try after the reconnect finds
    it by owner id and keeps it, instead of creating again (and waiting on its own)."""
    locks, direct = proxied(renew=False), make_manager()
    create = _operation(CREATE, Paths(CHROOT, namespace).hold(key))
    lock = locks.lock(key)
    zk_proxy.drop_reply(create)
    assert lock.acquire(timeout=SLACK)
    assert zk_proxy.fired == 1
    assert zk_proxy.forwarded(create) == 1
    info = direct.info(key)
    assert info is not None and info.token == lock.token
    assert info.thread_id == threading.get_ident()
    lock.release()
    assert direct.info(key) is None


def test_a_create_lost_before_the_server_is_tried_again(
    proxied: MakeManager, make_manager: MakeManager, zk_proxy: Proxy, namespace: str, key: str
) -> None:
    locks, direct = proxied(renew=False), make_manager()
    create = _operation(CREATE, Paths(CHROOT, namespace).hold(key))
    lock = locks.lock(key)
    zk_proxy.drop_request(create)
    assert lock.acquire(timeout=SLACK)
    assert zk_proxy.fired == 1
    assert zk_proxy.forwarded(create) == 1  # only the second try reached the server
    info = direct.info(key)
    assert info is not None and info.token == lock.token
    lock.release()


def test_a_delete_whose_reply_is_lost_counts_as_released(
    proxied: MakeManager, make_manager: MakeManager, zk_proxy: Proxy, namespace: str, key: str
) -> None:
    """The second try finds no node of its owner: within the lease that is the first
    try's doing, not a lost lock."""
    locks, direct = proxied(renew=False), make_manager()
    delete = _operation(DELETE, Paths(CHROOT, namespace).hold(key))
    lock = locks.lock(key)
    assert lock.acquire(timeout=SLACK)
    zk_proxy.drop_reply(delete)
    lock.release()
    assert zk_proxy.fired == 1
    assert zk_proxy.forwarded(delete) == 2  # the lost one and the second try
    assert direct.info(key) is None


@pytest.mark.slow
def test_an_unconfirmed_create_is_deleted_once_the_server_is_back(
    proxied: MakeManager, make_manager: MakeManager, zk_proxy: Proxy, namespace: str, key: str
) -> None:
    """The node was made, the reply lost and no new connection got through: the acquire
    fails (BackendError), and the node its session would keep goes once the connection
    is back, long before the session could expire."""
    locks = proxied(renew=False, ttl=30.0, database_timeout=2.0)
    direct = make_manager()
    create = _operation(CREATE, Paths(CHROOT, namespace).hold(key))
    lock = locks.lock(key)
    zk_proxy.refuse_new()
    zk_proxy.drop_reply(create)
    with pytest.raises(tierlock.BackendError, match=r"^cannot reach the database: "):
        lock.acquire(timeout=SLACK)
    assert zk_proxy.forwarded(create) == 1
    orphan = direct.info(key)
    assert orphan is not None and orphan.thread_id == threading.get_ident()
    zk_proxy.accept_new()
    wait_until(lambda: direct.info(key) is None, "the node to go", limit=SLACK * 2)
    assert direct.lock(key).acquire(blocking=False)


@pytest.mark.slow
def test_a_server_lost_for_good_raises_and_frees_the_keys_with_the_session(
    proxied: MakeManager, make_manager: MakeManager, zk_proxy: Proxy, key: str
) -> None:
    locks = proxied(ttl=SHORTEST_SESSION, database_timeout=2.0)
    direct = make_manager()
    held = locks.lock(key)
    assert held.acquire(timeout=SLACK)
    other = locks.lock(f"{key}:other")
    zk_proxy.refuse_all()
    began = time.monotonic()
    with pytest.raises(tierlock.BackendError, match=r"^cannot reach the database: ") as raised:
        other.acquire(timeout=SLACK)
    assert time.monotonic() - began < 3 * 2.0
    assert raised.value.key == other.key
    with pytest.raises(tierlock.BackendError):
        held.release()
    assert not held.owned()
    taker = direct.lock(key)
    assert taker.acquire(timeout=SHORTEST_SESSION + TICK + SLACK)  # once the session expired
    taker.release()
