"""Showing a database URL without its password, with no SQLAlchemy: for text that may
not even parse as a URL (an error message), and for code that must not load the
database code (the pytest plugin)."""

from __future__ import annotations

import re

__all__ = ["hide_password"]

_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")


def hide_password(url: str) -> str:
    """``url`` with the password replaced by ``***``, as SQLAlchemy shows it."""
    return _PASSWORD.sub(r"\1***@", url)
