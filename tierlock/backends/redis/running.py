"""Opening a client from a URL, and running operations on it with failures sorted and
retried.

A command borrows a pooled connection only while it runs, so no connection is held
between polls or while a thread waits (semantic 7). redis-py's own retries are off: a
command whose connection failed may or may not have run, which only the operation can
resolve (semantic 9). A failure is one of:

* connection trouble (refused, dropped or silent connections, a server still loading
  its data after a restart, a replica that is read-only after a failover): retried
  for ``timeout`` seconds, each retry told that an earlier try may have taken effect,
  then ``BackendError``;
* anything else (a wrong password, a server that refuses a command): ``BackendError``
  at once.

A command cut short by an interrupt, or by a failure that may have sent it, leaves the
owner id it was for in doubt (``Runner.doubts``): its hold may exist unconfirmed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.retry import Retry

from ...errors import UNREACHABLE, BackendError, LockError
from ...urls import hide_password
from ..basics import connect_timeout
from ..gate import Gate

__all__ = ["CLUSTER_SCHEMES", "UNBOUNDED_POOL", "Runner", "open_client"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# ``max_connections`` of a pool without a bound.
UNBOUNDED_POOL = 2**31
# URL schemes of a Redis Cluster, and the scheme redis-py knows each by.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SCHEMES = ("redis", "rediss", *CLUSTER_SCHEMES)
# The longest pause between two tries of an operation whose server is out of reach.
LONGEST_RETRY_PAUSE = 0.5
RETRY_PAUSE = 0.05

# Failures after which the server may come back: a retry may succeed.
_PASSING = (
    redis.ConnectionError,
    redis.TimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
)
# Failures that a retry would only repeat, although redis-py counts them as connection
# errors.
_LASTING = (AuthenticationError, AuthorizationError)


def _password(url: str) -> str | None:
    parts = urlsplit(url)
    return None if parts.password is None else unquote(parts.password)


def _address(url: str) -> str:
    """The server's host and port in a Redis URL (a cluster's first node)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    return f"[{host}]:{parts.port or 6379}" if ":" in host else f"{host}:{parts.port or 6379}"


def open_client(url: str, timeout: float) -> Any:
    """A thread-safe client for ``url`` (a pool of connections, or a cluster's), with
    redis-py's retries off.

    A connection gives up after ``connect_timeout(timeout)`` seconds, and so does each
    reply: redis-py sends its handshake (the client's name and version, a password, the
    database) on the new connection with the socket's timeout, so a server that takes
    the connection and never answers would otherwise hold the caller for longer.
    """
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"not a Redis URL (schemes: {', '.join(SCHEMES)}): {hide_password(url)}")
    patience = connect_timeout(timeout)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": patience,
        "socket_connect_timeout": patience,
        "retry": Retry(NoBackoff(), 0),
    }
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}", **options)
    # No bound on the pool unless the URL sets one (its ``max_connections`` wins), as
    # redis-py's pools had before 8.0 made 100 the default: no thread holds a
    # connection while it waits, so the pool never holds more than the threads in a
    # command at once, and ``wire`` keeps an unbounded pool's connections at hand.
    return redis.Redis.from_url(url, max_connections=UNBOUNDED_POOL, **options)


class Runner:
    """Runs operations with retries; its ``gate`` counts those under way (for close)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.timeout = timeout
        self.gate = Gate()
        # Owner ids whose acquire may have reached the server unconfirmed.
        self.doubts: set[str] = set()
        self._password = _password(url)
        self._address = _address(url)

    def after_fork(self) -> None:
        """Start afresh in a forked child: the gate's mutex may have been held at the
        fork, and the parent resolves its own doubts."""
        self.gate = Gate(shut=self.gate.shut)
        self.doubts = set()

    def message(self, what: str, exc: Exception) -> str:
        """What a ``BackendError`` says of ``exc``, on one line: a server out of reach
        reads as on every engine, with its address. A password the driver might echo
        is hidden."""
        if isinstance(exc, RedisClusterException) and isinstance(exc.__cause__, RedisError):
            exc = exc.__cause__  # (no node of the cluster answered: why the last did not)
        reason = " ".join(str(exc).split())
        text = (
            f"{UNREACHABLE}{self._address}: {reason}"
            if _passing(exc)
            else f"{what} failed: {reason}"
        )
        if self._password:
            text = text.replace(self._password, "***")
        return text

    def run(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[bool], T],
        *,
        owner: str | None = None,
        retry: bool = True,
    ) -> T:
        """``attempt(uncertain)`` until it returns, with retries (unless ``retry`` is
        false); ``uncertain`` is True once an earlier try failed in a way that may have
        taken effect. ``owner``: the owner id whose hold the operation may create; a try
        cut short leaves it in doubt. Raises only tierlock errors, apart from what
        interrupts it."""
        self.gate.enter()
        try:
            return self._tries(what, key, attempt, owner, self.timeout if retry else 0.0)
        finally:
            self.gate.leave()

    def _tries(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[bool], T],
        owner: str | None,
        patience: float,
    ) -> T:
        uncertain = owner is not None and owner in self.doubts
        give_up = time.monotonic() + patience
        tries = 0
        while True:
            tries += 1
            try:
                return attempt(uncertain)
            except LockError:
                raise
            except RedisError as exc:
                if not _passing(exc):
                    raise BackendError(self.message(what, exc), key) from exc
                logger.debug("%s of %r failed, retrying: %s", what, key, exc)
                if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                    uncertain = True  # (the command may have run before the failure)
                    if owner is not None:
                        self.doubts.add(owner)
                now = time.monotonic()
                if now >= give_up:
                    raise BackendError(self.message(what, exc), key) from exc
            except Exception as exc:  # the server's answer was not what a script returns
                if owner is not None:
                    self.doubts.add(owner)
                raise BackendError(self.message(what, exc), key) from exc
            except BaseException:
                if owner is not None:
                    self.doubts.add(owner)
                raise
            time.sleep(min(RETRY_PAUSE * tries, LONGEST_RETRY_PAUSE, give_up - now))


def _passing(exc: Exception) -> bool:
    return isinstance(exc, _PASSING) and not isinstance(exc, _LASTING)
