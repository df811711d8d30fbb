"""Money moving both ways between two accounts, in child processes, each transfer
holding both accounts' keys through ``lock_all``: the ``lock_all`` tests' load.

Every thread (or task) names the accounts in its own direction's order, source
first; only the set's one global order keeps opposite transfers from each holding
one key and waiting for the other. The balances live in shared memory, read, left
for a moment and written back, so overlapping transfers lose money.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
import traceback
from multiprocessing.synchronize import Barrier

from procs import CTX, HOLD_LIMIT, PAUSE, WAIT_LIMIT, open_manager

from tierlock.aio import AsyncLockManager

OPENING_BALANCE = 10_000
# What one transfer moves in each direction: unequal, so that a lost update shows.
AMOUNTS = {(0, 1): 3, (1, 0): 2}


class Bank:
    """Two balances in shared memory, with no protection of their own."""

    def __init__(self) -> None:
        self.balances = CTX.RawArray(ctypes.c_longlong, [OPENING_BALANCE, OPENING_BALANCE])

    def move(self, source: int, target: int) -> None:
        amount = AMOUNTS[source, target]
        balances = self.read()
        time.sleep(PAUSE)  # widens the race window; it synchronises nothing
        self._write(balances, source, target, amount)

    async def amove(self, source: int, target: int) -> None:
        amount = AMOUNTS[source, target]
        balances = self.read()
        await asyncio.sleep(PAUSE)  # the loop runs other tasks meanwhile
        self._write(balances, source, target, amount)

    def read(self) -> list[int]:
        return list(self.balances)

    def _write(self, balances: list[int], source: int, target: int, amount: int) -> None:
        self.balances[source] = balances[source] - amount
        self.balances[target] = balances[target] + amount

    def expected(self, transfers: int, workers: int) -> list[int]:
        """The balances after ``transfers`` transfers by each of ``workers`` workers
        (of all processes), half of them each way (see ``direction``)."""
        one_way = transfers * (workers // 2)
        net = one_way * (AMOUNTS[0, 1] - AMOUNTS[1, 0])
        return [OPENING_BALANCE - net, OPENING_BALANCE + net]


def direction(process: int, worker: int) -> tuple[int, int]:
    """Worker ``worker`` of process ``process``: (source, target); both ways in every
    process, and each way in both processes."""
    return (0, 1) if (process + worker) % 2 == 0 else (1, 0)


def keys(prefix: str, source: int, target: int) -> list[tuple[str, int]]:
    """The keys of a transfer, as its worker names them: source first."""
    return [(prefix, source), (prefix, target)]


def transfer_threads(
    *,
    url: str,
    table: str,
    prefix: str,
    bank: Bank,
    process: int,
    threads: int,
    transfers: int,
    start: Barrier,
) -> None:
    """``threads`` threads of one manager, each doing ``transfers`` transfers."""
    try:
        manager = open_manager(url, table)
    except BaseException:
        start.abort()
        raise
    failures: list[str] = []

    def work(worker: int) -> None:
        source, target = direction(process, worker)
        try:
            start.wait(WAIT_LIMIT)
            for _ in range(transfers):
                with manager.lock_all(keys(prefix, source, target), timeout=WAIT_LIMIT):
                    bank.move(source, target)
        except BaseException:
            start.abort()
            failures.append(traceback.format_exc())

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(HOLD_LIMIT)
    finally:
        manager.close()
    if any(worker.is_alive() for worker in workers):
        failures.append("a transfer thread did not finish")
    if failures:
        raise AssertionError("\n".join(failures))


def transfer_tasks(
    *,
    url: str,
    table: str,
    prefix: str,
    bank: Bank,
    process: int,
    tasks: int,
    transfers: int,
    start: Barrier,
) -> None:
    """``transfer_threads`` with ``tasks`` asyncio tasks of one ``AsyncLockManager``."""

    async def main() -> None:
        async with AsyncLockManager(
            url, table=table, reaper_interval=None, poll_interval=0.01
        ) as locks:

            async def work(worker: int) -> None:
                source, target = direction(process, worker)
                for _ in range(transfers):
                    async with locks.lock_all(keys(prefix, source, target), timeout=WAIT_LIMIT):
                        await bank.amove(source, target)

            await asyncio.to_thread(start.wait, WAIT_LIMIT)
            await asyncio.wait_for(asyncio.gather(*(work(n) for n in range(tasks))), HOLD_LIMIT)

    try:
        asyncio.run(main())
    except BaseException:
        start.abort()
        raise
