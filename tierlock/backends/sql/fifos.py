"""Wake-ups on SQLite: named pipes (FIFOs) in a directory beside the database file.

SQLite has no server to tell a process that a row left the table, so pollers of a key
held elsewhere would only sleep, and a process that passes the key between its own
threads would win it back before they woke. Instead, a process that polls a key opens
a FIFO ``<digest of table and key>.<creation time>.<pid>.<serial>`` in
``<database>.tierlock/`` and waits on it with ``poll()``; a process that deletes the
key's row writes one byte into the oldest FIFO of that digest, so processes take turns
in the order they began to wait. As with the other doorbells a wake-up only saves
time: a poller still tries again after each pause, so a lost one costs one pause.

A FIFO is renamed into place only once its reader is open, and removed before its
reader is closed, so a writer that finds no reader (``ENXIO``) has met the FIFO of a
process that died, and removes it.

A try without waiting leaves no FIFO, so a process that only tries marks the key
instead (``want``): it writes, into ``want.<digest>`` in the same directory, until when
(``time.monotonic_ns()``, one clock for the host, as the FIFOs' names use) and which
process marked it. The holder's ``waiting`` reads it: one ``open`` that fails while
nobody ever tried. The file is rewritten in place, so the directory's listing stays
valid; a mark long past is removed by whoever reads it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import select
import threading
import time
from urllib.parse import unquote, urlsplit

from sqlalchemy.engine import URL

from ...stats import Counters
from .. import Doorbell

__all__ = ["FifoBells", "sqlite_file"]

logger = logging.getLogger(__name__)

DIRECTORY_MODE = 0o700
FIFO_MODE = 0o600
MARK_MODE = 0o600
# What a want mark's file name begins with: never a digest's first character, so a
# mark is never taken for a FIFO.
WANT_PREFIX = "want."
# A mark that ended this long ago (nanoseconds) is removed by its reader: whoever still
# tries has marked again long since.
STALE_MARK = 1_000_000_000
# How many of its marks' paths a manager keeps, to remove them when it closes.
MOST_MARKS_KEPT = 1024
# A mark that ends further ahead than this (nanoseconds) was left before the host last
# booted (the monotonic clock began again): it is ignored.
MOST_AHEAD = 60_000_000_000
# How old, in nanoseconds, a directory's mtime must be for a listing of it to be kept:
# well past the kernel's clock tick (1-10 ms), so that any later change moves the mtime.
SETTLED = 50_000_000
# Keeps the FIFOs of two managers of one process apart: each is another process to
# the other, as tier 1 belongs to one manager.
_serials = itertools.count()


def sqlite_file(url: URL) -> str | None:
    """The database file of a SQLite URL, or ``None`` if it names none."""
    database = url.database
    if url.query.get("uri") == "true" and database and database.startswith("file:"):
        database = unquote(urlsplit(database).path)
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        return None
    return database


class _Fifo:
    """One FIFO of this process, shared by its pollers of one key."""

    __slots__ = ("path", "pid", "reader", "users", "writer")

    def __init__(self, path: str, reader: int, writer: int) -> None:
        self.path, self.pid, self.users = path, os.getpid(), 0
        self.reader = reader  # what pollers wait on
        self.writer = writer  # kept open so that reads never meet end-of-file

    def close(self) -> None:
        for fd in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                os.close(fd)


class FifoBells:
    """The FIFOs of one manager's table: ``doorbell`` for its pollers, ``notify`` once a
    row left, ``want`` for its tries, ``waiting`` for whether other processes poll or
    try a key."""

    @classmethod
    def for_url(cls, url: URL, table: str, counters: Counters) -> FifoBells | None:
        """The FIFOs beside the database file of SQLite ``url``; ``None`` if it names no
        file, or the system has no FIFOs (Windows): then pollers only sleep."""
        path = sqlite_file(url)
        if path is None or not hasattr(os, "mkfifo") or not hasattr(select, "poll"):
            return None
        return cls(path, table, counters)

    def __init__(self, database_path: str, table: str, counters: Counters) -> None:
        # One directory for every spelling of the path (relative, through a symlink).
        self._directory = os.path.realpath(database_path) + ".tierlock"
        self._table = table
        self._counters = counters
        self._fifos: dict[str, _Fifo] = {}
        self.forget()

    def forget(self) -> None:
        """Start afresh; in a forked child, close the inherited descriptors (else the
        parent's FIFOs would keep a reader after the parent died) and leave the files."""
        for fifo in self._fifos.values():
            fifo.close()
        self._mutex = threading.Lock()
        self._fifos = {}  # by digest
        self._names: set[str] = set()  # of this object's FIFOs, which it never rings
        self._serial = next(_serials)
        self._closed = False
        self._listed: tuple[int, list[str]] | None = None  # (mtime, names) of the directory
        self._marker = f"{os.getpid():08x}{self._serial:08x}".encode()  # who marks: us
        self._marked: set[str] = set()  # paths of this object's want marks

    def doorbell(self, key: str) -> Doorbell | None:
        """A doorbell for a poller of ``key``; ``None`` if no FIFO could be made (the
        directory is not writable, say), so the poller just sleeps."""
        digest = _digest(self._table, key)
        with self._mutex:
            if self._closed:
                return None
            fifo = self._fifos.get(digest)
            if fifo is None:
                try:
                    fifo = self._fifos[digest] = self._make(digest)
                except OSError as exc:
                    logger.debug("no FIFO for waking pollers of %r: %s", key, exc)
                    return None
                self._names.add(os.path.basename(fifo.path))
            fifo.users += 1
        return _Bell(self, digest, fifo)

    def notify(self, key: str) -> bool:
        """Wake the poller of ``key`` that has polled longest in another process (or
        manager): the next in line. The others keep to their pauses rather than race
        it with inserts, one of which would win at random (ZooKeeper's lock recipe
        likewise wakes only the next node). ``False``: nobody polls ``key``."""
        if not self._next_in_line(key, ring=True):
            return False
        self._counters.add("wakeups")
        return True

    def waiting(self, key: str) -> bool:
        """Whether a poller in another process (or manager) waits for ``key`` now, or a
        try of one marked it wanted (``want``) lately."""
        return self._wanted(key) or self._next_in_line(key, ring=False)

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` as wanted by this process for ``seconds`` (see the module
        docstring); a mark that cannot be written is only logged."""
        if self._closed:
            return
        path = self._want_path(key)
        until = time.monotonic_ns() + int(seconds * 1e9)
        mark = b"%016x" % until + self._marker  # (fixed length: rewritten in place)
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, MARK_MODE)
            except FileNotFoundError:
                os.makedirs(self._directory, DIRECTORY_MODE, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, MARK_MODE)
            try:
                os.pwrite(fd, mark, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            logger.debug("could not mark %r wanted: %s", key, exc)
            return
        with self._mutex:
            if len(self._marked) >= MOST_MARKS_KEPT:
                self._marked.clear()  # (their readers remove them once long past)
            self._marked.add(path)

    def close(self) -> None:
        """Remove this process's FIFOs and wake their pollers, which close the
        descriptors as they leave (closing them now could pull one from under a poll)."""
        with self._mutex:
            self._closed = True
            fifos = list(self._fifos.values())
            marked, self._marked = self._marked, set()
        for path in marked:  # (a mark another process wrote since is its own to keep)
            if _read_mark(path)[1] == self._marker:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.unlink(fifo.path)
            with contextlib.suppress(OSError):
                os.write(fifo.writer, b"\0")

    def _next_in_line(self, key: str, *, ring: bool) -> bool:
        """Find the oldest FIFO of ``key`` with a reader, removing those of dead
        processes on the way, and write a byte into it if ``ring``."""
        prefix = _digest(self._table, key) + "."
        try:  # microseconds, or one failed stat while nobody ever polled
            names = sorted(n for n in self._listing() if n.startswith(prefix))
        except OSError:
            return False
        for name in names:  # oldest first: the names begin with their creation time
            if name in self._names:
                continue
            path = os.path.join(self._directory, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no reader: its process died
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                continue
            try:
                if ring:
                    os.write(fd, b"\0")
            except OSError:  # full (its poller no longer reads) or just closed
                continue  # so the next one goes
            finally:
                os.close(fd)
            return True
        return False

    def _wanted(self, key: str) -> bool:
        """Whether another process (or manager) marked ``key`` wanted until a moment
        still to come; a mark long past is removed."""
        path = self._want_path(key)
        until, marker = _read_mark(path)
        if until is None or marker == self._marker:
            return False
        now = time.monotonic_ns()
        if now <= until <= now + MOST_AHEAD:
            return True
        if until < now - STALE_MARK:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return False

    def _want_path(self, key: str) -> str:
        return os.path.join(self._directory, WANT_PREFIX + _digest(self._table, key))

    def _listing(self) -> list[str]:
        """The directory's names, listed again only if it may have changed since: its
        mtime moved, or it was so recent when listed that a later change could bear
        the same one (the kernel stamps times at a clock tick). A release with nobody
        polling thus costs one stat, not a listing."""
        mtime = os.stat(self._directory).st_mtime_ns
        listed = self._listed
        if listed is not None and listed[0] == mtime:
            return listed[1]
        names = os.listdir(self._directory)
        settled = time.time_ns() - mtime > SETTLED
        self._listed = (mtime, names) if settled else None
        return names

    def _make(self, digest: str) -> _Fifo:
        name = f"{digest}.{time.monotonic_ns():016x}.{os.getpid()}.{self._serial}"
        staging = os.path.join(self._directory, "." + name)  # no digest prefix: unseen
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)  # left by a dead process that had our pid
        try:
            os.mkfifo(staging, FIFO_MODE)
        except FileNotFoundError:
            os.makedirs(self._directory, DIRECTORY_MODE, exist_ok=True)
            os.mkfifo(staging, FIFO_MODE)
        fifo = _Fifo(os.path.join(self._directory, name), -1, -1)
        try:
            fifo.reader = os.open(staging, os.O_RDONLY | os.O_NONBLOCK)
            fifo.writer = os.open(staging, os.O_WRONLY | os.O_NONBLOCK)
            os.rename(staging, fifo.path)  # published with its reader open
        except OSError:
            fifo.close()
            with contextlib.suppress(OSError):
                os.unlink(staging)
            raise
        return fifo

    def _leave(self, digest: str, fifo: _Fifo) -> None:
        """A poller is done with ``fifo``: the last one removes it."""
        with self._mutex:
            fifo.users -= 1
            if fifo.users or fifo.pid != os.getpid():  # (a forked child's is not its own)
                return
            if self._fifos.get(digest) is fifo:
                del self._fifos[digest]
            self._names.discard(os.path.basename(fifo.path))
            with contextlib.suppress(OSError):
                os.unlink(fifo.path)  # before the reader goes: see the module docstring
            fifo.close()


class _Bell(Doorbell):
    """One poller's doorbell: ``wait`` polls the FIFO, which a release elsewhere rings."""

    wakes_in_turn = True

    def __init__(self, bells: FifoBells, digest: str, fifo: _Fifo) -> None:
        super().__init__()
        self._bells, self._digest = bells, digest
        self._fifo: _Fifo | None = fifo
        self._poll = select.poll()  # one per poller: a poll object is not for two threads
        self._poll.register(fifo.reader, select.POLLIN)

    def arm(self) -> None:
        # A byte that came before this try is about a release the try will see.
        if self._fifo is not None:
            _drain(self._fifo.reader)

    def wait(self, seconds: float) -> bool:
        # close() writes into the FIFO too, so nothing else need cut the pause short.
        fifo = self._fifo
        if fifo is None or self._bells._closed or not self._poll.poll(max(seconds, 0) * 1e3):
            return False
        _drain(fifo.reader)
        return True

    def close(self) -> None:
        fifo, self._fifo = self._fifo, None
        if fifo is not None:
            self._poll.unregister(fifo.reader)
            self._bells._leave(self._digest, fifo)


def _digest(table: str, key: str) -> str:
    text = f"{table}\0{key}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=8).hexdigest()  # 16 characters


def _read_mark(path: str) -> tuple[int | None, bytes]:
    """A want mark's end (``None``: no mark, or none readable) and who wrote it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # (mostly: nobody ever tried the key)
        return None, b""
    try:
        mark = os.pread(fd, 64, 0)
    except OSError:
        return None, b""
    finally:
        os.close(fd)
    try:
        return int(mark[:16], 16), mark[16:]
    except ValueError:  # (written this moment, or not by us)
        return None, b""


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 256):
            pass
