"""Where the lock files live: the directory a ``file:///`` URL names, and a file name per
key that any key maps to safely.

A key's name keeps its lowercase letters, digits, ``-``, ``_`` and ``.`` (not leading)
and writes every other byte of its UTF-8 form as ``%`` and two lowercase hex digits.
So no name holds a ``/``, starts with a dot or is empty, two keys that differ, even only
in case, get names that differ in more than case (a case-insensitive filesystem keeps
them apart), and a name is decoded back exactly. A name that would pass
``PLAIN_NAME_LIMIT`` characters is ``%-`` and the SHA-256 of the key in hex instead,
which no plain name can be (``%`` is always followed by two hex digits there); the
file itself holds the key.
"""

from __future__ import annotations

import hashlib
import os
from urllib.parse import unquote, urlsplit

__all__ = ["COUNTER", "HOLD", "MAKING", "WAITING", "key_name", "parse_url"]

SCHEME = "file"
# The file of a key's hold, of its fencing-token counter (also the key's guard), and
# the mark that another process's poller found the key held.
HOLD = ".lock"
COUNTER = ".token"
WAITING = ".wait"
# The start of the name of a file being made, before it is linked into place under its
# own (see ``Directory.place``): no key's name starts with a dot.
MAKING = ".making-"
# Longest plain name: with a suffix, well within the 255 bytes most filesystems allow.
PLAIN_NAME_LIMIT = 200
HASHED = "%-"

_KEPT = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
_ESCAPES = [chr(byte) if byte in _KEPT else f"%{byte:02x}" for byte in range(256)]


def key_name(key: str) -> str:
    """The file name stem of ``key``: safe, bounded and distinct from every other key's."""
    encoded = key.encode()
    name = "".join([_ESCAPES[byte] for byte in encoded])
    if name.startswith("."):
        name = "%2e" + name[1:]
    if len(name) > PLAIN_NAME_LIMIT:
        return HASHED + hashlib.sha256(encoded).hexdigest()
    return name


def parse_url(url: str) -> str:
    """The absolute directory of ``file:///absolute/dir`` (``file://localhost/...`` too).

    :raises ValueError: not such a URL.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != SCHEME:
        raise ValueError(f"not a file:// URL: {url!r}")
    if parts.netloc not in ("", "localhost"):
        raise ValueError(
            f"a file:// URL names a directory on this host (file:///dir), not on "
            f"{parts.netloc!r}: mount the shared directory and name it: {url!r}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"a file:// URL takes no query or fragment: {url!r}")
    path = unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise ValueError(f"a file:// URL needs an absolute directory (file:///dir): {url!r}")
    return os.path.normpath(path)
