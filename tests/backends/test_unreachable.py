"""A database out of reach reads the same on every database: the ``BackendError``
begins with "cannot reach the database", followed by the driver's reason, whether
making the manager or an operation found it so.

No server is needed: MariaDB and PostgreSQL are asked for on a port nobody listens on,
and SQLite for a file in a directory that does not exist, or that is a file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError

import tierlock

REACHLESS = r"^cannot reach the database: \S"

SQLITE_URLS = [
    pytest.param("sqlite:///{tmp_path}/missing/locks.db", id="sqlite-missing-directory"),
    pytest.param("sqlite:///{tmp_path}/a-file/locks.db", id="sqlite-under-a-file"),
]
POSTGRESQL_URL = pytest.param(
    "postgresql+psycopg://postgres:secret@127.0.0.1:1/test", id="postgresql"
)
MARIADB_URL = pytest.param("mysql+pymysql://root:secret@127.0.0.1:1/test", id="mariadb")


def out_of_reach(template: str, tmp_path: Path) -> str:
    (tmp_path / "a-file").write_text("not a directory")
    return template.format(tmp_path=tmp_path)


def check(error: tierlock.BackendError) -> None:
    assert isinstance(error.__cause__, DBAPIError)
    reason = " ".join(str(error.__cause__.orig).split())  # the driver's, on one line
    assert reason in str(error)
    assert "secret" not in str(error)


@pytest.mark.parametrize("template", [*SQLITE_URLS, POSTGRESQL_URL, MARIADB_URL])
def test_making_a_manager_that_creates_the_table(tmp_path: Path, template: str) -> None:
    with pytest.raises(tierlock.BackendError, match=REACHLESS) as caught:
        tierlock.LockManager(out_of_reach(template, tmp_path), reaper_interval=None)
    check(caught.value)


@pytest.mark.parametrize("template", [MARIADB_URL])
def test_making_a_manager_on_mariadb(template: str, tmp_path: Path) -> None:
    """Even without creating the table, it asks for InnoDB's auto-increment lock mode."""
    url = out_of_reach(template, tmp_path)
    with pytest.raises(tierlock.BackendError, match=REACHLESS) as caught:
        tierlock.LockManager(url, create_table=False, reaper_interval=None)
    check(caught.value)


@pytest.mark.parametrize("template", [*SQLITE_URLS, POSTGRESQL_URL])
def test_operations(tmp_path: Path, template: str) -> None:
    """A manager that does not create the table opens nothing until it is used. (On
    MariaDB it does, see above; test_connection_loss.py loses its server later.)"""
    url = out_of_reach(template, tmp_path)
    with tierlock.LockManager(
        url, create_table=False, reaper_interval=None, database_timeout=2
    ) as locks:
        lock = locks.lock("user:42")
        for operation in (
            lock.acquire,
            lock.locked,
            lambda: locks.info("user:42"),
            locks.holders,
            lambda: locks.force_release("user:42"),
            locks.reap,
        ):
            with pytest.raises(tierlock.BackendError, match=REACHLESS) as caught:
                operation()
            check(caught.value)
