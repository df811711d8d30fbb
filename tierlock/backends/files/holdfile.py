"""What a lock directory's files hold, and the few operations on them that every
engine step is made of: read a hold, create one exclusively, write, rewrite or renew
it, guard a key, read the file server's clock, and count a key's fencing numbers.

A hold is the file ``<name>.lock``: created with ``O_CREAT | O_EXCL``, so that of all
who create it at once exactly one succeeds, then written with ``Stored`` (first with a
provisional number, then, under the guard, with its own). Its lease ends ``span``
milliseconds after the file's modification time, which the file server stamps on every
write and touch: the server's clock decides, not the client's.

Anything that removes or rewrites a hold file, or bumps a key's counter, does so while
it holds the key's guard: an exclusive ``flock`` on ``<name>.token``, held for a few
system calls, never while a lock is held or waited for. The kernel drops it when its
holder dies, so a guard is never stale. That makes check-then-act atomic: two waiters
cannot both take over one expired file, and a late release cannot delete a new
holder's. Only creating a free hold and renewing by a touch go without it (see
``FileBackend``).

A lock directory may be shared by several users: what the engine makes in it gets its
mode from the lock directory's (``modes``), whatever the umask. Files that others write
(counters, the clock) appear with their mode already given.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ...records import LockInfo
from ...stats import Counters
from ..basics import Record
from .modes import Modes, give
from .names import MAKING

__all__ = ["CREATE_GRACE", "PROVISIONAL", "Directory", "GuardBusy", "Seen", "Stored"]

# A hold file still empty or half written counts as held for this long from its last
# write, then as abandoned: its creator died (or is stopped) between its first few
# system calls. Safety does not rest on it: a creator checks, under the guard, that its
# file is still there.
CREATE_GRACE = 2_000  # ms
# The fencing number of a new hold's first record, written before its number is known.
PROVISIONAL = 0
# Fencing numbers are at least the file server's clock in ticks of this many ns (as on
# Redis): shifted by the hand-off bits, ticks stay below 2**63 until about the year 2400.
TICK = 100_000
_COUNTER_WIDTH = 20
_READ_SIZE = 4096  # a record with a 255-character key and host names fits
_CLOCK = ".clock"
_DECODER = json.JSONDecoder()
# Pauses between tries of a busy guard: its holder keeps it for a few system calls.
FIRST_GUARD_PAUSE = 0.0005
LONGEST_GUARD_PAUSE = 0.02
# How long a hold file that this process may not read is tried again, in seconds: long
# enough for its maker to give it its mode, even on a busy host.
MODE_WAIT = 1.0


def milliseconds(nanoseconds: int) -> int:
    return nanoseconds // 1_000_000


def span_of(seconds: float) -> int:
    """A lease of ``seconds`` as a record's span, in whole ms (at least one)."""
    return max(1, math.ceil(seconds * 1000))


class GuardBusy(TimeoutError):
    """A key's guard stayed taken past the bound."""


def _locked(fd: int) -> bool:
    """Take the ``flock`` of ``fd`` if nobody holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Stored(NamedTuple):
    """A hold file's content: the hold's fencing number (before hand-offs), its lease's
    length from the file's modification time in ms, its key and its holder."""

    number: int
    span: int
    key: str
    record: Record

    def dumps(self) -> bytes:
        data = [self.number, self.span, self.key, list(self.record)]
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def loads(cls, data: bytes) -> Stored | None:
        """The content, or ``None`` if it is not all written yet. What follows the first
        JSON value is the tail of a longer record that a rewrite has not cut off yet."""
        try:
            (number, span, key, record), _ = _DECODER.raw_decode(data.decode())
            return cls(number, span, key, Record(*record))
        except (ValueError, TypeError):
            return None


class Seen(NamedTuple):
    """A hold file as read: its content (``None``: still being written), which file it
    was, and its modification time by the file server's clock."""

    stored: Stored | None
    inode: int
    mtime_ns: int

    @property
    def expires(self) -> int:
        span = CREATE_GRACE if self.stored is None else self.stored.span
        return milliseconds(self.mtime_ns) + span

    def owned_by(self, owner_id: str) -> bool:
        return self.stored is not None and self.stored.record.owner_id == owner_id

    def info(self, now: int) -> LockInfo | None:
        """The hold the file shows at ``now`` (ms); ``None`` while it is being written."""
        stored = self.stored
        if stored is None or stored.number == PROVISIONAL:
            return None
        return stored.record.info(stored.key, stored.number, self.expires, now)


