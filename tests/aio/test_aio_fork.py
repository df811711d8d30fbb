"""A forked child never touches its parent's holds: a process whose tasks hold keys
through an ``AsyncLockManager``, and whose thread holds one through a ``LockManager``,
forks from inside a task; however the child ends, the parent keeps every hold, and the
child ends at once.

Each case runs this module as a program (``python test_aio_fork.py URL TABLE ENDING``),
so that the child is a plain program's child: its ``sys.exit(0)`` ends it, and nothing
of pytest's runs in it. The program prints what the parent saw as one line of JSON.

The parent's event loop polls with ``poll()``, not ``epoll``: an epoll set is shared
with a forked child, whose ``asyncio.run`` takes the parent's wake-up pipe out of it as
it closes its copy of the loop (asyncio's own hazard, whatever the child does with
tierlock). And the parent's loop stands still while the child lives (it waits for the
child in the loop's thread), so that the child's copy of the loop, which reads the
wake-up pipe both share, costs the parent no wake-up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import os
import select
import selectors
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import procs
import pytest

import tierlock
from tierlock.aio import AsyncLock, AsyncLockManager, AsyncReadLock, AsyncSemaphore

if TYPE_CHECKING:
    from conftest import MakeManager

ASYNC_KEYS = ("fork:async:1", "fork:async:2")
SYNC_KEY = "fork:sync"
HELD = (*ASYNC_KEYS, SYNC_KEY)
OTHER_KEY = "fork:child"
# A child that has not ended after this many seconds hung, and is killed.
CHILD_LIMIT = 10.0
# The bound on every other wait, which only a broken lock reaches.
LIMIT = 30.0

# (as conftest's SQL_DATABASES: this module also runs as a program, without conftest)
ENGINES = pytest.mark.parametrize(
    "db",
    [
        "sqlite",
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
    ],
    indirect=True,
)


# -- the tests ------------------------------------------------------------------------


@ENGINES
@pytest.mark.multiprocess
@pytest.mark.parametrize("ending", ["exit", "aclose", "new-manager"])
def test_a_forked_child_leaves_its_parents_holds_alone(
    db_url: str, table: str, tmp_path: Path, make_manager: MakeManager, ending: str
) -> None:
    """The child ends with ``sys.exit(0)`` (``asyncio.run``'s teardown cancels the
    inherited tasks, whose ``async with`` exits release), after ``await aclose()`` of
    the inherited manager, or after taking another key through a new manager."""
    _check(_run_program(db_url, table, ending, tmp_path))
    assert make_manager().holders() == []


@ENGINES
@pytest.mark.multiprocess
def test_an_inherited_async_manager_refuses_every_call(
    db_url: str, table: str, tmp_path: Path, make_manager: MakeManager
) -> None:
    """In the child, every call of the inherited manager and of its handles raises
    ``LockError`` at once and sends no statement; ``aclose()`` does nothing."""
    _check(_run_program(db_url, table, "every-call", tmp_path))
    assert make_manager().holders() == []


def _run_program(url: str, table: str, ending: str, cwd: Path) -> tuple[dict[str, Any], str]:
    """What the parent saw, and what the program wrote to stderr."""
    ran = procs.run_python(str(Path(__file__)), url, table, ending, cwd=cwd)
    assert ran.returncode == 0, f"the program failed:\n{ran.stderr}"
    return json.loads(ran.stdout.splitlines()[-1]), ran.stderr


def _check(outcome: tuple[dict[str, Any], str]) -> None:
    report, stderr = outcome
    said = f"\n--- the program's stderr:\n{stderr}"
    child = report["child_exit"]
    assert child == 0, (
        f"the child hung for {CHILD_LIMIT:g} s" if child is None else f"the child exited {child}"
    ) + said
    assert all(report["rows_before"].values()), said
    assert report["rows_after"] == report["rows_before"], said
    assert report["taken_by_another"] == dict.fromkeys(HELD, False), said
    assert report["owned"] == dict.fromkeys(HELD, True), said
    assert report["errors"] == [], said


# -- the program: the parent ----------------------------------------------------------


def parent(url: str, table: str, ending: str) -> dict[str, Any]:
    """Hold the keys, fork from a task, let the child end by ``ending``, and report
    what became of the holds."""
    sync = tierlock.LockManager(url, table=table, reaper_interval=None)
    sync_holder = SyncHolder(sync.lock(SYNC_KEY))
    with asyncio.Runner(loop_factory=_polling_loop) as runner:
        report = runner.run(_in_loop(url, table, ending, sync_holder))
    sync.close()
    return report


def _polling_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.PollSelector())


class SyncHolder:
    """A thread that holds ``lock`` until ``finish()``."""

    def __init__(self, lock: tierlock.Lock) -> None:
        self.lock = lock
        self.owned = False  # at the end of its section
        self.errors: list[str] = []
        self._held = threading.Event()
        self._leave = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="sync-holder")
        self._thread.start()
        assert self._held.wait(LIMIT), "the thread did not get its lock"

    def _hold(self) -> None:
        try:
            with self.lock:
                self._held.set()
                self._leave.wait(LIMIT)
                self.owned = self.lock.owned()
        except tierlock.LockError as exc:
            self.errors.append(f"{self.lock.key}: {exc!r}")

    def finish(self) -> None:
        """Leave the section and release."""
        self._leave.set()
        self._thread.join(LIMIT)


async def _in_loop(url: str, table: str, ending: str, sync_holder: SyncHolder) -> dict[str, Any]:
    report: dict[str, Any] = {"owned": {}, "errors": []}
    locks = AsyncLockManager(url, table=table, reaper_interval=None)
    leave = asyncio.Event()
    holders = []
    for key in ASYNC_KEYS:
        held = asyncio.Event()
        holders.append(asyncio.create_task(_hold(locks.lock(key), held, leave, report)))
        await asyncio.wait_for(held.wait(), LIMIT)
    report["rows_before"] = await _rows(locks)
    pid = await asyncio.create_task(_fork(locks, url, table, ending))
    report["child_exit"] = _wait_for_child(pid)
    report["rows_after"] = await _rows(locks)
    report["taken_by_another"] = await _taken_by_another(url, table)
    leave.set()
    await asyncio.wait_for(asyncio.gather(*holders), LIMIT)
    sync_holder.finish()
    report["owned"][SYNC_KEY] = sync_holder.owned
    report["errors"] += sync_holder.errors
    await locks.aclose()
    return report


async def _hold(
    lock: AsyncLock, held: asyncio.Event, leave: asyncio.Event, report: dict[str, Any]
) -> None:
    """Hold ``lock`` in a task until ``leave``; note whether it is still owned then."""
    try:
        async with lock:
            held.set()
            await leave.wait()
            report["owned"][lock.key] = lock.owned()
    except tierlock.LockError as exc:
        report["errors"].append(f"{lock.key}: {exc!r}")


async def _rows(locks: AsyncLockManager) -> dict[str, tuple[str, int] | None]:
    """Each held key's row, by owner and token."""
    rows: dict[str, tuple[str, int] | None] = {}
    for key in HELD:
        info = await locks.info(key)
        rows[key] = None if info is None else (info.owner, info.token)
    return rows


