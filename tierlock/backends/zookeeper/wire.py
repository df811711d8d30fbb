"""What kazoo's connection tells of the session, and a bound on its handshake.

kazoo keeps two things to itself that the backend needs, so ``Wire`` wraps the methods
of its ``ConnectionHandler`` that every request and reply of a session pass through
(all of them run in kazoo's one connection thread, so the wrappers need no mutex):

* **How long the server surely keeps the session** (``promise``). The server expires a
  session no earlier than its timeout after it last heard from the client, and a reply
  to a request sent at ``s`` proves that it heard at or after ``s``. So every request is
  noted with the time it was sent, kazoo's pings included (it sends one every third of
  the session when nothing else goes), and every reply moves ``promise.until`` on to
  that time plus the granted timeout, less ``DRIFT``. The server answers a connection's
  requests in the order they came, so a reply answers the oldest request noted with its
  xid; any noted before it are dropped unanswered, which can only make the promise
  shorter, never longer. A new session gets a new ``Promise``: the holds of an expired
  one keep theirs, which never moves on again, and a handshake that finds the session
  expired ends it at once.
* **The handshake.** A starting ZooKeeper may take a connection and never read its
  ConnectRequest, while kazoo waits for the answer as long as the whole session lasts;
  the server serves again within seconds. A handshake unanswered within
  ``HANDSHAKE_LIMIT`` (at most a third of the session) is abandoned and kazoo connects
  again. Each further one abandoned in a row waits twice as long, up to kazoo's own
  wait, so that a server too slow for the limit is still reached.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Connect

from ...records import Promise, lease_end

__all__ = ["HANDSHAKE_LIMIT", "Wire"]

logger = logging.getLogger(__name__)

# How long a handshake waits for its answer before kazoo connects again (at most a
# third of the session; twice as long after each one abandoned in a row).
HANDSHAKE_LIMIT = 2.0
# The xid of what the server sends unasked (a watch's event): it answers no request.
_EVENT_XID = -1


class Wire:
    """The session as kazoo's connection sees it: the timeout the server granted, and
    ``promise``, the end of what the server surely keeps (a new object for each new
    session, handed to ``promised``)."""

    def __init__(
        self, location: str, requested: float, promised: Callable[[Promise], None]
    ) -> None:
        self.location = location
        self.requested = requested  # the session timeout asked for, in seconds
        self.granted = requested  # the one the server granted
        self.promise = Promise(float("-inf"))  # (no session yet)
        self._promised = promised
        self._contact = float("-inf")  # when the latest request answered was sent
        self._asked: collections.deque[tuple[int, float]] = collections.deque()
        self._abandoned = 0  # handshakes in a row abandoned unanswered

    def attach(self, connection: Any) -> None:
        """Wrap ``connection``'s methods (a kazoo ``ConnectionHandler``)."""
        submit, read_header, invoke = (
            connection._submit,
            connection._read_header,
            connection._invoke,
        )

        def submit_noted(request: Any, timeout: float, xid: int | None = None) -> Any:
            if xid is not None:  # (the ConnectRequest has none: see handshake)
                self._asked.append((xid, time.monotonic()))
            return submit(request, timeout, xid)

        def read_header_noted(timeout: float) -> Any:
            read = read_header(timeout)
            if read[0].xid != _EVENT_XID:
                self._answered(read[0].xid)
            return read

        def invoke_bounded(timeout: float, request: Any, xid: int | None = None) -> Any:
            # (kazoo invokes the handshake's requests: the ConnectRequest, then the
            # credentials', answered at once by a server that answered the first)
            if isinstance(request, Connect):
                return self._handshake(invoke, timeout, request)
            return invoke(timeout, request, xid)

        connection._submit = submit_noted
        connection._read_header = read_header_noted
        connection._invoke = invoke_bounded

    def _limit(self) -> float:
        return min(HANDSHAKE_LIMIT, self.granted / 3) * 2.0**self._abandoned

    def _handshake(self, invoke: Callable[..., Any], timeout: float, request: Any) -> Any:
        """Send the ConnectRequest and read its answer (as kazoo's ``_invoke``, within
        ``timeout``), no longer than the limit; learn the session from the answer."""
        self._asked.clear()  # (a new connection: the last one's requests go unanswered)
        limit = self._limit()
        sent = time.monotonic()
        try:
            result = invoke(min(timeout, limit), request)
        except KazooTimeoutError:
            if limit < timeout:
                self._abandoned += 1
                logger.warning(
                    "ZooKeeper at %s took the connection but did not answer its handshake "
                    "within %g s: connecting again",
                    self.location,
                    limit,
                )
            raise
        self._abandoned = 0
        answer = result[0]
        if answer.time_out <= 0:  # the session expired: nothing of it lives on
            self.promise.until = min(self.promise.until, sent)
            return result
        self._grant(answer.time_out / 1000)
        if answer.session_id == request.session_id:
            self._heard(sent)
        else:  # a new session (the first, or one after an expired one)
            self._contact = sent
            self.promise = Promise(lease_end(sent, self.granted))
            self._promised(self.promise)
        return result

    def _grant(self, seconds: float) -> None:
        if seconds != self.granted:
            logger.warning(
                "ZooKeeper at %s grants sessions of %g s, not the %g s asked for (the "
                "manager's ttl): a holder that stops or loses the server keeps its locks "
                "that long",
                self.location,
                seconds,
                self.requested,
            )
        self.granted = seconds

    def _answered(self, xid: int) -> None:
        asked = self._asked
        while asked:
            noted, sent = asked.popleft()
            if noted == xid:
                self._heard(sent)
                return

    def _heard(self, sent: float) -> None:
        """The server heard from the client at or after ``sent``."""
        if sent > self._contact:
            self._contact = sent
            self.promise.until = lease_end(sent, self.granted)
