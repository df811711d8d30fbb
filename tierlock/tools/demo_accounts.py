"""Where ``tierlock demo`` keeps its accounts: beside the locks, on the same engine.

A transfer reads both balances, pauses and writes both back in separate requests, with
no transaction around them, so two overlapping transfers lose money unless a lock keeps
them apart.
"""

from __future__ import annotations

import abc
import os
import shutil
import time
from typing import Any

from sqlalchemy import Column, Integer, MetaData, create_engine, event, func, insert, select, update
from sqlalchemy import Table as SQLTable

from ..urls import engine_of, sql_url

__all__ = ["Accounts", "accounts_name", "open_accounts"]

# Between reading the balances and writing them back: wide enough that overlapping
# transfers lose updates every second, short enough to keep the rate up.
TRANSFER_PAUSE = 0.001
# SQLite's busy timeout: several processes write the file, and without a lock at all
# writers queue for it often.
SQLITE_BUSY_SECONDS = 30


def accounts_name(lock_table: str) -> str:
    """The accounts live next to the locks, so demos on other tables never meet."""
    return f"{lock_table}_demo_accounts"


class Accounts(abc.ABC):
    """Balances by account number, on one connection pool of one process."""

    @abc.abstractmethod
    def seed(self, count: int, balance: int) -> None:
        """Start afresh: accounts ``0`` to ``count - 1``, each holding ``balance``."""

    @abc.abstractmethod
    def total(self) -> int: ...

    @abc.abstractmethod
    def balances(self, source: int, target: int) -> tuple[int, int]: ...

    @abc.abstractmethod
    def write(self, account: int, balance: int) -> None: ...

    @abc.abstractmethod
    def drop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def move(self, source: int, target: int, amount: int) -> None:
        """Read both balances, pause, write both back: safe only if nothing else touches
        the two accounts meanwhile."""
        from_balance, to_balance = self.balances(source, target)
        time.sleep(TRANSFER_PAUSE)
        self.write(source, from_balance - amount)
        self.write(target, to_balance + amount)


class SQLAccounts(Accounts):
    """A table, written in autocommit statements."""

    def __init__(self, url: str, table: str, connections: int) -> None:
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_size": connections}
        parsed = sql_url(url)  # mysql:// takes PyMySQL here too, as the locks' URL does
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite:
            options["connect_args"] = {"timeout": SQLITE_BUSY_SECONDS}
        self._engine = create_engine(parsed, **options)
        if sqlite:

            @event.listens_for(self._engine, "connect")
            def _wal(dbapi_connection: Any, record: object) -> None:
                # WAL lets readers run beside the one writer of the file.
                dbapi_connection.execute("PRAGMA journal_mode = WAL")

        self._table = SQLTable(
            accounts_name(table),
            MetaData(),
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("balance", Integer, nullable=False),
        )

    def seed(self, count: int, balance: int) -> None:
        self.drop()
        self._table.create(self._engine)
        with self._engine.connect() as connection:
            rows = [{"id": i, "balance": balance} for i in range(count)]
            connection.execute(insert(self._table), rows)

    def total(self) -> int:
        with self._engine.connect() as connection:
            column = self._table.c.balance
            return int(connection.execute(select(func.sum(column))).scalar_one())

    def balances(self, source: int, target: int) -> tuple[int, int]:
        columns = self._table.c
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(columns.id, columns.balance).where(columns.id.in_((source, target)))
            )
            found: dict[int, int] = {row.id: row.balance for row in rows}
        return found[source], found[target]

    def write(self, account: int, balance: int) -> None:
        columns = self._table.c
        with self._engine.connect() as connection:
            connection.execute(
                update(self._table).where(columns.id == account).values(balance=balance)
            )

    def drop(self) -> None:
        self._table.drop(self._engine, checkfirst=True)

    def close(self) -> None:
        self._engine.dispose()


def _balance(value: bytes | str | None) -> int:
    if value is None:
        raise LookupError("an account is missing")
    return int(value)


