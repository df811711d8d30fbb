"""What one process of a pytest run shares with the others: where the locks live,
the run's id, and the manager, made on first use.

This module imports no database code: pytest loads it in every run.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from ..urls import hide_password

if TYPE_CHECKING:
    from ..manager import LockManager
    from ..records import LockInfo
    from .results import Results

__all__ = ["MARKER", "PluginRun", "holder"]

MARKER = "tierlock"
DEFAULT_FILE = "tierlock.sqlite3"
MAX_RUN_ID = 64  # (and the run-once lock keys stay short)
# The thread name a hold of the plugin is taken under, so that its row says what holds
# it: "test <node id>" or "tierlock_once('<key>')".
_LABEL = "pytest {worker} {what}"
# What the controller of an xdist run learns from a worker: which results it stored.
_STORED = "tierlock_stored"


class PluginRun:
    """This process's part in the run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        #: The xdist worker's name ("gw0"), or "main" outside pytest-xdist.
        self.worker: str = "main" if workerinput is None else workerinput["workerid"]
        self.is_worker = workerinput is not None
        explicit: str | None = config.getoption("tierlock_run")
        if explicit is not None and not 0 < len(explicit) <= MAX_RUN_ID:
            raise pytest.UsageError(f"--tierlock-run takes an ID of 1 to {MAX_RUN_ID} characters")
        #: Whose results a run-once function's outcome is: the run's own unless shared.
        self.run_id: str = explicit or (
            workerinput["testrunuid"] if workerinput is not None else uuid.uuid4().hex
        )
        self.shared = explicit is not None
        self.table: str = config.getini("tierlock_table")
        self._manager: LockManager | None = None
        self._results: Results | None = None
        self._to_forget: set[tuple[str, str, str]] = set()
        #: Whether a collected test is marked or asks for the plugin's fixtures.
        self.used = False

    @functools.cached_property
    def url(self) -> str:
        given: str | None = self.config.getoption("tierlock_url") or self.config.getini(
            "tierlock_url"
        )
        if given:
            return given
        # xdist gives each worker a directory of its own in the controller's, which
        # is the run's: the workers of one run meet there, and two runs never do.
        factory: pytest.TempPathFactory = self.config._tmp_path_factory  # type: ignore[attr-defined]
        base = factory.getbasetemp()
        return f"sqlite:///{(base.parent if self.is_worker else base) / DEFAULT_FILE}"

    @property
    def where(self) -> str:
        """The report header's line."""
        return f"tierlock: {hide_password(self.url)} (table {self.table})"

    @property
    def manager(self) -> LockManager:
        if self._manager is None:
            from ..manager import LockManager

            # No reaper thread: waiters take over the holds of killed workers, and the
            # rows nobody asks for again (a killed run's) go in this pass, at the start.
            manager = LockManager(self.url, table=self.table, reaper_interval=None)
            try:
                manager.reap()
            except BaseException:
                manager.close()
                raise
            self._manager = manager
        return self._manager

    @property
    def results(self) -> Results:
        """The store of run-once outcomes; the run's controller deletes this run's
        when it ends, unless the run id is shared."""
        if self._results is None:
            from .results import Results

            results = Results(self.url, self.table)
            try:
                results.prepare(self.manager)
            except BaseException:
                results.close()
                raise
            self._results = results
            where = (self.url, self.table, self.run_id)
            output = getattr(self.config, "workeroutput", None)
            if output is not None:
                output[_STORED] = list(where)
            else:
                self._to_forget.add(where)
        return self._results

    @contextmanager
    def labelled(self, what: str) -> Iterator[None]:
        """Take holds in this block under a name that says what holds them."""
        thread = threading.current_thread()
        name = thread.name
        thread.name = _LABEL.format(worker=self.worker, what=what)
        try:
            yield
        finally:
            thread.name = name

    def worker_finished(self, workeroutput: dict[str, Any]) -> None:
        stored = workeroutput.get(_STORED)
        if stored is not None:
            url, table, run_id = stored
            self._to_forget.add((url, table, run_id))

    def finish(self) -> None:
        """At the end of the session: delete the run's results (in the controller, once
        every worker is done) and close what this process opened."""
        try:
            if self._to_forget and not self.shared:
                self._forget_results()
        finally:
            if self._results is not None:
                self._results.close()
            if self._manager is not None:
                self._manager.close()

    def _forget_results(self) -> None:
        from .results import Results

        for url, table, run_id in self._to_forget:
            store = Results(url, table)
            try:
                store.forget(run_id)
            finally:
                store.close()


def holder(info: LockInfo | None) -> str:
    """Who holds a key, for a message: the test if a test of the plugin holds it."""
    if info is None:
        return "it was free again when asked"
    where = f"host {info.host}, pid {info.pid}"
    prefix, _, rest = info.thread_name.partition(" ")
    worker, _, what = rest.partition(" ")
    if prefix == "pytest" and what:
        return f"held by {what} on worker {worker} ({where})"
    return f"held by thread {info.thread_name!r} ({where})"