async def _taken_by_another(url: str, table: str) -> dict[str, bool]:
    """Whether another manager's try without waiting got each held key."""
    taken = {}
    async with AsyncLockManager(url, table=table, reaper_interval=None) as other:
        for key in HELD:
            lock = other.lock(key)
            taken[key] = await lock.acquire(blocking=False)
            if taken[key]:
                await lock.release()
    return taken


def _wait_for_child(pid: int) -> int | None:
    """The child's exit code, or ``None`` if it was still running after ``CHILD_LIMIT``
    seconds (it is killed then). Blocks the loop's thread on purpose (see the module's
    docstring)."""
    child = os.pidfd_open(pid)
    try:
        ended, _, _ = select.select([child], [], [], CHILD_LIMIT)
    finally:
        os.close(child)
    if not ended:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# -- the program: the child -----------------------------------------------------------


@dataclasses.dataclass
class Inherited:
    """What the child inherits: the manager, and handles made in the parent."""

    locks: AsyncLockManager
    lock: AsyncLock
    reader: AsyncReadLock
    permits: AsyncSemaphore
    guarded: Callable[[int], Awaitable[None]]
    url: str
    table: str


async def _fork(locks: AsyncLockManager, url: str, table: str, ending: str) -> int:
    """Fork from inside a task; the child ends by ``ending`` and ``sys.exit(0)``, or
    exits 1 if that fails."""

    @locks.synchronized("fork:guarded:{number}")
    async def guarded(number: int) -> None:
        pass

    inherited = Inherited(
        locks,
        locks.lock(ASYNC_KEYS[0]),
        locks.read_lock(OTHER_KEY),
        locks.semaphore(OTHER_KEY, 2),
        guarded,
        url,
        table,
    )
    procs.wait_for_ended_threads()
    pid = os.fork()
    if pid:
        return pid
    try:
        await ENDINGS[ending](inherited)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    sys.exit(0)


