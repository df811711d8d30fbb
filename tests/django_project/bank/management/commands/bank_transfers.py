"""``manage.py bank_transfers --threads N --count M --seed S``: a second process's share
of the load. It prints ``ready``, waits for a line on stdin, then makes N threads do M
transfers each, each in its own ``transaction.atomic()``."""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connections, transaction

from bank.services import transfer


def run_transfers(accounts: list[int], count: int, seed: int) -> None:
    """``count`` random transfers between ``accounts``, each in a transaction."""
    chance = random.Random(seed)
    try:
        for _ in range(count):
            src, dst = chance.sample(accounts, 2)
            with transaction.atomic():
                transfer(src, dst, chance.randint(1, 50))
    finally:
        connections.close_all()


class Command(BaseCommand):  # type: ignore[misc]
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--threads", type=int, required=True)
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--seed", type=int, required=True)
        parser.add_argument("accounts", type=int, nargs="+")

    def handle(self, *args: Any, **options: Any) -> None:
        print("ready", flush=True)
        sys.stdin.readline()
        errors: list[BaseException] = []

        def work(seed: int) -> None:
            try:
                run_transfers(options["accounts"], options["count"], seed)
            except BaseException as exc:
                errors.append(exc)
                raise

        threads = [
            threading.Thread(target=work, args=(options["seed"] + number,))
            for number in range(options["threads"])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise SystemExit(f"{len(errors)} thread(s) failed: {errors[0]!r}")
        print("done", flush=True)
