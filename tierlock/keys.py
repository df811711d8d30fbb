"""Turning ``"user:42"`` or ``("user", 42, "pay")`` into a checked key string, and
``synchronized``'s key templates into keys."""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable
from typing import Any, Union

__all__ = [
    "MARK",
    "MAX_KEY_LENGTH",
    "KeyLike",
    "KeyTemplate",
    "is_reader_key",
    "make_key",
    "permit_key",
    "reader_key",
    "user_key",
]

# Keys up to this long work; checking here means a long key is refused before anything
# is written, instead of truncated or refused by the server.
MAX_KEY_LENGTH = 255
SEPARATOR = ":"
# Rows of read holds and semaphore permits are stored under the user's key, this mark
# and a suffix, so that all rows of one key sort together; user keys cannot contain it.
MARK = "\x01"

KeyLike = Union[str, "tuple[str | int, ...]"]


def make_key(key: object) -> str:
    """Return the key string for ``key``, or raise ``TypeError``/``ValueError``.

    A key is a non-empty ``str``, or a non-empty tuple of ``str``/``int`` parts joined
    with ``":"``. It is stored and compared verbatim.
    """
    if isinstance(key, str):
        text = key
    elif isinstance(key, tuple):
        if not key:
            raise ValueError("a lock key tuple must have at least one part")
        for part in key:
            # bool is an int subclass, but True/False as key parts are almost surely a bug.
            if isinstance(part, bool) or not isinstance(part, (str, int)):
                raise TypeError(
                    f"lock key parts must be str or int, not {type(part).__name__}: {part!r}"
                )
        text = SEPARATOR.join(str(part) for part in key)
    else:
        raise TypeError(f"a lock key must be a str or a tuple of str/int, not {type(key).__name__}")
    if not text:
        raise ValueError("a lock key must not be empty")
    if len(text) > MAX_KEY_LENGTH:
        raise ValueError(f"a lock key has at most {MAX_KEY_LENGTH} characters, got {len(text)}")
    if "\x00" in text or MARK in text:
        raise ValueError("a lock key must not contain the characters U+0000 or U+0001")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a lock key must be valid Unicode text: {exc}") from None
    return text


def user_key(row_key: str) -> str:
    """The user's key of a row's key (see ``MARK``)."""
    return row_key.partition(MARK)[0]


def is_reader_key(row_key: str) -> bool:
    """Whether a row's key is a read hold's (see ``reader_key``)."""
    return f"{MARK}r" in row_key


def reader_key(key: str, owner_id: str) -> str:
    """The row key of a read hold of ``key`` (one per process and manager)."""
    return f"{key}{MARK}r{owner_id}"


def stand_in_key(key: str, owner_id: str) -> str:
    """The row key under which a writer's row of ``key`` is inserted before it moves to
    ``key``, in one transaction (MariaDB/MySQL: see ``sql.takeover.take_reserved``)."""
    return f"{key}{MARK}w{owner_id}"


def permit_key(key: str, slot: int) -> str:
    """The row key of permit slot ``slot`` of semaphore ``key``."""
    return f"{key}{MARK}p{slot}"


class KeyTemplate:
    """A ``synchronized`` key: a ``str.format`` template filled from a call's bound
    arguments, defaults included (``"user:{user_id}"``, ``"order:{order.id}"``)."""

    def __init__(self, template: object) -> None:
        if not isinstance(template, str):
            name = type(template).__name__
            raise TypeError(f"synchronized() takes a key template str, not {name}")
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        self._roots = {re.split(r"[.\[]", field, maxsplit=1)[0] for field in fields}
        if not fields:
            make_key(template)
        self._template = template

    def for_function(self, function: Callable[..., Any]) -> Callable[..., str]:
        """How a call of ``function`` makes its key.

        :raises ValueError: the template names a parameter ``function`` lacks.
        """
        signature = inspect.signature(function)
        unknown = sorted(self._roots - signature.parameters.keys())
        if unknown:
            raise ValueError(
                f"key template {self._template!r} names {', '.join(map(repr, unknown))}, "
                f"which {function.__qualname__}() has no parameter for"
            )

        def key(*args: Any, **kwargs: Any) -> str:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return self._template.format(**bound.arguments)

        return key
