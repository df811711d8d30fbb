"""What a URL says, with no SQLAlchemy and no engine loaded: which engine it names, and
the URL shown without its password, for text that may not even parse as a URL (an
error message) and for code that must not load the database code (the pytest plugin)."""

from __future__ import annotations

import re

__all__ = ["ENGINE_SCHEMES", "engine_label", "engine_of", "hide_password", "shown_url"]

# URL schemes of the engines that are not SQL; any other URL is SQLAlchemy's.
ENGINE_SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "zookeeper": "zookeeper",
    "file": "file",
}


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


_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def hide_password(url: str) -> str:
    """``url`` with the password replaced by ``***``, as SQLAlchemy shows it, in the
    user part or (as redis-py takes it) the query."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", url))


def shown_url(url: str) -> str:
    """``url`` as tierlock shows it: SQLAlchemy's rendering of a database URL, the URL
    itself for the other engines, the password hidden either way."""
    if engine_of(url) != "sql":
        return hide_password(url)
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
