"""A thread's lock cannot guard coroutines: coroutines of one event loop share its
thread, so they would all count as its holder. Such uses of ``LockManager`` fail
loudly instead of protecting nothing (``tierlock.aio`` is for coroutines)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MakeManager

import tierlock

pytestmark = pytest.mark.parametrize("db", ["sqlite"], indirect=True)

COROUTINES = 20


def test_coroutines_cannot_share_a_thread_s_lock(make_manager: MakeManager, key: str) -> None:
    locks = make_manager()
    inside = 0
    most_inside = 0

    async def section() -> None:
        nonlocal inside, most_inside
        with locks.lock(key):
            inside += 1
            most_inside = max(most_inside, inside)
            await asyncio.sleep(0)
            inside -= 1

    async def main() -> list[BaseException | None]:
        return await asyncio.gather(*(section() for _ in range(COROUTINES)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert most_inside == 0
    assert all(isinstance(outcome, tierlock.LockError) for outcome in outcomes), outcomes
    assert "event loop" in str(outcomes[0])
    assert locks.holders() == []


def test_non_blocking_acquire_in_a_loop_also_fails(make_manager: MakeManager, key: str) -> None:
    lock = make_manager().lock(key)

    async def main() -> None:
        lock.acquire(blocking=False)

    with pytest.raises(tierlock.LockError, match="event loop"):
        asyncio.run(main())
    assert not lock.owned()


def test_worker_threads_of_a_loop_may_lock(make_manager: MakeManager, key: str) -> None:
    """A worker thread of a loop may take a thread's lock."""
    lock = make_manager().lock(key)

    def section() -> int:
        with lock:
            assert lock.token is not None
            return lock.token

    async def main() -> list[int]:
        return await asyncio.gather(*(asyncio.to_thread(section) for _ in range(4)))

    tokens = asyncio.run(main())
    assert len(set(tokens)) == 4


def test_synchronized_refuses_async_functions(make_manager: MakeManager) -> None:
    locks = make_manager()
    with pytest.raises(TypeError, match="async"):

        @locks.synchronized("user:{user_id}")
        async def pay(user_id: int) -> None: ...

    with pytest.raises(TypeError, match="async"):

        @locks.synchronized("feed:{user_id}")
        async def feed(user_id: int):  # type: ignore[no-untyped-def]
            yield user_id
