"""``locks.semaphore(key, permits)`` against CPython's own semaphore tests.

Adapted from CPython 3.11's ``Lib/test/lock_tests.py``: ``BaseSemaphoreTests`` (with
``SemaphoreTests`` and ``BoundedSemaphoreTests``), test by test and in the same order, on
every database. Where a CPython test is dropped or changed, a comment says why. The
differences all come from two rules of tierlock's semaphore: ``permits`` has no default
and must be positive, and a permit belongs to the thread that took it (only that thread
may release it, so a semaphore is bounded and no thread hands out permits it never took).

CPython's ``Bunch`` and ``support.sleeping_retry`` become the ``Bunch`` below and
``wait_until``; blocking acquires in worker threads carry a long timeout (``LONG``, from
``rwhelpers``), so that a hang becomes a failure instead of a stuck run.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

import pytest
from conftest import SHARED_HOLDS, MakeManager
from polling import wait_until
from rwhelpers import LONG, SPREAD, rows_of

import tierlock

pytestmark = SHARED_HOLDS

# CPython's wait_threads_blocked(): a pause that lets threads reach their wait. Used only
# before checking that something did NOT happen (a blocked thread did not get through);
# it is ten polls of the managers (poll_interval 0.02), so a wrong pass would show.
BLOCKED_PAUSE = 0.2


class Bunch:
    """CPython's ``Bunch``: ``count`` threads running ``func(index)``, joined on exit.

    The threads' exceptions fail the test on exit; so does a thread still running
    after ``LONG`` seconds.
    """

    def __init__(self, func: Callable[[int], None], count: int) -> None:
        self.started: list[int] = []
        self.finished: list[int] = []
        self.exceptions: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._task, args=(func, index), daemon=True)
            for index in range(count)
        ]

    def _task(self, func: Callable[[int], None], index: int) -> None:
        self.started.append(index)
        try:
            func(index)
        except BaseException as exc:
            self.exceptions.append(exc)
        finally:
            self.finished.append(index)

    def __enter__(self) -> Bunch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        deadline = time.monotonic() + LONG
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if exc_type is not None:
            return  # the test's own failure says more than the threads'
        if self.exceptions:
            raise AssertionError(f"threads raised {self.exceptions!r}") from self.exceptions[0]
        running = sum(thread.is_alive() for thread in self._threads)
        assert running == 0, f"{running} thread(s) still running after {LONG:g} s"


def _semaphores(
    make_manager: MakeManager, key: str, permits: int, count: int, spread: str
) -> list[tierlock.Semaphore]:
    """``count`` handles on the semaphore: one manager's, or each of its own manager."""
    if spread == "one-manager":
        manager = make_manager()
        return [manager.semaphore(key, permits) for _ in range(count)]
    return [make_manager().semaphore(key, permits) for _ in range(count)]


# -- BaseSemaphoreTests -------------------------------------------------------------


