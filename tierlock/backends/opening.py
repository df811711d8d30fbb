"""The backend a manager opens: the engine its URL names (see ``urls.engine_of``), or
SQL on a ready SQLAlchemy engine. Engines are imported only when chosen, so that a
manager on one engine never loads the others' client libraries, and needs only its
own installed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..urls import engine_of, missing_driver
from . import LockBackend

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..stats import Counters

__all__ = ["open_backend"]

# The client library each engine that has one imports.
CLIENT_LIBRARIES = {"redis": "redis", "zookeeper": "kazoo"}


def open_backend(
    url: str | None,
    engine: Engine | None,
    *,
    table: str,
    create_table: bool,
    ttl: float,
    counters: Counters,
    timeout: float,
) -> LockBackend:
    """The backend for a URL (its scheme picks the engine) or a ready SQLAlchemy engine.

    ``ttl`` is the manager's default lease (a ZooKeeper session's timeout);
    ``counters`` receives the backend's events; ``timeout`` bounds, in seconds, how
    long one operation keeps trying to reach the engine.
    """
    kind = "sql" if url is None else engine_of(url)
    if kind != "sql":
        if engine is not None:
            raise ValueError("give a database URL or an engine, not both")
        assert url is not None
        if kind == "redis":
            with _client_library(url, kind):
                from .redis import RedisBackend

            return RedisBackend(url, table=table, counters=counters, timeout=timeout)
        if kind == "file":
            from .files import FileBackend

            return FileBackend(
                url, table=table, create_table=create_table, counters=counters, timeout=timeout
            )
        with _client_library(url, kind):
            from .zookeeper import ZooKeeperBackend

        return ZooKeeperBackend(url, table=table, ttl=ttl, counters=counters, timeout=timeout)
    from .sql import SQLBackend

    return SQLBackend(
        url=url,
        engine=engine,
        table=table,
        create_table=create_table,
        counters=counters,
        timeout=timeout,
    )


@contextlib.contextmanager
def _client_library(url: str, kind: str) -> Iterator[None]:
    """Importing engine ``kind``'s package: its client library missing (or broken) is
    ``MissingDriverError``, which says what to install; tierlock's own import errors
    stay what they are."""
    try:
        yield
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == __name__.partition(".")[0]:
            raise
        raise missing_driver(url, CLIENT_LIBRARIES[kind], exc) from exc
