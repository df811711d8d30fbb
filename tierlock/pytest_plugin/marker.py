"""``@pytest.mark.tierlock(*keys, timeout=None)``: the test body runs holding every
key, taken in sorted order so that marked tests never deadlock one another.

Only the body holds them: fixtures are set up before and torn down after, and one
that must run under a key takes it itself, through ``tierlock_manager``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from ..errors import LockLostError
from ..keys import make_key
from ..lock import Lock, seconds
from .run import MARKER, PluginRun, holder

__all__ = ["MarkedTests", "parse"]


class Marked(NamedTuple):
    keys: tuple[str, ...]
    timeout: float | None  # None: wait as long as it takes


def parse(node: pytest.Item) -> Marked | None:
    """The keys and timeout of ``node``'s markers (the closest giving ``timeout`` wins),
    or ``None`` without one.

    :raises TypeError, ValueError: the markers' arguments, saying what is wrong.
    """
    keys: set[str] = set()
    timeouts: list[float | None] = []
    for mark in node.iter_markers(MARKER):
        unknown = sorted(set(mark.kwargs) - {"timeout"})
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}; it takes timeout=")
        if not mark.args:
            raise ValueError(f"give at least one key: @pytest.mark.{MARKER}('printer')")
        for key in mark.args:
            if not isinstance(key, str):
                raise TypeError(f"a key is a str, not {type(key).__name__}: {key!r}")
            keys.add(make_key(key))
        if "timeout" in mark.kwargs:
            timeouts.append(seconds("timeout", mark.kwargs["timeout"], none_ok=True, zero_ok=True))
    if not keys:
        return None
    return Marked(tuple(sorted(keys)), timeouts[0] if timeouts else None)


class MarkedTests:
    """The marker's per-test hook, registered only when a collected test is marked, so
    that a suite without marked tests runs none of it."""

    def __init__(self, run: PluginRun) -> None:
        self.run = run

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        marked = parse(item)
        if marked is None:
            return (yield)
        locks = self._take(marked, item.nodeid)
        try:
            return (yield)
        finally:
            self._let_go(locks)

    def _take(self, marked: Marked, test: str) -> list[Lock]:
        manager = self.run.manager
        deadline = None if marked.timeout is None else time.monotonic() + marked.timeout
        taken: list[Lock] = []
        try:
            with self.run.labelled(f"test {test}"):
                for key in marked.keys:
                    lock = manager.lock(key)
                    left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                    if not lock.acquire(timeout=left):
                        pytest.fail(
                            f"tierlock: {key!r} not taken within {marked.timeout:g} s: "
                            f"{holder(manager.info(key))}",
                            pytrace=False,
                        )
                    taken.append(lock)
        except BaseException:
            self._let_go(taken)
            raise
        return taken

    @staticmethod
    def _let_go(locks: list[Lock]) -> None:
        lost = []
        for lock in reversed(locks):
            try:
                lock.release()
            except LockLostError:
                lost.append(lock.key)
        if lost:
            pytest.fail(
                f"tierlock: the test lost its hold of {', '.join(map(repr, lost))} while it "
                "ran (its process stopped or lost the database for longer than the lease)",
                pytrace=False,
            )
