"""Where the Django integration keeps its locks: read from ``settings.TIERLOCK`` and
the ``DATABASES`` entry it names, resolved afresh whenever those settings change.

MySQL/MariaDB and PostgreSQL keep the lock table in the application's own database,
reached by tierlock's own autocommit connections (``mysql+pymysql``,
``postgresql+psycopg``). SQLite does not: a transaction of the application holds the
write lock of its file until it ends, so tierlock writing its table in that file from
another connection would wait for it, and a lock released at commit (see
``transactions``) could never be taken by the next request meanwhile. So on SQLite the
locks live in a file of their own beside the application's, ``<name>-tierlock<suffix>``
(``db.sqlite3`` -> ``db-tierlock.sqlite3``), which follows the test database as the
application's file does. An in-memory database, Django's default test database on
SQLite, is private to its process, so its locks go to a temporary file of the process.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from sqlalchemy.engine import URL

from ...backends.basics import check_table_name
from ...base import DEFAULT_TABLE
from ...manager import LockManager
from ...urls import engine_of, sql_url

__all__ = ["DEFAULT_ALIAS", "Target", "database_url", "resolve", "snapshot"]

DEFAULT_ALIAS = "default"
# TIERLOCK keys passed on to LockManager as they are.
MANAGER_OPTIONS = {
    "TTL": "ttl",
    "RENEW": "renew",
    "REAPER_INTERVAL": "reaper_interval",
    "POLL_INTERVAL": "poll_interval",
    "DATABASE_TIMEOUT": "database_timeout",
}
KNOWN_KEYS = frozenset({"DATABASE", "URL", "TABLE", "CREATE_TABLE", *MANAGER_OPTIONS})
# What a DATABASES entry says about where its database is.
DATABASE_FIELDS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT")
DRIVERS = {"mysql": "mysql+pymysql", "postgresql": "postgresql+psycopg"}


@dataclasses.dataclass(frozen=True)
class Target:
    """A lock table and what the manager needs to know about it."""

    url: str  # password included: never shown (LockManager.url hides it)
    alias: str  # the Django database whose migrations create the table
    table: str
    shared: bool  # the table is in that database itself (MySQL, PostgreSQL)
    create_table: bool  # the manager creates it (else migrations do, and it is checked)
    options: tuple[tuple[str, Any], ...]  # the other LockManager options

    def manager(self, **overrides: Any) -> LockManager:
        options: dict[str, Any] = {
            "table": self.table,
            "create_table": self.create_table,
            **dict(self.options),
            **overrides,
        }
        return LockManager(self.url, **options)


def tierlock_settings() -> dict[str, Any]:
    config = getattr(settings, "TIERLOCK", None) or {}
    if not isinstance(config, dict):
        raise ImproperlyConfigured(f"TIERLOCK must be a dict, not {type(config).__name__}")
    return config


def snapshot() -> tuple[Any, ...]:
    """What ``resolve()`` reads, cheap to take on every use: the manager is made again
    when it changes (Django's test runner renames the database after start-up)."""
    config = tierlock_settings()
    alias = config.get("DATABASE", DEFAULT_ALIAS)
    database = settings.DATABASES.get(alias) or {}
    return (
        tuple(sorted(config.items())),
        tuple(database.get(field) for field in DATABASE_FIELDS),
    )


def resolve() -> Target:
    """The lock table that the settings describe now.

    :raises ImproperlyConfigured: an unknown key, a missing alias, a database tierlock
        cannot use, a table name it cannot use, or a URL that would put the locks in the
        application's SQLite file.
    """
    config = tierlock_settings()
    unknown = sorted(set(config) - KNOWN_KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"TIERLOCK has unknown key(s) {', '.join(unknown)}; "
            f"known keys: {', '.join(sorted(KNOWN_KEYS))}"
        )
    alias = config.get("DATABASE", DEFAULT_ALIAS)
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(f"TIERLOCK['DATABASE'] is {alias!r}, not in DATABASES")
    database = settings.DATABASES[alias]
    vendor = connections[alias].vendor
    create_table = config.get("CREATE_TABLE", False)
    if not isinstance(create_table, bool):
        raise ImproperlyConfigured("TIERLOCK['CREATE_TABLE'] must be True or False")
    if "URL" in config:
        url, shared = str(config["URL"]), False
        if vendor == "sqlite":
            _refuse_application_file(url, database)
    else:
        url, shared = database_url(database, vendor), vendor != "sqlite"
        # Nothing but this process can reach its temporary file, nor migrate it.
        create_table = create_table or _is_in_memory(database)
    try:
        table = check_table_name(config.get("TABLE", DEFAULT_TABLE))
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"TIERLOCK['TABLE']: {exc}") from None
    return Target(
        url=url,
        alias=alias,
        table=table,
        shared=shared,
        create_table=create_table,
        options=tuple(
            (MANAGER_OPTIONS[key], config[key]) for key in sorted(config) if key in MANAGER_OPTIONS
        ),
    )


def database_url(database: dict[str, Any], vendor: str) -> str:
    """The SQLAlchemy URL of the lock database for a ``DATABASES`` entry (see above)."""
    if vendor == "sqlite":
        return URL.create(
            "sqlite", database=os.fspath(sqlite_lock_file(database))
        ).render_as_string(hide_password=False)
    if vendor not in DRIVERS:
        raise ImproperlyConfigured(
            f"tierlock keeps locks in SQLite, MySQL/MariaDB or PostgreSQL, not {vendor}; "
            "give TIERLOCK['URL']"
        )
    host = str(database.get("HOST") or "") or None
    query = {}
    if host is not None and host.startswith("/"):  # a Unix socket's path or directory
        query = {"unix_socket" if vendor == "mysql" else "host": host}
        host = None
    port = database.get("PORT")
    url = URL.create(
        DRIVERS[vendor],
        username=database.get("USER") or None,
        password=database.get("PASSWORD") or None,
        host=host,
        port=int(port) if port else None,
        database=database.get("NAME") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def sqlite_lock_file(database: dict[str, Any]) -> Path:
    if _is_in_memory(database):
        return _private_directory() / "locks.sqlite3"
    path = Path(database["NAME"])
    return path.with_name(f"{path.stem}-tierlock{path.suffix or '.sqlite3'}")


def _is_in_memory(database: dict[str, Any]) -> bool:
    name = str(database.get("NAME") or "")
    return name in ("", ":memory:") or "mode=memory" in name


_private: list[Path] = []


def _private_directory() -> Path:
    """A directory of this process's own, removed when it exits."""
    if not _private:
        path = Path(tempfile.mkdtemp(prefix="tierlock-django-"))
        atexit.register(_remove, path, os.getpid())
        _private.append(path)
    return _private[0]


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # (not in a forked child: the directory is its parent's)
        shutil.rmtree(path, ignore_errors=True)


def _refuse_application_file(url: str, database: dict[str, Any]) -> None:
    if engine_of(url) != "sql":
        return
    parsed = sql_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or _is_in_memory(database):
        return
    if Path(parsed.database).resolve() == Path(database["NAME"]).resolve():
        raise ImproperlyConfigured(
            "TIERLOCK['URL'] names the application's own SQLite file: a transaction holds "
            "that file's write lock until it ends, and tierlock's table could not be "
            "written meanwhile; leave URL out to keep the locks in a file beside it"
        )
