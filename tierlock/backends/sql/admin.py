"""What the SQL backend does beside taking and keeping holds: telling whether a key is
held and by whom, force-releasing, and deleting rows that nobody will use (the
reaper's expired rows, and the sweeper's rows of interrupted owners)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ...keys import MARK, is_reader_key, user_key
from ...records import LockInfo
from ...stats import Counters
from .link import Link
from .queries import Queries
from .rows import row_info
from .sweeper import Sweep
from .table import REAP_BATCH

if TYPE_CHECKING:
    from .running import Runner
    from .sharedholds import SQLSharedHolds
    from .wakeups import WakeUps

__all__ = ["TableAdmin"]

logger = logging.getLogger(__name__)


class TableAdmin:
    """These operations of ``SQLBackend``, on its attributes."""

    queries: Queries
    counters: Counters
    shared: SQLSharedHolds
    _runner: Runner
    _wakeups: WakeUps

    def is_locked(self, key: str) -> bool:
        return self._runner.run(
            "locked",
            key,
            lambda link, _: bool(link.execute(self.queries.select_live, {"key": key}).rows),
        )

    def info(self, key: str) -> LockInfo | None:
        def attempt(link: Link, uncertain: bool) -> LockInfo | None:
            rows = link.execute(self.queries.select_info, {"key": key}).records()
            return row_info(rows[0]) if rows else None

        return self._runner.run("info", key, attempt)

    def holders(self) -> list[LockInfo]:
        return self._runner.run(
            "holders",
            None,
            lambda link, _: [
                row_info(row) for row in link.execute(self.queries.select_all).records()
            ],
        )

    def force_release(self, key: str) -> bool:
        params = {"key": key, "under": key + MARK, "above": key + chr(ord(MARK) + 1)}
        queries = self.queries

        def attempt(link: Link, uncertain: bool) -> bool:
            deleted = link.execute(queries.delete_key, params).rowcount > 0
            if deleted and queries.notify_forced is not None:
                link.execute(queries.notify_forced, {"key": key})
            return deleted

        deleted: bool = self._runner.run("force_release", key, attempt)
        if deleted:
            self._wakeups.released(key)
        return deleted

    def reap(self) -> int:
        total = 0
        while count := self._runner.run(
            "reap", None, lambda link, _: self.shared.steps.reap_readers(link)
        ):
            total += count
        while True:
            deleted: int = self._runner.run(
                "reap",
                None,
                lambda link, _: link.execute(self.queries.delete_expired_batch).rowcount,
            )
            total += deleted
            if deleted < REAP_BATCH:
                self.counters.add("reaped", total)
                return total

    def _sweep(self, item: Sweep) -> bool:
        """Delete ``item``'s row once its sessions are over; ``False``: not yet."""
        queries = self.queries
        params = {"key": item.key, "owner": item.owner_id}
        deleted = False

        def attempt(link: Link, uncertain: bool) -> bool:
            nonlocal deleted
            if item.sessions and time.monotonic() < item.give_up:
                for session in item.sessions:
                    if link.execute(queries.session_alive, {"session": session}).rows:
                        return False
            if is_reader_key(item.key):  # (counted out of its group as it goes)
                steps = self.shared.steps
                group = steps.discard_reader(link, item.key, item.owner_id)
                if group is not None:
                    steps.drop_if_empty(link, user_key(item.key), group)
                gone = group is not None
            else:
                gone = link.execute(queries.delete_owned, params).rowcount > 0
            if gone:
                logger.warning("lock %r: deleted a row its interrupted owner left", item.key)
                deleted = True
            return True

        done: bool = self._runner.run("sweep", item.key, attempt)
        if deleted:
            self._wakeups.released(user_key(item.key))
        return done
