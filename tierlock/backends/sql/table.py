"""The lock table, the database clock, and every SQL statement tier 2 sends.

All times are taken from the database (semantic 3): ``utc_now()`` and ``utc_after()``
compile to each dialect's own clock, so a client with a skewed clock can neither
shorten nor stretch a lease. Timestamps are stored in UTC.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Double,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler, TypeCompiler
from sqlalchemy.sql.expression import (
    ColumnElement,
    Delete,
    Executable,
    FunctionElement,
    Select,
    Update,
)

from ...keys import MAX_KEY_LENGTH

__all__ = ["Statements", "check_table_name", "lock_table"]

# Names derived from the table name (index, constraint, sequence) must stay under
# PostgreSQL's 63-character identifier limit.
MAX_TABLE_NAME_LENGTH = 40
_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# The reaper deletes at most this many rows per statement, so one pass never locks a
# large part of the table at once.
REAP_BATCH = 500

MYSQL_FAMILY = ("mysql", "mariadb")

# A fencing token is a row's number shifted left by HANDOFF_BITS plus how many times
# the row was handed from one thread of its process to the next; handoffs per row stay
# far below 2**HANDOFF_BITS, so tokens strictly increase across all holds of a key.
HANDOFF_BITS = 16
MAX_ROW_HANDOFFS = (1 << HANDOFF_BITS) - 1


def fencing_token(token: int, handoffs: int) -> int:
    return (token << HANDOFF_BITS) | handoffs


def check_table_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"table must be a str, not {type(name).__name__}")
    if not _PLAIN_IDENTIFIER.match(name) or len(name) > MAX_TABLE_NAME_LENGTH:
        raise ValueError(
            f"table must be a plain identifier (letters, digits, underscores, not starting "
            f"with a digit, at most {MAX_TABLE_NAME_LENGTH} characters), got {name!r}"
        )
    return name


class LockKeyType(String):
    """VARCHAR(255) that compares keys exactly: case, trailing spaces, all of Unicode."""

    cache_ok = True

    def __init__(self) -> None:
        super().__init__(MAX_KEY_LENGTH)


@compiles(LockKeyType, "mysql")
@compiles(LockKeyType, "mariadb")
def _key_type_mysql(type_: LockKeyType, compiler: TypeCompiler, **kw: Any) -> str:
    # utf8mb4_bin is a PAD SPACE collation: 'a' and 'a ' would collide in the unique
    # index. MariaDB's utf8mb4_nopad_bin and MySQL 8's utf8mb4_0900_bin do not pad.
    is_mariadb = getattr(compiler.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if is_mariadb else "utf8mb4_0900_bin"
    return f"VARCHAR({MAX_KEY_LENGTH}) CHARACTER SET utf8mb4 COLLATE {collation}"


@compiles(LockKeyType, "postgresql")
def _key_type_postgresql(type_: LockKeyType, compiler: TypeCompiler, **kw: Any) -> str:
    # The "C" collation compares bytes: exact, and the cheapest for a unique index.
    return f'VARCHAR({MAX_KEY_LENGTH}) COLLATE "C"'


# DATETIME(6) on MySQL/MariaDB keeps microseconds; PostgreSQL's timestamptz does already.
Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL_FAMILY)


def lock_table(name: str, metadata: MetaData | None = None) -> Table:
    """The lock table. ``token`` is an ever-increasing identity, the base of the
    fencing token: SQLite's AUTOINCREMENT, MySQL's persistent AUTO_INCREMENT and
    PostgreSQL's sequence never hand out a value twice, across restarts too.
    ``handoffs`` counts the in-process hand-offs of the row (see ``fencing_token``).

    The columns after ``expires_at`` came with renewed leases and are nullable, so that
    a table of an earlier version gains them in place: ``lease`` is what the holder's
    heartbeat renews the row by (``NULL``: a fixed lease), and ``host_id`` and
    ``proc_start`` identify the holder process well enough to prove it gone (see
    ``tierlock.process``)."""
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column(
            "token",
            BigInteger().with_variant(Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        Column("lock_key", LockKeyType(), nullable=False),
        Column("handoffs", Integer, nullable=False, server_default=text("0")),
        Column("owner_id", String(32), nullable=False),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("thread_id", BigInteger, nullable=False),
        Column("thread_name", String(255), nullable=False),
        Column("acquired_at", Timestamp, nullable=False),
        Column("expires_at", Timestamp, nullable=False),
        Column("lease", Double),
        Column("host_id", String(64)),
        Column("proc_start", BigInteger),
        UniqueConstraint("lock_key", name=f"uq_{name}_lock_key"),
        Index(f"ix_{name}_expires_at", "expires_at"),
        sqlite_autoincrement=True,
        # A mysql+ URL on MariaDB compiles with the "mysql" dialect, mariadb+ with "mariadb".
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mariadb_engine="InnoDB",
        mariadb_charset="utf8mb4",
    )


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


def _expired(table: Table) -> ColumnElement[bool]:
    return table.c.expires_at <= utc_now()


_SESSION_ALIVE = {
    "mysql": "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = :session",
    "mariadb": "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = :session",
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE pid = :session",
    "sqlite": "SELECT 1 WHERE 0 = :session",
}


class Statements:
    """Every statement for one table and dialect. Bound parameter names: ``key``,
    ``owner``, ``ttl`` and ``lease`` (seconds), ``row`` (a row's token), ``handoffs``,
    and for the holder's record ``host_name``, ``host_identity``, ``proc``,
    ``proc_started``, ``thread``, ``thread_label``."""

    def __init__(self, table: Table, dialect_name: str, channel: str | None = None) -> None:
        self._table = table
        c = table.c
        key_is = c.lock_key == bindparam("key")
        owned = key_is & (c.owner_id == bindparam("owner"))
        self.returns_token = dialect_name == "postgresql"

        # insert_if_absent(key, owner, host_name, proc, thread, thread_label, ttl):
        # 1 row (PostgreSQL: the token returned) if the key was free, 0 rows if taken.
        # The dialect's insert-if-absent form means contention raises no error and
        # writes no line to the server's log.
        values = {
            "lock_key": bindparam("key"),
            "owner_id": bindparam("owner"),
            "host": bindparam("host_name"),
            "pid": bindparam("proc"),
            "thread_id": bindparam("thread"),
            "thread_name": bindparam("thread_label"),
            "acquired_at": utc_now(),
            "expires_at": utc_after(bindparam("ttl", type_=Float)),
            "lease": bindparam("lease", type_=Float),
            "host_id": bindparam("host_identity"),
            "proc_start": bindparam("proc_started", type_=BigInteger),
        }
        # The token is drawn from the sequence before the server checks the unique key,
        # so a second insert of the key must not be able to draw, win, and release in
        # between, or the first would then win with the lower token. PostgreSQL: a
        # transaction-level advisory lock on the key, taken before the draw, keeps
        # inserts of one key apart. MariaDB/MySQL: INSERT ... SELECT holds InnoDB's
        # table-level AUTO-INC lock to the end of the statement (innodb_autoinc_lock_mode
        # 0 or 1, the default). SQLite runs one writer at a time.
        names = list(values)
        row = select(*(value.label(name) for name, value in values.items()))
        self.insert_if_absent: Executable
        if dialect_name == "postgresql":
            serialised = select(
                func.pg_advisory_xact_lock(
                    func.hashtext(literal(table.name)), func.hashtext(bindparam("key"))
                ).label("locked")
            ).cte("serialised")
            self.insert_if_absent = (
                postgresql.insert(table)
                .from_select(names, row.select_from(serialised))
                .on_conflict_do_nothing(index_elements=[c.lock_key])
                .returning(c.token)
            )
        elif dialect_name == "sqlite":
            self.insert_if_absent = (
                sqlite.insert(table)
                .values(values)
                .on_conflict_do_nothing(index_elements=[c.lock_key])
            )
        else:
            # Safe here, though IGNORE also demotes other errors to warnings: every
            # value is checked or cut to its column's size before it is sent.
            self.insert_if_absent = insert(table).from_select(names, row).prefix_with("IGNORE")

        # select_holder(key): the holder's row (its token, and who and where it is) with
        # the database's verdict on its lease; no row if the key is free.
        self.select_holder = select(
            c.token, c.host_id, c.pid, c.proc_start, _expired(table).label("expired")
        ).where(key_is)

        # delete_expired_row(key, row): 1 row if that row of the key was removed because
        # its lease had ended (a waiter takes over); 0 rows if it is gone or was renewed.
        row_is = key_is & (c.token == bindparam("row", type_=BigInteger))
        self.delete_expired_row = delete(table).where(row_is & _expired(table))

        # delete_row(key, row): 1 row if that row of the key was removed, whatever its
        # lease: its holder process is proven gone (see tierlock.process).
        self.delete_row = delete(table).where(row_is)

        # delete_owned(key, owner): 1 row if the hold was ours and is now released;
        # 0 rows if it is no longer ours (reaped, taken over or force-released). With a
        # channel (PostgreSQL), the release is announced there with the key.
        self.delete_owned: Delete | Select[Any] = delete(table).where(owned)
        if channel is not None:
            gone = delete(table).where(owned).returning(c.lock_key).cte("gone")
            self.delete_owned = select(func.pg_notify(literal(channel), gone.c.lock_key))

        # extend_owned(key, owner, ttl, lease): 1 row if our hold now lasts ttl from
        # now, renewed by lease if given; 0 rows if it is no longer ours.
        self.extend_owned = (
            update(table)
            .where(owned)
            .values(
                expires_at=utc_after(bindparam("ttl", type_=Float)),
                lease=bindparam("lease", type_=Float),
            )
        )

        # handoff_owned(key, owner, handoffs, thread, thread_label, ttl, lease): 1 row if
        # our hold now belongs to another thread of this process, with the hand-off count
        # given (exactly: local hand-offs are counted in memory) and a lease of ttl from
        # now, renewed by lease if given; 0 rows if the row is no longer ours.
        holder = {
            "handoffs": bindparam("handoffs", type_=Integer),
            "thread_id": bindparam("thread"),
            "thread_name": bindparam("thread_label"),
            "acquired_at": utc_now(),
            "lease": bindparam("lease", type_=Float),
        }
        self.handoff_owned = (
            update(table)
            .where(owned)
            .values(**holder, expires_at=utc_after(bindparam("ttl", type_=Float)))
        )

        # record_holder(key, owner, handoffs, thread, thread_label, lease): 1 row if our
        # row now names the thread that holds it after hand-offs that sent no statement;
        # 0 rows if it is no longer ours.
        self.record_holder = update(table).where(owned).values(**holder)

        # select_owned_token(key, owner): token and handoffs if we hold the key, else
        # no row. Resolves an insert or hand-off whose outcome a dropped connection hid.
        self.select_owned_token = select(c.token, c.handoffs).where(owned)

        # select_live(key): a row if the key has an unexpired hold.
        self.select_live = select(c.token).where(key_is & ~_expired(table))

        # select_info(key) / select_all(): rows with the database's verdict on expiry.
        columns = [*table.c, _expired(table).label("expired")]
        self.select_info: Select[Any] = select(*columns).where(key_is)
        self.select_all: Select[Any] = select(*columns).order_by(c.lock_key)

        # session_alive(session): a row while the server session with this id (MySQL's
        # connection id, PostgreSQL's backend pid) exists; SQLite has no sessions.
        self.session_alive = text(_SESSION_ALIVE[dialect_name]).bindparams(
            bindparam("session", type_=BigInteger)
        )

        # delete_key(key): 1 row if the key had a hold, whoever's; 0 rows if free.
        self.delete_key = delete(table).where(key_is)

        # delete_expired_batch(): up to REAP_BATCH expired rows; fewer means none are left.
        self.delete_expired_batch: Delete
        if dialect_name in MYSQL_FAMILY:
            # MySQL forbids a subquery on the table being deleted from, but has LIMIT.
            self.delete_expired_batch = (
                delete(table)
                .where(_expired(table))
                .with_dialect_options(**{f"{dialect_name}_limit": REAP_BATCH})
            )
        else:
            batch = select(c.token).where(_expired(table)).limit(REAP_BATCH)
            self.delete_expired_batch = delete(table).where(c.token.in_(batch.scalar_subquery()))

    # The heartbeat names the rows it renews: a statement for ``size`` rows binds keys
    # k0, k1, ... and owner ids o0, o1, ... (unused places get "", which no row has).
    # Owner ids are unique to one row, so the rows matched are exactly those listed
    # that are still ours, and their count tells whether any was lost.

    def renew_owned(self, size: int) -> Update:
        """1 row for each listed row still ours with a live, renewed lease: it now lasts
        its ``lease`` from now. Rows whose lease ended are left to expire."""
        c = self._table.c
        return (
            update(self._table)
            .where(_listed(self._table, size) & c.lease.isnot(None) & ~_expired(self._table))
            .values(expires_at=utc_after(c.lease))
        )

    def select_live_owned(self, size: int) -> Select[Any]:
        """The owner ids of the listed rows still ours with a live lease."""
        return select(self._table.c.owner_id).where(
            _listed(self._table, size) & ~_expired(self._table)
        )


def _listed(table: Table, size: int) -> ColumnElement[bool]:
    keys: list[ColumnElement[Any]] = [bindparam(f"k{index}") for index in range(size)]
    owners: list[ColumnElement[Any]] = [bindparam(f"o{index}") for index in range(size)]
    return table.c.lock_key.in_(keys) & table.c.owner_id.in_(owners)
