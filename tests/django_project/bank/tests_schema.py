"""The migration creates exactly the table that ``LockManager(create_table=True)``
creates, adopts that table, refuses another (with one line from ``migrate``), and can
be undone."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import TransactionTestCase
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from tierlock import LockManager
from tierlock.backends.sql.layout import lock_table
from tierlock.contrib.django import LockTableError
from tierlock.contrib.django.conf import resolve
from tierlock.contrib.django.schema import CreateLockTable, ddl, django_dialect

COPY = "bank_ddl_copy"


def drop_table(url: str, name: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as sql:
            sql.execute(text(f"DROP TABLE IF EXISTS {name}"))
    finally:
        engine.dispose()


def described(engine: Engine, name: str) -> dict[str, Any]:
    """The table as SQLAlchemy reflects it, its own name replaced by ``T``."""
    inspector = inspect(engine)

    def named(value: object) -> str:
        return str(value).replace(name, "T")

    return {
        "columns": [
            (c["name"], named(c["type"]), c["nullable"], named(c.get("default")))
            for c in inspector.get_columns(name)
        ],
        "primary key": inspector.get_pk_constraint(name)["constrained_columns"],
        "unique": sorted(
            (named(u["name"]), tuple(u["column_names"]))
            for u in inspector.get_unique_constraints(name)
        ),
        "indexes": sorted(
            (named(i["name"]), tuple(map(str, i["column_names"])), i["unique"])
            for i in inspector.get_indexes(name)
        ),
    }


def server_ddl(engine: Engine, name: str) -> list[str]:
    """What the database itself says the table is, its own name replaced by ``T``."""
    with engine.connect() as sql:
        if engine.dialect.name == "sqlite":
            rows = sql.execute(
                text(
                    "SELECT COALESCE(sql, name) FROM sqlite_master WHERE tbl_name = :t"
                    " ORDER BY type, name"
                ),
                {"t": name},
            )
            found = [row[0] for row in rows]
        elif engine.dialect.name == "mysql":
            create = sql.execute(text(f"SHOW CREATE TABLE {name}")).one()[1]
            found = [re.sub(r" AUTO_INCREMENT=\d+", "", create)]
        else:
            columns = sql.execute(
                text(
                    "SELECT column_name, data_type, character_maximum_length, collation_name,"
                    " is_nullable, column_default FROM information_schema.columns"
                    " WHERE table_name = :t ORDER BY ordinal_position"
                ),
                {"t": name},
            )
            indexes = sql.execute(
                text("SELECT indexdef FROM pg_indexes WHERE tablename = :t"),
                {"t": name},
            )
            found = [repr(tuple(row)) for row in columns]
            found += sorted(row[0].replace(name, "T") for row in indexes)
    return [statement.replace(name, "T") for statement in found]


class MigrationTests(TransactionTestCase):  # type: ignore[misc]
    def setUp(self) -> None:
        self.target = resolve()
        LockManager(self.target.url, table=COPY, reaper_interval=None).close()
        self.addCleanup(drop_table, self.target.url, COPY)
        self.engine = create_engine(self.target.url, poolclass=NullPool)
        self.addCleanup(self.engine.dispose)

    def test_migrated_table_is_the_one_create_table_makes(self) -> None:
        applied = MigrationRecorder(connection).applied_migrations()
        assert ("tierlock", "0001_initial") in applied
        assert self.target.table == "tierlock_locks"
        migrated = described(self.engine, self.target.table)
        assert migrated == described(self.engine, COPY)
        assert len(migrated["columns"]) == len(lock_table(COPY).columns)
        assert server_ddl(self.engine, self.target.table) == server_ddl(self.engine, COPY)

    def test_sqlmigrate_shows_the_ddl(self) -> None:
        out = io.StringIO()
        call_command("sqlmigrate", "tierlock", "0001_initial", stdout=out)
        if connection.vendor == "sqlite":  # the locks are in a file of their own
            assert "tierlock's lock table tierlock_locks is in sqlite:///" in out.getvalue()
            assert "apart from this database" in out.getvalue()
            return
        for statement in ddl(lock_table(self.target.table), django_dialect(connection)):
            assert statement.splitlines()[0] in out.getvalue()

    def test_migration_adopts_the_same_table_and_refuses_another(self) -> None:
        if connection.vendor == "sqlite":
            self.skipTest("the lock table is in a file of its own, created by tierlock")
        with self.settings(TIERLOCK={"TABLE": COPY}), connection.schema_editor() as editor:
            CreateLockTable().database_forwards("tierlock", editor, None, None)
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE bank_bogus (id integer)")
        self.addCleanup(drop_table, self.target.url, "bank_bogus")
        with (
            self.settings(TIERLOCK={"TABLE": "bank_bogus"}),
            pytest.raises(
                CommandError, match=r"^tierlock: .*lacks token, lock_key, .*proc_start"
            ) as refused,
            connection.schema_editor() as editor,
        ):
            CreateLockTable().database_forwards("tierlock", editor, None, None)
        assert isinstance(refused.value.__cause__, LockTableError)

    def test_migration_is_undone_and_done_again(self) -> None:
        before = described(self.engine, self.target.table)
        call_command("migrate", "tierlock", "zero", verbosity=0)
        assert not inspect(self.engine).has_table(self.target.table)
        call_command("migrate", "tierlock", verbosity=0)
        assert described(self.engine, self.target.table) == before
