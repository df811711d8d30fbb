"""``tierlock_once(key, fn)``: one process of the run runs ``fn()``; every process gets
its result, or an error naming what it raised.

The first process to take the key's lock finds no outcome in the run's results, runs
``fn`` while holding the lock (renewed, however long ``fn`` takes), and stores the
outcome before letting go; the others, queued on the lock, read it. A process that
dies while running ``fn`` stored nothing, so the next process to get the lock runs it.
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

from .results import Outcome
from .run import PluginRun

__all__ = ["Once", "OnceFailed"]


class OnceFailed(Exception):
    """The run-once function raised, in this process earlier or in another one; it is
    not run again in this run."""


class Once:
    """The callable that the ``tierlock_once`` fixture gives."""

    def __init__(self, run: PluginRun) -> None:
        self.run = run
        self._known: dict[str, Outcome] = {}  # outcomes seen by this process

    def __call__(self, key: str, fn: Callable[[], Any]) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"tierlock_once() takes a str key, not {type(key).__name__}")
        if not callable(fn):
            raise TypeError(f"tierlock_once() takes a function, not {type(fn).__name__}")
        outcome = self._known.get(key)
        if outcome is None:
            outcome = self._decide(key, fn)
        if outcome.failed:
            raise OnceFailed(
                f"tierlock_once({key!r}): the function raised in {outcome.made_by} and is "
                f"not run again in this run:\n{outcome.body}"
            )
        return json.loads(outcome.body)

    def _decide(self, key: str, fn: Callable[[], Any]) -> Outcome:
        run = self.run
        lock = run.manager.lock(f"pytest-once:{run.run_id}:{key}")
        if lock.owned():
            raise RuntimeError(f"tierlock_once({key!r}) was called by its own function")
        with run.labelled(f"tierlock_once({key!r})"), lock:
            outcome = run.results.get(run.run_id, key)
            if outcome is None:
                outcome = self._run(key, fn)
        self._known[key] = outcome
        return outcome

    def _run(self, key: str, fn: Callable[[], Any]) -> Outcome:
        run = self.run
        made_by = f"{run.worker} (host {socket.gethostname()}, pid {os.getpid()})"
        try:
            value = fn()
            body = _encoded(key, value)
        except Exception as exc:
            # Stored, so that no other process runs it again; raised here as it is.
            failure = Outcome(True, "".join(traceback.format_exception(exc)), made_by)
            run.results.put(run.run_id, key, failure)
            self._known[key] = failure
            raise
        outcome = Outcome(False, body, made_by)
        run.results.put(run.run_id, key, outcome)
        return outcome


def _encoded(key: str, value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"tierlock_once({key!r}): the function returned a {type(value).__name__}, which "
            f"cannot be stored as JSON ({exc}); return JSON data for every process to get"
        ) from exc
