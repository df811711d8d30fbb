"""examples/fastapi_transfers.py under concurrent requests: tierlock.aio's per-user locks
keep every transfer whole on every database, and the same load without them breaks the
total.

Requests go through httpx's in-process ASGI transport, all sent at once with
``asyncio.gather``, so that the handlers interleave at the await between reading and
writing the balances, as concurrent requests of a real server do.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from types import ModuleType

import httpx
import procs
import pytest
from fastapi import FastAPI

from tierlock.aio import AsyncLockManager


def load_example() -> ModuleType:
    """examples/fastapi_transfers.py as a module (examples/ is no package)."""
    path = procs.ROOT / "examples" / "fastapi_transfers.py"
    spec = importlib.util.spec_from_file_location("fastapi_transfers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = load_example()
create_app: Callable[..., FastAPI] = example.create_app

USERS: int = example.USERS
OPENING_BALANCE: int = example.OPENING_BALANCE
TOTAL = USERS * OPENING_BALANCE
TRANSFERS = 200
# The largest amount, over half an opening balance: some transfers find too little (409).
MOST = 60
WAIT_LIMIT = 20.0  # seconds; only a broken lock makes a test wait this long

Transfer = dict[str, int]


def random_transfers(seed: int) -> list[Transfer]:
    choose = random.Random(seed)
    return [
        {"source": source, "target": target, "amount": choose.randint(1, MOST)}
        for source, target in (choose.sample(range(USERS), 2) for _ in range(TRANSFERS))
    ]


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``, inside its lifespan (which ASGITransport does not run)."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://transfers") as client,
    ):
        yield client


async def balances(client: httpx.AsyncClient) -> dict[int, int]:
    response = await client.get("/balances")
    assert response.status_code == 200, response.text
    return {int(user): balance for user, balance in response.json().items()}


async def send_all(client: httpx.AsyncClient, transfers: list[Transfer]) -> list[int]:
    """Send every transfer at once; their status codes, in order."""
    responses = await asyncio.gather(*(client.post("/transfers", json=t) for t in transfers))
    return [response.status_code for response in responses]


def balances_after(made: Iterable[Transfer]) -> dict[int, int]:
    """The balances once each transfer ``made`` has moved its amount, once."""
    expected = dict.fromkeys(range(USERS), OPENING_BALANCE)
    for transfer in made:
        expected[transfer["source"]] -= transfer["amount"]
        expected[transfer["target"]] += transfer["amount"]
    return expected


async def asked_in_vain(locks: AsyncLockManager) -> None:
    """Wait until ``locks`` has found a key held elsewhere in the database."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not locks.stats().insert_conflicts:
        assert time.monotonic() < deadline, "no request asked the database for a held key"
        await asyncio.sleep(0.01)


def test_concurrent_transfers_keep_every_balance(db_url: str, table: str) -> None:
    transfers = random_transfers(seed=1)
    app = create_app(db_url, table)

    async def main() -> tuple[list[int], dict[int, int]]:
        async with serving(app) as client:
            locks: AsyncLockManager = app.state.locks
            statuses = await send_all(client, transfers)
            final = await balances(client)
            assert await locks.holders() == []
            stats = locks.stats()
        # Two locks per transfer, each taken and released once.
        assert stats.acquisitions == stats.releases == 2 * TRANSFERS
        assert stats.local_handoffs > 0, "requests queued for the same users"
        return statuses, final

    statuses, final = asyncio.run(main())
    assert set(statuses) == {200, 409}, "some transfers were made, some refused"
    assert sum(final.values()) == TOTAL
    assert min(final.values()) >= 0
    made = [t for t, status in zip(transfers, statuses, strict=True) if status == 200]
    assert final == balances_after(made)


# The app without locks touches no database: one database shows what the locks prevent.
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_without_the_locks_the_same_load_breaks_the_total(db_url: str, table: str) -> None:
    transfers = random_transfers(seed=1)
    app = create_app(db_url, table, locking=False)

    async def main() -> tuple[list[int], dict[int, int]]:
        async with serving(app) as client:
            return await send_all(client, transfers), await balances(client)

    statuses, final = asyncio.run(main())
    assert set(statuses) <= {200, 409}
    assert sum(final.values()) != TOTAL, "overlapping transfers overwrote each other"


def test_a_transfer_waits_while_another_instance_holds_a_user(db_url: str, table: str) -> None:
    """A user's lock taken by another instance of the service (another manager on the
    same table, as on another host) holds the user's transfers back, and only those."""
    app = create_app(db_url, table)
    held_back: Transfer = {"source": 0, "target": 1, "amount": 10}
    free: Transfer = {"source": 2, "target": 3, "amount": 10}

    async def main() -> None:
        async with (
            AsyncLockManager(db_url, table=table, reaper_interval=None) as elsewhere,
            serving(app) as client,
        ):
            locks: AsyncLockManager = app.state.locks
            async with elsewhere.lock(("user", 0)):
                waiting = asyncio.ensure_future(client.post("/transfers", json=held_back))
                assert (await client.post("/transfers", json=free)).status_code == 200
                await asked_in_vain(locks)
                assert not waiting.done()
                assert await balances(client) == balances_after([free])
            assert (await asyncio.wait_for(waiting, WAIT_LIMIT)).status_code == 200
            assert await balances(client) == balances_after([free, held_back])
            assert await locks.holders() == []

    asyncio.run(main())


def test_a_client_that_gives_up_leaves_no_lock_behind(db_url: str, table: str) -> None:
    """A request cancelled (its client gone) while it holds one user's lock and waits for
    the other's lets go of the first: the next transfer of that user goes through."""
    app = create_app(db_url, table)
    given_up: Transfer = {"source": 0, "target": 1, "amount": 10}
    next_one: Transfer = {"source": 0, "target": 2, "amount": 5}

    async def main() -> None:
        async with (
            AsyncLockManager(db_url, table=table, reaper_interval=None) as elsewhere,
            serving(app) as client,
        ):
            locks: AsyncLockManager = app.state.locks
            async with elsewhere.lock(("user", 1)):
                # It takes user 0, then waits for user 1.
                gone = asyncio.ensure_future(client.post("/transfers", json=given_up))
                await asked_in_vain(locks)
                gone.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await gone
                sent = client.post("/transfers", json=next_one)
                assert (await asyncio.wait_for(sent, WAIT_LIMIT)).status_code == 200
                assert [info.key for info in await locks.holders()] == ["user:1"]
            assert await balances(client) == balances_after([next_one])
            assert await locks.holders() == []

    asyncio.run(main())


def test_refused_transfers_move_nothing(db_url: str, table: str) -> None:
    app = create_app(db_url, table)

    async def main() -> None:
        async with serving(app) as client:
            cases = {
                409: {"source": 0, "target": 1, "amount": OPENING_BALANCE + 1},
                422: {"source": 2, "target": 2, "amount": 5},
                404: {"source": 0, "target": USERS, "amount": 5},
            }
            for status, transfer in cases.items():
                response = await client.post("/transfers", json=transfer)
                assert response.status_code == status, response.text
            negative = {"source": 0, "target": 1, "amount": -5}
            assert (await client.post("/transfers", json=negative)).status_code == 422
            assert await balances(client) == dict.fromkeys(range(USERS), OPENING_BALANCE)
            assert await app.state.locks.holders() == []

    asyncio.run(main())
