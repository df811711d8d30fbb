"""What the asyncio tiers share: how the event loop reaches the backend, the manager's
heartbeat and cohort rules, and the background tasks that must finish before it closes.

The database is reached through the same backend as ``LockManager``'s, its calls run
in a few threads of the manager's own (``STATEMENT_THREADS``), and a poller's pauses
on a doorbell in a few more (``DOORBELL_THREADS``), reached as ``hops`` says. Native
async drivers (psycopg's async connection, aiomysql, aiosqlite) would need a second
copy of every statement, retry rule and wake-up of the SQL backend for each database,
to save part of the hop to a thread. Measured on two cores: an empty call through a
thread takes about 58 µs alone, 4 µs each when 50 tasks call at once (their answers
come back together); on PostgreSQL ``SELECT 1`` takes 89 µs from the caller's thread,
193 µs through an executor's thread and 111 µs on psycopg's async connection. A
hand-off between tasks sends no statement and makes no hop, so only keys that go to
the database each time pay it. Waiting tasks never use a thread: they wait on futures
in the loop, and only the one poller of a key calls the backend.

A call that may change a row runs to its end even if the task awaiting it is
cancelled: its outcome is then undone in the thread (``call(..., undo=)``), so a
cancellation never leaves a row that nobody will release.

A forked child gets a copy of the manager, of its tasks and of its event loop, but not
its threads; the rows are the parent's. So in a child the core refuses every call,
pause and task, and skips every undo, and the tiers refuse before they change anything:
nothing the child does (a release, the cancelled tasks of ``asyncio.run``'s teardown, a
garbage collection) reaches the database or passes a hold to another task (see
``AsyncLockManager``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..backends import Doorbell, LockBackend
from ..errors import LockError
from ..stats import Counters
from ..tier1.cohorts import Cohorts
from ..tier1.leases import Heartbeat
from .hops import Hops

__all__ = ["Core"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Threads that send statements for the loop; more would only queue at the database's
# connection pool (5 connections by default) on a machine with few cores. (On SQL, up
# to 4 statements of a kind go alone before threads share one, so these never share:
# with 16 threads sharing, 1000 tasks over 1000 keys on MariaDB ran 900 sections/s
# against 940-1000 with 4.)
STATEMENT_THREADS = 4
# Threads in which pollers of keys held elsewhere pause on their doorbells (a blocking
# wait: a named lock on MariaDB, a FIFO on SQLite, a NOTIFY on PostgreSQL); one per key
# being polled at once, up to this many, after which pauses wait their turn.
DOORBELL_THREADS = 8

INHERITED = "this AsyncLockManager was made in another process; make a new one in this process"


class Core:
    """One async manager's backend, executors, heartbeat and background tasks."""

    def __init__(self, backend: LockBackend, counters: Counters, poll_interval: float, idle: float):
        self.backend = backend
        self.counters = counters
        self.poll_interval = poll_interval
        self.heartbeat = Heartbeat(backend, counters, idle)
        self.cohorts = Cohorts(backend)
        self.closed = False
        self._pid = os.getpid()  # its threads and event loop do not survive a fork
        self._statements = Hops(STATEMENT_THREADS, "tierlock-aio")
        self._bells = Hops(DOORBELL_THREADS, "tierlock-aio-bell")
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def inherited(self) -> bool:
        """Whether this process is a forked child of the one that made the manager."""
        return os.getpid() != self._pid

    def check_process(self, key: str | None = None) -> None:
        """:raises LockError: in a forked child, which may not use the manager."""
        if self.inherited:
            raise LockError(INHERITED, key)

    def check_open(self, key: str | None = None) -> None:
        self.check_process(key)
        if self.closed:
            raise LockError("this AsyncLockManager is closed", key)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's holds and heartbeat threads, which
        are gone. The executors are left as they are, never used nor shut down here (a
        mutex of theirs may have been held at the fork, and their queues may hold the
        parent's statements)."""
        self.heartbeat.forget()

    async def call(
        self, function: Callable[..., T], *args: Any, undo: Callable[[], None] | None = None
    ) -> T:
        """``function(*args)`` in a statement thread. With ``undo``, the call is finished
        even if the awaiting task is cancelled, and ``undo()`` then runs after it in a
        statement thread, whatever it returned or raised."""
        self.check_process()
        call = self._statements.call(function, *args)
        if undo is None:
            return await call.future
        try:
            return await asyncio.shield(call.future)
        except asyncio.CancelledError:
            call.when_run(lambda: self._undo(undo))
            raise

    def _undo(self, undo: Callable[[], None]) -> None:
        if self.inherited:  # a forked child's copy of the call: the parent undoes its own
            return

        def run() -> None:
            try:
                undo()
            except LockError as exc:
                logger.warning("cleaning up after a cancelled call failed: %s", exc)

        try:
            self._statements.post(run)
        except RuntimeError:  # shut down: the threads are gone, run it here
            run()

    async def pause(self, doorbell: Doorbell, seconds: float, deadline: float | None) -> bool:
        """``doorbell.pause`` in a doorbell thread (see ``Doorbell.pause``)."""
        self.check_process()
        return await self._bells.call(doorbell.pause, seconds, deadline).future

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task of the manager's: no caller's cancellation reaches it,
        and ``aclose`` waits for it. In a forked child, ``work`` is closed unstarted."""
        if self.inherited:
            work.close()
            raise LockError(INHERITED)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # (a release awaited by its caller reports there; the others are logged)
            exc = task.exception()
            if not isinstance(exc, LockError):
                logger.error("a tierlock task failed", exc_info=exc)

    async def settle(self) -> None:
        """Wait for every background task, including those they start."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def shutdown(self) -> None:
        """Stop the threads, once nothing runs in them any more."""
        self.heartbeat.close()
        self._bells.shutdown()
        self._statements.shutdown()