class RedisAccounts(Accounts):
    """One string per account, read with MGET and written with SET."""

    def __init__(self, url: str, table: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url)
        self._prefix = f"{accounts_name(table)}:"

    def _names(self, count: int) -> list[str]:
        return [f"{self._prefix}{i}" for i in range(count)]

    def seed(self, count: int, balance: int) -> None:
        self.drop()
        self._client.mset({name: balance for name in self._names(count)})
        self._client.set(f"{self._prefix}count", count)

    def total(self) -> int:
        count = int(self._client.get(f"{self._prefix}count") or 0)
        return sum(_balance(value) for value in self._client.mget(self._names(count)))

    def balances(self, source: int, target: int) -> tuple[int, int]:
        names = [f"{self._prefix}{source}", f"{self._prefix}{target}"]
        found = self._client.mget(names)
        return _balance(found[0]), _balance(found[1])

    def write(self, account: int, balance: int) -> None:
        self._client.set(f"{self._prefix}{account}", balance)

    def drop(self) -> None:
        names = list(self._client.scan_iter(match=f"{self._prefix}*", count=1000))
        if names:
            self._client.delete(*names)

    def close(self) -> None:
        self._client.close()


class ZooKeeperAccounts(Accounts):
    """One node per account, its balance as the node's data, written unversioned."""

    def __init__(self, url: str, table: str, timeout: float = 30.0) -> None:
        from kazoo.client import KazooClient

        from ..backends.zookeeper.address import parse_url

        address = parse_url(url)  # (the lock manager made the chroot)
        auth = [("digest", address.credentials)] if address.credentials else None
        self._client = KazooClient(
            hosts=address.hosts + address.chroot, timeout=timeout, auth_data=auth
        )
        self._client.start(timeout=timeout)
        self._path = f"/{accounts_name(table)}"

    def seed(self, count: int, balance: int) -> None:
        self.drop()
        self._client.ensure_path(self._path)
        for account in range(count):
            self._client.create(f"{self._path}/{account}", str(balance).encode())

    def total(self) -> int:
        children = self._client.get_children(self._path)
        return sum(int(self._client.get(f"{self._path}/{child}")[0]) for child in children)

    def balances(self, source: int, target: int) -> tuple[int, int]:
        reads = [self._client.get_async(f"{self._path}/{account}") for account in (source, target)]
        return int(reads[0].get()[0]), int(reads[1].get()[0])

    def write(self, account: int, balance: int) -> None:
        self._client.set(f"{self._path}/{account}", str(balance).encode())

    def drop(self) -> None:
        if self._client.exists(self._path):
            self._client.delete(self._path, recursive=True)

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class FileAccounts(Accounts):
    """One file per account in a directory beside the lock directory, its balance as
    the file's text, read and overwritten in place."""

    def __init__(self, url: str, table: str) -> None:
        from ..backends.files.names import parse_url

        self._root = os.path.join(parse_url(url), accounts_name(table))

    def _path(self, account: int) -> str:
        return os.path.join(self._root, str(account))

    def seed(self, count: int, balance: int) -> None:
        self.drop()
        os.makedirs(self._root)
        for account in range(count):
            self.write(account, balance)

    def total(self) -> int:
        return sum(self._read(os.path.join(self._root, name)) for name in os.listdir(self._root))

    def _read(self, path: str) -> int:
        with open(path, "rb") as file:
            return _balance(file.read())

    def balances(self, source: int, target: int) -> tuple[int, int]:
        return self._read(self._path(source)), self._read(self._path(target))

    def write(self, account: int, balance: int) -> None:
        # Fixed width, in place: a read meanwhile sees the old balance or the new one.
        fd = os.open(self._path(account), os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            os.pwrite(fd, b"%20d" % balance, 0)
        finally:
            os.close(fd)

    def drop(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

    def close(self) -> None:
        pass


def open_accounts(url: str, table: str, connections: int) -> Accounts:
    """The accounts of a demo on ``url``'s engine (``connections``: its threads)."""
    kind = engine_of(url)
    if kind == "redis":
        return RedisAccounts(url, table)
    if kind == "zookeeper":
        return ZooKeeperAccounts(url, table)
    if kind == "file":
        return FileAccounts(url, table)
    return SQLAccounts(url, table, connections)
