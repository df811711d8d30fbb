"""Making the lock table ready: create it, bring an older one up to date, and check
the server settings that fencing tokens rely on."""

from __future__ import annotations

import logging
import time

from sqlalchemy import Table, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.schema import CreateColumn

from ...errors import BackendError
from .columns import MYSQL_FAMILY, ROW_KEY_LENGTH
from .engine import is_contention, unreachable
from .running import LONGEST_RETRY_PAUSE, RETRY_PAUSE

__all__ = ["prepare_table"]

logger = logging.getLogger(__name__)


def prepare_table(engine: Engine, table: Table, *, create: bool, timeout: float) -> None:
    """Create ``table`` if asked and bring it up to date; on MySQL/MariaDB, warn if the
    server may hand out fencing tokens out of order. Contention (on SQLite, another
    process writing: the managers of several processes opening at once, say) is tried
    again until ``timeout`` runs out, as an operation's is.

    :raises BackendError: the database cannot be reached, or the table not created.
    """
    give_up = time.monotonic() + timeout
    tries = 0
    while True:
        tries += 1
        try:
            if create:
                _create_table(engine, table)
            if engine.dialect.name in MYSQL_FAMILY:
                _check_autoinc_lock_mode(engine, table)
            return
        except DBAPIError as exc:  # (contention, which the steps pass on, or a lookup's)
            left = give_up - time.monotonic()
            if not is_contention(exc) or left <= 0:
                raise BackendError(f"cannot prepare table {table.name!r}: {exc.orig}") from exc
        time.sleep(min(RETRY_PAUSE * tries, LONGEST_RETRY_PAUSE, left))


def _create_table(engine: Engine, table: Table) -> None:
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        if is_contention(exc):
            raise
        raise BackendError(unreachable(exc, engine.url)) from exc
    with connection:
        try:
            table.create(connection, checkfirst=True)
        except DBAPIError as exc:
            if is_contention(exc):
                raise
            # Another process may have created it between the check and CREATE.
            if not _has_table(engine, table):
                message = f"cannot create table {table.name!r}: {exc.orig}"
                raise BackendError(message) from exc
    _add_missing_columns(engine, table)


def _check_autoinc_lock_mode(engine: Engine, table: Table) -> None:
    """Fencing tokens rise in the order holds are won only while InnoDB holds its
    AUTO-INC lock through an INSERT ... SELECT (see ``Statements``)."""
    try:
        with engine.connect() as connection:
            mode = connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar()
    except DBAPIError as exc:
        raise BackendError(unreachable(exc, engine.url)) from exc
    if mode == 2:
        logger.warning(
            "innodb_autoinc_lock_mode is 2 (interleaved): fencing tokens of lock table "
            "%r may come out of order when two inserts of one key race; set it to 1",
            table.name,
        )


def _has_table(engine: Engine, table: Table) -> bool:
    try:
        return inspect(engine).has_table(table.name)
    except SQLAlchemyError:
        return False


def _add_missing_columns(engine: Engine, table: Table) -> None:
    """Bring a table of an earlier version up to date: 0.1 had no ``handoffs``, 0.2
    none of the columns that came with renewed leases, 0.3 none of those of read holds
    and semaphores (all nullable), and a key column too narrow for their rows."""
    missing = _missing(engine, table)
    if not missing:
        return
    _widen_key(engine, table)
    # Quoted as CREATE TABLE quoted it: PostgreSQL folds a bare MixedCase to lower case.
    name = engine.dialect.identifier_preparer.format_table(table)
    for column in missing:
        spec = CreateColumn(table.c[column]).compile(dialect=engine.dialect)
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {spec}")
        except DBAPIError as exc:
            if is_contention(exc):
                raise
            if column in _missing(engine, table):  # (else another process added it first)
                raise BackendError(f"cannot upgrade table {table.name!r}: {exc.orig}") from exc
        logger.warning("added column %s to lock table %r", column, table.name)


def _widen_key(engine: Engine, table: Table) -> None:
    """Widen the key column of a table of an earlier version, which had room for a
    user's key only (SQLite does not enforce a VARCHAR's length)."""
    if engine.dialect.name == "sqlite":
        return
    columns = {column["name"]: column for column in inspect(engine).get_columns(table.name)}
    length = getattr(columns["lock_key"]["type"], "length", None)
    if length is None or length >= ROW_KEY_LENGTH:
        return
    name = engine.dialect.identifier_preparer.format_table(table)
    spec = table.c.lock_key.type.compile(dialect=engine.dialect)
    if engine.dialect.name == "postgresql":
        alter = f"ALTER TABLE {name} ALTER COLUMN lock_key TYPE {spec}"
    else:
        alter = f"ALTER TABLE {name} MODIFY lock_key {spec} NOT NULL"
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(alter)
    except DBAPIError as exc:
        raise BackendError(f"cannot upgrade table {table.name!r}: {exc.orig}") from exc
    logger.warning("widened column lock_key of lock table %r", table.name)


def _missing(engine: Engine, table: Table) -> list[str]:
    present = {column["name"] for column in inspect(engine).get_columns(table.name)}
    return [column.name for column in table.columns if column.name not in present]
