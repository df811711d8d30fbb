"""Reading ``zookeeper://[user:password@]host:port[,host:port...][/chroot]``."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from ...urls import hide_password

__all__ = ["Address", "parse_url"]

SCHEME = "zookeeper://"
DEFAULT_PORT = 2181


class Address(NamedTuple):
    """Where the locks live: kazoo's host list (with no chroot: the backend puts the
    chroot in front of its own paths, so that it can create it), the chroot (``""`` for
    none), digest credentials (``"user:password"``) if any, and the URL as it may be
    shown (password hidden)."""

    hosts: str
    chroot: str
    credentials: str | None
    location: str

    def __repr__(self) -> str:  # (the credentials must never be shown)
        return f"Address({self.location!r})"


def parse_url(url: str) -> Address:
    """:raises ValueError: ``url`` is not a ZooKeeper URL this backend can use."""
    location = hide_password(url)
    if url[: len(SCHEME)].lower() != SCHEME:
        raise ValueError(f"not a zookeeper:// URL: {location!r}")
    rest = url[len(SCHEME) :]
    if "?" in rest or "#" in rest:
        raise ValueError(f"a zookeeper:// URL takes no query or fragment: {location!r}")
    netloc, slash, path = rest.partition("/")
    login, at, host_list = netloc.rpartition("@")
    credentials = None
    if at:
        user, _, password = login.partition(":")
        if not user:
            raise ValueError(f"credentials without a user name in {location!r}")
        credentials = f"{unquote(user)}:{unquote(password)}"
    hosts = [_host(part, location) for part in host_list.split(",")]
    return Address(",".join(hosts), _chroot(path if slash else "", location), credentials, location)


def _host(text: str, location: str) -> str:
    """``host[:port]`` (an IPv6 address in brackets) checked, with the default port if
    none was given."""
    try:
        parts = urlsplit(f"//{text.strip()}")
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:  # (a port out of range or not a number)
        host = None
    if not host or parts.username is not None:
        raise ValueError(f"bad host:port {text!r} in {location!r}")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _chroot(path: str, location: str) -> str:
    """The chroot as an absolute node path, or ``""``."""
    parts = [unquote(part) for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"a chroot cannot contain '.' or '..': {location!r}")
    return "".join(f"/{part}" for part in parts)
