"""The engines that are not SQL databases, Redis, ZooKeeper and a lock directory, as the
benchmark meets them: a client of each, whether the server answers (the directory can
be written), the holds a cell left, and the removal of a run's namespace: tierlock's
(``<table>:`` keys, the ``/<table>`` node, the ``<table>`` directory) and the peers'
beside it (see :func:`peer_namespace`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from typing import Any

import redis
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

import tierlock
from tierlock.backends.files.names import parse_url as parse_file_url
from tierlock.backends.zookeeper.address import parse_url
from tierlock.urls import engine_of, hide_password

# How long a client may take to reach its server before the server counts as unreachable.
CONNECT_LIMIT = 5.0


def is_sql(url: str) -> bool:
    return engine_of(url) == "sql"


def peer_namespace(table: str) -> str:
    """Where the peers of a run keep their keys (Redis: this prefix and a colon, and
    python-redis-lock's ``lock:`` and ``lock-signal:`` before it), nodes (ZooKeeper:
    this node under the chroot) or files (a directory of this name beside tierlock's):
    apart from tierlock's, whose listing they would otherwise join."""
    return f"{table}_peers"


def lock_directory(url: str, name: str) -> str:
    """The directory ``name`` in the lock directory of a ``file://`` URL."""
    return os.path.join(parse_file_url(url), name)


def zookeeper_parts(url: str) -> tuple[str, str]:
    """kazoo's hosts and the chroot ("" for none) of a ``zookeeper://`` URL."""
    address = parse_url(url)
    return address.hosts, address.chroot


class CountingKazooClient(KazooClient):  # type: ignore[misc]
    """A client that counts the requests it sends (its pings aside), from any thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self._counting = threading.Lock()

    def _call(self, request: Any, async_object: Any) -> Any:
        with self._counting:
            self.requests += 1
        return super()._call(request, async_object)


def kazoo_client(url: str, *, chroot: bool = True) -> CountingKazooClient:
    """A started client of the URL's servers, inside its chroot unless ``chroot`` is
    False."""
    hosts, root = zookeeper_parts(url)
    client = CountingKazooClient(hosts=hosts + root if chroot else hosts)
    client.start(timeout=CONNECT_LIMIT)
    return client


def stop(client: KazooClient) -> None:
    client.stop()
    client.close()


def unreachable(url: str) -> str | None:
    """Why the Redis or ZooKeeper server of ``url``, or its lock directory, cannot be
    used, or None. A lock directory is made if missing, as tierlock would make it."""
    try:
        if engine_of(url) == "file":
            directory = parse_file_url(url)
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK | os.X_OK):
                raise PermissionError(f"{directory} cannot be written")
        elif engine_of(url) == "redis":
            with redis.Redis.from_url(url, socket_connect_timeout=CONNECT_LIMIT) as client:
                client.ping()
        else:
            stop(kazoo_client(url, chroot=False))
    except Exception as exc:
        return f"cannot use {hide_password(url)}: {exc}"
    return None


def prepare(url: str) -> None:
    """Make ZooKeeper's chroot, which clients inside it cannot make without a warning."""
    if engine_of(url) == "zookeeper":
        root = zookeeper_parts(url)[1]
        if root:
            client = kazoo_client(url, chroot=False)
            try:
                client.ensure_path(root)
            finally:
                stop(client)


def holds_left(url: str, table: str) -> int:
    """How many holds tierlock's ``table`` still has, by its own listing; releases
    them, so the next cell starts clean."""
    manager = tierlock.LockManager(url, table=table, reaper_interval=None)
    try:
        left = manager.holders()
        for info in left:
            manager.force_release(info.key)
        return len(left)
    finally:
        manager.close()


def drop_namespace(url: str, table: str) -> None:
    """Remove tierlock's namespace ``table`` and its peers' from the engine of ``url``."""
    peers = peer_namespace(table)
    if engine_of(url) == "file":
        for name in (table, peers):
            with contextlib.suppress(FileNotFoundError):  # (nothing was made)
                shutil.rmtree(lock_directory(url, name))
        return
    if engine_of(url) == "redis":
        with redis.Redis.from_url(url) as client:
            for pattern in (
                f"{table}:*",
                f"{peers}:*",
                f"lock:{peers}:*",
                f"lock-signal:{peers}:*",
            ):
                names = list(client.scan_iter(match=pattern, count=1000))
                for start in range(0, len(names), 1000):
                    client.delete(*names[start : start + 1000])
        return
    client = kazoo_client(url)
    try:
        for node in (table, peers):
            with contextlib.suppress(NoNodeError):  # (nothing was made)
                client.delete(f"/{node}", recursive=True)
    finally:
        stop(client)
