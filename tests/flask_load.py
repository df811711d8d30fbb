"""A load on the bank app (tests/flask_bank.py): requests planned ahead, client threads
that start together, and the HTTP calls to a served app."""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections.abc import Callable

import procs

ACCOUNTS = 6

Plan = list[tuple[str, dict[str, int]]]


def plan(count: int, seed: int) -> Plan:
    """``count`` requests: mostly transfers between two accounts, some deposits."""
    choose = random.Random(seed)
    requests: Plan = []
    for _ in range(count):
        source, target = choose.sample(range(ACCOUNTS), 2)
        if choose.random() < 0.8:
            requests.append(("/transfer", {"from": source, "to": target, "amount": 7}))
        else:
            requests.append(("/deposit", {"to": target, "amount": 3}))
    return requests


def deposited(requests: Plan) -> int:
    return sum(body["amount"] for path, body in requests if path == "/deposit")


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Run ``work(n)`` in ``count`` threads at once; re-raise the first failure."""
    failures: list[BaseException] = []
    start = threading.Barrier(count)

    def run(number: int) -> None:
        try:
            start.wait(procs.WAIT_LIMIT)
            work(number)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(procs.WAIT_LIMIT * 4)
        assert not thread.is_alive(), "a client thread hung"
    if failures:
        raise failures[0]


def post(port: int, path: str, body: dict[str, int]) -> int:
    """POST ``body`` as JSON; the serving worker's pid."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=procs.WAIT_LIMIT)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", path, json.dumps(body), headers)
        response = connection.getresponse()
        reply = response.read()
        assert response.status == 200, reply
        pid: int = json.loads(reply)["pid"]
        return pid
    finally:
        connection.close()


def get_balances(port: int) -> dict[str, int] | None:
    """The balances, or ``None`` while nothing answers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=procs.WAIT_LIMIT)
    try:
        connection.request("GET", "/balances")
        balances: dict[str, int] = json.loads(connection.getresponse().read())
        return balances
    except ConnectionRefusedError:
        return None
    finally:
        connection.close()
