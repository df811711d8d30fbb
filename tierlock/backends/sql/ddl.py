"""The lock table's DDL as ``tierlock init --print-sql`` prints it, for a database
administrator to run: compiled for the URL's dialect, with no table made."""

from __future__ import annotations

from sqlalchemy import Table, create_engine
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable, ExecutableDDLElement

from ..basics import connect_timeout
from .columns import MYSQL_FAMILY
from .layout import lock_table

__all__ = ["table_ddl"]

SUPPORTED = ("sqlite", *MYSQL_FAMILY, "postgresql")


def table_ddl(url: URL, name: str, timeout: float) -> str:
    """The DDL the manager would send for lock table ``name``, compiled for ``url``'s
    dialect without a table being made. MariaDB and MySQL 8 name their binary collation
    differently, so a mysql:// URL, which serves both, asks the server which it is
    (giving up as a manager with ``database_timeout=timeout`` gives up connecting), or
    gives both.

    :raises ValueError: tierlock does not support the URL's database, or SQLAlchemy
        cannot load its dialect.
    """
    if url.get_backend_name() not in SUPPORTED:
        raise ValueError(f"unsupported database {url.get_backend_name()!r}")
    try:
        dialect = url.get_dialect()()
    except SQLAlchemyError as exc:
        raise ValueError(str(exc)) from exc
    table = lock_table(name)
    if dialect.name == "mysql":
        server = _server_dialect(url, connect_timeout(timeout))
        if server is None:
            return "\n".join(
                [
                    f"-- tierlock lock table {table.name} for mysql",
                    "-- The server could not be asked whether it is MariaDB or MySQL (it did",
                    "-- not answer, or its driver is not installed), so here are both; they",
                    "-- differ only in lock_key's collation.",
                    "",
                    "-- For MariaDB:",
                    *_ddl_lines(table, mysql.dialect(is_mariadb=True)),
                    "",
                    "-- For MySQL 8:",
                    *_ddl_lines(table, mysql.dialect()),
                ]
            )
        dialect = server
    flavour = "mariadb" if getattr(dialect, "is_mariadb", False) else dialect.name
    return "\n".join(
        [f"-- tierlock lock table {table.name} for {flavour}", *_ddl_lines(table, dialect)]
    )


def _server_dialect(url: URL, seconds: float) -> Dialect | None:
    """The dialect as connecting to ``url`` sets it up, or ``None`` if that fails or
    takes longer than ``seconds`` a step."""
    # PyMySQL reads the greeting and the login's answer with its read timeout, and
    # connecting also sends a few queries, so a server that does not answer must not
    # hold the command; options in the URL take precedence.
    timeouts = ("connect_timeout", "read_timeout", "write_timeout")
    connect_args = {name: seconds for name in timeouts if name not in url.query}
    try:
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except ImportError:  # the URL's driver is missing: the DDL needs none
        return None
    try:
        with engine.connect() as connection:
            return connection.dialect
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def _ddl_lines(table: Table, dialect: Dialect) -> list[str]:
    elements: list[ExecutableDDLElement] = [CreateTable(table)]
    elements += [CreateIndex(index) for index in sorted(table.indexes, key=str)]
    lines: list[str] = []
    for element in elements:
        statement = str(element.compile(dialect=dialect)).strip().expandtabs(4)
        lines += ["", "\n".join(line.rstrip() for line in statement.splitlines()) + ";"]
    return lines
