"""What the harness drives, whatever the lock: an :class:`Implementation` is a row of
the report; it opens a :class:`Subject` once in every worker process, which gives every
thread of the process a :class:`Contender`: its way to take and free a key, named by
index, waiting for it (``acquire``) or not (``try_acquire``). Statements are counted
where they are sent, never assumed.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
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


@dataclass(frozen=True)
class Implementation:
    """A lock implementation on one server, as a row of the report."""

    name: str  # for --impl: tierlock, table-only, get-lock, advisory, redis, floor
    label: str  # the row's label
    database: str | None  # None: needs none of them, shown in every database's table
    open: Callable[[], Subject]  # called in each worker process
    excludes: bool = True  # False for the floor, whose violations are expected
