"""DDL scripts as statements, their layout removed, to compare a script with what
SQLAlchemy compiles."""

from __future__ import annotations

import re

__all__ = ["normalise", "split", "without_comments"]


def without_comments(script: str) -> str:
    return "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))


def split(script: str) -> list[str]:
    """The statements of a DDL script, as written, comment lines dropped."""
    return [part.strip() for part in without_comments(script).split(";") if part.strip()]


def normalise(statement: str) -> str:
    """One statement with its layout removed: runs of whitespace become one space, and
    none is kept next to parentheses and commas."""
    statement = re.sub(r"\s+", " ", statement)
    return re.sub(r" ?([(),]) ?", r"\1", statement).strip()