@pytest.mark.parametrize(
    ("permits", "error"),
    [
        (-1, ValueError),
        (-sys.maxsize, ValueError),
        # Changed: CPython allows a value of 0; a semaphore nobody can ever hold is refused.
        (0, ValueError),
        # Added: the value is a permit count, an int (and not a bool).
        (1.0, TypeError),
        ("2", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
    ids=repr,
)
def test_constructor(
    manager: tierlock.LockManager, key: str, permits: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="permits"):
        manager.semaphore(key, permits)  # type: ignore[arg-type]
    assert manager.holders() == []


def test_acquire(manager: tierlock.LockManager, key: str) -> None:
    # Changed: one key per semaphore (CPython makes two independent objects).
    sem = manager.semaphore(f"{key}:1", 1)
    assert sem.acquire()
    sem.release()
    sem = manager.semaphore(f"{key}:2", 2)
    assert sem.acquire()
    assert sem.acquire()
    sem.release()
    sem.release()
    assert manager.holders() == []


def test_acquire_destroy(manager: tierlock.LockManager, key: str) -> None:
    # Changed: permits=1 given (there is no default), and the test goes on to check
    # what dropping the handle means here: the permit stays with the thread.
    sem = manager.semaphore(key, 1)
    assert sem.acquire()
    del sem
    gc.collect()
    again = manager.semaphore(key, 1)
    assert again.locked()
    assert again.owned()
    again.release()
    assert manager.holders() == []


@SPREAD
def test_acquire_contended(make_manager: MakeManager, key: str, spread: str) -> None:
    """CPython: 10 threads take two permits each of 7 while the main thread, which
    holds one, lets them through in phases by releasing 7, then 6, then 1 permits that
    it never took. Here a thread releases only permits it holds, so the main thread
    takes all 7 first and releases them in two phases (3, then 4); each worker takes one
    permit and keeps it until told to let go, which lets the last 3 through in phase 2.
    Every acquire returns True, no phase lets through more threads than it freed
    permits, and no more than 7 ever hold at once."""
    permits, workers = 7, 10
    main = make_manager().semaphore(key, permits)
    semaphores = _semaphores(make_manager, key, permits, workers, spread)
    for _ in range(permits):
        assert main.acquire(blocking=False)
    phase = [0]
    results: list[int] = []  # the phase in which each worker got its permit
    acquired: list[bool] = []
    inside, most = [0], [0]
    mutex = threading.Lock()
    let_go = threading.Event()

    def func(index: int) -> None:
        sem = semaphores[index]
        got = sem.acquire(timeout=LONG)
        acquired.append(got)
        if not got:
            return
        with mutex:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        results.append(phase[0])
        assert let_go.wait(LONG)
        with mutex:
            inside[0] -= 1
        sem.release()

    with Bunch(func, workers):
        # Phase 0
        for _ in range(3):
            main.release()
        wait_until(lambda: len(results) >= 3, "3 workers through")
        assert results == [0] * 3

        # Phase 1
        phase[0] = 1
        for _ in range(4):
            main.release()
        wait_until(lambda: len(results) >= 7, "7 workers through")
        assert sorted(results) == [0] * 3 + [1] * 4
        # The semaphore is still locked: 7 workers hold, 3 wait.
        assert not main.owned()
        assert main.locked()
        assert not main.acquire(False)
        time.sleep(BLOCKED_PAUSE)  # (see BLOCKED_PAUSE: nobody else may get through)
        assert len(results) == 7

        # Phase 2: changed: the holders release, not the main thread.
        phase[0] = 2
        let_go.set()
        wait_until(lambda: len(results) >= workers, "the last 3 workers through")
        assert sorted(results) == [0] * 3 + [1] * 4 + [2] * 3

    assert acquired == [True] * workers
    assert most[0] <= permits
    assert main.acquire(False)  # every permit is free again
    main.release()
    assert rows_of(make_manager, key) == []


# Dropped: test_multirelease: release(n) does not exist (a thread returns one permit at a
# time, and only permits it holds).


def test_try_acquire(manager: tierlock.LockManager, key: str) -> None:
    sem = manager.semaphore(key, 2)
    assert sem.acquire(False)
    assert sem.acquire(False)
    assert not sem.acquire(False)
    sem.release()
    assert sem.acquire(False)
    # Added: give everything back.
    sem.release()
    sem.release()
    assert manager.holders() == []


@SPREAD
def test_try_acquire_contended(make_manager: MakeManager, key: str, spread: str) -> None:
    # Changed: the threads try while all others still hold what they got (a barrier),
    # then give their permits back, instead of ending while holding them.
    main = make_manager().semaphore(key, 4)
    assert main.acquire()
    threads = 5
    semaphores = _semaphores(make_manager, key, 4, threads, spread)
    results: list[bool] = []
    tried = threading.Barrier(threads, timeout=LONG)

    def f(index: int) -> None:
        sem = semaphores[index]
        got = [sem.acquire(False), sem.acquire(False)]
        results.extend(got)
        tried.wait()
        for _ in range(sum(got)):
            sem.release()

    with Bunch(f, threads):
        pass
    # There can be a thread switch between acquiring the semaphore and appending the
    # result, so the results are not necessarily ordered.
    assert sorted(results) == [False] * 7 + [True] * 3
    main.release()
    assert rows_of(make_manager, key) == []


def test_acquire_timeout(manager: tierlock.LockManager, key: str) -> None:
    sem = manager.semaphore(key, 2)
    with pytest.raises(ValueError, match="non-blocking"):
        sem.acquire(False, timeout=1.0)
    # Added: threading's other rule for timeouts.
    with pytest.raises(ValueError, match="non-negative"):
        sem.acquire(timeout=-2)
    assert sem.acquire(timeout=0.005)
    assert sem.acquire(timeout=0.005)
    assert not sem.acquire(timeout=0.005)
    sem.release()
    assert sem.acquire(timeout=0.005)
    started = time.monotonic()
    assert not sem.acquire(timeout=0.5)
    elapsed = time.monotonic() - started
    # CPython's assertTimeout(): at least 0.6 times the timeout, less than 10 times.
    assert 0.5 * 0.6 <= elapsed < 0.5 * 10
    sem.release()
    sem.release()
    assert manager.holders() == []


@SPREAD
def test_default_value(make_manager: MakeManager, key: str, spread: str) -> None:
    # Changed: there is no default value, so permits=1 is given; the blocked thread
    # waits in this manager (tier 1) or in one of its own (tier 2).
    sem, other = _semaphores(make_manager, key, 1, 2, spread)
    assert sem.acquire()
    waiting = threading.Event()

    def f(index: int) -> None:
        waiting.set()
        assert other.acquire(timeout=LONG)
        other.release()

    with Bunch(f, 1) as bunch:
        # Thread blocked on acquire()
        assert waiting.wait(LONG)
        time.sleep(BLOCKED_PAUSE)  # (see BLOCKED_PAUSE: the thread must not get through)
        assert not bunch.finished

        # Thread unblocked
        sem.release()
    assert bunch.finished == [0]


def test_with(manager: tierlock.LockManager, key: str) -> None:
    sem = manager.semaphore(key, 2)

    def _with(err: BaseException | None = None) -> None:
        with sem as entered:
            assert entered is sem  # added: __enter__ returns the handle
            assert sem.acquire(False)
            sem.release()
            with sem:
                assert not sem.acquire(False)
                if err:
                    raise err

    _with()
    assert sem.acquire(False)
    sem.release()
    with pytest.raises(TypeError):
        _with(TypeError())
    assert sem.acquire(False)
    sem.release()
    assert manager.holders() == []


# -- SemaphoreTests ------------------------------------------------------------------

# Dropped: SemaphoreTests.test_release_unacquired: an unbounded release, which adds a
# permit nobody took, does not exist; tierlock's semaphore is bounded (see below).
# Dropped: SemaphoreTests.test_repr and BoundedSemaphoreTests.test_repr: the repr's format
# is not part of the contract.

# -- BoundedSemaphoreTests -----------------------------------------------------------


def test_release_unacquired(manager: tierlock.LockManager, key: str) -> None:
    # Changed: permits=1 given (no default); NotHeldError, a RuntimeError as threading
    # raises for a lock, instead of the ValueError of CPython's BoundedSemaphore.
    sem = manager.semaphore(key, 1)
    with pytest.raises(tierlock.NotHeldError):
        sem.release()
    assert sem.acquire()
    sem.release()
    with pytest.raises(tierlock.NotHeldError) as caught:
        sem.release()
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.key == key


def test_release_of_another_threads_permit_is_refused(
    manager: tierlock.LockManager, key: str
) -> None:
    # Added (CPython lets any thread release): a permit is returned only by its holder.
    sem = manager.semaphore(key, 2)
    assert sem.acquire()
    errors: list[BaseException] = []

    def intruder(index: int) -> None:
        try:
            sem.release()
        except tierlock.NotHeldError as exc:
            errors.append(exc)

    with Bunch(intruder, 1):
        pass
    assert len(errors) == 1
    assert sem.owned()
    assert [info.mode for info in manager.holders()] == ["permit"]
    sem.release()
    assert manager.holders() == []
