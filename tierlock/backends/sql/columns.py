"""Column types and the database's clock, compiled for each dialect: keys compared
exactly, timestamps in UTC with microseconds, and times that the database, not the
client, tells (semantic 3)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import DateTime, String, literal_column
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler, TypeCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.expression import FunctionElement

from ...keys import MAX_KEY_LENGTH

__all__ = [
    "MYSQL_FAMILY",
    "ROW_KEY_LENGTH",
    "LockKeyType",
    "Timestamp",
    "if_absent",
    "larger",
    "plain",
    "unindexed",
    "utc_after",
    "utc_now",
]

MYSQL_FAMILY = ("mysql", "mariadb")

# The lock table's key column is wider than a user's key: read holds and permits are
# rows under the key, a mark and a suffix (see ``tierlock.keys.MARK``).
ROW_KEY_LENGTH = 300


class LockKeyType(String):
    """VARCHAR that compares keys exactly: case, trailing spaces, all of Unicode."""

    cache_ok = True

    def __init__(self, length: int = MAX_KEY_LENGTH) -> None:
        super().__init__(length)


@compiles(LockKeyType, "mysql")
@compiles(LockKeyType, "mariadb")
def _key_type_mysql(type_: LockKeyType, compiler: TypeCompiler, **kw: Any) -> str:
    # utf8mb4_bin is a PAD SPACE collation: 'a' and 'a ' would collide in the unique
    # index. MariaDB's utf8mb4_nopad_bin and MySQL 8's utf8mb4_0900_bin do not pad.
    is_mariadb = getattr(compiler.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if is_mariadb else "utf8mb4_0900_bin"
    return f"VARCHAR({type_.length}) CHARACTER SET utf8mb4 COLLATE {collation}"


@compiles(LockKeyType, "postgresql")
def _key_type_postgresql(type_: LockKeyType, compiler: TypeCompiler, **kw: Any) -> str:
    # The "C" collation compares bytes: exact, and the cheapest for a unique index.
    return f'VARCHAR({type_.length}) COLLATE "C"'


# DATETIME(6) on MySQL/MariaDB keeps microseconds; PostgreSQL's timestamptz does already.
Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL_FAMILY)


class utc_now(FunctionElement[Any]):
    """The database's current UTC time."""

    type = Timestamp
    inherit_cache = True


class utc_after(FunctionElement[Any]):
    """The database's current UTC time plus a number of seconds."""

    type = Timestamp
    inherit_cache = True


# SQLite's strftime gives milliseconds; three zeros make a six-digit fraction, the
# form SQLAlchemy reads back, and keep stored values comparable as text.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now'{}) || '000'"


@compiles(utc_now, "sqlite")
def _now_sqlite(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    return _SQLITE_NOW.format("")


@compiles(utc_after, "sqlite")
def _after_sqlite(element: utc_after, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return _SQLITE_NOW.format(f", printf('%+.3f seconds', {seconds})")


@compiles(utc_now, "mysql")
@compiles(utc_now, "mariadb")
def _now_mysql(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


@compiles(utc_after, "mysql")
@compiles(utc_after, "mariadb")
def _after_mysql(element: utc_after, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"UTC_TIMESTAMP(6) + INTERVAL ROUND({seconds} * 1000000) MICROSECOND"


@compiles(utc_now, "postgresql")
def _now_postgresql(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "statement_timestamp()"


@compiles(utc_after, "postgresql")
def _after_postgresql(element: utc_after, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"statement_timestamp() + make_interval(secs => {seconds})"


class unindexed(FunctionElement[Any]):
    """A column's value in a form no index serves, so that MariaDB looks a key's row up
    by ``lock_key`` alone. It plans ``UPDATE ... WHERE lock_key = ? AND expires_at >
    now`` as a range scan of the ``expires_at`` index, locking every live key's entries
    on the way, and ``DELETE ... WHERE lock_key = ? AND token = ?`` through the primary
    key, locking the row before its ``lock_key`` entry, where every other statement of
    the key locks the entry first: either deadlocks with statements of other keys, or of
    the same key."""

    inherit_cache = True

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(unindexed)
def _unindexed(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(unindexed, "mysql")
@compiles(unindexed, "mariadb")
def _unindexed_mysql(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    zero = "INTERVAL 0 MICROSECOND" if isinstance(element.type, DateTime) else "0"
    return f"({compiler.process(element.clauses, **kw)} + {zero})"


def if_absent(statement: mysql.Insert) -> mysql.Insert:
    """MariaDB/MySQL's insert-if-absent: a duplicate key changes nothing (``ON DUPLICATE
    KEY UPDATE`` of the key to itself). Not ``INSERT IGNORE``: for a duplicate, InnoDB
    then locks the existing entry exclusively, not shared, so that inserts of a key
    whose row was just deleted wait for one another instead of deadlocking (each holding
    a shared lock on the deleted entry, each waiting to insert beside it). The server
    reports such a duplicate as one row found (or none) with no insert id, and returns
    the existing row to a ``RETURNING``."""
    return statement.on_duplicate_key_update(lock_key=statement.table.c.lock_key)


class larger(FunctionElement[Any]):
    """The larger of two values."""

    inherit_cache = True


@compiles(larger)
def _larger(element: larger, compiler: SQLCompiler, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(larger, "sqlite")
def _larger_sqlite(element: larger, compiler: SQLCompiler, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


# Text that means the same inside quotes on every dialect, paramstyle and server setting:
# letters, digits and ``_.:/-`` only (no quote, backslash, percent sign or question
# mark, nothing outside ASCII).
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.:/-]*\Z")


def plain(value: str) -> ColumnElement[str]:
    """``value`` written into the SQL as a string literal, not sent as a parameter: for
    values that every statement of a table or a process sends alike (a parameter less
    spares the driver its conversion at every statement).

    :raises ValueError: ``value`` is not plain text, which would need quoting that
        differs between dialects and server settings: send it as a parameter instead.
    """
    if not _PLAIN_TEXT.match(value):
        raise ValueError(f"not plain text: {value!r}")
    return literal_column(f"'{value}'", String)
