"""The threads the async manager's calls run in: what an executor promises is kept."""

from __future__ import annotations

import asyncio
import threading

import procs
import pytest

from tierlock.aio.hops import Hops


def _names(prefix: str) -> list[str]:
    return sorted(thread.name for thread in threading.enumerate() if thread.name.startswith(prefix))


def test_each_caller_gets_its_own_outcome_when_answers_come_together() -> None:
    hops = Hops(4, "hops-outcomes")

    def work(number: int) -> int:
        if number % 7 == 0:
            raise ValueError(number)
        if number == 100:
            raise StopIteration  # (no future may hold it: it comes as a RuntimeError)
        return number * 2

    async def main() -> list[int | BaseException]:
        return await asyncio.gather(
            *(hops.call(work, number).future for number in range(200)), return_exceptions=True
        )

    outcomes = asyncio.run(main())
    hops.shutdown()
    for number, outcome in enumerate(outcomes):
        if number % 7 == 0:
            assert isinstance(outcome, ValueError) and outcome.args == (number,)
        elif number == 100:
            assert isinstance(outcome, RuntimeError)
        else:
            assert outcome == number * 2


def test_a_call_whose_caller_went_before_it_started_never_runs() -> None:
    hops = Hops(1, "hops-cancelled")
    busy, free = threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> None:
        busy.set()
        assert free.wait(procs.WAIT_LIMIT)

    async def main() -> None:
        first = hops.call(block)
        assert await asyncio.to_thread(busy.wait, procs.WAIT_LIMIT)
        late = hops.call(ran.append, "late")

        async def wait() -> None:
            await late.future

        waiting = asyncio.create_task(wait())
        await asyncio.sleep(0)  # (the task now awaits the call)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        free.set()
        await first.future

    asyncio.run(main())
    hops.shutdown()  # (runs what is queued first)
    assert ran == []


def test_what_runs_after_a_call_runs_after_it_even_if_its_caller_went() -> None:
    hops = Hops(2, "hops-after")
    started, free = threading.Event(), threading.Event()
    order: list[str] = []
    after_ran = threading.Event()

    def work() -> None:
        started.set()
        assert free.wait(procs.WAIT_LIMIT)
        order.append("call")

    async def main() -> None:
        call = hops.call(work)
        waiting = asyncio.ensure_future(asyncio.shield(call.future))
        assert await asyncio.to_thread(started.wait, procs.WAIT_LIMIT)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        def after() -> None:
            order.append("after")
            after_ran.set()

        call.when_run(after)
        assert order == []  # (not before the call has run)
        free.set()
        assert await asyncio.to_thread(after_ran.wait, procs.WAIT_LIMIT)
        done = hops.call(order.append, "next")
        await done.future
        done.when_run(lambda: order.append("at once"))

    asyncio.run(main())
    hops.shutdown()
    assert order == ["call", "after", "next", "at once"]


def test_shutdown_runs_what_is_queued_then_takes_no_more() -> None:
    hops = Hops(1, "hops-shutdown")
    ran: list[int] = []

    async def main() -> None:
        for number in range(20):
            hops.call(ran.append, number)
        hops.post(lambda: ran.append(-1))

    asyncio.run(main())
    hops.shutdown()
    assert ran == [*range(20), -1]
    assert _names("hops-shutdown") == []
    with pytest.raises(RuntimeError):
        hops.post(lambda: None)


def test_threads_start_as_calls_find_none_idle_up_to_the_limit() -> None:
    hops = Hops(3, "hops-threads")
    gate = threading.Barrier(4)  # three calls at once, and this thread

    async def main() -> None:
        await hops.call(lambda: None).future
        assert _names("hops-threads") == ["hops-threads_0"]
        await hops.call(lambda: None).future  # (the idle one takes it)
        assert _names("hops-threads") == ["hops-threads_0"]
        meeting = [hops.call(gate.wait, procs.WAIT_LIMIT) for _ in range(3)]
        await asyncio.to_thread(gate.wait, procs.WAIT_LIMIT)
        await asyncio.gather(*(call.future for call in meeting))
        await asyncio.gather(*(hops.call(lambda: None).future for _ in range(10)))

    asyncio.run(main())
    assert _names("hops-threads") == ["hops-threads_0", "hops-threads_1", "hops-threads_2"]
    hops.shutdown()
