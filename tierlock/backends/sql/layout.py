"""The lock table's layout: its columns, and what a row's mode says it is."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    text,
)

from .columns import ROW_KEY_LENGTH, LockKeyType, Timestamp

__all__ = ["GROUP", "PERMIT", "RESERVED", "SHARED", "lock_table"]

# What a row is, in its ``mode`` column: NULL for an exclusive hold; a group row holds
# a key for its readers, each of whom has a row of its own under the key; a permit row
# is one slot of a semaphore (see ``shared``).
GROUP = "group"
SHARED = "shared"
PERMIT = "permit"
# A group whose last reader left while a writer waited becomes a reservation: readers
# keep out, and a writer deletes it and inserts its own row.
RESERVED = "reserved"


def lock_table(name: str, metadata: MetaData | None = None) -> Table:
    """The lock table. ``token`` is an ever-increasing identity, the base of the
    fencing token: SQLite's AUTOINCREMENT, MySQL's persistent AUTO_INCREMENT and
    PostgreSQL's sequence never hand out a value twice, across restarts too.
    ``handoffs`` counts the in-process hand-offs of the row (see ``basics.fencing_token``).

    The columns after ``expires_at`` came with renewed leases and are nullable, so that
    a table of an earlier version gains them in place: ``lease`` is what the holder's
    heartbeat renews the row by (``NULL``: a fixed lease), and ``host_id`` and
    ``proc_start`` identify the holder process well enough to prove it gone (see
    ``tierlock.process``).

    The last five came with read holds and semaphores (see ``shared``): ``mode`` is
    ``NULL`` for an exclusive hold, else one of ``MODES``; ``members``, ``waiting`` and
    ``permits`` belong to a group row and to permit rows, ``parent`` to a reader's row."""
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column(
            "token",
            BigInteger().with_variant(Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        Column("lock_key", LockKeyType(ROW_KEY_LENGTH), nullable=False),
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
        Column("mode", String(8)),
        Column("members", Integer),
        Column("waiting", Timestamp),
        Column("permits", Integer),
        Column("parent", BigInteger),
        UniqueConstraint("lock_key", name=f"uq_{name}_lock_key"),
        Index(f"ix_{name}_expires_at", "expires_at"),
        sqlite_autoincrement=True,
        # A mysql+ URL on MariaDB compiles with the "mysql" dialect, mariadb+ with "mariadb".
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mariadb_engine="InnoDB",
        mariadb_charset="utf8mb4",
    )