async def _just_exit(inherited: Inherited) -> None:
    """Nothing: ``sys.exit(0)`` follows, and ``asyncio.run``'s teardown cancels the
    inherited tasks."""


async def _close_the_inherited_manager(inherited: Inherited) -> None:
    await inherited.locks.aclose()


async def _use_a_new_manager(inherited: Inherited) -> None:
    """Take another key through a manager of the child's own, in a loop of its own
    (asyncio sees no running loop in a forked child: the inherited one is the
    parent's)."""
    asyncio.run(_take_another_key(inherited.url, inherited.table))


async def _take_another_key(url: str, table: str) -> None:
    async with AsyncLockManager(url, table=table, reaper_interval=None) as mine:
        for key in HELD:
            assert not await mine.lock(key).acquire(blocking=False), f"the child got {key}"
        async with mine.lock(OTHER_KEY, timeout=LIMIT):
            info = await mine.info(OTHER_KEY)
            assert info is not None and info.pid == os.getpid()


async def _refuse_every_call(inherited: Inherited) -> None:
    """Every call raises the one ``LockError`` at once, and none sends a statement;
    ``aclose()`` returns and changes nothing of that."""
    calls = _calls(inherited)
    failures = [await _refused(name, call) for name, call in calls.items()]
    await inherited.locks.aclose()
    failures.append(await _refused("info() after aclose()", calls["info()"]))
    if statements := inherited.locks.stats().statements:
        failures.append(f"the child sent {statements} statement(s)")
    assert not any(failures), "\n".join(filter(None, failures))


def _calls(inherited: Inherited) -> dict[str, Callable[[], object]]:
    locks = inherited.locks
    calls: dict[str, Callable[[], object]] = {
        "lock()": functools.partial(locks.lock, OTHER_KEY),
        "write_lock()": functools.partial(locks.write_lock, OTHER_KEY),
        "read_lock()": functools.partial(locks.read_lock, OTHER_KEY),
        "semaphore()": functools.partial(locks.semaphore, OTHER_KEY, 2),
        "info()": functools.partial(locks.info, ASYNC_KEYS[0]),
        "holders()": locks.holders,
        "force_release()": functools.partial(locks.force_release, ASYNC_KEYS[0]),
        "reap()": locks.reap,
        "a synchronized function": functools.partial(inherited.guarded, 1),
        "async with the manager": locks.__aenter__,
    }
    handles: list[tuple[str, AsyncLock | AsyncReadLock | AsyncSemaphore]] = [
        ("the held lock", inherited.lock),
        ("a read lock", inherited.reader),
        ("a semaphore", inherited.permits),
    ]
    for name, handle in handles:
        calls |= {
            f"{name}: acquire()": handle.acquire,
            f"{name}: acquire(blocking=False)": functools.partial(handle.acquire, False),
            f"{name}: release()": handle.release,
            f"{name}: extend()": handle.extend,
            f"{name}: locked()": handle.locked,
            f"{name}: owned()": handle.owned,
            f"{name}: token": functools.partial(getattr, handle, "token"),
            f"{name}: async with": handle.__aenter__,
        }
    return calls


async def _refused(name: str, call: Callable[[], object]) -> str | None:
    """What is wrong with how ``call`` was refused, if anything."""
    try:
        result = call()
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        if type(exc) is tierlock.LockError and "another process" in str(exc):
            return None
        return f"{name} raised {exc!r}"
    return f"{name} did not raise"


ENDINGS: dict[str, Callable[[Inherited], Awaitable[None]]] = {
    "exit": _just_exit,
    "aclose": _close_the_inherited_manager,
    "new-manager": _use_a_new_manager,
    "every-call": _refuse_every_call,
}


if __name__ == "__main__":
    print(json.dumps(parent(*sys.argv[1:])))
