"""Server restarts: fencing tokens never go back (semantic 5), and a load rides over
an outage with prompt errors, no overlap and no stuck lock.

Tokens come from the table's identity counter, so they must survive everything that
drops state: other processes, every connection closing, the server restarting, and
the table being empty at that moment. The last case is the classic InnoDB pitfall:
before MariaDB 10.2.4 an empty table's AUTO_INCREMENT restarted at 1 after a restart,
and a plain SQLite rowid (without AUTOINCREMENT) reuses numbers the same way.

MariaDB and PostgreSQL are restarted for real, on private servers (``servers.py``),
since other test workers use the shared ones at the same time. For SQLite, whose
"server" lives in each connection, closing every connection is the restart.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

import procs
import pytest
from polling import wait_until
from servers import Server, ServerUnavailable, private_server

import tierlock

# (key, token) of every hold, in the order the holds were taken.
Log = list[tuple[str, int]]

# A hold left behind by a process that exits without releasing; short, so the test
# waits little for its lease to end before reaping it.
STALE_TTL = 0.3
# Bounds on waits that normally take milliseconds.
WAIT = 15.0

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(
    scope="module",
    params=[
        # One group per server: all its tests run on one worker, which starts it once.
        pytest.param(
            "mariadb", marks=[pytest.mark.mariadb, pytest.mark.xdist_group("restart-mariadb")]
        ),
        pytest.param(
            "postgresql",
            marks=[pytest.mark.postgresql, pytest.mark.xdist_group("restart-postgresql")],
        ),
    ],
)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A private server of this module's own, which its tests may restart."""
    name: str = request.param
    _skip_unless_chosen(request, name)
    try:
        instance = private_server(name)
    except ServerUnavailable as exc:
        reason = f"cannot start a private {name} server: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    yield instance
    instance.close()


def _skip_unless_chosen(request: pytest.FixtureRequest, name: str) -> None:
    chosen = request.config.getoption("db")
    if chosen and name not in chosen:
        pytest.skip(f"{name} not chosen with --db")


def _manager(url: str, table: str) -> tierlock.LockManager:
    return tierlock.LockManager(url, table=table, reaper_interval=None, poll_interval=0.02)


def _take_holds(manager: tierlock.LockManager, keys: Sequence[str], rounds: int, log: Log) -> None:
    """In each of three threads, hold and release each key in turn, ``rounds`` times,
    logging every token while it holds (so a key's tokens are logged in the order of
    its holds, local hand-offs between the threads included)."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(rounds):
                for key in keys:
                    with manager.lock(key, timeout=WAIT) as lock:
                        assert lock.token is not None
                        log.append((key, lock.token))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * WAIT)
    assert errors == []


def _child(
    url: str, table: str, keys: list[str], rounds: int, stale: str | None, pipe: Connection
) -> None:
    try:
        log: Log = []
        with _manager(url, table) as manager:
            _take_holds(manager, keys, rounds, log)
            if stale is not None:
                # Exit holding it, as a crashed process would.
                lock = manager.lock(stale, ttl=STALE_TTL)
                assert lock.acquire(timeout=WAIT)
                assert lock.token is not None
                log.append((stale, lock.token))
        pipe.send(log)
    except BaseException as exc:
        pipe.send(repr(exc))
        raise


def _holds_in_child(
    url: str, table: str, keys: list[str], rounds: int, stale: str | None = None
) -> Log:
    """``_take_holds`` in a forked process; ``stale``: a key it then leaves held."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(url, table, keys, rounds, stale, sender))
    procs.wait_for_ended_threads()
    child.start()
    try:
        assert receiver.poll(WAIT), "the child process sent nothing"
        result: Log | str = receiver.recv()
    finally:
        child.join(WAIT)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0, result
    assert isinstance(result, list)
    return result


def _assert_tokens_increase(before: Log, after: Log) -> None:
    tokens: dict[str, list[int]] = {}
    for key, token in before + after:
        tokens.setdefault(key, []).append(token)
    for key, series in tokens.items():
        assert all(a < b for a, b in itertools.pairwise(series)), f"{key} went back: {series}"
    # Holds after the restart outrank every hold before it, whatever the key.
    last_before = max(token for _, token in before)
    first_after = min(token for _, token in after)
    assert first_after > last_before, f"token {first_after} after the restart, {last_before} before"


