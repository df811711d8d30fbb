"""Statements shared between threads: when threads of one process send statements of
one kind (inserts of holds, releases) for different keys at the same moment, one
multi-row statement serves them all.

A ``Lane`` lets a few statements of its kind be under way at a time (its ``width``).
A thread that finds fewer under way sends its own statement at once, as it would alone.
Threads that come while the lane is full queue; when a statement under way returns, one
of them sends one statement for everything queued by then. So a queued thread waits for
a statement under way, never longer, and the statement it saves is its own: no thread
waits to be combined longer than the statement it saves. A lane's width keeps the
threads of a process that sends few statements at once side by side, as before
(sharing would only make some of them wait), and combines the rest.

Only the main thread runs signal handlers, so only the main thread is interrupted, and
it never sends a statement for other threads: a batch with another thread in it is
sent by that one. A statement cut short by an interrupt is then always the main
thread's own, and no other thread has to wonder whether it may still reach the server
later. Each state of an ``Entry`` says who answers for it while the main thread is
interrupted:

* ``QUEUED``: nothing is sent; the thread that leaves takes it out of the queue.
* ``LEADS``: woken to send its batch; leaving before sending, it passes the batch on.
* ``SENT``: in a batch under way; leaving, it is marked ``LEFT`` and the sender undoes
  what the statement did for it (``undo``).
* ``DONE``: answered; its caller, interrupted after that, undoes its own result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Entry", "Lane"]

R = TypeVar("R")  # what a thread asks
A = TypeVar("A")  # its answer

QUEUED, LEADS, SENT, DONE, LEFT = range(5)


class Entry(Generic[R, A]):
    """One thread's request in a lane, until it is answered."""

    __slots__ = ("_woken", "answer", "batch", "main", "request", "state")

    def __init__(self, request: R) -> None:
        self.request = request
        self.main = threading.current_thread() is threading.main_thread()
        self.answer: A | None = None
        self.state = QUEUED
        self.batch: list[Entry[R, A]] = []
        self._woken = threading.Lock()
        self._woken.acquire()

    def wake(self) -> None:
        self._woken.release()

    def wait(self) -> None:
        self._woken.acquire()


class Lane(Generic[R, A]):
    """One statement of a kind under way at a time; see the module docstring.

    ``send(requests)`` sends one statement for ``requests`` (one, or a batch) and answers
    each, in order; it raises only what interrupts it (a failure is an answer, such as
    "go the long way"). ``unsent`` answers a request whose batch was never sent, and
    ``unsure`` one whose statement was cut short. ``undo(requests, answers)`` is given
    the requests whose threads left while their statement was under way, with their
    answers.
    """

    def __init__(
        self,
        send: Callable[[Sequence[R]], list[A]],
        undo: Callable[[Sequence[R], Sequence[A]], None],
        *,
        unsent: A,
        unsure: A,
        most: int,
        width: int,
    ) -> None:
        self._send = send
        self._undo = undo
        self._unsent = unsent
        self._unsure = unsure
        self._most = most  # requests in one statement at most
        self._width = width  # statements under way at once
        self._mutex = threading.Lock()
        self._busy = 0  # statements under way
        self._queue: list[Entry[R, A]] = []

    def after_fork(self) -> None:
        """Start afresh in a forked child: only the forking thread came along."""
        self._mutex = threading.Lock()
        self._busy = 0
        self._queue = []

    def ask(self, request: R) -> A:
        """Send ``request``, alone or with others queued; its answer."""
        alone = False
        entry: Entry[R, A] | None = None
        try:
            # (A signal handler runs after a call returns: the queue's append or the
            # mutex's exit. So everything that changes the lane is inside ``try``, and
            # ``alone`` is set beside the count with no call between them.)
            with self._mutex:
                if self._busy < self._width:
                    self._busy += 1
                    alone = True
                else:
                    entry = Entry[R, A](request)
                    self._queue.append(entry)
            if alone:
                return self._send((request,))[0]
            assert entry is not None
            entry.wait()
            if entry.state == LEADS:
                self._lead(entry)
        except BaseException:
            if entry is not None:
                self._leave(entry)
            raise
        finally:
            if alone:
                self._hand_on()
        assert entry.state == DONE
        return entry.answer  # type: ignore[return-value]  # (set with DONE)

    def _lead(self, entry: Entry[R, A]) -> None:
        """Send ``entry``'s batch and answer its threads, even if interrupted; then let
        the next batch go."""
        batch: list[Entry[R, A]] | None = None
        answers: list[A] | None = None
        sending = False
        try:
            with self._mutex:
                # (Those that left before it was sent need nothing undone.)
                batch = [each for each in entry.batch if each.state != LEFT]
                entry.state = SENT
            sending = True
            answers = self._send([each.request for each in batch])
        finally:
            if batch is not None:
                if answers is None:
                    answers = [self._unsure if sending else self._unsent] * len(batch)
                self._answer(batch, answers)

    def _answer(self, batch: list[Entry[R, A]], answers: list[A]) -> None:
        """Answer ``batch``'s threads (the sender's own included), let the next batch
        go, and undo what the statement did for threads that left."""
        left_requests: list[R] = []
        left_answers: list[A] = []
        with self._mutex:
            for each, answer in zip(batch, answers, strict=True):
                each.answer = answer
                if each.state == LEFT:
                    left_requests.append(each.request)
                    left_answers.append(answer)
                else:
                    each.state = DONE
                    each.wake()  # (the sender's own lock too: nobody waits on it)
        self._hand_on()
        if left_requests:
            self._undo(left_requests, left_answers)

    def _hand_on(self) -> None:
        """The statement under way returned: wake a queued thread to send what is
        queued, or free the lane."""
        with self._mutex:
            if not self._queue:
                self._busy -= 1
                return
            batch = self._queue[: self._most]
            del self._queue[: self._most]
            self._give(batch)

    def _give(self, batch: list[Entry[R, A]]) -> None:
        """Wake a thread of ``batch`` to send it: not the main thread, if another is in
        it (the mutex is held)."""
        sender = next((each for each in batch if not each.main), batch[0])
        for each in batch:
            each.state = SENT
        sender.state = LEADS
        sender.batch = batch
        sender.wake()

    def _leave(self, entry: Entry[R, A]) -> None:
        """``entry``'s thread is interrupted: settle who answers for its request."""
        with self._mutex:
            state = entry.state
            if state == QUEUED and entry in self._queue:  # (interrupted before it was in)
                self._queue.remove(entry)
            elif state == LEADS:  # (woken to send, and never sent: pass the batch on)
                rest = [each for each in entry.batch if each is not entry]
                if rest:
                    self._give(rest)
            if state in (QUEUED, LEADS, SENT):
                # (SENT: its statement is under way, and its sender undoes it.)
                entry.state = LEFT
            if state != LEADS or rest:
                return
        self._hand_on()  # (it was the batch's only thread)
