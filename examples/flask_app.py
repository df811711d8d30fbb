"""A Flask endpoint that moves money between two users, guarded by both users' locks.

``POST /transfer {"from": 1, "to": 2, "amount": 5}`` reads both balances, pauses and
writes both back: two transfers that share a user would overwrite each other's writes,
so ``move()`` holds both users' locks: ``@locks.synchronized`` with a key template per
user takes them all through ``lock_all``, in one order, so that opposite transfers (1 to
2 and 2 to 1) cannot each hold one lock and wait forever for the other. The locks come
from ``tierlock.contrib.flask``: the app's settings name the lock database, and the
manager is opened at the first lock.

Run as a script, it serves the app on a free port with a threaded server, fires
concurrent transfers at it from a pool of client threads, and checks that every balance
ends where the transfers say (exit code 1 if not)::

    python examples/flask_app.py
    python examples/flask_app.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

The balances live in a SQLite file standing in for the application's database; the
locks in the database given by --url (by default another SQLite file), as they would
for several app processes on several hosts.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sqlite3
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

from flask import Flask, request
from werkzeug.serving import make_server

from tierlock.contrib.flask import TierLock

USERS = 5
OPENING_BALANCE = 1000
TRANSFERS = 200
CLIENTS = 8

locks = TierLock()


def connect(bank: Path) -> sqlite3.Connection:
    # Autocommit: each statement commits alone, so only the lock keeps a transfer whole.
    return sqlite3.connect(bank, timeout=30, isolation_level=None)


def open_accounts(bank: Path) -> None:
    with closing(connect(bank)) as db:
        db.execute("PRAGMA journal_mode = WAL")  # readers do not wait for the writer
        db.execute("CREATE TABLE balances (user_id INTEGER PRIMARY KEY, balance INTEGER)")
        db.executemany(
            "INSERT INTO balances VALUES (?, ?)", [(u, OPENING_BALANCE) for u in range(USERS)]
        )


@locks.synchronized("user:{source}", "user:{target}")
def move(bank: Path, source: int, target: int, amount: int) -> None:
    """Move ``amount`` from user ``source`` to ``target``, holding both users' locks."""
    with closing(connect(bank)) as db:
        read = "SELECT balance FROM balances WHERE user_id = ?"
        balances = {u: db.execute(read, (u,)).fetchone()[0] for u in (source, target)}
        time.sleep(0.001)  # a request for the same user would read stale balances now
        write = "UPDATE balances SET balance = ? WHERE user_id = ?"
        db.execute(write, (balances[source] - amount, source))
        db.execute(write, (balances[target] + amount, target))


def create_app(url: str, table: str, bank: Path) -> Flask:
    app = Flask(__name__)
    app.config.update(TIERLOCK_URL=url, TIERLOCK_TABLE=table)
    locks.init_app(app)  # connects to nothing until the first lock

    @app.post("/transfer")
    def transfer() -> dict[str, int]:
        body = request.get_json()
        source, target, amount = int(body["from"]), int(body["to"]), int(body["amount"])
        move(bank, source, target, amount)
        return {"from": source, "to": target, "amount": amount}

    @app.get("/balances")
    def balances() -> dict[str, int]:
        with closing(connect(bank)) as db:
            return {str(u): b for u, b in db.execute("SELECT user_id, balance FROM balances")}

    return app


def post_transfer(base: str, source: int, target: int, amount: int) -> None:
    body = json.dumps({"from": source, "to": target, "amount": amount}).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{base}/transfer", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def main() -> int:
    parser = argparse.ArgumentParser(description="A Flask transfer endpoint under load.")
    parser.add_argument("--url", help="lock database (default: SQLite in a temp dir)")
    parser.add_argument("--table", default="tierlock_locks", help="lock table")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request

    with tempfile.TemporaryDirectory() as scratch:
        bank = Path(scratch) / "bank.db"
        open_accounts(bank)
        url = args.url or f"sqlite:///{Path(scratch) / 'locks.db'}"
        app = create_app(url, args.table, bank)
        with app.extensions["tierlock"]:  # closed before the scratch directory goes
            server = make_server("127.0.0.1", 0, app, threaded=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            base = f"http://127.0.0.1:{server.port}"

            choose = random.Random(42)
            transfers = [
                (*choose.sample(range(USERS), 2), choose.randint(1, 20)) for _ in range(TRANSFERS)
            ]
            started = time.perf_counter()
            with ThreadPoolExecutor(CLIENTS) as pool:
                list(pool.map(lambda t: post_transfer(base, *t), transfers))
            elapsed = time.perf_counter() - started
            with urllib.request.urlopen(f"{base}/balances", timeout=60) as response:
                final = {int(u): b for u, b in json.load(response).items()}
            server.shutdown()

    expected = dict.fromkeys(range(USERS), OPENING_BALANCE)
    for source, target, amount in transfers:
        expected[source] -= amount
        expected[target] += amount
    print(f"{TRANSFERS} transfers from {CLIENTS} client threads in {elapsed:.1f} s")
    for user in range(USERS):
        print(f"user {user}: balance {final[user]:4d}, expected {expected[user]:4d}")
    total = sum(final.values())
    print(f"total {total} of {USERS * OPENING_BALANCE}")
    if final != expected:
        print("balances do NOT add up: some transfers overwrote others")
        return 1
    print("every balance adds up")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
