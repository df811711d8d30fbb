"""What every engine shares, and where the engines other than SQL differ: the URL's
scheme picks the engine, and read locks and semaphores, which are SQL rows, are refused
elsewhere before anything is written."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MakeManager
from engines import ENGINES, SQL

import tierlock
from tierlock.aio import AsyncLockManager
from tierlock.urls import engine_label

OTHERS = [
    pytest.param(name, marks=getattr(pytest.mark, name)) for name in ENGINES if name not in SQL
]


@pytest.mark.parametrize("db", OTHERS, indirect=True)
def test_read_locks_and_semaphores_are_refused_where_the_engine_has_none(
    make_manager: MakeManager, db_url: str, table: str, key: str
) -> None:
    locks = make_manager()
    for make in (lambda: locks.read_lock(key), lambda: locks.semaphore(key, 2)):
        with pytest.raises(tierlock.LockError, match="on the SQL engines only"):
            make()
    assert locks.holders() == []
    with locks.write_lock(key):  # (the exclusive hold, as lock())
        assert locks.lock(key).locked()

    async def main() -> None:
        async with AsyncLockManager(db_url, table=table, reaper_interval=None) as alocks:
            with pytest.raises(tierlock.LockError, match="on the SQL engines only"):
                alocks.read_lock(key)
            with pytest.raises(tierlock.LockError, match="on the SQL engines only"):
                alocks.semaphore(key, 2)

    asyncio.run(main())


def test_the_url_scheme_picks_the_engine(make_manager: MakeManager, db: str) -> None:
    locks = make_manager()
    label = engine_label(locks.url)
    assert label == {"mariadb": "mysql"}.get(db, db)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "zookeeper://127.0.0.1:2181/x"])
def test_an_engine_and_a_url_of_another_engine_are_refused(url: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    try:
        with pytest.raises(ValueError, match="not both"):
            tierlock.LockManager(url, engine=engine)
    finally:
        engine.dispose()
