"""``combining.Lane``, the flat combining behind statements shared between threads, on
its own: a ``send`` that the test holds and lets go stands for the statement.

Signals are delivered with ``signal.pthread_kill`` to the main thread, the only thread
that runs signal handlers, at the state of its request the test chose.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import procs
import pytest
from interrupts import Interrupted, Steps, interrupting
from polling import wait_until

from tierlock.backends.sql.combining import Lane

UNSENT, UNSURE = "unsent", "unsure"


class Statements:
    """A ``send`` for a lane of ``width``: records each batch and who sent it, answers
    each request with ``"<request>!"``, and waits until ``release()`` at each batch
    that ``hold`` names (0: the first)."""

    def __init__(self, *hold: int, width: int = 1) -> None:
        self.batches: list[list[str]] = []
        self.senders: list[int] = []
        self.undone: list[tuple[list[str], list[str]]] = []
        self._hold = set(hold)
        self.sending = [threading.Event() for _ in range(8)]
        self._go = [threading.Event() for _ in range(8)]
        self.lane: Lane[str, str] = Lane(
            self.send, self.undo, unsent=UNSENT, unsure=UNSURE, most=4, width=width
        )

    def send(self, requests: Sequence[str]) -> list[str]:
        index = len(self.batches)
        self.batches.append(list(requests))
        self.senders.append(threading.get_ident())
        self.sending[index].set()
        if index in self._hold:
            assert self._go[index].wait(procs.WAIT_LIMIT), "a held statement was never let go"
        return [f"{request}!" for request in requests]

    def undo(self, requests: Sequence[str], answers: Sequence[str]) -> None:
        self.undone.append((list(requests), list(answers)))

    def release(self, index: int) -> None:
        self._go[index].set()

    def under_way(self, request: str) -> Asker:
        """A thread whose request is sent (the first statement, held), once it is."""
        asker = Asker(self, request)
        assert self.sending[0].wait(procs.WAIT_LIMIT)
        return asker

    def queued(self, count: int) -> Callable[[], bool]:
        return lambda: len(self.lane._queue) == count


class Asker(threading.Thread):
    """A thread that asks the lane once and keeps the answer."""

    def __init__(self, statements: Statements, request: str) -> None:
        super().__init__(daemon=True)
        self._statements = statements
        self.request = request
        self.answer: str | None = None
        self.start()

    def run(self) -> None:
        self.answer = self._statements.lane.ask(self.request)

    def done(self) -> str | None:
        self.join(procs.WAIT_LIMIT)
        assert not self.is_alive()
        return self.answer


@pytest.fixture
def interrupt() -> Iterator[Callable[[Steps], None]]:
    """``interrupt(steps)``: see ``interrupts.interrupting``."""
    yield from interrupting(Interrupted)


def test_a_lone_request_is_sent_at_once_by_its_own_thread() -> None:
    statements = Statements()
    assert statements.lane.ask("a") == "a!"
    assert statements.batches == [["a"]]
    assert statements.senders == [threading.get_ident()]


def test_requests_that_come_while_one_is_under_way_share_the_next_statement() -> None:
    statements = Statements(0)
    first = statements.under_way("a")
    others = [Asker(statements, request) for request in "bcd"]
    wait_until(statements.queued(3), "three requests to queue")
    assert not statements.sending[1].is_set()  # (nothing more is sent meanwhile)
    statements.release(0)
    assert [asker.done() for asker in [first, *others]] == ["a!", "b!", "c!", "d!"]
    assert statements.batches[0] == ["a"]
    assert sorted(statements.batches[1]) == ["b", "c", "d"]
    assert len(statements.batches) == 2
    assert statements.senders[1] in {asker.ident for asker in others}


def test_as_many_go_alone_as_the_lane_is_wide_and_the_next_share_one() -> None:
    statements = Statements(0, 1, width=2)
    first = statements.under_way("a")
    second = Asker(statements, "b")
    assert statements.sending[1].wait(procs.WAIT_LIMIT)  # (alone, beside the first)
    others = [Asker(statements, request) for request in "cde"]
    wait_until(statements.queued(3), "three requests to queue")
    statements.release(1)
    assert [asker.done() for asker in [second, *others]] == ["b!", "c!", "d!", "e!"]
    statements.release(0)
    assert first.done() == "a!"
    assert [sorted(batch) for batch in statements.batches] == [["a"], ["b"], ["c", "d", "e"]]


def test_a_batch_holds_at_most_its_bound_and_the_rest_go_next() -> None:
    statements = Statements(0)
    first = statements.under_way("a")
    others = []
    for count, request in enumerate("bcdefg", start=1):
        others.append(Asker(statements, request))
        wait_until(statements.queued(count), "the requests to queue in order")
    statements.release(0)
    assert [asker.done() for asker in others] == [f"{request}!" for request in "bcdefg"]
    assert first.done() == "a!"
    assert [sorted(batch) for batch in statements.batches] == [["a"], list("bcde"), ["f", "g"]]


def test_the_main_thread_never_sends_a_statement_for_others() -> None:
    statements = Statements(0)
    first = statements.under_way("a")
    queued_after: list[Asker] = []

    def queue_another_then_let_go() -> None:
        wait_until(statements.queued(1), "the main thread to queue")
        queued_after.append(Asker(statements, "b"))
        wait_until(statements.queued(2), "another thread to queue behind it")
        statements.release(0)

    helper = threading.Thread(target=queue_another_then_let_go, daemon=True)
    helper.start()
    assert statements.lane.ask("main") == "main!"  # queued first, yet not the sender
    helper.join(procs.WAIT_LIMIT)
    assert queued_after[0].done() == "b!" and first.done() == "a!"
    assert sorted(statements.batches[1]) == ["b", "main"]
    assert statements.senders[1] == queued_after[0].ident


def test_interrupted_while_queued_it_is_never_sent(
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    statements = Statements(0)
    first = statements.under_way("a")
    later: list[Asker] = []

    def steps() -> None:
        later.append(Asker(statements, "b"))
        wait_until(statements.queued(2), "the main thread and another to queue")

    interrupt(steps)
    with pytest.raises(Interrupted):
        statements.lane.ask("main")
    assert statements.queued(1)()
    statements.release(0)
    assert first.done() == "a!" and later[0].done() == "b!"
    assert statements.batches == [["a"], ["b"]]
    assert statements.undone == []


def test_interrupted_while_its_statement_is_under_way_the_sender_undoes_it(
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    statements = Statements(0, 1)
    first = statements.under_way("a")
    later: list[Asker] = []

    def steps() -> None:
        later.append(Asker(statements, "b"))
        wait_until(statements.queued(2), "the main thread and another to queue")
        statements.release(0)
        assert statements.sending[1].wait(procs.WAIT_LIMIT)  # (b sends both)

    interrupt(steps)
    with pytest.raises(Interrupted):
        statements.lane.ask("main")
    statements.release(1)
    assert first.done() == "a!" and later[0].done() == "b!"
    assert sorted(statements.batches[1]) == ["b", "main"]
    assert statements.undone == [(["main"], ["main!"])]


def test_interrupted_in_its_own_statement_the_next_batch_still_goes(
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    statements = Statements(0)
    later: list[Asker] = []

    def steps() -> None:
        assert statements.sending[0].wait(procs.WAIT_LIMIT)
        later.append(Asker(statements, "b"))
        wait_until(statements.queued(1), "another thread to queue behind the main one")

    interrupt(steps)
    with pytest.raises(Interrupted):
        statements.lane.ask("main")  # (alone: its own statement, cut short)
    assert later[0].done() == "b!"
    assert statements.batches == [["main"], ["b"]]
    assert statements.lane.ask("c") == "c!"  # (and the lane is free again)


def interrupted_after_a_call_in_ask(statements: Statements, when: Callable[[], bool]) -> None:
    """The main thread asks the lane, and is interrupted (the ``interrupt`` fixture's
    signal) when a call made in ``Lane.ask`` returns once ``when()`` holds: the first
    moment a signal handler can run there."""
    main = threading.get_ident()
    ask = Lane.ask.__code__

    def at_return(frame: Any, event: str, arg: object) -> None:
        if event == "c_return" and frame.f_code is ask and when():
            sys.setprofile(None)
            signal.pthread_kill(main, signal.SIGUSR1)

    sys.setprofile(at_return)
    try:
        with pytest.raises(Interrupted):
            statements.lane.ask("main")
    finally:
        sys.setprofile(None)


def test_interrupted_right_after_it_queued_it_leaves_the_queue(
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    """The signal lands at the first moment a handler can run once the request is in
    the queue (the call that queued it returns), before the thread waits."""
    statements = Statements(0)
    first = statements.under_way("a")
    interrupted_after_a_call_in_ask(statements, statements.queued(1))
    assert statements.queued(0)()
    statements.release(0)
    assert first.done() == "a!"
    assert statements.lane.ask("b") == "b!"  # (the lane is free again)
    assert statements.batches == [["a"], ["b"]]


def test_interrupted_right_after_it_took_the_lane_it_frees_it(
    interrupt: Callable[[Callable[[], Any]], None],
) -> None:
    """As above, for a request that finds the lane free: the signal lands when the call
    that let go of the lane's mutex returns, before its statement is sent."""
    statements = Statements()
    interrupted_after_a_call_in_ask(statements, lambda: statements.lane._busy == 1)
    assert statements.lane._busy == 0
    assert statements.batches == []
    assert Asker(statements, "b").done() == "b!"
