"""The engines the contract suite runs on, how to tell one is reachable, and how to
remove a test's namespace (a table, a Redis key prefix, a ZooKeeper node, a directory)
afterwards."""

from __future__ import annotations

import functools
import os
import shutil

import pytest
from sqlalchemy import create_engine, inspect, text

from tierlock.urls import engine_of, hide_password

ENGINES = {
    "sqlite": None,  # a fresh file per test, under tmp_path
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "redis": "redis://127.0.0.1:6379/0",
    "zookeeper": "zookeeper://127.0.0.1:2181/tierlock",
    "file": None,  # a fresh directory per test, under tmp_path
}
SQL = ("sqlite", "mariadb", "postgresql")


def _zookeeper(url: str) -> tuple[str, str]:
    """kazoo's hosts and the chroot of a ``zookeeper://`` URL."""
    from tierlock.backends.zookeeper.address import parse_url

    address = parse_url(url)
    return address.hosts, address.chroot


def _directory(url: str, name: str) -> str:
    from tierlock.backends.files.names import parse_url

    return os.path.join(parse_url(url), name)


@functools.cache
def _unreachable(url: str) -> str | None:
    """Why ``url`` cannot be used, or None; asked once per process."""
    try:
        kind = engine_of(url)
        if kind == "redis":
            import redis

            with redis.Redis.from_url(url, socket_timeout=5) as client:
                client.ping()
        elif kind == "zookeeper":
            from kazoo.client import KazooClient

            client = KazooClient(hosts=_zookeeper(url)[0])
            client.start(timeout=5)
            client.stop()
            client.close()
        else:
            engine = create_engine(url)
            try:
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
            finally:
                engine.dispose()
    except Exception as exc:
        return f"{hide_password(url)} is unreachable: {exc}"
    return None


def require_server(url: str) -> None:
    reason = _unreachable(url)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


def drop_namespace(url: str, table: str) -> None:
    """Remove what tests left of ``table`` on ``url``'s engine."""
    kind = engine_of(url)
    if kind == "file":
        shutil.rmtree(_directory(url, table), ignore_errors=True)
    elif kind == "redis":
        import redis

        with redis.Redis.from_url(url) as client:
            for name in client.scan_iter(match=f"{table}:*", count=1000):
                client.delete(name)
    elif kind == "zookeeper":
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError

        hosts, chroot = _zookeeper(url)
        client = KazooClient(hosts=hosts + chroot)
        client.start(timeout=10)
        try:
            client.delete(f"/{table}", recursive=True)
        except NoNodeError:  # (nothing was made)
            pass
        finally:
            client.stop()
            client.close()
    else:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                for dropped in (table, f"{table}_once"):
                    connection.execute(text(f"DROP TABLE IF EXISTS {dropped}"))
        finally:
            engine.dispose()


def left_over(url: str, name: str) -> bool:
    """Whether anything named ``name`` is left on ``url``'s engine: a table, Redis keys
    under ``name:``, a ZooKeeper node ``/name``, a directory ``name``."""
    kind = engine_of(url)
    if kind == "file":
        return os.path.exists(_directory(url, name))
    if kind == "redis":
        import redis

        with redis.Redis.from_url(url) as client:
            return any(True for _ in client.scan_iter(match=f"{name}:*", count=1000))
    if kind == "zookeeper":
        from kazoo.client import KazooClient

        hosts, chroot = _zookeeper(url)
        client = KazooClient(hosts=hosts + chroot)
        client.start(timeout=10)
        try:
            return client.exists(f"/{name}") is not None
        finally:
            client.stop()
            client.close()
    engine = create_engine(url)
    try:
        return inspect(engine).has_table(name)
    finally:
        engine.dispose()


def keeps_expired(db: str) -> bool:
    """Whether a hold whose lease ended stays visible (expired) until it is reaped or
    taken over. Redis deletes it at the end of its lease, by the key's own expiry."""
    return db != "redis"
