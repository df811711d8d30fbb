"""The lock table under Django: the migration's operation, what every ``migrate``
makes sure of, and the check that a manager which does not create its table finds it.

The migration creates the table where the manager keeps its locks (see ``conf``). In
the application's own database (MySQL/MariaDB, PostgreSQL) it runs, through Django's
schema editor and inside the migration's transaction where the database has one, the
DDL that ``LockManager(create_table=True)`` sends: both compile ``lock_table()`` for
the database's SQLAlchemy dialect, so the two cannot drift apart, and ``sqlmigrate``
shows it. A table already there (made by ``create_table=True`` or ``tierlock init``)
is adopted if it has every column, refused with a clear message if not. Elsewhere (the
SQLite lock file, a ``URL``) the migration has tierlock create it, as
``create_table=True`` does.

Django applies a migration once, but the table can change after that (a new
``TABLE``) or go (dropped, or its SQLite file deleted). So after every ``migrate`` of
its database, while the migration is applied, the table the settings name is created
if it is missing, and ``migrate tierlock`` is the one fix for a missing table.
Unapplied, the migration drops the table if it is there, and says so if not; another
engine's keys, nodes or files may belong to live holds, and are left alone. Bad
settings and an unreachable lock database stop ``migrate`` with one line.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation
from django.db.migrations.recorder import MigrationRecorder
from sqlalchemy import Table, inspect
from sqlalchemy.dialects.mysql.base import MySQLDialect
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.schema import CreateIndex, CreateTable, ExecutableDDLElement

from ...backends.sql.engine import engine_for_url, unreachable
from ...backends.sql.layout import lock_table
from ...base import DEFAULT_DATABASE_TIMEOUT
from ...errors import UNREACHABLE, BackendError, LockError
from ...manager import LockManager
from ...urls import engine_of, shown_url
from .conf import Target, resolve

__all__ = [
    "CreateLockTable",
    "LockTableError",
    "check_before_migrate",
    "create_missing_table",
    "ddl",
    "open_manager",
]

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
        target = _target_of(schema_editor.connection.alias)
        if target is None:
            return
        if schema_editor.collect_sql and not target.shared:
            schema_editor.collected_sql.append(f"-- {_elsewhere(target)}")
            return
        with _as_command_error(target):
            create_table(target, schema_editor)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        target = _target_of(schema_editor.connection.alias)
        if target is None:
            return
        if target.shared:
            # (IF EXISTS: ``check_before_migrate`` has said if there is nothing to drop.)
            name = schema_editor.quote_name(target.table)
            schema_editor.execute(f"DROP TABLE IF EXISTS {name}", None)
        elif schema_editor.collect_sql:
            schema_editor.collected_sql.append(f"-- {_elsewhere(target)}")
        elif engine_of(target.url) == "sql":
            with _as_command_error(target), _lock_database(target) as engine:
                lock_table(target.table).drop(engine, checkfirst=True)

    def describe(self) -> str:
        return "Create tierlock's lock table"


def create_table(target: Target, schema_editor: Any) -> None:
    """Create ``target``'s table unless it is there: in the application's database
    through ``schema_editor``, elsewhere as ``create_table=True`` does (which makes
    another engine's namespace ready).

    :raises LockTableError: a table of that name is there but is not tierlock's.
    :raises BackendError: the lock database cannot be reached.
    """
    if target.shared:
        _create_in(schema_editor, lock_table(target.table))
    else:
        target.manager(create_table=True, reaper_interval=None).close()


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
    except BackendError as exc:
        # (out of reach: looking for the table would only wait for the server again)
        problem = None if str(exc).startswith(UNREACHABLE) else table_problem(target)
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
    try:
        present = table_columns(target)
    except BackendError:
        return None
    if present is None:
        return f"lock table {target.table} does not exist in {shown}; {MIGRATE}"
    missing = missing_columns(lock_table(target.table), present)
    if not missing:
        return None
    return (
        f"lock table {target.table} in {shown} lacks {', '.join(missing)}, which this "
        "version of tierlock needs; set TIERLOCK['CREATE_TABLE'] = True once and "
        "tierlock adds them"
    )


def table_columns(target: Target) -> set[str] | None:
    """The column names of ``target``'s table (an SQL one), ``None`` if it has none.

    :raises BackendError: the lock database cannot be reached.
    """
    with _lock_database(target) as engine:
        inspector = inspect(engine)
        if not inspector.has_table(target.table):
            return None
        return {column["name"] for column in inspector.get_columns(target.table)}


@contextlib.contextmanager
def _lock_database(target: Target) -> Iterator[Engine]:
    """An engine on ``target``'s SQL database for one look or change, connecting within
    the manager's ``database_timeout`` (a server that stops answering must not hang
    ``migrate``), its driver's errors raised as ``BackendError``."""
    timeout = dict(target.options).get("database_timeout", DEFAULT_DATABASE_TIMEOUT)
    engine = engine_for_url(target.url, timeout)
    try:
        yield engine
    except DBAPIError as exc:
        # (OperationalError: the server refused or dropped the connection.)
        reason = unreachable(exc) if isinstance(exc, OperationalError) else str(exc.orig)
        raise BackendError(reason) from exc
    finally:
        engine.dispose()


