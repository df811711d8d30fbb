"""The backend a manager opens: the engine its URL names (see ``urls.engine_of``), or
SQL on a ready SQLAlchemy engine. Engines are imported only when chosen, so that a
manager on one engine never loads the others' client libraries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..urls import engine_of
from . import LockBackend

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..stats import Counters

__all__ = ["open_backend"]


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
            from .redis import RedisBackend

            return RedisBackend(url, table=table, counters=counters, timeout=timeout)
        if kind == "file":
            from .files import FileBackend

            return FileBackend(
                url, table=table, create_table=create_table, counters=counters, timeout=timeout
            )
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
