"""The file backend: a hold is a lock file in a directory that every holder can reach,
as in JD's patent: a local directory for processes on one host, or one shared over
NFS, CephFS or the like for hosts that share nothing else. The files and their guard:
``holdfile``; key names: ``names``; the reaper's work: ``reaping``.

* Taking a free key is one exclusive create and a provisional holder record, then,
  under the key's guard, the record with the hold's fencing number, counted there.
* A key whose hold file exists is taken over, under its guard, only if that file's
  lease has ended by the file server's clock, or its holder process is proven gone on
  this host, or it was left half written; two waiters cannot both win, as the second
  finds the first one's new file.
* Release, extend and hand-offs check the owner id in the file under the guard, so
  none touches a file someone else holds, even after the process was stopped between
  its check and its write.
* Renewal touches each hold file through a descriptor whose content it checked, then
  makes sure no takeover replaced the file meanwhile; the touch is the file server's
  stamp, so the lease runs from its clock.

Waiting pollers try again with backoff; on this host, a release wakes them at once
where inotify can see it (``wakeups``). A lost try marks its key wanted, for the
holder to see (``wanting``). Operations are system calls; on a hung network
mount they hang with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from ... import process
from ...errors import BackendError, LockError
from ...records import LockInfo, Owner
from ...stats import Counters
from .. import Doorbell, LockBackend
from ..basics import MAX_HANDOFFS, Record, check_table_name, fencing_token
from ..gate import Gate
from .holdfile import PROVISIONAL, Directory, GuardBusy, Seen, Stored, milliseconds, span_of
from .names import COUNTER, HOLD, key_name, parse_url
from .reaping import reap_ended
from .wakeups import WakeUps
from .wanting import Wanting

__all__ = ["FileBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class FileBackend(LockBackend):
    """Holds as lock files; see the module docstring."""

    MAX_HANDOFFS = MAX_HANDOFFS

    def __init__(
        self, url: str, *, table: str, create_table: bool, counters: Counters, timeout: float
    ) -> None:
        self.table = check_table_name(table)
        self.counters = counters
        self.timeout = timeout
        self.location = url
        root = os.path.join(parse_url(url), table)
        self._files = Directory(root, counters, guard_limit=timeout)
        self._gate = Gate()
        self._closing = threading.Event()
        self._doubts: set[str] = set()  # owner ids whose acquire left its file behind
        self._wakeups = WakeUps(root, self._closing)
        self._wanting = Wanting(self._files)
        self._run("open", None, lambda: self._open(root, create_table))

    def _open(self, root: str, create_table: bool) -> None:
        if create_table:
            self._files.make()
        elif not os.path.isdir(root):
            raise FileNotFoundError(
                "no lock directory: make it with create_table=True or `tierlock init`"
            )
        self._files.probe()

    def _run(self, what: str, key: str | None, operation: Callable[[], T]) -> T:
        """Run ``operation`` through the gate, its ``OSError`` as ``BackendError``."""
        self._gate.enter()
        try:
            return operation()
        except OSError as exc:
            raise BackendError(f"{what} failed in {self._files.root}: {exc}", key) from exc
        finally:
            self._gate.leave()

    def _paths(self, key: str) -> tuple[str, str]:
        """The key's hold file and counter (guard) file."""
        name = key_name(key)
        return self._files.path(name + HOLD), self._files.path(name + COUNTER)

    # -- holds -----------------------------------------------------------------------

    def try_acquire(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None = None,
        limit: float | None = None,
    ) -> int | None:
        def attempt() -> int | None:
            try:
                return self._acquire(key, owner, ttl, lease, limit)
            except GuardBusy:
                if limit is None:
                    raise
                self._held_elsewhere(key)
                return None  # (the try's time is up)

        return self._run("acquire", key, attempt)

    def _acquire(
        self, key: str, owner: Owner, ttl: float, lease: float | None, limit: float | None
    ) -> int | None:
        files = self._files
        hold, counter = self._paths(key)
        with files.created(hold) as fd:
            if fd is not None:
                # A record at once (its number comes under the guard), so that a dead
                # creator's file is reclaimed as any dead holder's. The key is ours now:
                # the guard is waited for as long as anything waits for one.
                provisional = Stored(PROVISIONAL, span_of(ttl), key, Record.of(owner, 0, lease))
                files.write(fd, provisional, longer=True)
                try:
                    with files.guard(counter) as guard:
                        status = files.still_at(hold, fd)
                        if status is None:  # (taken over meanwhile)
                            self._held_elsewhere(key)
                            return None
                        return self._fill(key, owner, ttl, lease, fd, guard, status)
                except BaseException:
                    self._doubts.add(owner.owner_id)  # its file stays: ``discard`` deletes it
                    raise
        seen = files.peek(hold)
        if seen is not None and not self._ended(seen, files.now()):
            self._held_elsewhere(key)
            return None
        return self._take_over(key, owner, ttl, lease, seen, limit)

    def _held_elsewhere(self, key: str) -> None:
        """A try lost ``key``: count it, and mark the key wanted for its holder."""
        self.counters.add("insert_conflicts")
        self._wanting.mark(key)

    def _ended(self, seen: Seen, now: int) -> bool:
        """Whether a hold seen in its file may be taken over: its lease has ended, or its
        holder process is proven gone."""
        if seen.expires <= now:
            return True
        if seen.stored is None:
            return False
        holder = seen.stored.record
        return process.is_gone(holder.host_id, holder.pid, holder.proc_start)

    def _take_over(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None,
        seen: Seen | None,
        limit: float | None,
    ) -> int | None:
        """Under the key's guard: remove the hold file ``seen`` if it is still there and
        still ended, then take the key (``seen``: ``None`` if it went meanwhile)."""
        files = self._files
        hold, counter = self._paths(key)
        with files.guard(counter, limit) as guard:
            current = files.peek(hold)
            if current is not None:
                if seen is None or current.inode != seen.inode:
                    self._held_elsewhere(key)
                    return None  # a new hold: the next try looks at it
                if current != seen and not self._ended(current, files.now()):
                    self._held_elsewhere(key)
                    return None  # renewed or extended meanwhile
                files.remove(hold)
                self._tell_takeover(key, current)
            with files.created(hold) as fd:
                if fd is None:  # a new holder created it meanwhile (creating takes no guard)
                    self._held_elsewhere(key)
                    return None
                self.counters.add("statements")  # (the fstat)
                return self._fill(key, owner, ttl, lease, fd, guard, os.fstat(fd))

    def _tell_takeover(self, key: str, seen: Seen) -> None:
        if seen.stored is None:
            logger.warning("lock %r: removed a hold file its creator left half written", key)
            self.counters.add("takeovers")
            return
        holder = seen.stored.record
        if process.is_gone(holder.host_id, holder.pid, holder.proc_start):
            logger.warning(
                "lock %r: took over the hold of process %d, which has exited", key, holder.pid
            )
            self.counters.add("reclaims")
        else:
            self.counters.add("takeovers")

    def _fill(
        self,
        key: str,
        owner: Owner,
        ttl: float,
        lease: float | None,
        fd: int,
        guard: int,
        status: os.stat_result,
    ) -> int | None:
        """Write a new hold file (``fd``, created by this try, whose ``status`` was
        just read) with its fencing number, holding the key's guard; its token, or
        ``None`` if the backend closed. Its lease runs from its first write."""
        files = self._files
        began = status.st_mtime_ns
        number = files.next_number(guard, began)
        record = Record.of(owner, milliseconds(began), lease)
        files.write(fd, Stored(number, span_of(ttl), key, record), longer=True)
        os.utime(fd, ns=(began, began))
        self.counters.add("statements")
        self.counters.add("inserts")
        if self._gate.shut:  # won just as the manager closed: nobody will hold it
            files.remove(self._paths(key)[0])
            return None
        return fencing_token(number, 0)

    def release(self, key: str, owner_id: str, live_until: float) -> bool:
        # Under the guard even while the lease surely runs: a process stopped between
        # its check and its delete may resume after a takeover.
        hold, counter = self._paths(key)

        def release() -> bool:
            with self._files.guard(counter):
                return self._remove_owned(hold, owner_id)

        return self._run("release", key, release)

    def _remove_owned(self, hold: str, owner_id: str) -> bool:
        """Delete ``owner_id``'s hold file, holding its guard; ``False``: not theirs."""
        seen = self._files.peek(hold)
        return seen is not None and seen.owned_by(owner_id) and self._files.remove(hold)

    def discard(self, key: str, owner_id: str, *, certain: bool) -> None:
        # A system call ran or did not: only an acquire cut short leaves a file behind.
        doubted = owner_id in self._doubts
        self._doubts.discard(owner_id)
        if not (certain or doubted):
            return
        hold, counter = self._paths(key)

        def remove() -> None:
            with self._files.guard(counter):
                if self._remove_owned(hold, owner_id):
                    logger.warning("lock %r: deleted a hold its interrupted owner left", key)

        try:
            self._run("discard", key, remove)
        except LockError as exc:  # its lease ends it, or this process's end
            logger.warning("lock %r: an interrupted owner's hold stays: %s", key, exc)

    def handoff(
        self,
        key: str,
        owner_id: str,
        handoffs: int,
        successor: Owner,
        ttl: float,
        lease: float | None,
    ) -> bool:
        def passed(stored: Stored) -> Stored:
            record = stored.record.passed_to(successor, handoffs, lease)
            return stored._replace(span=span_of(ttl), record=record)

        return self._rewrite("handoff", key, owner_id, passed, keep_expiry=False)

    def record_holder(
        self, key: str, owner_id: str, holder: Owner, handoffs: int, lease: float | None
    ) -> bool:
        def passed(stored: Stored) -> Stored:
            return stored._replace(record=stored.record.passed_to(holder, handoffs, lease))

        return self._rewrite("record", key, owner_id, passed, keep_expiry=True)

    def extend(self, key: str, owner_id: str, ttl: float, lease: float | None) -> bool:
        def extended(stored: Stored) -> Stored:
            return stored._replace(span=span_of(ttl), record=stored.record._replace(lease=lease))

        return self._rewrite("extend", key, owner_id, extended, keep_expiry=False)

    def _rewrite(
        self,
        what: str,
        key: str,
        owner_id: str,
        change: Callable[[Stored], Stored],
        *,
        keep_expiry: bool,
    ) -> bool:
        """Write ``change`` of ``owner_id``'s hold file into it, under the key's guard:
        the lease then runs anew from now, or (``keep_expiry``) ends when it did;
        ``False`` if the file is not theirs."""
        hold, counter = self._paths(key)

        def rewrite() -> bool:
            with self._files.guard(counter):
                return self._files.rewrite_owned(hold, owner_id, change, keep_expiry=keep_expiry)

        return self._run(what, key, rewrite)

    def renew(self, holds: Sequence[tuple[str, str]]) -> set[str]:
        if not holds:
            return set()

        def renew_all() -> set[str]:
            now = self._files.now()
            self.counters.add("heartbeats")
            renewed = set()
            for key, owner_id in holds:
                if self._files.renew_owned(*self._paths(key), owner_id, now):
                    renewed.add(owner_id)
            return renewed

        return self._run("renew", None, renew_all)

    # -- looking -----------------------------------------------------------------------

    def is_locked(self, key: str) -> bool:
        hold = self._paths(key)[0]

        def locked() -> bool:
            seen = self._files.peek(hold)
            return seen is not None and seen.expires > self._files.now()

        return self._run("locked", key, locked)

    def info(self, key: str) -> LockInfo | None:
        hold = self._paths(key)[0]

        def look() -> LockInfo | None:
            seen = self._files.peek(hold)
            return None if seen is None else seen.info(self._files.now())

        return self._run("info", key, look)

    def holders(self) -> list[LockInfo]:
        def look() -> list[LockInfo]:
            files = self._files
            now = files.now()
            seen = [files.peek(entry.path) for entry in files.listing(HOLD)]
            found = [each.info(now) for each in seen if each is not None]
            return sorted((info for info in found if info is not None), key=lambda i: i.key)

        return self._run("holders", None, look)

    def force_release(self, key: str) -> bool:
        hold, counter = self._paths(key)

        def remove() -> bool:
            with self._files.guard(counter):
                return self._files.remove(hold)

        return self._run("force_release", key, remove)

    def reap(self) -> int:
        reaped = self._run("reap", None, lambda: reap_ended(self._files))
        if reaped:
            self.counters.add("reaped", reaped)
        return reaped

    # -- life --------------------------------------------------------------------------

    def others_waiting(self, key: str, ringing: bool) -> bool | None:
        """Whether a try of another process lost ``key`` lately: see ``wanting``."""
        try:
            return self._run("others_waiting", key, lambda: self._wanting.others_waiting(key))
        except LockError:  # (closed, or the directory failed: the next cohort asks again)
            return None

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` as a lost try does (it has, unless the holder took the mark
        away since): the holder counts it for ``wanting.WANTED_MEMORY``."""
        with contextlib.suppress(LockError):  # (closed)
            self._run("want", key, lambda: self._wanting.mark(key))

    def doorbell(self, key: str) -> Doorbell:
        return self._wakeups.doorbell(key_name(key) + HOLD)

    def after_fork(self) -> None:
        self._gate = Gate()  # (the parent's operations under way are not this child's)
        self._closing = threading.Event()
        self._doubts = set()
        self._wakeups.forget(self._closing)
        self._wanting.forget()

    def close(self) -> None:
        if self._gate.shut:
            return
        self._closing.set()
        self._wakeups.close()
        self._gate.close(self.timeout)
        self._gate.seal()
