"""What only the Redis engine shows: tokens across server restarts, passwords and TLS,
a lost connection, awkward keys and cluster slots, fork safety, one
round trip per heartbeat, wake-ups, marks of lost tries, and a private Redis Cluster.

Most tests use the shared server; those that restart one, set a password, speak TLS or
form a cluster start private ``redis-server`` processes (``redis_servers``).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import procs
import pytest
import redis
from conftest import managers
from engines import ENGINES, drop_namespace, require_server
from polling import wait_until
from proxy import Proxy
from redis.crc import key_slot
from redis_servers import RedisCluster, RedisServer, self_signed_certificate
from servers import ServerUnavailable

import tierlock
from tierlock.backends.basics import HANDOFF_BITS
from tierlock.backends.redis import wanting
from tierlock.backends.redis.backend import RedisBackend
from tierlock.backends.redis.layout import names
from tierlock.backends.redis.running import UNBOUNDED_POOL
from tierlock.backends.redis.scripts import ACQUIRE, RELEASE
from tierlock.backends.redis.wire import pack
from tierlock.urls import ENGINE_SCHEMES

pytestmark = pytest.mark.redis

SHARED_URL = ENGINES["redis"] or "redis://127.0.0.1:6379/0"
MakeLocks = Callable[..., tierlock.LockManager]
# Bounds that only a broken lock reaches; they turn a hang into a failure.
SLACK = 5.0
# Ticks of the token clock (100 microseconds) in a day.
DAY_OF_TICKS = 864_000_000


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def table() -> Iterator[str]:
    """A namespace of this test's own on the shared server, removed afterwards."""
    require_server(SHARED_URL)
    name = f"tl_{uuid.uuid4().hex[:16]}"
    yield name
    drop_namespace(SHARED_URL, name)