class Directory:
    """One lock directory (``<dir>/<table>``); every file operation is counted as a
    statement. ``OSError`` passes through: the backend says what failed. A guard busy
    for ``guard_limit`` seconds raises ``GuardBusy``."""

    def __init__(self, root: str, counters: Counters, guard_limit: float) -> None:
        self.root = root
        self._guard_limit = guard_limit
        self._count = counters.add
        self._clock = os.path.join(root, _CLOCK)
        self._modes = Modes.of(0)  # (until ``make`` or ``probe`` reads the lock directory's)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _learn_modes(self) -> None:
        self._modes = Modes.of(os.stat(os.path.dirname(self.root)).st_mode)

    def make(self) -> None:
        """Make the directory, and the lock directory it is in if there is none, unless
        another process made it first. The directory gets its mode at once: one made by
        another process is that process's to give its mode."""
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        self._learn_modes()
        mode = self._modes.directory
        try:
            os.mkdir(self.root, mode)
        except FileExistsError:
            return
        # (Linux sets the setgid bit already; a chmod by someone outside the group would
        # clear it, so only one that changes something is made.)
        if stat.S_IMODE(os.stat(self.root).st_mode) != mode:
            give(self.root, mode)

    def now(self) -> int:
        """The file server's clock, in ms: the time it stamps on a file touched now."""
        try:
            os.utime(self._clock)
        except FileNotFoundError:
            self.place(self._clock)
            os.utime(self._clock)
            self._count("statements")
        self._count("statements", 2)
        return milliseconds(os.stat(self._clock).st_mtime_ns)

    def probe(self) -> None:
        """Learn the modes of what is made here from the lock directory, and make sure
        the directory can be written, stamped and ``flock``-ed; a mount without
        ``flock`` raises here instead of locking unsafely later."""
        self._learn_modes()
        self.now()
        with self.guard(self._clock):
            pass

    def place(self, path: str) -> None:
        """Make the empty file ``path`` with its mode unless there is one: made under a
        name of its own, given its mode and linked into place, so that no other user
        finds it before it has its mode. A filesystem without hard links gets it made
        in place, then given its mode."""
        temporary = self.path(MAKING + os.urandom(8).hex())
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            give(fd, self._modes.file)
        finally:
            os.close(fd)
        self._count("statements", 3)
        try:
            os.link(temporary, path)
        except FileExistsError:  # (made meanwhile; on NFS, maybe this very link)
            pass
        except OSError:
            self.mark(path)
        finally:
            os.unlink(temporary)
            self._count("statements", 2)

    def peek(self, path: str) -> Seen | None:
        """The hold file at ``path``, or ``None`` if there is none. One this process
        may not read was made by another user a moment ago, who gives it its mode with
        the next system call: it is tried again for up to ``MODE_WAIT`` seconds. (Not
        taken as a file being written: then one never readable would be taken over.)"""
        deadline = time.monotonic() + MODE_WAIT
        pause = FIRST_GUARD_PAUSE
        while True:
            try:
                with self.opened(path, os.O_RDONLY) as fd:
                    return None if fd is None else self.read(fd)
            except PermissionError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_GUARD_PAUSE)

    @contextlib.contextmanager
    def opened(
        self, path: str, flags: int, refused: type[OSError] = FileNotFoundError
    ) -> Iterator[int | None]:
        """The file at ``path`` open with ``flags``, or ``None`` if the open failed
        with ``refused`` (by default: there is no such file)."""
        self._count("statements")
        try:
            fd = os.open(path, flags, self._modes.file)
        except refused:
            yield None
            return
        try:
            if flags & os.O_EXCL:  # (made by this open)
                give(fd, self._modes.file)
                self._count("statements")
            yield fd
        finally:
            os.close(fd)
            self._count("statements")

    def read(self, fd: int) -> Seen:
        status = os.fstat(fd)
        data = os.pread(fd, _READ_SIZE, 0)
        self._count("statements", 2)
        return Seen(Stored.loads(data), status.st_ino, status.st_mtime_ns)

    def created(self, path: str) -> contextlib.AbstractContextManager[int | None]:
        """A new hold file at ``path``, open for writing, or ``None`` if one exists."""
        return self.opened(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FileExistsError)

    def write(self, fd: int, stored: Stored, *, longer: bool = False) -> None:
        """Put ``stored`` in the hold file: this write is also the touch that starts
        its lease anew. ``longer``: nothing as long is there (no tail to cut off)."""
        data = stored.dumps()
        os.pwrite(fd, data, 0)
        if not longer:
            os.ftruncate(fd, len(data))
        self._count("statements", 1 if longer else 2)

    def still_at(self, path: str, fd: int) -> os.stat_result | None:
        """``fd``'s status if it is the file at ``path`` still (no takeover replaced
        it), else ``None``."""
        status = os.fstat(fd)
        self._count("statements")
        return status if self.names(path, status.st_ino) else None

    def names(self, path: str, inode: int) -> bool:
        """Whether ``path`` names the file ``inode`` (of an open descriptor)."""
        self._count("statements")
        try:
            return os.stat(path).st_ino == inode
        except FileNotFoundError:
            return False

    def mark(self, path: str) -> None:
        """Make the (empty) file at ``path`` if there is none. (Nobody writes it: its
        mode comes after its making.)"""
        with self.opened(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FileExistsError):
            pass

    def remove(self, path: str) -> bool:
        """Delete the file at ``path``; ``False`` if there was none."""
        self._count("statements")
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    @contextlib.contextmanager
    def guard(self, path: str, limit: float | None = None) -> Iterator[int]:
        """Hold the guard of the key whose counter file is ``path``; yields that file.

        A guard is held for a few system calls, so a busy one is tried again after short
        pauses; one busy for ``limit`` seconds (default: the directory's) has a holder
        that is stopped or stuck: ``GuardBusy``. A counter file the reaper deleted
        between this open and its lock is not the guard any more: lock the new one.
        """
        bound = self._guard_limit if limit is None else limit
        deadline = time.monotonic() + bound
        pause = FIRST_GUARD_PAUSE
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                self.place(path)
                continue
            try:
                while not _locked(fd):
                    self._count("statements")
                    if time.monotonic() >= deadline:
                        raise GuardBusy(
                            f"the guard {path} stayed taken for {limit or self._guard_limit:g} s"
                        )
                    time.sleep(pause)
                    pause = min(pause * 2, LONGEST_GUARD_PAUSE)
                self._count("statements", 2)
                if self.still_at(path, fd) is not None:
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)  # (which unlocks)
            self._count("statements")

    def rewrite_owned(
        self, hold: str, owner_id: str, change: Callable[[Stored], Stored], *, keep_expiry: bool
    ) -> bool:
        """Holding the key's guard, write ``change`` of ``owner_id``'s hold file into it:
        the lease then runs anew from now, or (``keep_expiry``) ends when it did;
        ``False`` if the file is not theirs."""
        with self.opened(hold, os.O_RDWR) as fd:
            if fd is None:
                return False
            seen = self.read(fd)
            if seen.stored is None or not seen.owned_by(owner_id):
                return False
            self.write(fd, change(seen.stored))
            if keep_expiry:  # the file server's own earlier stamp, back again
                os.utime(fd, ns=(seen.mtime_ns, seen.mtime_ns))
                self._count("statements")
            return True

    def renew_owned(self, hold: str, counter: str, owner_id: str, now: int) -> bool:
        """Touch ``owner_id``'s hold file if its lease runs at ``now`` (ms): through the
        descriptor it checked, so only that file is touched, then make sure no takeover
        replaced it meanwhile. A lease whose length changed is rewritten under the
        guard instead; a fixed lease stays as it is."""
        with self.opened(hold, os.O_RDONLY) as fd:
            if fd is None:
                return False
            seen = self.read(fd)
            if seen.stored is None or not seen.owned_by(owner_id) or seen.expires <= now:
                return False
            lease = seen.stored.record.lease
            if lease is None:
                return True
            if seen.stored.span != span_of(lease):
                renewed = seen.stored._replace(span=span_of(lease))
                with self.guard(counter):
                    return self.rewrite_owned(hold, owner_id, lambda _: renewed, keep_expiry=False)
            os.utime(fd)
            self._count("statements")
            return self.names(hold, seen.inode)

    def next_number(self, guard: int, mtime_ns: int) -> int:
        """Count one more hold in the key's counter (``guard``, held): one more than
        the last, or the file server's clock at the hold's creation (``mtime_ns``) in
        ticks if that is higher, so numbers rise even if the counter was lost."""
        last = os.pread(guard, _COUNTER_WIDTH, 0)
        number = max(int(last or b"0") + 1, mtime_ns // TICK)
        os.pwrite(guard, b"%0*d" % (_COUNTER_WIDTH, number), 0)
        self._count("statements", 2)
        return number

    def listing(self, suffix: str = "", prefix: str = "") -> list[os.DirEntry[str]]:
        """The directory's files whose names start with ``prefix`` and end with
        ``suffix``."""
        self._count("statements")
        with os.scandir(self.root) as entries:
            return [
                entry
                for entry in entries
                if entry.name.startswith(prefix) and entry.name.endswith(suffix)
            ]
