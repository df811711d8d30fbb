"""What the harness drives, whatever the lock: an :class:`Implementation` is a row of
the report; it opens a :class:`Subject` once in every worker process, which gives every
thread of the process a :class:`Contender`: its way to take and free a key, named by
index, waiting for it (``acquire``) or not (``try_acquire``). An asyncio lock opens an
:class:`AsyncSubject` instead, whose :class:`AsyncContender` serves one task of the
process's event loop. Statements are counted where they are sent, never assumed.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

# How long any acquire may wait before the run counts as broken rather than slow.
WAIT_LIMIT = 30.0
# The lease of every hold: far longer than any section, so none ever expires.
TTL = 60.0


class Contender(abc.ABC):
    """One thread's way to take and free keys by index, on connections of its own."""

    sent = 0  # statements sent, counted by subclasses that send their own

    def statements(self) -> int:
        """Statements or commands this contender has sent so far."""
        return self.sent

    @abc.abstractmethod
    def acquire(self, index: int) -> None:
        """Take key ``index``, waiting for it as long as it is held elsewhere."""

    @abc.abstractmethod
    def try_acquire(self, index: int) -> bool:
        """Take key ``index`` if it is free now, without waiting: whether it was taken."""

    @abc.abstractmethod
    def release(self, index: int) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the contender opened."""


class Subject(abc.ABC):
    """One process's side of an implementation."""

    def __init__(self) -> None:
        self.contenders: list[Contender] = []
        self._mutex = threading.Lock()

    def contender(self) -> Contender:
        """A contender for the calling thread; its statements count towards this subject."""
        contender = self.make_contender()
        with self._mutex:
            self.contenders.append(contender)
        return contender

    @abc.abstractmethod
    def make_contender(self) -> Contender: ...

    def statements(self) -> int:
        """Statements or commands sent so far by all of this process's contenders."""
        with self._mutex:
            return sum(contender.statements() for contender in self.contenders)

    @abc.abstractmethod
    def close(self) -> None:
        """Close what the subject opened."""


class AsyncContender(abc.ABC):
    """One task's way to take and free keys by index, in the event loop of its process."""

    @abc.abstractmethod
    def lock(self, index: int) -> AbstractAsyncContextManager[object]:
        """Key ``index``, taken by ``async with`` (waiting as long as it is held
        elsewhere) and freed at its end."""


class AsyncSubject(abc.ABC):
    """One process's side of an asyncio lock, made and closed in its event loop's thread."""

    @abc.abstractmethod
    def contender(self) -> AsyncContender:
        """A contender for one task."""

    @abc.abstractmethod
    def statements(self) -> int:
        """Statements or commands sent so far; may be called from any thread."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close what the subject opened."""


@dataclass(frozen=True)
class Implementation:
    """A lock implementation on one server, as a row of the report."""

    # For --impl: tierlock, table-only, bare-cursor, get-lock, advisory, redis,
    # python-redis-lock, kazoo, filelock, floor; in the asyncio scenarios, tierlock-aio
    # and redis-aio beside tierlock.
    name: str
    label: str  # the row's label
    database: str | None  # the engine; None: needs none, shown in every engine's table
    # Called in each worker process; an AsyncSubject, in the thread of its event loop.
    open: Callable[[], Subject | AsyncSubject]
    excludes: bool = True  # False for the floor, whose violations are expected
    scenarios: tuple[str, ...] | None = None  # the only scenarios it runs in; None: all

    def runs_in(self, scenario: str) -> bool:
        return self.scenarios is None or scenario in self.scenarios
