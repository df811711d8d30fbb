"""The DDL files in sql/ are what ``create_table=True`` creates, and work as they are.

Each file is compared with the lock table compiled for its dialect, so the test fails
as soon as either drifts; then it is run on the real server and a manager with
``create_table=False`` takes a lock in the table it made.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ddl import normalise, split
from sqlalchemy import inspect, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.schema import CreateIndex, CreateTable, ExecutableDDLElement

import tierlock
from tierlock.backends.sql.layout import lock_table

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
DEFAULT_TABLE = "tierlock_locks"

# The file for each database, and the dialect tierlock compiles the table with there.
# mysql.sql is for MariaDB reached through a mysql+pymysql:// URL: SQLAlchemy's MySQL
# dialect in MariaDB mode. (The separate "mariadb" dialect would drop the mysql_engine
# and mysql_charset table options.)
FILES: dict[str, tuple[str, Callable[[], Dialect]]] = {
    "sqlite": ("sqlite.sql", sqlite.dialect),
    "mariadb": ("mysql.sql", lambda: mysql.dialect(is_mariadb=True)),
    "postgresql": ("postgresql.sql", postgresql.dialect),
}


def compiled_ddl(dialect: Dialect) -> list[str]:
    """What ``create_table=True`` sends for the default table: the table, its indexes."""
    table = lock_table(DEFAULT_TABLE)
    ddl: list[ExecutableDDLElement] = [CreateTable(table)]
    ddl += [CreateIndex(index) for index in sorted(table.indexes, key=lambda i: str(i.name))]
    return [normalise(str(element.compile(dialect=dialect))) for element in ddl]


def read(db: str) -> str:
    return (SQL_DIR / FILES[db][0]).read_text(encoding="utf-8")


@pytest.mark.parametrize("db_name", sorted(FILES))
def test_file_equals_the_compiled_table(db_name: str) -> None:
    script = read(db_name)
    expected = compiled_ddl(FILES[db_name][1]())
    assert [normalise(statement) for statement in split(script)] == expected
    assert script.startswith("--"), "the file opens with a header comment"


def test_normalise_keeps_what_matters() -> None:
    # The comparison above ignores layout only: names, types and order still count.
    assert normalise("CREATE TABLE t (\n\ta INTEGER, \n\tb TEXT\n)") == (
        "CREATE TABLE t(a INTEGER,b TEXT)"
    )
    assert normalise("CREATE TABLE t (a INT)") != normalise("CREATE TABLE t (a BIGINT)")
    assert split("-- x; y\nCREATE TABLE t (a INT);\n\nCREATE INDEX i ON t (a);\n") == [
        "CREATE TABLE t (a INT)",
        "CREATE INDEX i ON t (a)",
    ]


def test_file_makes_a_working_table(
    db: str,
    engine: Engine,
    table: str,
    make_manager: Callable[..., tierlock.LockManager],
    key: str,
) -> None:
    script = read(db)
    with engine.connect() as connection:  # so the dialect knows the server it talks to
        dialect = connection.dialect
        if dialect.name == "mysql" and not getattr(dialect, "is_mariadb", False):
            # A MySQL server given with --dburi: the one edit the file's header asks for.
            script = script.replace("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
    # What this very server would be sent by create_table=True, version quirks included.
    assert [normalise(statement) for statement in split(script)] == compiled_ddl(dialect)

    with engine.begin() as connection:
        for statement in split(script.replace(DEFAULT_TABLE, table)):
            connection.exec_driver_sql(statement)
    assert inspect(engine).has_table(table)

    locks = make_manager(create_table=False)
    lock = locks.lock(key)
    assert lock.acquire(blocking=False)
    first = lock.token
    assert first is not None
    info = locks.info(key)
    assert info is not None
    assert (info.key, info.token, info.expired) == (key, first, False)
    # The key column compares exactly: these are other locks, free to take now.
    others = [locks.lock(key + " "), locks.lock(key.upper())]
    assert all(other.acquire(blocking=False) for other in others)
    for other in others:
        other.release()
    lock.release()
    assert locks.info(key) is None

    assert lock.acquire(blocking=False)
    second = lock.token
    lock.release()
    assert second is not None
    assert second > first


def test_table_without_handoffs_column_is_upgraded(
    make_manager: Callable[..., tierlock.LockManager], engine: Engine, table: str
) -> None:
    """A table made before hand-offs existed gets its column, and locks work on it."""
    lock_table(table).create(engine)
    with engine.begin() as connection:
        connection.execute(text(f"ALTER TABLE {table} DROP COLUMN handoffs"))
    manager = make_manager()
    with manager.lock("user:1") as lock:
        assert lock.token is not None
    columns = {column["name"] for column in inspect(engine).get_columns(table)}
    assert "handoffs" in columns


@pytest.fixture
def mixed_case_table(engine: Engine) -> Iterator[str]:
    """A table name that only works quoted on PostgreSQL, which folds bare names to
    lower case; dropped afterwards."""
    name = f"MixedCase_{uuid.uuid4().hex[:16]}"
    yield name
    lock_table(name).drop(engine, checkfirst=True)


def test_mixed_case_table_without_handoffs_column_is_upgraded(
    make_manager: Callable[..., tierlock.LockManager], engine: Engine, mixed_case_table: str
) -> None:
    lock_table(mixed_case_table).create(engine)
    quoted = engine.dialect.identifier_preparer.quote(mixed_case_table)
    with engine.begin() as connection:
        connection.execute(text(f"ALTER TABLE {quoted} DROP COLUMN handoffs"))
    manager = make_manager(table=mixed_case_table)
    with manager.lock("user:1") as lock:
        assert lock.token is not None
        assert manager.info("user:1") is not None
    columns = {column["name"] for column in inspect(engine).get_columns(mixed_case_table)}
    assert "handoffs" in columns
