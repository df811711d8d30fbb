"""The session's promise and the bounded handshake as kazoo's connection shows them,
on a stand-in for the connection (no server): what proves that the server heard from
the client when, and what does not."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Connect, Ping, ReplyHeader

from tierlock.backends.zookeeper import wire
from tierlock.records import Promise, lease_end

SESSION = 30.0
PING_XID, EVENT_XID = -2, -1


class _Clock:
    """``time.monotonic`` for the wire, moved on by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Connection:
    """Stands in for kazoo's ``ConnectionHandler``: it sends nothing, reads the replies
    the test queues, and answers each handshake with the next of ``answers`` (or
    raises it), noting how long it was let wait."""

    def __init__(self) -> None:
        self.replies: collections.deque[int] = collections.deque()
        self.answers: collections.deque[Connect | Exception] = collections.deque()
        self.waits: list[float] = []

    def _submit(self, request: Any, timeout: float, xid: int | None = None) -> None:
        pass

    def _read_header(self, timeout: float) -> tuple[ReplyHeader, bytes, int]:
        return ReplyHeader(self.replies.popleft(), 1, 0), b"", 0

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        self.waits.append(timeout)
        answer = self.answers.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer, None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(wire, "time", clock)
    return clock


@pytest.fixture
def promised() -> list[Promise]:
    return []


@pytest.fixture
def connection(clock: _Clock, promised: list[Promise]) -> Any:
    """A connection whose wire has connected at ``clock.now`` (session 7)."""
    connection = _Connection()
    the_wire = wire.Wire("zookeeper://test", SESSION, promised.append)
    the_wire.attach(connection)
    _connect(connection, session_id=7)
    return connection


def _connect(connection: Any, session_id: int, asked: int = 0, time_out: float = SESSION) -> Any:
    connection.answers.append(Connect(0, 0, int(time_out * 1000), session_id, b"", False))
    return connection._invoke(SESSION, Connect(0, 0, int(SESSION * 1000), asked, b"", False))


def _send(connection: Any, xid: int) -> None:
    connection._submit(Ping, 1.0, xid)


def _reply(connection: Any, xid: int) -> None:
    connection.replies.append(xid)
    connection._read_header(1.0)


def test_a_reply_promises_the_session_from_when_its_request_was_sent(
    clock: _Clock, connection: Any, promised: list[Promise]
) -> None:
    (promise,) = promised
    assert promise.until == lease_end(clock.now, SESSION)  # (from the handshake's sending)
    sent = clock.now = clock.now + 5
    _send(connection, 1)
    clock.now += 3  # (a late reply proves only that the server heard after the sending)
    _reply(connection, 1)
    assert promise.until == lease_end(sent, SESSION)


def test_of_two_pings_in_flight_a_reply_answers_the_older(
    clock: _Clock, connection: Any, promised: list[Promise]
) -> None:
    (promise,) = promised
    first = clock.now = clock.now + 1
    _send(connection, PING_XID)
    clock.now += 1
    _send(connection, PING_XID)
    _reply(connection, PING_XID)
    assert promise.until == lease_end(first, SESSION)


def test_an_event_the_server_sends_unasked_proves_nothing(
    clock: _Clock, connection: Any, promised: list[Promise]
) -> None:
    (promise,) = promised
    before = promise.until
    clock.now += 10
    _send(connection, 1)
    _reply(connection, EVENT_XID)
    assert promise.until == before
    _reply(connection, 1)  # (the request it did not answer is still answered later)
    assert promise.until == lease_end(clock.now, SESSION)


def test_a_new_session_has_a_promise_of_its_own(
    clock: _Clock, connection: Any, promised: list[Promise]
) -> None:
    """A reconnect to the same session moves its promise on; one that finds it expired
    ends it at once, and the new session's replies never move it on again."""
    (old,) = promised
    clock.now += 1
    _connect(connection, session_id=7, asked=7)
    assert promised == [old] and old.until == lease_end(clock.now, SESSION)
    expired = clock.now = clock.now + 1
    _connect(connection, session_id=0, asked=7, time_out=0)
    assert old.until == expired
    clock.now += 1
    _connect(connection, session_id=8)
    new = promised[-1]
    assert new is not old and new.until == lease_end(clock.now, SESSION)
    sent = clock.now = clock.now + 1
    _send(connection, 1)
    _reply(connection, 1)
    assert new.until == lease_end(sent, SESSION)
    assert old.until == expired


def test_an_unanswered_handshake_waits_twice_as_long_each_time_in_a_row(
    clock: _Clock, connection: Any
) -> None:
    for _ in range(5):
        connection.answers.append(KazooTimeoutError())
        with pytest.raises(KazooTimeoutError):
            connection._invoke(SESSION, Connect(0, 0, 30000, 7, b"", False))
    _connect(connection, session_id=7, asked=7)
    # (kazoo's own wait, the session, is the most: a slow server is reached all the same)
    limit = wire.HANDSHAKE_LIMIT
    assert connection.waits == [limit, limit, 2 * limit, 4 * limit, 8 * limit, SESSION, SESSION]
    _connect(connection, session_id=7, asked=7)
    assert connection.waits[-1] == limit  # (a handshake answered starts the count again)
