"""Loopback TCP servers that misbehave on purpose: a proxy in front of a real server,
and addresses where no server answers at all (``DeadAddress``).

Tests point a manager at the proxy and arm one fault at a time: make a statement vanish
before the server sees it (``drop_request``), or after it took effect but before the
client hears back (``drop_reply``), either followed by a stall if asked; cut every
connection (``cut_all``); hold every byte in both directions, as a hung server would,
until ``resume`` (``stall``, or ``stall_at`` a given statement); or turn new connections
away (``refuse_new``). ``fired`` counts faults that really happened, so a test can tell a
handled fault from one that never occurred. A pattern matches a statement that names it
outside MariaDB's insert-if-absent clause (``ON DUPLICATE KEY UPDATE``): ``b"UPDATE"``
means an UPDATE, not an insert.

The proxy runs an asyncio event loop in a thread of its own, so synchronous tests drive
it with plain calls; every call runs on that loop and waits for it. Faults match within
one received chunk, which is fine for the small statements a lock sends.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["DEAD_KINDS", "DeadAddress", "Proxy"]

T = TypeVar("T")

_IF_ABSENT = b"ON DUPLICATE KEY UPDATE"


def _names(chunk: bytes, pattern: bytes) -> bool:
    """Whether ``chunk`` holds ``pattern`` outside an ``ON DUPLICATE KEY UPDATE``."""
    return pattern in chunk.replace(_IF_ABSENT, b"")


CHUNK = 65536
# How long the test thread waits for the proxy's loop to run a command.
COMMAND_TIMEOUT = 10.0
# The ways a DeadAddress does not answer.
DEAD_KINDS = ("silent", "black_hole", "refused")
# Connections a silent address takes without answering: far more than a test opens.
SILENT_BACKLOG = 1024
# How long DeadAddress waits, checking itself, for what would come at once if it
# answered.
SELF_CHECK_WAIT = 0.2


class _Pair:
    """One client connection and the server connection it is forwarded to."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.drop_next_reply = False
        self.stall_after_drop = False
        self.pumps: list[asyncio.Task[None]] = []


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream``; close() stops it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._pairs: set[_Pair] = set()
        self._fault: tuple[str, bytes, bool] | None = None  # kind, pattern, stall after
        self._refusing = False
        self._forwarded: list[bytes] = []
        self._held: list[bytes] = []
        self._fired = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._thread.start()
        self._flowing: asyncio.Event = self._call(self._new_event)
        self._server: asyncio.Server = self._run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port: int = self._server.sockets[0].getsockname()[1]

    # -- the test's side -----------------------------------------------------------

    def drop_request(self, pattern: bytes, *, then_stall: bool = False) -> None:
        """Cut the connection that next sends a chunk containing ``pattern``,
        without forwarding it: the server never sees the statement. With
        ``then_stall``, everything stalls from then on, until ``resume``."""
        self._call(lambda: self._arm("request", pattern, then_stall))

    def drop_reply(self, pattern: bytes, *, then_stall: bool = False) -> None:
        """Forward the next chunk containing ``pattern``, then cut its connection
        when the server answers: the statement ran, the client never hears so. With
        ``then_stall``, everything stalls from then on, until ``resume``."""
        self._call(lambda: self._arm("reply", pattern, then_stall))

    def stall_at(self, pattern: bytes) -> None:
        """Stall from the next chunk containing ``pattern`` on, that chunk included,
        until ``resume``: the statement is on its way, the server has not seen it."""
        self._call(lambda: self._arm("stall", pattern, True))

    def cut_all(self) -> int:
        """Close every open connection now; return how many there were."""
        return self._call(self._close_all)

    def stall(self) -> None:
        """Hold every byte, both ways and on new connections too, until ``resume``:
        to the client the server has hung."""
        self._call(self._flowing.clear)

    def resume(self) -> None:
        """Deliver what a stall held, in order, and let traffic flow again."""
        self._call(self._flowing.set)

    def refuse_new(self) -> None:
        """Close each new connection as soon as it is accepted; open ones go on."""
        self._call(lambda: setattr(self, "_refusing", True))

    def accept_new(self) -> None:
        self._call(lambda: setattr(self, "_refusing", False))

    def refuse_all(self) -> None:
        """Lose the server for good: cut every connection, now and from now on."""
        self.refuse_new()
        self.cut_all()

    @property
    def open_connections(self) -> int:
        """Client connections the proxy is forwarding now."""
        return self._call(lambda: len(self._pairs))

    @property
    def fired(self) -> int:
        """Faults that happened: a dropped request or reply, a refused connection."""
        return self._call(lambda: self._fired)

    def held(self, pattern: bytes) -> int:
        """How many chunks containing ``pattern`` a stall holds right now."""
        return self._call(lambda: sum(_names(chunk, pattern) for chunk in self._held))

    def forwarded(self, pattern: bytes) -> int:
        """How many client chunks containing ``pattern`` reached the server."""
        return self._call(lambda: sum(_names(chunk, pattern) for chunk in self._forwarded))

    def close(self) -> None:
        """Stop serving, cut what is open and end the loop's thread."""
        self._run(self._shut_down())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(COMMAND_TIMEOUT)
        assert not self._thread.is_alive(), "the proxy thread did not stop"
        self._loop.close()

    def _run(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` on the proxy's loop and return its result."""

        async def run() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(COMMAND_TIMEOUT)

    def _call(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the proxy's loop, which owns all state; return its result."""

        async def call() -> T:
            return function()

        return self._run(call())

    # -- the loop's side -------------------------------------------------------------

    @staticmethod
    def _new_event() -> asyncio.Event:
        flowing = asyncio.Event()
        flowing.set()
        return flowing

    def _arm(self, kind: str, pattern: bytes, then_stall: bool) -> None:
        assert self._fault is None, "a fault is already armed"
        self._fault = (kind, pattern, then_stall)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self._fired += 1
            writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, server_writer)
        self._pairs.add(pair)
        pair.pumps = [
            asyncio.create_task(self._pump(pair, reader, server_writer, from_client=True)),
            asyncio.create_task(self._pump(pair, server_reader, writer, from_client=False)),
        ]

    async def _pump(
        self,
        pair: _Pair,
        source: asyncio.StreamReader,
        target: asyncio.StreamWriter,
        *,
        from_client: bool,
    ) -> None:
        try:
            while data := await source.read(CHUNK):
                if self._drops(pair, data, from_client=from_client):
                    break
                if not self._flowing.is_set():
                    self._held.append(data)  # a stall holds the chunk here
                    try:
                        await self._flowing.wait()
                    finally:
                        self._held.remove(data)
                if pair not in self._pairs:
                    break
                if from_client:
                    self._forwarded.append(data)
                target.write(data)
                await target.drain()
        except OSError:
            pass
        finally:
            self._close(pair)

    def _drops(self, pair: _Pair, data: bytes, *, from_client: bool) -> bool:
        """Whether ``data`` is to be dropped with its connection; starts a stall that
        an armed fault asks for."""
        if not from_client:
            if pair.drop_next_reply:
                self._fired += 1
                if pair.stall_after_drop:
                    self._flowing.clear()
            return pair.drop_next_reply
        if self._fault is not None and _names(data, self._fault[1]):
            kind, _, then_stall = self._fault
            self._fault = None
            if kind == "stall":
                self._fired += 1
                self._flowing.clear()
            elif kind == "request":
                self._fired += 1
                if then_stall:
                    self._flowing.clear()
                return True
            else:
                pair.drop_next_reply = True
                pair.stall_after_drop = then_stall
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
        for writer in (pair.client, pair.server):
            writer.transport.abort()
        for pump in pair.pumps:
            if pump is not asyncio.current_task():
                pump.cancel()

    async def _shut_down(self) -> None:
        """End every task on the loop, including a connection still being accepted,
        whose pumps would otherwise outlive the loop."""
        self._server.close()
        self._flowing.set()
        this = asyncio.current_task()
        while tasks := [task for task in asyncio.all_tasks() if task is not this]:
            self._close_all()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()


class DeadAddress:
    """``127.0.0.1:<port>``, where nothing will ever answer, in one of ``DEAD_KINDS``:

    * ``silent``: a server that takes connections and never says a word. The socket
      listens and nobody accepts: the kernel completes each handshake (up to the
      backlog) and acknowledges what the client sends, which is all a client can see
      of a hung server.
    * ``black_hole``: a connect's SYN goes unanswered, as behind a firewall that drops
      it. The socket listens with a backlog of 0 and a first connection fills it:
      Linux drops a SYN while the accept queue is full, whatever SYN cookies say, and
      its retransmissions too, so a connect waits for its own timeout. (A blackhole
      route fails a local connect at once with EINVAL, and iptables needs root and a
      firewall tool; this needs neither and drops only this port's SYNs.)
    * ``refused``: the port is bound, not listening: connects are refused at once.

    Each checks on creation that it behaves as named; ``close()`` frees the port.
    """

    def __init__(self, kind: str) -> None:
        assert kind in DEAD_KINDS, kind
        self.kind = kind
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self._filler: socket.socket | None = None
        if kind == "silent":
            self._socket.listen(SILENT_BACKLOG)
        elif kind == "black_hole":
            self._socket.listen(0)
            self._filler = socket.create_connection(("127.0.0.1", self.port))
        self._check()

    def _check(self) -> None:
        """Fail unless a connect meets what the kind promises."""
        with socket.socket() as probe:
            probe.settimeout(SELF_CHECK_WAIT)
            try:
                probe.connect(("127.0.0.1", self.port))
            except TimeoutError:
                seen = "black_hole"
            except ConnectionRefusedError:
                seen = "refused"
            else:
                probe.sendall(b"hello?")
                try:
                    seen = f"an answer {probe.recv(1)!r}"
                except TimeoutError:
                    seen = "silent"
        assert seen == self.kind, f"the {self.kind} address behaved as {seen}"
        if seen == "silent":
            assert self.taken() == 1  # (the probe's: from now on, the client's are counted)

    def taken(self) -> int:
        """How many connections a silent address took since the last call. It accepts
        and closes them: call it once the client is done with them."""
        assert self.kind == "silent", self.kind
        self._socket.setblocking(False)
        count = 0
        while True:
            try:
                connection, _ = self._socket.accept()
            except BlockingIOError:
                break
            connection.close()
            count += 1
        return count

    def close(self) -> None:
        if self._filler is not None:
            self._filler.close()
        self._socket.close()
