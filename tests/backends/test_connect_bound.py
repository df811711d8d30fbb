"""Connecting gives up in time on every engine with a server: against an address where
nothing answers (silent, a black hole, or refused: see ``proxy.DeadAddress``), a
manager's first connection fails within ``connect_timeout(database_timeout)`` (the
least of 5 s and half of it; on PostgreSQL rounded up to whole seconds, at least 2),
plus ``OVERRUN``, with a ``BackendError`` of one line that names the address and what
happened. No server is needed: the addresses are made here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

# The drivers and engines, loaded before anything is timed: what the tests measure is
# the connect, not a first import.
import kazoo.client  # noqa: F401
import psycopg  # noqa: F401
import pymysql  # noqa: F401
import pytest
import redis.cluster  # noqa: F401
import sqlalchemy.dialects.mysql.pymysql
import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401
from proxy import DEAD_KINDS, DeadAddress

import tierlock
import tierlock.backends.redis
import tierlock.backends.sql
import tierlock.backends.zookeeper
from tierlock.backends.basics import connect_timeout
from tierlock.base import DEFAULT_DATABASE_TIMEOUT

# Each engine's URL at a port; every one carries a password, which no message may show.
URLS = {
    "mariadb": "mysql+pymysql://root:s3cret@127.0.0.1:{port}/test",
    "postgresql": "postgresql+psycopg://postgres:s3cret@127.0.0.1:{port}/test",
    "redis": "redis://:s3cret@127.0.0.1:{port}/0",
    "redis-cluster": "redis+cluster://:s3cret@127.0.0.1:{port}/0",
    "zookeeper": "zookeeper://alice:s3cret@127.0.0.1:{port}/tierlock",
}
# The mark of each engine's tests (a cluster's URL is the Redis engine's).
MARKS = {
    "mariadb": pytest.mark.mariadb,
    "postgresql": pytest.mark.postgresql,
    "redis": pytest.mark.redis,
    "redis-cluster": pytest.mark.redis,
    "zookeeper": pytest.mark.zookeeper,
}
# What README promises beyond the connect timeout: the error comes within this much
# after it (it takes some milliseconds: a driver's clean-up, kazoo's thread ending).
OVERRUN = 1.0
# How much earlier than its timeout a wait may end: the clocks' granularity.
EARLY = 0.05
# The default database_timeout, and a short one: the bound follows it.
TIMEOUTS = [DEFAULT_DATABASE_TIMEOUT, 3.0]


ENGINES = [pytest.param(name, marks=MARKS[name]) for name in URLS]


@pytest.fixture(params=DEAD_KINDS)
def dead(request: pytest.FixtureRequest) -> Iterator[DeadAddress]:
    address = DeadAddress(request.param)
    yield address
    address.close()


def connect_bound(engine: str, timeout: float) -> float:
    """How long a connect there may take: libpq counts whole seconds, at least 2."""
    seconds = connect_timeout(timeout)
    return max(2, math.ceil(seconds)) if engine == "postgresql" else seconds


def expected_time(engine: str, dead: DeadAddress, timeout: float) -> tuple[float, float]:
    """From when to when the first connection may fail: not before the connect timeout
    (libpq may give up on a black hole at its tcp_user_timeout, half of ``timeout``,
    before its whole seconds), unless refused, which fails at once; except on
    ZooKeeper, whose client keeps connecting until the connect timeout (as it would if
    the server were starting)."""
    if dead.kind == "refused" and engine != "zookeeper":
        return 0.0, OVERRUN
    return connect_timeout(timeout) - EARLY, connect_bound(engine, timeout) + OVERRUN


def check_error(error: tierlock.BackendError, dead: DeadAddress) -> None:
    """One line, saying that the database is out of reach, where, and why."""
    message = str(error)
    assert "\n" not in message
    assert message.startswith("cannot reach the database: "), message
    assert f"127.0.0.1:{dead.port}" in message
    assert "s3cret" not in message
    if dead.kind == "refused":
        assert "refused" in message.lower(), message
    else:
        assert any(word in message.lower() for word in ("timed out", "timeout", "within")), message


def check_tries(engine: str, dead: DeadAddress) -> None:
    """A silent server was tried once (ZooKeeper's client connects again after a
    handshake it abandoned: see ``wire``)."""
    if dead.kind == "silent":
        taken = dead.taken()
        assert taken >= 1 if engine == "zookeeper" else taken == 1, f"{taken} connections"


@pytest.mark.slow
@pytest.mark.parametrize("timeout", TIMEOUTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_first_connection_gives_up_in_time(
    engine: str, dead: DeadAddress, timeout: float
) -> None:
    """Making the manager is its first connection (creating the table, or on Redis and
    ZooKeeper connecting), and a single try: a wrong address is told as soon as the
    driver gives up, not after retries for database_timeout."""
    url = URLS[engine].format(port=dead.port)
    began = time.monotonic()
    with pytest.raises(tierlock.BackendError) as raised:
        tierlock.LockManager(url, reaper_interval=None, database_timeout=timeout)
    took = time.monotonic() - began
    earliest, latest = expected_time(engine, dead, timeout)
    assert earliest <= took <= latest, f"gave up after {took:.2f} s"
    check_error(raised.value, dead)
    check_tries(engine, dead)


@pytest.mark.slow
@pytest.mark.postgresql
def test_a_first_operation_gives_up_in_time(dead: DeadAddress) -> None:
    """A manager on PostgreSQL that does not create the table connects first for its
    first operation: that one try is bounded the same, and not repeated."""
    url = URLS["postgresql"].format(port=dead.port)
    with tierlock.LockManager(url, create_table=False, reaper_interval=None) as locks:
        began = time.monotonic()
        with pytest.raises(tierlock.BackendError) as raised:
            locks.lock("user:42").acquire()
        took = time.monotonic() - began
    earliest, latest = expected_time("postgresql", dead, DEFAULT_DATABASE_TIMEOUT)
    assert earliest <= took <= latest, f"gave up after {took:.2f} s"
    check_error(raised.value, dead)
    check_tries("postgresql", dead)