@pytest.fixture
def make_locks(table: str) -> Iterator[MakeLocks]:
    """Managers on the shared server (or ``url``), all closed afterwards."""
    with managers(SHARED_URL, table) as make:
        yield make


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start private servers (options as ``RedisServer`` takes them); all are killed
    and their files removed afterwards."""
    started: list[RedisServer] = []

    def start(*options: str, **settings: Any) -> RedisServer:
        server = RedisServer(tmp_path / f"redis{len(started)}", *options, **settings)
        started.append(server)
        try:
            server.start()
        except ServerUnavailable as exc:
            unavailable(f"no private Redis server: {exc}")
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    require_server(SHARED_URL)
    proxy = Proxy(("127.0.0.1", 6379))
    yield proxy
    proxy.close()


def shown(error: BaseException) -> str:
    """What ``error`` and the errors chained to it say (as messages, reprs and in a
    traceback, but not the test's own source lines)."""
    said = []
    chained: BaseException | None = error
    while chained is not None:
        said += [str(chained), repr(chained), *traceback.format_exception_only(chained)]
        chained = chained.__cause__ or chained.__context__
    return "\n".join(said)


def take(locks: tierlock.LockManager, key: str) -> int:
    """Acquire and release ``key``; the hold's token."""
    lock = locks.lock(key)
    assert lock.acquire(timeout=procs.WAIT_LIMIT)
    token = lock.token
    lock.release()
    assert token is not None
    return token


# -- fencing tokens across restarts ---------------------------------------------------


def test_tokens_rise_across_a_restart_with_an_append_only_file(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, table: str, key: str
) -> None:
    """The key's counter is persisted: a counter pushed a day past the server's clock
    (as a clock stepped back would leave it) still rules after a restart."""
    server = private_redis("--appendonly", "yes", "--appendfsync", "always")
    locks = make_locks(server.url)
    tokens = [take(locks, key) for _ in range(3)]
    counter = names(table, key).counter
    with server.client() as client:
        ahead = int(client.get(counter)) + DAY_OF_TICKS
        client.set(counter, ahead)
    tokens.append(take(locks, key))
    assert tokens[-1] >> HANDOFF_BITS == ahead + 1
    server.restart()
    tokens.append(take(locks, key))  # (the manager reconnects by itself)
    assert tokens[-1] >> HANDOFF_BITS == ahead + 2  # from the counter, not the clock
    assert tokens == sorted(set(tokens))
    assert max(tokens) < 2**63  # within a signed 64-bit column


def test_tokens_rise_across_a_restart_without_persistence(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, table: str, key: str
) -> None:
    """Nothing survives the restart, but the server's clock has gone on: tokens go on
    rising."""
    server = private_redis("--appendonly", "no")
    locks = make_locks(server.url)
    tokens = [take(locks, key) for _ in range(3)]
    server.restart()
    with server.client() as client:
        assert client.dbsize() == 0  # the counter is gone with the rest
    tokens.append(take(locks, key))
    assert tokens == sorted(set(tokens))


def test_without_persistence_a_counter_ahead_of_the_clock_is_lost(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, table: str, key: str
) -> None:
    """The documented limit: without persistence only the clock carries tokens over a
    restart, so a counter that had run ahead of it (a key taken more than 10,000 times
    a second, or a clock stepped back) is not kept."""
    server = private_redis("--appendonly", "no")
    locks = make_locks(server.url)
    with server.client() as client:
        client.set(names(table, key).counter, take(locks, key) // 2**HANDOFF_BITS + DAY_OF_TICKS)
    before = take(locks, key)
    server.restart()
    assert take(locks, key) < before


# -- passwords and TLS --------------------------------------------------------------------


def test_password_is_never_shown(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, key: str
) -> None:
    secret = "s3cret-Pa55w0rd"
    server = private_redis(password=secret)
    locks = make_locks(server.url, database_timeout=1.0)
    assert secret not in locks.url and ":***@" in locks.url
    assert secret not in repr(locks)
    take(locks, key)
    server.stop()
    with pytest.raises(tierlock.BackendError) as caught:
        locks.lock(key).acquire()
    assert str(caught.value).startswith("cannot reach the database: ")
    assert secret not in shown(caught.value)


def test_server_out_of_reach_at_construction(table: str) -> None:
    began = time.monotonic()
    with pytest.raises(tierlock.BackendError, match=r"^cannot reach the database: \S") as caught:
        tierlock.LockManager("redis://:secret@127.0.0.1:1/0", table=table, reaper_interval=None)
    assert time.monotonic() - began < SLACK  # (told at once, not after database_timeout)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert "secret" not in shown(caught.value)


def test_wrong_password_is_a_backend_error(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks
) -> None:
    server = private_redis(password="the-right-one")
    for url in (
        server.url.replace("the-right-one", "a-wrong-one"),
        server.url.replace(":the-right-one@", "default:a-wrong-one@"),
    ):
        began = time.monotonic()
        with pytest.raises(tierlock.BackendError) as caught:
            make_locks(url)
        assert time.monotonic() - began < SLACK  # at once: retrying would not help
        text = shown(caught.value)
        assert "a-wrong-one" not in text and "the-right-one" not in text


def test_password_in_the_query_is_hidden(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, key: str
) -> None:
    server = private_redis(password="query-secret")
    locks = make_locks(f"redis://127.0.0.1:{server.port}/0?password=query-secret")
    take(locks, key)
    assert "query-secret" not in locks.url and "password=***" in locks.url


def test_tls(
    private_redis: Callable[..., RedisServer], make_locks: MakeLocks, tmp_path: Path, key: str
) -> None:
    """``rediss://`` speaks TLS, checking the server's certificate against the authority
    the URL names; without one it refuses the self-signed server."""
    try:
        certificate = self_signed_certificate(tmp_path)
    except ServerUnavailable as exc:
        unavailable(f"no certificate for a TLS server: {exc}")
    server = private_redis(tls=certificate)
    assert server.url.startswith("rediss://")
    locks = make_locks(server.url)
    with locks.lock(key) as lock:
        info = locks.info(key)
        assert info is not None and info.token == lock.token
    assert not locks.lock(key).locked()
    for refused in (server.url.partition("?")[0], server.url.replace("rediss://", "redis://")):
        with pytest.raises(tierlock.BackendError):
            make_locks(refused, database_timeout=1.0)


# -- a lost connection ----------------------------------------------------------------------


def test_hold_out_of_reach_past_its_lease_is_reported_lost(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    lost = threading.Event()
    calls: list[tuple[str, int]] = []

    def on_lost(lost_key: str, token: int) -> None:
        calls.append((lost_key, token))
        lost.set()

    locks = make_locks(
        f"redis://127.0.0.1:{proxy.port}/0", ttl=1.0, database_timeout=0.5, on_lost=on_lost
    )
    lock = locks.lock(key)
    assert lock.acquire()
    token = lock.token
    proxy.refuse_all()
    assert lost.wait(procs.WAIT_LIMIT), "on_lost was never called"
    assert calls == [(key, token)] and not lock.owned()
    taker = make_locks().lock(key)
    assert taker.acquire(timeout=procs.WAIT_LIMIT)  # the lease ended on the server
    proxy.accept_new()
    with pytest.raises(tierlock.LockLostError):
        lock.release()
    taker.release()
    assert calls == [(key, token)]  # once


def test_stalled_server_past_the_lease_loses_the_hold(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    lost = threading.Event()
    locks = make_locks(
        f"redis://127.0.0.1:{proxy.port}/0",
        ttl=1.0,
        database_timeout=0.5,
        on_lost=lambda *_: lost.set(),
    )
    lock = locks.lock(key)
    assert lock.acquire()
    proxy.stall()
    try:
        assert lost.wait(procs.WAIT_LIMIT), "on_lost was never called"
    finally:
        proxy.resume()
    with pytest.raises(tierlock.LockLostError):
        lock.release()


def renewed_times(locks: tierlock.LockManager, times: int) -> bool:
    return locks.stats().renewals >= times


def test_cut_connections_within_the_lease_lose_nothing(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    locks = make_locks(f"redis://127.0.0.1:{proxy.port}/0", ttl=1.5, database_timeout=0.5)
    lock = locks.lock(key)
    assert lock.acquire()
    for cut in range(1, 4):
        assert proxy.cut_all() >= 1
        wait_until(functools.partial(renewed_times, locks, cut), "a renewal after the cut")
    assert lock.owned() and locks.stats().lost_holds == 0
    lock.release()
    assert make_locks().info(key) is None


def test_acquire_whose_reply_is_lost_is_found_by_owner_id(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    """The script took the key but the client never heard: the retry finds the hold
    its own by owner id, instead of waiting on it."""
    locks = make_locks(f"redis://127.0.0.1:{proxy.port}/0", renew=False)
    lock = locks.lock(key)
    proxy.drop_reply(ACQUIRE.sha.encode())
    assert lock.acquire(timeout=1.0)
    assert proxy.fired == 1 and proxy.forwarded(ACQUIRE.sha.encode()) == 2
    info = make_locks().info(key)
    assert info is not None and info.token == lock.token and info.pid == os.getpid()
    assert locks.stats().insert_conflicts == 0  # it never waited on its own hold
    lock.release()


def test_release_whose_reply_is_lost_counts_as_released(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    locks = make_locks(f"redis://127.0.0.1:{proxy.port}/0", renew=False)
    lock = locks.lock(key)
    assert lock.acquire()
    proxy.drop_reply(RELEASE.sha.encode())
    lock.release()  # no LockLostError: the hold went, by our own first try
    assert proxy.fired == 1 and proxy.forwarded(RELEASE.sha.encode()) == 2
    assert make_locks().info(key) is None


def test_abandoned_acquire_leaves_no_hold_behind(
    make_locks: MakeLocks, proxy: Proxy, key: str
) -> None:
    """An acquire that took the key unheard, then gave up as the server stalled, has
    its hold deleted once the server is back, long before the hold's lease ends."""
    locks = make_locks(f"redis://127.0.0.1:{proxy.port}/0", ttl=60.0, database_timeout=0.5)
    proxy.drop_reply(ACQUIRE.sha.encode(), then_stall=True)
    with pytest.raises(tierlock.BackendError):
        locks.lock(key).acquire()
    direct = make_locks()
    assert direct.lock(key).locked()  # the unheard script took it
    proxy.resume()
    wait_until(lambda: direct.info(key) is None, "the abandoned hold to be deleted", limit=SLACK)


# -- keys --------------------------------------------------------------------------------------

AWKWARD_KEYS = [
    "}",
    "{",
    "%",
    "%7D",
    "%25",
    "%257D",
    "a}b",
    "a%7Db",
    "{user}:42",
    "}{",
    "%%}}{{",
    "\U0001f600 \U0001f512",
    "k" * 255,
    "\U0001f600" * 255,
    "x" * 254 + "}",
]


def test_awkward_keys_stay_apart_and_each_keeps_to_one_slot(
    make_locks: MakeLocks, table: str
) -> None:
    locks = make_locks()
    held = [locks.lock(key) for key in AWKWARD_KEYS]
    assert all(lock.acquire(blocking=False) for lock in held)  # no two share a hold
    try:
        assert [info.key for info in locks.holders()] == sorted(AWKWARD_KEYS)
        for lock in held:
            info = locks.info(lock.key)
            assert info is not None and info.key == lock.key and info.token == lock.token
            where = names(table, lock.key)
            assert where.record.startswith(f"{table}:")
            assert key_slot(where.record.encode()) == key_slot(where.counter.encode())
    finally:
        for lock in held:
            lock.release()
    assert locks.holders() == []


# -- fork safety ---------------------------------------------------------------------------


def use_inherited_manager(*, manager: tierlock.LockManager, key: str) -> None:
    assert take(manager, key)


def test_fork_leaves_the_parents_connections_alone(
    make_locks: MakeLocks, key: str, children: procs.Children
) -> None:
    """A child that uses the inherited manager opens connections of its own; the
    parent's pooled connection is the same server session afterwards."""
    locks = make_locks()
    lock = locks.lock(key)
    assert lock.acquire()
    client = locks._backend._client  # type: ignore[attr-defined]
    session = client.client_id()
    children.start(use_inherited_manager, manager=locks, key=f"{key}:child")
    children.join()
    assert client.client_id() == session
    lock.release()


# -- hand-offs -----------------------------------------------------------------------------


@pytest.mark.parametrize("renew", [True, False], ids=["renewed", "fixed"])
def test_hand_off_to_a_local_waiter_is_recorded(
    make_locks: MakeLocks, key: str, renew: bool
) -> None:
    """The hold passes to a waiting thread of the process (with no command when both
    renew their leases, else with one); the record names the new thread and its token
    (at the next heartbeat, when no command was sent)."""
    locks = make_locks(ttl=0.9, renew=renew)
    lock = locks.lock(key)
    assert lock.acquire()
    first = lock.token
    seen: list[tuple[int, int | None]] = []
    done = threading.Event()

    def wait_in_line() -> None:
        assert lock.acquire(timeout=procs.WAIT_LIMIT)
        seen.append((threading.get_ident(), lock.token))
        done.wait(procs.WAIT_LIMIT)
        lock.release()

    thread = threading.Thread(target=wait_in_line)
    thread.start()
    wait_until(lambda: locks.stats().local_waits == 1, "the waiter to queue")
    lock.release()
    wait_until(lambda: seen, "the hand-off")
    thread_id, token = seen[0]
    assert first is not None and token == first + 1

    def recorded() -> tierlock.LockInfo | None:
        info = locks.info(key)
        return info if info is not None and info.thread_id == thread_id else None

    info = wait_until(recorded, "the record to name the new holder")
    assert info is not None and info.token == token
    stats = locks.stats()
    assert (stats.local_handoffs, stats.handoffs) == ((1, 0) if renew else (0, 1))
    done.set()
    thread.join(procs.WAIT_LIMIT)
    assert locks.info(key) is None


# -- renewal and wake-ups -----------------------------------------------------------------


@pytest.mark.slow
def test_info_and_holders_never_show_an_expired_hold(make_locks: MakeLocks, key: str) -> None:
    """Redis drops a hold once its clock passes the key's expiry time, and keeps it
    through that millisecond: read up to the moment it is gone, by ``info()`` and
    ``holders()`` in turn, a hold is never shown expired."""
    locks = make_locks()
    seen = 0
    for _ in range(5):
        lock = locks.lock(key, ttl=0.2, renew=False)
        assert lock.acquire(blocking=False)
        while (info := locks.info(key)) is not None:
            assert not info.expired, info
            assert all(not holder.expired for holder in locks.holders())
            seen += 1
    assert seen >= 5  # (the polls did read live holds)


def test_one_round_trip_renews_every_hold(
    make_locks: MakeLocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,200 holds (three scripts' worth) are renewed by one pipeline per beat."""
    count, ttl = 1200, 0.9
    locks = make_locks(ttl=ttl)
    held = [locks.lock(f"key:{number}") for number in range(count)]
    assert all(lock.acquire(blocking=False) for lock in held)
    backend = locks._backend
    renew = backend.renew
    beats: list[tuple[int, int, int]] = []  # each beat's heartbeats, commands, holds renewed

    def watched(holds: Any) -> set[str]:
        """The beat's own counts, taken in the heartbeat's thread as it renews: no
        other beat runs meanwhile, and nothing else sends."""
        before = locks.stats()
        renewed: set[str] = renew(holds)
        after = locks.stats()
        beats.append(
            (
                after.heartbeats - before.heartbeats,
                after.statements - before.statements,
                len(renewed),
            )
        )
        return renewed

    monkeypatch.setattr(backend, "renew", watched)
    wait_until(lambda: len(beats) >= 3, "three beats")
    assert all(lock.owned() for lock in held)  # past three leases
    locks.close()
    assert beats and all(beat == (1, 3, count) for beat in beats), beats
    assert len(make_locks().holders()) == count


def test_waiting_does_not_pin_a_connection(make_locks: MakeLocks, key: str) -> None:
    """With a pool of one connection, a thread waiting for a key held elsewhere leaves
    it free for other work (its wake-ups come on a connection of their own)."""
    small = make_locks(f"{SHARED_URL}?max_connections=1", database_timeout=2.0)
    holder = make_locks().lock(key)
    assert holder.acquire()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(small.lock(key).acquire(timeout=5)))
    waiter.start()
    wait_until(lambda: small.stats().insert_conflicts >= 2, "the waiter to poll")
    for number in range(20):
        take(small, f"{key}:other:{number}")
    holder.release()
    waiter.join(procs.WAIT_LIMIT)
    assert result == [True]


def test_a_bounded_pool_keeps_a_connection_for_other_work(make_locks: MakeLocks, key: str) -> None:
    """With a pool of one connection, the scripts of acquires and releases give it back
    after each command: looking (``info``, ``locked``) and renewing still find it."""
    small = make_locks(f"{SHARED_URL}?max_connections=1", ttl=0.6, database_timeout=2.0)
    held = small.lock(key)
    assert held.acquire()
    for number in range(5):
        take(small, f"{key}:other:{number}")
        assert small.info(key) is not None and small.lock(f"{key}:other").locked() is False
    beats = small.stats().heartbeats
    wait_until(lambda: small.stats().heartbeats >= beats + 2, "two renewals")
    assert held.owned() and small.stats().lost_holds == 0
    held.release()


def test_a_pool_without_a_bound_is_not_asked_for_each_script(
    make_locks: MakeLocks, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL that sets no ``max_connections`` gets a pool without a bound (redis-py 8
    would bound it at 100), so the scripts of acquires and releases keep their
    connection at hand: after the first, none takes one from the pool."""
    locks = make_locks()
    pool = locks._backend._client.connection_pool  # type: ignore[attr-defined]
    assert pool.max_connections == UNBOUNDED_POOL
    take(locks, key)
    checkouts: list[object] = []
    get_connection = pool.get_connection

    def counted(*args: Any, **kwargs: Any) -> Any:
        checkouts.append(args)
        return get_connection(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted)
    for number in range(20):
        take(locks, f"{key}:{number}")
    assert checkouts == []
    bounded = make_locks(f"{SHARED_URL}?max_connections=7")
    assert bounded._backend._client.connection_pool.max_connections == 7  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "parts",
    [("EVALSHA", "0" * 40, 1, "k"), ("SET", "\U0001f600 \u00e9", "", 0, -12, 2**62)],
    ids=["ascii", "unicode-and-numbers"],
)
def test_commands_are_packed_as_redis_py_packs_them(parts: tuple[object, ...]) -> None:
    packed = redis.Connection().pack_command(*parts)  # type: ignore[no-untyped-call]
    assert pack(parts) == b"".join(packed)


def test_release_wakes_a_poller_elsewhere(make_locks: MakeLocks, key: str) -> None:
    """A release wakes the poller of another manager at once, in the middle of a pause
    that would have lasted a quarter of a second or more."""
    holder, waiter = make_locks(), make_locks(poll_interval=1.0)
    lock = holder.lock(key)
    assert lock.acquire()
    took: list[float] = []
    thread = threading.Thread(
        target=lambda: took.append(time.monotonic()) if waiter.lock(key).acquire() else None
    )
    thread.start()
    # Pauses double from 2 ms: the ninth failed try begins one of 256-512 ms.
    wait_until(lambda: waiter.stats().insert_conflicts >= 9, "the poller's pauses to grow")
    assert holder._backend.others_waiting(key, False)
    released_at = time.monotonic()
    lock.release()
    thread.join(procs.WAIT_LIMIT)
    assert took and took[0] - released_at < 0.2


def test_a_lost_try_without_waiting_tells_the_holder_until_its_mark_ends(
    make_locks: MakeLocks, table: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try without waiting leaves no listener on the key's channel, but the command
    that lost marks the key wanted: the holder's census says so until the mark ends,
    then that nobody waits."""
    monkeypatch.setattr(wanting, "MARK_LIFE", 1.0)  # (outlasts a loaded machine's pause)
    holder, trier = make_locks(), make_locks()
    census = holder._backend
    assert holder.lock(key).acquire()
    assert census.others_waiting(key, False) is False
    assert not trier.lock(key).acquire(blocking=False)
    mark = names(table, key).want
    with redis.Redis.from_url(SHARED_URL, decode_responses=True) as client:
        tried = trier._backend
        assert isinstance(tried, RedisBackend)
        assert client.get(mark) == tried._wanting.tag  # (written by the try)
        assert census.others_waiting(key, False) is True
        wait_until(lambda: census.others_waiting(key, False) is False, "the mark to end")
        assert not client.exists(mark)


def test_want_marks_a_key_but_not_for_the_holder_itself(make_locks: MakeLocks, key: str) -> None:
    """``want`` marks the key for the time asked (a SET), unless a mark of the backend
    lasts as long already; the holder's own mark (left before it won) does not count."""
    holder, other = make_locks(), make_locks()
    census = holder._backend
    census.want(key, 2.0)
    assert holder.lock(key).acquire()
    assert census.others_waiting(key, False) is False
    before = other.stats().statements
    other._backend.want(key, 2.0)
    other._backend.want(key, 0.1)  # (within the mark's time: nothing to send)
    assert other.stats().statements == before + 1
    assert census.others_waiting(key, False) is True
    wait_until(lambda: census.others_waiting(key, False) is False, "the mark to end")


# -- cluster ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private three-node Redis Cluster: holds of keys on every node, turns between
    managers, renewal, the admin calls."""
    monkeypatch.setitem(ENGINE_SCHEMES, "redis+cluster", "redis")
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        try:
            cluster.start()
        except ServerUnavailable as exc:
            unavailable(f"no private Redis Cluster: {exc}")
        options: dict[str, Any] = {"table": "tl_cluster", "reaper_interval": None, "ttl": 0.9}
        with (
            tierlock.LockManager(cluster.url, **options) as first,
            tierlock.LockManager(cluster.url, **options) as second,
        ):
            keys = [f"key:{number}" for number in range(30)]
            with redis.RedisCluster.from_url(cluster.url.replace("+cluster", "")) as client:
                nodes = {client.get_node_from_key(names("tl_cluster", k).record).name for k in keys}
            assert len(nodes) == len(cluster.nodes)  # the keys live on every node
            held = [first.lock(key) for key in keys]
            assert all(lock.acquire(blocking=False) for lock in held)
            tokens = {lock.key: lock.token for lock in held}
            beats = first.stats().heartbeats
            wait_until(lambda: first.stats().heartbeats >= beats + 3, "three beats")
            assert all(lock.owned() for lock in held)
            assert [info.key for info in second.holders()] == sorted(keys)
            assert not second.lock(keys[0]).acquire(blocking=False)
            # No node counts the listeners of the others: the mark of the lost try tells
            # who waits, until it ends.
            monkeypatch.setattr(wanting, "MARK_LIFE", 1.0)
            assert not second.lock(keys[1]).acquire(blocking=False)
            assert first._backend.others_waiting(keys[1], False) is True
            wait_until(lambda: first._backend.others_waiting(keys[1], False) is None, "its end")
            took: list[int | None] = []

            def wait_for_first_key() -> None:
                lock = second.lock(keys[0])
                assert lock.acquire(timeout=procs.WAIT_LIMIT)
                took.append(lock.token)
                lock.release()

            thread = threading.Thread(target=wait_for_first_key)
            thread.start()
            for lock in held:
                lock.release()
            thread.join(procs.WAIT_LIMIT)
            assert took and took[0] is not None and took[0] > (tokens[keys[0]] or 0)
            assert second.holders() == []
            assert first.lock(keys[1]).acquire() and second.force_release(keys[1])
    finally:
        cluster.close()
