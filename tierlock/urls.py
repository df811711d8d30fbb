"""Showing a database URL without its password, with no SQLAlchemy: for text that may
not even parse as a URL (an error message), and for code that must not load the
database code (the pytest plugin)."""

from __future__ import annotations

import re

__all__ = ["hide_password", "shown_url"]

_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def hide_password(url: str) -> str:
    """``url`` with the password replaced by ``***``, as SQLAlchemy shows it, in the
    user part or (as redis-py takes it) the query."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", url))


def shown_url(url: str) -> str:
    """``url`` as tierlock shows it: SQLAlchemy's rendering of a database URL, the URL
    itself for the other engines, the password hidden either way."""
    from .backends import engine_of

    if engine_of(url) != "sql":
        return hide_password(url)
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
