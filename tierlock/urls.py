"""What a URL says, with no engine loaded: which engine it names, the driver a SQL URL
uses, what to install when an engine's library is missing, and the URL shown without its
password, for text that may not even parse as a URL (an error message) and for code
that must not load the database code (the pytest plugin)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import MissingDriverError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = [
    "DEFAULT_DRIVERS",
    "ENGINE_SCHEMES",
    "EXTRAS",
    "KNOWN_SCHEMES",
    "SQL_DATABASES",
    "engine_label",
    "engine_of",
    "hide_password",
    "missing_driver",
    "shown_url",
    "sql_url",
]

# URL schemes of the engines that are not SQL; any other URL is SQLAlchemy's.
ENGINE_SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "zookeeper": "zookeeper",
    "file": "file",
}
# The databases of the SQL engine, as SQLAlchemy names them (a URL's scheme up to "+").
SQL_DATABASES = ("sqlite", "mysql", "mariadb", "postgresql")
# Every scheme tierlock takes, for the message about one it does not.
_SCHEMES = [*SQL_DATABASES, *ENGINE_SCHEMES]
KNOWN_SCHEMES = f"{', '.join(_SCHEMES[:-1])} or {_SCHEMES[-1]}"
# The driver of a SQL URL that names none: the one tierlock's extra installs. SQLAlchemy
# would pick mysqlclient's MySQLdb for MySQL and MariaDB, which no extra installs, and
# for PostgreSQL psycopg2 or psycopg depending on its version.
DEFAULT_DRIVERS = {"mysql": "pymysql", "mariadb": "pymysql", "postgresql": "psycopg"}
# The extra that installs each module an engine imports: the Redis and ZooKeeper client
# libraries, and the SQL drivers (which SQLAlchemy names after their module).
EXTRAS = {"redis": "redis", "kazoo": "zookeeper", "pymysql": "mysql", "psycopg": "postgres"}


def engine_of(url: str) -> str:
    """The engine a URL names: ``"redis"``, ``"zookeeper"``, ``"file"`` or ``"sql"``."""
    return ENGINE_SCHEMES.get(url.partition(":")[0].lower(), "sql")


def engine_label(url: str) -> str:
    """What metrics and messages call ``url``'s engine: ``"redis"``, ``"zookeeper"``,
    ``"file"``, or SQLAlchemy's name of the database (``"sqlite"``, ``"mysql"``,
    ``"postgresql"``)."""
    kind = engine_of(url)
    if kind != "sql":
        return kind
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name()


def sql_url(url: str | URL) -> URL:
    """``url`` as the SQL engine takes it: parsed, naming a database tierlock supports,
    and with the driver of tierlock's extra if it names none (``mysql://`` is
    ``mysql+pymysql://``, as ``tierlock[mysql]`` installs PyMySQL); a driver it names is
    kept.

    :raises ValueError: ``url`` is not a URL, or names no engine of tierlock's.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # Not quoted: the text may hold a password.
        raise ValueError(
            "not a database URL; expected scheme://user:password@host:port/database, "
            f"the scheme one of {KNOWN_SCHEMES}"
        ) from None
    database = parsed.get_backend_name()
    if database not in SQL_DATABASES:
        raise ValueError(f"unsupported database {database!r} in {parsed!r}: use {KNOWN_SCHEMES}")
    if "+" not in parsed.drivername and database in DEFAULT_DRIVERS:
        parsed = parsed.set(drivername=f"{database}+{DEFAULT_DRIVERS[database]}")
    return parsed


def missing_driver(url: str, module: str, error: ImportError) -> MissingDriverError:
    """The error for ``url``'s engine failing to import ``module`` (its client library
    or SQL driver) with ``error``: it names the extra that installs the module, or for a
    driver no extra installs, the URL's driver that one does."""
    scheme = url.partition(":")[0].lower()
    extra = EXTRAS.get(module)
    if extra is not None:
        fix = f'pip install "tierlock[{extra}]"'
    else:
        database = scheme.partition("+")[0]
        ours = DEFAULT_DRIVERS.get(database)
        fix = "install it"
        if ours is not None:
            fix += f', or write {database}+{ours}:// and pip install "tierlock[{EXTRAS[ours]}]"'
    missing = (error.name or "").partition(".")[0]
    if isinstance(error, ModuleNotFoundError) and missing.lower() == module.lower():
        # Named as imported: SQLAlchemy's "mysqldb" driver is the module MySQLdb.
        return MissingDriverError(scheme, missing, fix)
    return MissingDriverError(scheme, module, fix, str(error))


_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def hide_password(url: str) -> str:
    """``url`` with the password replaced by ``***``, as SQLAlchemy shows it, in the
    user part or (as redis-py takes it) the query."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", url))


def shown_url(url: str) -> str:
    """``url`` as tierlock shows it: the URL the SQL engine uses (see ``sql_url``), as
    SQLAlchemy renders it, or the URL itself for the other engines and for text the SQL
    engine refuses, the password hidden either way."""
    if engine_of(url) != "sql":
        return hide_password(url)
    try:
        return sql_url(url).render_as_string(hide_password=True)
    except ValueError:
        return hide_password(url)
