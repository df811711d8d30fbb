"""Bare driver connections for the peers and floors that bypass SQLAlchemy, and a count
of the statements (Redis: commands; ZooKeeper: requests) every driver of this process
sends, or of its file-system calls, which are a lock directory's statements."""

from __future__ import annotations

import fcntl
import functools
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL


def mysql_connection(url: URL) -> Any:
    """An autocommit pymysql connection to the server of a ``mysql+pymysql://`` URL."""
    import pymysql

    return pymysql.connect(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.database,
        autocommit=True,
    )


def postgresql_connection(url: URL) -> Any:
    """An autocommit psycopg connection to the server of a ``postgresql+psycopg://`` URL."""
    import psycopg

    return psycopg.connect(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
        autocommit=True,
    )


# The functions of ``os`` that reach the file system, as the file engine, filelock and
# the floor on a lock directory call them (``os.path`` and ``pathlib`` through them too).
FILE_CALLS = (
    *("open", "close", "stat", "lstat", "fstat", "read", "write", "pread", "pwrite"),
    *("ftruncate", "utime", "unlink", "rename", "replace", "link", "mkdir", "rmdir"),
    *("scandir", "fchmod", "lseek"),
)


class _Executed:
    """Statements executed on DBAPI cursors of this process, and commands and requests
    sent by its Redis and ZooKeeper clients, since ``count_statements()``; or its
    file-system calls since ``count_file_calls()``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._count = 0

    def tick(self) -> None:
        with self._mutex:
            self._count += 1

    def __call__(self) -> int:
        return self._count


def _counting(call: Callable[..., Any], executed: _Executed) -> Callable[..., Any]:
    """``call`` (a function, or a method once set on its class), counted at each call."""

    @functools.wraps(call)
    def counted(*args: Any, **kwargs: Any) -> Any:
        executed.tick()
        return call(*args, **kwargs)

    return counted


class _CountingSQLiteCursor(sqlite3.Cursor):
    executed: _Executed

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.executed.tick()
        return super().execute(*args, **kwargs)


class _CountingSQLiteConnection(sqlite3.Connection):
    def cursor(self, factory: Any = _CountingSQLiteCursor) -> Any:
        return super().cursor(factory)


def count_statements() -> Callable[[], int]:
    """From now on, count each ``execute`` on a DBAPI cursor of pymysql, psycopg or
    sqlite3 in this process, whoever calls it (SQLAlchemy's pool included), each
    command redis-py packs to send (pipelines' one by one) and each request a
    ``KazooClient`` sends (its pings aside); return a function that reads the count.

    For a process of its own: the drivers' classes stay patched. sqlite3's cursors are
    counted on connections opened afterwards; its ``Connection.execute`` shortcut,
    which SQLAlchemy and tierlock use only to set a connection up, is not.
    """
    executed = _Executed()
    import psycopg
    import pymysql.cursors
    import redis.connection
    from kazoo.client import KazooClient

    for packer in (redis.connection.PythonRespSerializer, redis.connection.HiredisRespSerializer):
        packer.pack = _counting(packer.pack, executed)  # type: ignore[method-assign]
    KazooClient._call = _counting(KazooClient._call, executed)

    pymysql.cursors.Cursor.execute = _counting(pymysql.cursors.Cursor.execute, executed)
    psycopg.Cursor.execute = _counting(  # type: ignore[method-assign]
        psycopg.Cursor.execute, executed
    )
    _CountingSQLiteCursor.executed = executed
    connect = sqlite3.connect

    @functools.wraps(connect)
    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("factory", _CountingSQLiteConnection)
        return connect(*args, **kwargs)

    sqlite3.connect = sqlite3.dbapi2.connect = counting_connect
    return executed


@functools.cache
def count_file_calls() -> Callable[[], int]:
    """From now on, count each call of the ``os`` functions of ``FILE_CALLS`` and of
    ``fcntl.flock`` in this process, from any thread and whoever makes it; return a
    function that reads the count. They stay patched: a later call returns the same
    count rather than counting each call twice.

    Each is one system call (``scandir``: a listing), issued by Python code; what C
    code does on its own (``open()``'s file objects, SQLite) is not counted.
    """
    executed = _Executed()
    for name in FILE_CALLS:
        setattr(os, name, _counting(getattr(os, name), executed))
    fcntl.flock = _counting(fcntl.flock, executed)
    return executed
