"""The short way to the server for the scripts every acquire and release sends.

A command sent through ``redis.Redis`` pays for redis-py's generality on every call:
a retry wrapper (tierlock's retries are its own, ``running``), observability hooks, a
peek at the socket to make sure the pooled connection holds no stray reply, the
command parsed by name. That is about as much CPU as the round trip itself. Here a
script goes straight onto a connection of the client's pool kept in an idle list of
our own, written in the protocol here (``pack``: plain strings and numbers only, a
third of redis-py's general packer's cost), and its reply is read back as it comes.

A connection is taken from the idle list only for one command (semantic 7: no thread
holds one while it waits), and goes back only after its reply was read whole, so it
never holds a stray reply; a command that fails or is interrupted before that
disconnects its connection and hands it back to the pool, which reconnects it when it
is next used. The connections stay the pool's: ``close`` of the client closes them.
A pool with a bound on its connections (a URL's ``?max_connections=``) gets each
connection back after its command, so the client's other work (renewals, ``info``)
never finds the pool emptied into the idle list. A forked child makes a new ``Wire`` on
its new client.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from .running import UNBOUNDED_POOL

__all__ = ["Wire", "pack"]


def pack(parts: tuple[object, ...]) -> bytes:
    """``parts`` (strings and integers) as one command in the Redis protocol, encoded
    as redis-py encodes them (UTF-8, an integer in decimal)."""
    packed = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode() if isinstance(part, str) else str(part).encode()
        packed.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(packed)


class Wire:
    """Sends commands on connections of ``client``'s pool; quacks like the client
    for what ``scripts.Scripts`` asks of one."""

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []  # (list.pop and list.append are atomic)
        self._keeps = getattr(self._pool, "max_connections", 0) >= UNBOUNDED_POOL

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: object) -> Any:
        return self._command("EVALSHA", sha, numkeys, *keys_and_args)

    def script_load(self, source: str) -> Any:
        return self._command("SCRIPT", "LOAD", source)

    def _command(self, *parts: object) -> Any:
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._pool.get_connection()
        try:
            connection.send_packed_command([pack(parts)], check_health=False)
            reply = connection.read_response()
        except ResponseError:  # (the server's answer, read whole: the connection is fine)
            self._put_back(connection)
            raise
        except BaseException:
            connection.disconnect()
            self._pool.release(connection)
            raise
        self._put_back(connection)
        return reply

    def _put_back(self, connection: Any) -> None:
        if self._keeps:
            self._idle.append(connection)
        else:
            self._pool.release(connection)

    def close(self) -> None:
        """Disconnect the idle connections (the pool's ``close`` would too)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()
