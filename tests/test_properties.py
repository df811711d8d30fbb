"""Semantic 11 and exact keys, as properties over generated input.

Any key is either stored verbatim through bound parameters (it reads back equal from
``info()`` and ``holders()``, and collides with no other key) or refused with a clear
``ValueError``/``TypeError`` before anything is written. Table names that are not plain
identifiers are refused and create nothing.

The examples share the test's manager and table: each one leaves the table empty, which
it asserts, so they cannot see each other. That is why the function-scoped fixture health
check is suppressed.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect
from sqlalchemy.engine import Engine

import tierlock

SHARED_FIXTURES = settings(
    max_examples=50,
    deadline=None,  # round trips to a busy server vary
    database=None,  # every example runs against fresh random tables and keys anyway
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# Characters that have broken lock keys elsewhere: separators, SQL metacharacters and
# LIKE wildcards, whitespace, NUL, lone surrogates, case and normalisation pairs, and
# 4-byte characters.
AWKWARD = ":'\";--%_\\/* \t\n\x00\ud800\udfffAaßsséé\U0001f600\U00010348"
KEY_TEXT = st.text(
    alphabet=st.one_of(st.sampled_from(AWKWARD), st.characters(codec="utf-8")), max_size=12
) | st.text(alphabet=st.sampled_from("x\U0001f600"), min_size=250, max_size=260)
KEY_PARTS = st.lists(
    st.one_of(KEY_TEXT, st.integers(min_value=-(2**63), max_value=2**63)), min_size=1, max_size=3
).map(tuple)

MAX_KEY_LENGTH = 255


def expected_key(key: str | tuple[str | int, ...]) -> str | None:
    """The key string tierlock must store for ``key``, or None if it must refuse it."""
    text = key if isinstance(key, str) else ":".join(map(str, key))
    if not 0 < len(text) <= MAX_KEY_LENGTH or "\x00" in text or "\x01" in text:
        return None
    if any(0xD800 <= ord(char) <= 0xDFFF for char in text):  # lone surrogates
        return None
    return text


@SHARED_FIXTURES
@given(key=st.one_of(KEY_TEXT, KEY_PARTS))
def test_a_key_round_trips_verbatim_or_is_refused(
    manager: tierlock.LockManager, key: str | tuple[str | int, ...]
) -> None:
    expected = expected_key(key)
    if expected is None:
        with pytest.raises((ValueError, TypeError)):
            manager.lock(key)
        assert manager.holders() == []
        return
    lock = manager.lock(key)
    assert lock.key == expected
    assert lock.acquire(blocking=False)
    try:
        info = manager.info(key)
        assert info is not None
        assert info.key == expected
        assert info.token == lock.token
        assert [holder.key for holder in manager.holders()] == [expected]
    finally:
        lock.release()
    assert manager.info(key) is None
    assert manager.holders() == []


VALID_KEY = KEY_TEXT.filter(lambda key: expected_key(key) is not None)


@SHARED_FIXTURES
@given(keys=st.lists(VALID_KEY, min_size=2, max_size=6, unique=True))
def test_distinct_keys_never_collide(manager: tierlock.LockManager, keys: list[str]) -> None:
    """Keys that differ in case, trailing space, normalisation or any character are
    separate locks on every database."""
    locks = [manager.lock(key) for key in keys]
    try:
        for lock in locks:
            assert lock.acquire(blocking=False), f"{lock.key!r} collided with another key"
        assert sorted(info.key for info in manager.holders()) == sorted(keys)
    finally:
        for lock in locks:
            if lock.owned():
                lock.release()
    assert manager.holders() == []


PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


@settings(SHARED_FIXTURES, max_examples=30)
@given(name=st.text(alphabet=st.sampled_from(AWKWARD + "abc_09;`()."), max_size=45))
def test_a_table_name_that_is_not_a_plain_identifier_creates_nothing(
    db_url: str, engine: Engine, name: str
) -> None:
    """Whatever the name holds, it is either a plain identifier or refused; a refused
    name reaches no database."""
    if PLAIN_IDENTIFIER.fullmatch(name):
        return  # made and dropped by the other tests, with their own tables
    before = set(inspect(engine).get_table_names())
    with pytest.raises(ValueError, match="plain identifier"):
        tierlock.LockManager(db_url, table=name, reaper_interval=None)
    after = set(inspect(engine).get_table_names())
    # Other tests create and drop their own tl_ tables meanwhile.
    assert {table for table in after - before if not table.startswith("tl_")} == set()
