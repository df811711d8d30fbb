"""A loopback TCP proxy that loses connections on purpose, in front of a real server.

Tests point a manager at the proxy and arm one fault at a time, to make a statement
vanish before the server sees it (``drop_request``), or after it took effect but before
the client hears back (``drop_reply``), or to cut every connection (``cut_all``) or the
server for good (``refuse_all``). ``fired`` counts faults that really happened, so a
test can tell a handled fault from one that never occurred.

One thread serves every socket with a selector. Faults match within one received chunk,
which is fine for the small statements a lock sends; sends block, which is fine for
traffic this small.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Proxy"]

T = TypeVar("T")

CHUNK = 65536
# How long the test thread waits for the proxy thread to run a command.
COMMAND_TIMEOUT = 10.0


class _Pair:
    """One client connection and the server connection it is forwarded to."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.drop_next_reply = False


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream``; close() stops it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()  # guards the fields below, shared with tests
        self._fault: tuple[str, bytes] | None = None
        self._refusing = False
        self._forwarded: list[bytes] = []
        self.fired = 0  # faults that happened: a dropped request or reply, a refusal
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="proxy", daemon=True)
        self._thread.start()

    # -- the test's side -----------------------------------------------------------

    def drop_request(self, pattern: bytes) -> None:
        """Cut the connection that next sends a chunk containing ``pattern``,
        without forwarding it: the server never sees the statement."""
        self._arm("request", pattern)

    def drop_reply(self, pattern: bytes) -> None:
        """Forward the next chunk containing ``pattern``, then cut its connection
        when the server answers: the statement ran, the client never hears so."""
        self._arm("reply", pattern)

    def cut_all(self) -> int:
        """Close every open connection now; return how many there were."""
        return self._call(self._close_all)

    def refuse_all(self) -> None:
        """Lose the server for good: cut every connection, now and from now on."""
        with self._lock:
            self._refusing = True
        self.cut_all()

    def forwarded(self, pattern: bytes) -> int:
        """How many client chunks containing ``pattern`` reached the server."""
        with self._lock:
            return sum(pattern in chunk for chunk in self._forwarded)

    def close(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake_writer.send(b"x")
        self._thread.join(COMMAND_TIMEOUT)
        assert not self._thread.is_alive(), "the proxy thread did not stop"
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()
        self._selector.close()
        if self._error is not None:
            raise AssertionError("the proxy thread failed") from self._error

    def _arm(self, kind: str, pattern: bytes) -> None:
        with self._lock:
            assert self._fault is None, "a fault is already armed"
            self._fault = (kind, pattern)

    def _call(self, function: Callable[[], T]) -> T:
        """Run ``function`` in the proxy thread, which owns the sockets; return its result."""
        done: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._commands.put(lambda: done.put(function()))
        self._wake_writer.send(b"x")
        return done.get(timeout=COMMAND_TIMEOUT)

    # -- the proxy thread --------------------------------------------------------

    def _serve(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                for selected, _ in self._selector.select():
                    if selected.fileobj is self._listener:
                        self._accept()
                    elif selected.fileobj is self._wake_reader:
                        self._wake_reader.recv(CHUNK)
                        while not self._commands.empty():
                            self._commands.get()()
                    elif selected.data[0] in self._pairs:  # not closed earlier in this batch
                        self._pump(*selected.data)
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._close_all()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        with self._lock:
            if self._refusing:
                self.fired += 1
                client.close()
                return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        pair = _Pair(client, server)
        self._pairs.add(pair)
        self._selector.register(pair.client, selectors.EVENT_READ, (pair, True))
        self._selector.register(pair.server, selectors.EVENT_READ, (pair, False))

    def _pump(self, pair: _Pair, from_client: bool) -> None:
        source, target = (pair.client, pair.server) if from_client else (pair.server, pair.client)
        try:
            data = source.recv(CHUNK)
        except OSError:
            data = b""
        if not data:
            self._close(pair)
            return
        with self._lock:
            drop = self._decide(pair, from_client, data)
        if drop:
            self._close(pair)
            return
        try:
            target.sendall(data)
        except OSError:
            self._close(pair)

    def _decide(self, pair: _Pair, from_client: bool, data: bytes) -> bool:
        """Whether ``data`` is to be dropped with its connection; under ``_lock``."""
        if not from_client:
            if pair.drop_next_reply:
                self.fired += 1
            return pair.drop_next_reply
        if self._fault is not None and self._fault[1] in data:
            kind, self._fault = self._fault[0], None
            if kind == "request":
                self.fired += 1
                return True
            pair.drop_next_reply = True
        self._forwarded.append(data)
        return False

    def _close_all(self) -> int:
        count = len(self._pairs)
        for pair in list(self._pairs):
            self._close(pair)
        return count

    def _close(self, pair: _Pair) -> None:
        if pair not in self._pairs:
            return
        self._pairs.remove(pair)
        for sock in (pair.client, pair.server):
            self._selector.unregister(sock)
            sock.close()
