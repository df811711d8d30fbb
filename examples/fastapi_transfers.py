"""A FastAPI service that moves money between users, each transfer holding both users' locks.

``POST /transfers {"source": 1, "target": 2, "amount": 5}`` reads both balances, awaits
(where a real service would wait for its database) and writes both back: a request for
the same user that the event loop runs meanwhile would see its write overwritten. So the
handler holds both users' ``tierlock.aio`` locks through ``locks.lock_all``, which takes
them in one order, so that opposite transfers (1 to 2 and 2 to 1) cannot each hold one
lock and wait forever for the other. The locks belong to the request's task; waiting
ones take no thread. A balance too small for the amount gets 409; ``GET /balances``
returns every balance.

``create_app(url)`` makes the app; its lifespan opens the ``AsyncLockManager`` on start-up,
keeps it at ``app.state.locks`` and closes it on shutdown. The balances live in the
process, as a stand-in for the service's database, guarded by nothing but the locks.

Run as a script, it sends concurrent transfers through httpx's in-process transport,
then the same transfers to an app built with ``locking=False``, and shows the total kept
with the locks and lost without them (exit code 1 if the locks did not keep it)::

    pip install fastapi httpx
    python examples/fastapi_transfers.py
    python examples/fastapi_transfers.py --url mysql+pymysql://root@127.0.0.1:3306/test

Serve ``create_app(url)`` with any ASGI server (uvicorn, hypercorn) to use it for real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, PositiveInt

from tierlock.aio import AsyncLockManager

USERS = 5
OPENING_BALANCE = 100
TRANSFERS = 200  # all sent at once
WAIT_LIMIT = 30.0  # seconds; only a broken lock makes a transfer wait this long


class Transfer(BaseModel):
    source: int
    target: int
    amount: PositiveInt


def create_app(url: str, table: str = "tierlock_locks", *, locking: bool = True) -> FastAPI:
    """The transfer service, its locks in ``table`` at ``url``; ``locking=False`` leaves
    the locks out, to show what they prevent."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncLockManager(url, table=table) as locks:
            app.state.locks = locks
            yield

    app = FastAPI(title="transfers", lifespan=lifespan)
    balances = dict.fromkeys(range(USERS), OPENING_BALANCE)

    async def move(transfer: Transfer) -> None:
        source, target = balances[transfer.source], balances[transfer.target]
        if source < transfer.amount:
            raise HTTPException(409, f"user {transfer.source} has only {source}")
        await asyncio.sleep(0)  # a database round trip: other requests run meanwhile
        balances[transfer.source] = source - transfer.amount
        balances[transfer.target] = target + transfer.amount

    @app.post("/transfers")
    async def transfers(transfer: Transfer, request: Request) -> Transfer:
        if transfer.source == transfer.target:
            raise HTTPException(422, "source and target are the same user")
        if not {transfer.source, transfer.target} <= balances.keys():
            raise HTTPException(404, "no such user")
        if not locking:
            await move(transfer)
            return transfer
        locks: AsyncLockManager = request.app.state.locks
        users = [("user", transfer.source), ("user", transfer.target)]
        async with locks.lock_all(users, timeout=WAIT_LIMIT):
            await move(transfer)
        return transfer

    @app.get("/balances")
    async def get_balances() -> dict[int, int]:
        return balances

    return app


async def send(app: FastAPI, transfers: list[dict[str, int]]) -> tuple[list[int], dict[int, int]]:
    """Send ``transfers`` all at once; their status codes, and the balances after them."""
    # An ASGI server enters the app's lifespan; httpx's in-process transport does not.
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://transfers") as client,
    ):
        responses = await asyncio.gather(*(client.post("/transfers", json=t) for t in transfers))
        balances = (await client.get("/balances")).json()
    return [r.status_code for r in responses], {int(u): b for u, b in balances.items()}


async def main() -> int:
    parser = argparse.ArgumentParser(description="A FastAPI transfer endpoint under load.")
    parser.add_argument("--url", help="lock database (default: SQLite in a temp dir)")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    args = parser.parse_args()

    choose = random.Random(42)
    transfers = [
        {"source": source, "target": target, "amount": choose.randint(1, 50)}
        for source, target in (choose.sample(range(USERS), 2) for _ in range(TRANSFERS))
    ]
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'locks.db'}"
        started = time.perf_counter()
        statuses, final = await send(create_app(url, args.table), transfers)
        elapsed = time.perf_counter() - started
        _, unguarded = await send(create_app(url, args.table, locking=False), transfers)

    expected = dict.fromkeys(range(USERS), OPENING_BALANCE)
    for transfer, status in zip(transfers, statuses, strict=True):
        if status == 200:
            expected[transfer["source"]] -= transfer["amount"]
            expected[transfer["target"]] += transfer["amount"]
    counts = Counter(statuses)
    made, refused = counts[200], counts[409]
    print(f"{TRANSFERS} concurrent transfers in {elapsed:.1f} s: {made} made, {refused} refused")
    for user in range(USERS):
        print(f"user {user}: balance {final[user]:4d}, expected {expected[user]:4d}")
    print(f"total {sum(final.values())} of {USERS * OPENING_BALANCE}")
    print(f"without the locks: total {sum(unguarded.values())} of {USERS * OPENING_BALANCE}")
    if final != expected or set(counts) - {200, 409}:
        print("balances do NOT add up: some transfers overwrote others")
        return 1
    print("every balance adds up")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
