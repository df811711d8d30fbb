"""What the async tiers' queues are made of: the calling task, which owns what it
acquires, and a waiting task's ``Waiter``; and the extend every async hold shares."""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar
from typing import Any

from ..errors import LockError, LockLostError
from ..records import Hold, Owner
from ..tier1.tiers import OnLost
from .core import Core

__all__ = ["Waiter", "current_task", "extend_hold", "releasing_for", "within"]

#: The task whose holds the calling task releases for it: a release put off until a
#: transaction ends, which SQLAlchemy may end in a task of its own (``async with
#: session`` closes it in one); see ``tierlock.contrib.sqlalchemy``. ``None``: its own.
#: The manager's tasks that such a release starts inherit it; none asks for its task.
releasing_for: ContextVar[asyncio.Task[Any] | None] = ContextVar("releasing_for", default=None)


def current_task() -> asyncio.Task[object]:
    """The calling task, which owns what it acquires (or the task it releases for)."""
    task = releasing_for.get()
    if task is not None:
        return task
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs
        task = None
    if task is None:
        raise LockError("tierlock.aio's locks belong to asyncio tasks: call them from a task")
    return task


class Waiter:
    """A task waiting in a queue, and what it asks for."""

    __slots__ = (
        "courteous",
        "deadline",
        "future",
        "on_lost",
        "owner",
        "patient",
        "renew",
        "task",
        "ttl",
    )

    def __init__(
        self,
        task: asyncio.Task[object],
        ttl: float,
        renew: bool,
        on_lost: OnLost | None,
        wait: float | None,
    ) -> None:
        self.task = task
        self.owner = Owner.current(task.get_name())
        self.ttl = ttl
        self.renew = renew
        self.on_lost = on_lost
        self.patient = wait != 0  # (not a try without waiting)
        self.deadline = None if wait is None else time.monotonic() + wait  # None: no limit
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.courteous = False  # let other processes try first

    def answer(self, got: object) -> None:
        if not self.future.done():
            self.future.set_result(got)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


def within(seconds: float, deadline: float | None) -> float:
    """``seconds``, or less if ``deadline`` (``time.monotonic()``) comes sooner."""
    return seconds if deadline is None else max(0.0, min(seconds, deadline - time.monotonic()))


async def extend_hold(core: Core, hold: Hold, key: str, ttl: float) -> None:
    """Move ``hold``'s lease end to now + ``ttl`` (renewed by ``ttl`` from then on if
    it is renewed at all).

    :raises LockLostError: the hold was lost, or its row found gone.
    """
    core.heartbeat.ensure_alive(hold, key, "it could be extended")
    lease = None if hold.lease is None else ttl
    sent = time.monotonic()
    if not await core.call(core.backend.extend, hold.key, hold.owner_id, ttl, lease):
        core.heartbeat.lost(hold, "its row was gone before it could be extended")
        raise LockLostError(key, hold.token)
    if not core.heartbeat.extended(hold, sent, ttl):
        raise LockLostError(key, hold.token)
