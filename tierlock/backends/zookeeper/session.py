"""The kazoo client of one backend: its session, the timeout the server granted, the
connection's state, and the retries of every operation.

The session is the lease of every renewed hold: its ephemeral nodes live as long as the
server hears from the client within the session's timeout, which is the manager's
``ttl`` as far as the server allows (ZooKeeper grants between 2 and 20 ticks by
default). kazoo pings the server every third of it and reconnects by itself; when the
connection drops, the session is SUSPENDED (the nodes live on, unless it stays away for
the timeout) and may come back, or be LOST (the server expired it and deleted its
nodes; kazoo then opens a new one). ``wire`` learns from kazoo's connection how long
the server surely keeps the session, the ``promise`` that bounds every hold's belief,
and abandons a handshake the server leaves unanswered.

The first connection is one bounded wait, as an SQL engine's is: it gives up after
``connect_timeout`` (kazoo would keep trying for as long as it is let, and wait for a
TCP connect as long as the whole session lasts), so that a wrong address is told soon.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.states import KazooState, KeeperState

from ...errors import UNREACHABLE, BackendError, LockError
from ...records import Promise
from ...stats import Counters
from ..basics import connect_timeout
from ..gate import Gate
from .address import Address
from .wire import Wire

__all__ = ["UNCERTAIN", "Calls", "Session"]

logger = logging.getLogger(__name__)

# kazoo logs every connection at INFO in every process; its warnings and errors pass.
_kazoo_logger = logging.getLogger(f"{__name__}.kazoo")
_kazoo_logger.setLevel(logging.WARNING)

T = TypeVar("T")

# Failures after which a request may or may not have taken effect: the connection
# dropped, the session expired, or the answer did not come in time.
UNCERTAIN = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# kazoo reconnects after pauses from this long, doubling up to MAX_RECONNECT_PAUSE: a
# restarted server is found again within about that long.
RECONNECT_PAUSE = 0.05
MAX_RECONNECT_PAUSE = 0.5
# Between two tries of an operation after a failure: time for kazoo to notice that the
# connection dropped and to begin reconnecting.
RETRY_PAUSE = 0.01
# The least time a TCP connect is given, even past the first connection's deadline:
# given none, kazoo fails it with an empty error, which a message could not tell from.
LEAST_CONNECT_WAIT = 0.01


class _Handler(SequentialThreadingHandler):  # type: ignore[misc]  # (kazoo is untyped)
    """kazoo's threads, with the waits of its connection thread bounded: a TCP connect
    by the connect timeout (kazoo's own is the whole session), a pause between connects
    by the client's stop, and, while the first connection is made, every wait by its
    deadline, so that the thread ends at once when the client is stopped for missing it."""

    def __init__(self, connect_timeout: float) -> None:
        super().__init__()
        self.connect_timeout = connect_timeout
        self.connect_by = math.inf  # (time.monotonic()) the first connection's deadline
        # Why the latest TCP connect failed (None if it did not), and whether any did not.
        self.failure: OSError | None = None
        self.reached = False
        self._stopping = threading.Event()

    def start(self) -> None:
        self._stopping.clear()
        super().start()

    def stop(self) -> None:
        self._stopping.set()
        super().stop()

    def sleep_func(self, seconds: float) -> None:
        """kazoo's pause between connects, cut short when the client stops."""
        self._stopping.wait(seconds)

    def _left(self) -> float:
        return self.connect_by - time.monotonic()

    def create_connection(self, *args: Any, timeout: float, **kwargs: Any) -> Any:
        timeout = max(LEAST_CONNECT_WAIT, min(timeout, self.connect_timeout, self._left()))
        try:
            connection = super().create_connection(*args, timeout=timeout, **kwargs)
        except OSError as exc:
            self.failure = exc
            raise
        self.failure, self.reached = None, True
        return connection

    def select(self, rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        if timeout is not None:
            timeout = max(0.0, min(timeout, self._left()))
        return super().select(rlist, wlist, xlist, timeout)


# The client states in which kazoo fails a request at once.
_REFUSING = (KeeperState.AUTH_FAILED, KeeperState.CLOSED, KeeperState.EXPIRED_SESSION)


class _Client(KazooClient):  # type: ignore[misc]
    """kazoo's client, except that an interrupt that lands while a request is queued
    goes through: kazoo's own ``_call`` wraps the write that wakes its connection thread
    in a bare ``except``, so a KeyboardInterrupt raised there vanished and the caller
    went on waiting (the request failed as "closed", or was answered after all). Raised
    after the request is queued, the interrupt leaves it in doubt, which the caller's
    clean-up (``discard(certain=True)``) sweeps."""

    def _call(self, request: Any, async_object: Any) -> bool | None:
        if self._state in _REFUSING:
            return bool(super()._call(request, async_object))  # (fails it, as kazoo does)
        self._queue.append((request, async_object))
        try:
            self._connection._write_sock.send(b"\0")
        except (OSError, AttributeError):  # (closed meanwhile: the socket is gone)
            async_object.set_exception(ConnectionClosedError("Connection has been closed"))
        return None


class Session:
    """One kazoo client, made at first use (again in a forked child), and the state of
    its session; ``run`` carries out an operation on it. ``promised`` is handed the
    ``Promise`` of each new session; ``connected`` is called, in kazoo's thread, each
    time the client has connected (again)."""

    def __init__(
        self,
        address: Address,
        ttl: float,
        timeout: float,
        counters: Counters,
        promised: Callable[[Promise], None],
        connected: Callable[[], None],
    ) -> None:
        self.address = address
        self.requested = ttl  # the session timeout asked for, in seconds
        self.timeout = timeout  # how long an operation keeps trying
        self.connect_timeout = connect_timeout(timeout)  # how long connecting may take
        self.counters = counters
        self._promised = promised
        self._on_connected = connected
        self.forget()

    def forget(self) -> None:
        """Start afresh, leaving the client alone: in a forked child, the parent's client
        is the parent's (its threads are not even there)."""
        self._mutex = threading.Lock()
        self._client: Any = None
        self._connected = threading.Event()
        self.gate = Gate()  # operations under way, for close()
        self.session_id: int | None = None  # of the session now, while connected
        self.wire = Wire(self.address.location, self.requested, self._promised)
        self._promised(self.wire.promise)

    @property
    def granted(self) -> float:
        """The session timeout the server granted, in seconds."""
        return self.wire.granted

    # -- the client ---------------------------------------------------------------

    def client(self, deadline: float) -> Any:
        """The client, started now if there is none yet.

        :raises BackendError: it did not connect by ``deadline`` (``time.monotonic()``).
        """
        client = self._client
        if client is None:
            with self._mutex:
                if self._client is None:
                    self._client = self._start(deadline)
                client = self._client
        return client

    def live_client(self) -> Any:
        """The client if it is connected, else ``None``: for what may as well not wait."""
        client = self._client
        return client if client is not None and client.connected else None

    @property
    def connected(self) -> bool:
        client = self._client
        return client is not None and bool(client.connected)

    def may_have_expired(self) -> bool:
        """Whether the session may be gone: lost, or its promise ended."""
        return self.session_id is None or time.monotonic() >= self.wire.promise.until

    def _start(self, deadline: float) -> Any:
        """A client connected by ``deadline``, or sooner after ``connect_timeout``."""
        address = self.address
        handler = _Handler(self.connect_timeout)
        handler.connect_by = min(deadline, time.monotonic() + self.connect_timeout)
        client = _Client(
            hosts=address.hosts,
            timeout=self.requested,
            auth_data=None if address.credentials is None else [("digest", address.credentials)],
            connection_retry={
                "max_tries": -1,
                "delay": RECONNECT_PAUSE,
                "max_delay": MAX_RECONNECT_PAUSE,
                "sleep_func": handler.sleep_func,
            },
            handler=handler,
            logger=_kazoo_logger,
        )
        self.wire.attach(client._connection)
        client.add_listener(lambda state: self._changed(client, state))
        try:
            client.start(timeout=max(0.001, handler.connect_by - time.monotonic()))
        except KazooTimeoutError as exc:  # (start() has stopped the client)
            raise BackendError(f"{UNREACHABLE}{self._no_session(handler)}") from exc
        return client

    def _no_session(self, handler: _Handler) -> str:
        """Why the first connection failed, as far as kazoo's latest connect tells."""
        where = f"ZooKeeper at {self.address.location}"
        within = f"within {self.connect_timeout:g} s"
        failure = handler.failure
        if failure is None:
            if handler.reached:
                return f"{where} took the connection but did not answer {within}"
            return f"{where}: no host of it could be resolved {within}"
        if isinstance(failure, TimeoutError):
            return f"{where} did not answer {within}"
        return f"{where}: {failure.strerror or failure}"

    def _changed(self, client: Any, state: str) -> None:
        """kazoo's connection state listener; runs in its connection thread."""
        if state == KazooState.CONNECTED:
            # The first connection's deadline bounds kazoo's waits no more (this runs in
            # its connection thread, before that waits again).
            client.handler.connect_by = math.inf
            self.session_id = client.client_id[0]
            self._connected.set()
            self._on_connected()
            return
        self._connected.clear()
        if self.gate.shut:
            return
        if state == KazooState.SUSPENDED:
            logger.warning(
                "lost the connection to ZooKeeper at %s: the locks of session 0x%x stay held "
                "until it comes back or the session expires (%g s)",
                self.address.location,
                self.session_id or 0,
                self.granted,
            )
        else:
            logger.warning(
                "ZooKeeper session 0x%x expired: every lock this manager held in it is lost",
                self.session_id or 0,
            )
            self.session_id = None

    def close(self) -> None:
        """Stop the client: the server deletes the session's ephemeral nodes at once."""
        with self._mutex:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.stop()
                client.close()
            except KazooException as exc:
                logger.debug("closing the ZooKeeper client failed: %s", exc)

    # -- operations ---------------------------------------------------------------

    def run(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[Calls, bool], T],
        *,
        wait: bool = True,
    ) -> T:
        """``attempt(calls, uncertain)`` until it returns, tried again after a failure that
        leaves a request's outcome open (``uncertain`` then) for up to ``timeout``
        seconds; ``wait=False``: once, and only if the client is connected now.

        :raises BackendError: the server could not be reached (the cause is chained).
        :raises LockError: the backend is closed.
        """
        self.gate.enter()
        try:
            deadline = time.monotonic() + self.timeout
            uncertain = False
            last: BaseException | None = None
            while True:
                client = self.client(deadline)
                if not self._wait_connected(client, deadline if wait else 0.0):
                    raise self._unreachable(what, last or "no connection", key)
                try:
                    return attempt(Calls(self, client, deadline), uncertain)
                except UNCERTAIN as exc:
                    last, uncertain = exc, True
                    if not wait or time.monotonic() >= deadline:
                        raise self._unreachable(what, exc, key) from exc
                except ConnectionClosedError as exc:
                    raise LockError("this LockManager is closed", key) from exc
                except KazooException as exc:
                    raise BackendError(f"{what} failed: {exc!r}", key) from exc
                time.sleep(RETRY_PAUSE)
        finally:
            self.gate.leave()

    def _wait_connected(self, client: Any, deadline: float) -> bool:
        # (kazoo's own flag falls as the connection drops; the listener hears of it after)
        while not client.connected:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._connected.wait(min(left, RETRY_PAUSE * 10))
        return True

    def _unreachable(self, what: str, why: object, key: str | None) -> BackendError:
        return BackendError(
            f"{UNREACHABLE}ZooKeeper at {self.address.location} did not answer ({what}) "
            f"within {self.timeout:g} s: {why!r}",
            key,
        )


class Calls:
    """The requests of one try of an operation: each is counted as it is sent and
    waited for no longer than the operation's deadline."""

    def __init__(self, session: Session, client: Any, deadline: float) -> None:
        self.client = client
        self._session = session
        self._deadline = deadline
        self.began = time.monotonic()

    def send(self, request: Any) -> Any:
        """``request``, the ``IAsyncResult`` of a request just sent, counted."""
        self._session.counters.add("statements")
        return request

    def wait(self, request: Any) -> Any:
        """The result of ``request``; raises what the server answered, or an uncertain
        failure (``KazooTimeoutError`` once the deadline has passed)."""
        return request.get(timeout=max(0.001, self._deadline - time.monotonic()))