# -- what every ``migrate`` of the lock table's database makes sure of ---------------------


def check_before_migrate(
    app_config: Any,
    using: str,
    plan: Any = None,
    verbosity: int = 1,
    stdout: Any = None,
    **kwargs: Any,
) -> None:
    """``pre_migrate``: check the settings before anything is migrated, and when the
    migration is to be unapplied with no table to drop, say so."""
    target = _target_of(using)
    if target is None or not any(
        backwards
        and any(isinstance(operation, CreateLockTable) for operation in migration.operations)
        for migration, backwards in plan or ()
    ):
        return
    shown = shown_url(target.url)
    if engine_of(target.url) != "sql":
        note = f"{shown} keeps no lock table: nothing to drop (namespace {target.table} is left)"
    else:
        with _as_command_error(target):
            if table_columns(target) is not None:
                return
        note = f"lock table {target.table} is not in {shown}: nothing to drop"
    if verbosity:
        (stdout or sys.stdout).write(f"  tierlock: {note}\n")


def create_missing_table(
    app_config: Any,
    using: str,
    plan: Any = None,
    verbosity: int = 1,
    stdout: Any = None,
    **kwargs: Any,
) -> None:
    """``post_migrate``: while tierlock's migration is applied, create the table the
    settings name if it is missing."""
    if plan is None:  # (``flush`` sends it too, and leaves the lock table alone)
        return
    target = _target_of(using)
    if target is None or not _is_migrated(app_config.label, connections[using]):
        return
    sql = engine_of(target.url) == "sql"
    with _as_command_error(target):
        if sql and table_columns(target) is not None:
            return
        with connections[using].schema_editor() as schema_editor:
            create_table(target, schema_editor)
    if sql and verbosity:
        shown = shown_url(target.url)
        (stdout or sys.stdout).write(f"  tierlock: created lock table {target.table} in {shown}\n")


def _target_of(using: str) -> Target | None:
    """The lock table the settings name, if ``using`` is the database that migrates it."""
    with _as_command_error():
        target = resolve()
    return target if target.alias == using else None


def _is_migrated(label: str, connection: Any) -> bool:
    """Whether tierlock's migration is applied to ``connection``'s database, or the
    app's migrations are turned off (``MIGRATION_MODULES``, a test database's
    ``"MIGRATE": False``), when Django makes the tables without them."""
    if MigrationLoader.migrations_module(label)[0] is None:
        return True
    return any(app == label for app, _ in MigrationRecorder(connection).applied_migrations())


@contextlib.contextmanager
def _as_command_error(target: Target | None = None) -> Iterator[None]:
    """Bad settings and an unreachable lock database as a ``CommandError``: one line
    from ``migrate``, not a traceback."""
    try:
        yield
    except BackendError as exc:
        where = "" if target is None else f"{shown_url(target.url)}: "
        raise CommandError(f"tierlock: {where}{exc}") from exc
    except (LockError, ImproperlyConfigured, ValueError, TypeError) as exc:
        raise CommandError(f"tierlock: {exc}") from exc
