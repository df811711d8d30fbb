"""Turning ``"user:42"`` or ``("user", 42, "pay")`` into a checked key string."""

from __future__ import annotations

from typing import Union

__all__ = [
    "MARK",
    "MAX_KEY_LENGTH",
    "KeyLike",
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


def permit_key(key: str, slot: int) -> str:
    """The row key of permit slot ``slot`` of semaphore ``key``."""
    return f"{key}{MARK}p{slot}"
