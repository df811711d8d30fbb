"""The lock table under Django: the migration's operation, and the check that a
manager which does not create its table finds it.

The migration creates the table where the manager keeps its locks (see ``conf``). In
the application's own database (MySQL/MariaDB, PostgreSQL) it runs, through Django's
schema editor and inside the migration's transaction where the database has one, the
DDL that ``LockManager(create_table=True)`` sends: both compile ``lock_table()`` for
the database's SQLAlchemy dialect, so the two cannot drift apart, and ``sqlmigrate``
shows it. A table already there (made by ``create_table=True`` or ``tierlock init``)
is adopted if it has every column, refused with a clear message if not. Elsewhere (the
SQLite lock file, a ``URL``) the migration has tierlock create it, as
``create_table=True`` does.
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation
from sqlalchemy import Table, create_engine, inspect
from sqlalchemy.dialects.mysql.base import MySQLDialect
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable, ExecutableDDLElement

from ...backends.sql.table import lock_table
from ...errors import BackendError, LockError
from ...manager import LockManager
from ...urls import engine_of, shown_url, sql_url
from .conf import Target, resolve

__all__ = ["CreateLockTable", "LockTableError", "ddl", "open_manager"]

MIGRATE = "run `python manage.py migrate tierlock`"
# A key no one locks: reading its row checks the table and all of its columns.
PROBE_KEY = "tierlock:django:probe"


class LockTableError(LockError):
    """The lock table is missing, or is not tierlock's; the message says what to do."""


def ddl(table: Table, dialect: Dialect) -> list[str]:
    """The statements ``table.create()`` sends: the table, then each index."""
    elements: list[ExecutableDDLElement] = [CreateTable(table)]
    elements += [CreateIndex(index) for index in sorted(table.indexes, key=str)]
    return [str(element.compile(dialect=dialect)).strip() for element in elements]


def django_dialect(connection: Any) -> Dialect:
    """The SQLAlchemy dialect for a Django connection's database."""
    if connection.vendor == "mysql":
        is_mariadb: bool = connection.mysql_is_mariadb
        return MySQLDialect(is_mariadb=is_mariadb)
    if connection.vendor == "postgresql":
        return PGDialect()  # type: ignore[no-untyped-call]
    return SQLiteDialect()


def missing_columns(table: Table, present: set[str]) -> list[str]:
    return [column.name for column in table.columns if column.name not in present]


class CreateLockTable(Operation):  # type: ignore[misc]
    """Create tierlock's lock table (``TIERLOCK["TABLE"]``) where its locks live."""

    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        """The table is tierlock's, not a model's: the project state does not change."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        target = resolve()
        if schema_editor.connection.alias != target.alias:
            return
        if target.shared:
            _create_in(schema_editor, lock_table(target.table))
        elif schema_editor.collect_sql:
            schema_editor.collected_sql.append(f"-- {_elsewhere(target)}")
        else:
            target.manager(create_table=True, reaper_interval=None).close()

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        target = resolve()
        if schema_editor.connection.alias != target.alias:
            return
        if target.shared:
            schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(target.table)}", None)
        elif schema_editor.collect_sql:
            schema_editor.collected_sql.append(f"-- {_elsewhere(target)}")
        else:
            engine = create_engine(sql_url(target.url), poolclass=NullPool)
            try:
                lock_table(target.table).drop(engine, checkfirst=True)
            finally:
                engine.dispose()

    def describe(self) -> str:
        return "Create tierlock's lock table"


def _elsewhere(target: Target) -> str:
    shown = shown_url(target.url)
    return f"tierlock's lock table {target.table} is in {shown}, apart from this database"


def _create_in(schema_editor: Any, table: Table) -> None:
    connection = schema_editor.connection
    if not schema_editor.collect_sql:
        with connection.cursor() as cursor:
            if table.name in connection.introspection.table_names(cursor):
                description = connection.introspection.get_table_description(cursor, table.name)
                missing = missing_columns(table, {column.name for column in description})
                if missing:
                    raise LockTableError(
                        f"table {table.name} exists in database {connection.alias!r} but is "
                        f"not tierlock's lock table: it lacks {', '.join(missing)}; drop or "
                        "rename it, or name another table in TIERLOCK['TABLE']"
                    )
                return  # made by create_table=True or `tierlock init`: the same table
    for statement in ddl(table, django_dialect(connection)):
        schema_editor.execute(statement, None)


def open_manager(target: Target, **overrides: Any) -> LockManager:
    """A manager for ``target``; unless it creates its table, the table is checked.

    :raises LockTableError: the table is missing or lacks columns.
    :raises BackendError: the database cannot be reached.
    """
    manager = target.manager(**overrides)
    if overrides.get("create_table", target.create_table):
        return manager
    try:
        manager.info(PROBE_KEY)
    except BackendError:
        problem = table_problem(target)
        manager.close()
        if problem is not None:
            raise LockTableError(problem) from None
        raise
    return manager


def table_problem(target: Target) -> str | None:
    """What is wrong with ``target``'s table, or ``None`` if nothing is, as far as the
    database says (the other engines have no table)."""
    if engine_of(target.url) != "sql":
        return None
    shown = shown_url(target.url)
    engine = create_engine(sql_url(target.url), poolclass=NullPool)
    try:
        inspector = inspect(engine)
        if not inspector.has_table(target.table):
            return f"lock table {target.table} does not exist in {shown}; {MIGRATE}"
        present = {column["name"] for column in inspector.get_columns(target.table)}
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    missing = missing_columns(lock_table(target.table), present)
    if not missing:
        return None
    return (
        f"lock table {target.table} in {shown} lacks {', '.join(missing)}, which this "
        "version of tierlock needs; set TIERLOCK['CREATE_TABLE'] = True once and "
        "tierlock adds them"
    )