def _tokens_across_restart(
    url: str, restart: Callable[[tierlock.LockManager], None], *, emptied: bool, old_lives: bool
) -> tuple[Log, Log]:
    """Holds of two keys from two managers and two processes, around ``restart``.

    ``emptied``: every row is gone at the restart (the last one reaped after its
    holder died); otherwise a third key is held across it. ``old_lives``: the manager
    from before the restart is used after it, its pooled connections now dead.
    """
    table = f"tl_{uuid.uuid4().hex[:16]}"
    first, second, spanning = (f"key:{uuid.uuid4().hex}" for _ in range(3))
    keys = [first, second]
    before: Log = []
    after: Log = []
    old = _manager(url, table)
    held_across = old.lock(spanning)
    new: tierlock.LockManager | None = None
    try:
        _take_holds(old, keys, 3, before)
        before += _holds_in_child(url, table, keys, 2, stale=first if emptied else None)
        if emptied:
            wait_until(
                lambda: not old.lock(first).locked(), "the dead holder's lease to end", limit=WAIT
            )
            assert old.reap() == 1
            assert old.holders() == []
        else:
            assert held_across.acquire(timeout=WAIT)
            assert held_across.token is not None
            before.append((spanning, held_across.token))

        restart(old)

        if old_lives:
            _take_holds(old, keys, 2, after)
        new = _manager(url, table)
        if not emptied:
            info = new.info(spanning)
            assert info is not None
            assert info.token == before[-1][1]
            if old_lives:
                held_across.release()  # still its own row: no LockLostError
            else:
                assert new.force_release(spanning)
            assert new.info(spanning) is None
        _take_holds(new, [*keys, spanning], 2, after)
        after += _holds_in_child(url, table, keys, 2)
        if old_lives:
            _take_holds(old, keys, 1, after)
    finally:
        old.close()
        if new is not None:
            new.close()
    return before, after


@pytest.mark.parametrize("emptied", [False, True], ids=["rows_kept", "table_emptied"])
def test_tokens_increase_across_server_restart(
    server: Server, emptied: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="tierlock.backends.sql"):
        before, after = _tokens_across_restart(
            server.url, lambda _: server.restart(), emptied=emptied, old_lives=True
        )
    _assert_tokens_increase(before, after)
    # The old manager really met its dead connections, and its retries rode over them.
    assert any(
        "acquire of" in record.getMessage() and "hit connection" in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize("emptied", [False, True], ids=["rows_kept", "table_emptied"])
def test_tokens_increase_across_sqlite_reopen(
    request: pytest.FixtureRequest, tmp_path: Path, emptied: bool
) -> None:
    _skip_unless_chosen(request, "sqlite")

    def close_every_connection(old: tierlock.LockManager) -> None:
        old.close()

    before, after = _tokens_across_restart(
        f"sqlite:///{tmp_path / 'locks.db'}",
        close_every_connection,
        emptied=emptied,
        old_lives=False,
    )
    _assert_tokens_increase(before, after)


# The restart-under-load test: processes, their threads, the keys they share.
OUTAGE_PROCESSES = 3
OUTAGE_THREADS = 2
OUTAGE_KEYS = 3
OUTAGE_TTL = 2.0
OUTAGE_DATABASE_TIMEOUT = 2.0
# Sections that show the load is running, before the stop and again after the start.
PROGRESS = 30


def test_load_rides_over_a_server_restart(server: Server) -> None:
    """Processes hammer a few keys while the server stops and starts again: calls
    during the outage raise BackendError within about ``database_timeout`` instead of
    hanging, work resumes once it is back, no two sections of a key overlap, tokens
    keep increasing, and afterwards every key can be taken within a lease."""
    table = f"tl_{uuid.uuid4().hex[:16]}"
    keys = [f"key:{uuid.uuid4().hex}" for _ in range(OUTAGE_KEYS)]
    _manager(server.url, table).close()  # the table, before the children race to make it
    ledger = procs.Ledger(OUTAGE_KEYS, OUTAGE_PROCESSES, OUTAGE_THREADS)
    children = procs.Children()
    try:
        for index in range(OUTAGE_PROCESSES):
            children.start(
                procs.churn,
                url=server.url,
                table=table,
                keys=keys,
                ledger=ledger,
                first_slot=index * OUTAGE_THREADS,
                ttl=OUTAGE_TTL,
                database_timeout=OUTAGE_DATABASE_TIMEOUT,
            )
        wait_until(
            lambda: min(ledger.sections) > 0 and sum(ledger.sections) >= PROGRESS,
            "every worker to get going",  # each has its manager before the server stops
            limit=WAIT,
        )
        server.stop()
        wait_until(
            lambda: sum(ledger.errors) >= OUTAGE_PROCESSES, "errors during the outage", limit=WAIT
        )
        server.start()
        resumed_from = sum(ledger.sections)
        wait_until(
            lambda: sum(ledger.sections) >= resumed_from + PROGRESS, "work to resume", limit=WAIT
        )
        ledger.stopping.value = 1
        children.join()
    finally:
        children.kill_all()
    print(
        f"{sum(ledger.sections)} sections, {sum(ledger.errors)} BackendErrors, the slowest "
        f"after {max(ledger.slowest_error):.2f} s; server stopped in "
        f"{server.last_stop_seconds:.2f} s, started in {server.last_start_seconds:.2f} s"
    )
    assert sum(ledger.overlaps) == 0
    assert sum(ledger.stale_tokens) == 0  # tokens kept increasing across the restart
    assert max(ledger.slowest_error) < 3 * OUTAGE_DATABASE_TIMEOUT
    with _manager(server.url, table) as manager:
        for key in keys:
            lock = manager.lock(key)
            assert lock.acquire(timeout=OUTAGE_TTL + procs.SLACK), f"{key!r} is stuck"
            lock.release()
