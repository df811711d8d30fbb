"""Wake-ups on ZooKeeper: a watch on the hold node, and marks of who else waits.

The one poller of a key in a process watches the key's hold node (``exists`` with a
watch, set before each try), so that the node's deletion wakes it at once; the pollers
of all processes are woken, and race for the key. A queue in which each poller watches
the one before it, as kazoo's Lock recipe does, would wake one process in turn, but
entering and leaving it costs two writes per turn: measured on a hot key (four
processes of four threads), it passed the key half as often, and no more fairly.

A process that wants a key marks it with an EPHEMERAL_SEQUENTIAL node
``<chroot>/T/#waiting/<encoded key>/<tag>-<sequence>`` from its poller's first miss
until ``LINGER`` seconds after its last poller stopped: long enough to span the turns of
a hot key, so that a process taking turns on it writes the mark once rather than at
every turn. A try without waiting that found the key held marks it so too, for the
time ``want`` is told. ``others_waiting`` answers from those marks, kept with a watch,
so that the hand-offs of a hot key inside a process ask the server only when another
process begins or stops wanting it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError, NotEmptyError

from ...memories import remember
from ...stats import Counters
from .. import Doorbell
from .nodes import Paths
from .session import UNCERTAIN, Session

__all__ = ["Waiting"]

logger = logging.getLogger(__name__)

# How long others_waiting (or a sweep) waits for one answer before it gives up on it.
ANSWER_LIMIT = 2.0
# How long a process's mark of a key stays after its last poller of the key stopped:
# well past a hot key's turn in the other processes (a few cohorts of milliseconds).
LINGER = 1.0
# For this long after this process first asks who waits for a key, no mark of another
# process counts as "cannot tell" rather than "nobody waits": processes that missed the
# key mark it a write later, which on a loaded server takes tens of milliseconds, while
# a cohort of this process's threads ends in a few. (Measured on a hot key in four
# processes on a loaded machine: without it, the first winner kept the key for 70-150
# ms, and its threads got twice the sections of the others'.)
FRESH = 0.25

Later = Callable[[Callable[[], bool], float], None]


class Waiting:
    """One backend's watches on hold nodes, its marks, and what it knows of others'."""

    def __init__(self, session: Session, paths: Paths, counters: Counters, later: Later) -> None:
        """``later(job, delay)``: run ``job`` in ``delay`` seconds, and again until it
        returns True (the backend's sweeper)."""
        self.session = session
        self.paths = paths
        self.counters = counters
        self.later = later
        self.forget()

    def forget(self) -> None:
        """Start afresh (a forked child marks and watches on its own)."""
        self.tag = secrets.token_hex(8)  # begins the names of this backend's marks
        self.closing = threading.Event()
        self._bells: weakref.WeakSet[_Bell] = weakref.WeakSet()
        self._mutex = threading.Lock()
        self._ringers: dict[str, _Ringer] = {}
        self._marks: dict[str, _Mark] = {}
        self._queues: dict[str, _Queue] = {}

    def doorbell(self, key: str) -> Doorbell:
        self._mark(key)
        bell = _Bell(self, key)
        self._bells.add(bell)
        return bell

    def wake_all(self) -> None:
        """Send every poller away (the backend is closing)."""
        self.closing.set()
        for bell in list(self._bells):
            bell.wake()

    # -- who waits -------------------------------------------------------------------

    def others_waiting(self, key: str) -> bool | None:
        """Whether another process (or manager) marks ``key``."""
        client = self.session.live_client()
        if client is None:
            return None
        queue = self._queues.get(key)
        if queue is None:
            queue = _Queue()
            remember(self._queues, key, queue)
        if queue.changed:
            # (the same callback again: kazoo keeps one per path, however often it is set)
            queue.changed = False
            path = self.paths.queue(key)
            try:
                names = self._ask(client.get_children_async(path, watch=queue.change))
            except NoNodeError:  # nobody marks it: watch for the first mark
                names = []
                if self._ask(client.exists_async(path, watch=queue.change)) is not None:
                    queue.changed = True  # (made just now: ask again next time)
            except (KazooException, *UNCERTAIN) as exc:
                logger.debug("could not tell who waits for %r: %s", key, exc)
                queue.changed = True
                return None
            mine = f"{self.tag}-"
            queue.others = any(not name.startswith(mine) for name in names)
        if not queue.others and time.monotonic() - queue.born < FRESH:
            return None
        return queue.others

    def _mark(self, key: str) -> None:
        """A poller of ``key`` begins: mark the key unless it is marked already."""
        client = self.session.live_client()
        session = self.session.session_id
        with self._mutex:
            mark = self._marks.get(key)
            if mark is None:
                # (forgotten marks' nodes go with the session, or stay marks)
                mark = _Mark()
                remember(self._marks, key, mark)
            mark.pollers += 1
            if client is None or (mark.request is not None and mark.session == session):
                return
            mark.session = session
            self.counters.add("statements")
            mark.request = client.create_async(
                f"{self.paths.queue(key)}/{self.tag}-",
                b"",
                ephemeral=True,
                sequence=True,
                makepath=True,
            )

    def want(self, key: str, seconds: float) -> None:
        """Mark ``key`` as a poller that stops at once would, for ``seconds`` (or for
        as long as a poller's mark lingers, if one marks it too). The request is sent,
        not waited for; a failure is only logged, for it costs only a turn."""
        try:
            self._mark(key)
        except Exception as exc:
            logger.debug("marking %r wanted failed: %s", key, exc)
        finally:
            self.unmark(key, seconds)

    def unmark(self, key: str, linger: float = LINGER) -> None:
        """A poller of ``key`` stops: remove the mark once no other began for
        ``linger`` seconds (and none that lingers longer stopped meanwhile)."""
        with self._mutex:
            mark = self._marks.get(key)
            if mark is None:
                return
            mark.pollers -= 1
            if mark.pollers:
                return
            mark.until = max(mark.until, time.monotonic() + linger)
        self.later(lambda: self._expire(key, mark), linger)

    def _expire(self, key: str, mark: _Mark) -> bool:
        with self._mutex:
            if mark.pollers or self._marks.get(key) is not mark:
                return True  # (a poller began again)
            if time.monotonic() < mark.until:
                return True  # (one that began and stopped since expires it later)
            del self._marks[key]
        if mark.request is None or mark.session != self.session.session_id:
            return True  # (a mark of a session that ended is gone with it)
        try:
            path: str = mark.request.get(timeout=ANSWER_LIMIT)
        except (KazooException, *UNCERTAIN) as exc:
            logger.debug("a mark of %r may stay until the session ends: %s", key, exc)
            return True
        self.later(lambda: self._remove(path, mark.session), 0.0)
        return True

    def _remove(self, path: str, session: int | None) -> bool:
        """Delete the mark ``path`` (and its queue, if that leaves it empty)."""
        client = self.session.live_client()
        if session != self.session.session_id:
            return True
        if client is None:
            return False
        self.counters.add("statements", 2)
        deleted = client.delete_async(path)
        client.delete_async(path.rpartition("/")[0]).rawlink(_ignore_refusal)  # (sent after)
        try:
            self._ask(deleted, counted=True)
        except NoNodeError:
            pass
        except (KazooException, *UNCERTAIN):
            return False
        return True

    def _ask(self, request: Any, *, counted: bool = False) -> Any:
        """The answer to a request just sent, within ``ANSWER_LIMIT``."""
        if not counted:
            self.counters.add("statements")
        return request.get(timeout=ANSWER_LIMIT)

    # -- watches -----------------------------------------------------------------------

    def watch(self, client: Any, path: str, rung: threading.Event) -> None:
        """Set ``rung`` at the next change of node ``path`` (or of the connection); a
        request that fails sets it at once."""
        with self._mutex:
            ringer = self._ringers.get(path)
            if ringer is None:
                ringer = self._ringers[path] = _Ringer(self, path)
            ringer.bells.add(rung)
        self.counters.add("statements")
        request = client.exists_async(path, watch=ringer)
        request.rawlink(lambda done: None if done.successful() else rung.set())

    def unwatch(self, path: str, rung: threading.Event) -> None:
        with self._mutex:
            ringer = self._ringers.get(path)
            if ringer is not None:
                ringer.bells.discard(rung)

    def rang(self, ringer: _Ringer) -> None:
        with self._mutex:
            if self._ringers.get(ringer.path) is ringer:
                del self._ringers[ringer.path]
            bells, ringer.bells = ringer.bells, set()
        for rung in bells:
            rung.set()


class _Mark:
    """This backend's mark of one key: how many of its pollers want the key, and the
    request that made the mark, in which session."""

    __slots__ = ("pollers", "request", "session", "until")

    def __init__(self) -> None:
        self.pollers = 0
        self.request: Any = None
        self.session: int | None = None
        self.until = 0.0  # when it may go, with no poller left (time.monotonic())


class _Queue:
    """What the marks of one key told, until a watch says they changed."""

    __slots__ = ("born", "changed", "others")

    def __init__(self) -> None:
        self.born = time.monotonic()
        self.changed = True  # (nothing told yet)
        self.others = False

    def change(self, event: object) -> None:
        self.changed = True


class _Ringer:
    """The one watch of a backend on one node: it rings every doorbell armed on it.
    kazoo keeps each callback set on a path until the next change, so one per path
    keeps pollers that come and go without one from growing its memory."""

    __slots__ = ("bells", "path", "waiting")

    def __init__(self, waiting: Waiting, path: str) -> None:
        self.waiting = waiting
        self.path = path
        self.bells: set[threading.Event] = set()

    def __call__(self, event: object) -> None:  # (a kazoo watch: its callback thread)
        self.waiting.rang(self)


class _Bell(Doorbell):
    """One poller's watch on its key's hold node."""

    def __init__(self, waiting: Waiting, key: str) -> None:
        super().__init__(waiting.closing)
        self._waiting = waiting
        self._key = key
        self._hold = waiting.paths.hold(key)
        self._armed = False  # a watch is set that has not fired
        self._rung = threading.Event()
        self._closed = False

    def arm(self) -> None:
        # The watch is set before the try that follows is sent (kazoo sends in order),
        # and costs the try no round trip.
        if self._armed or self._waiting.closing.is_set():
            return
        client = self._waiting.session.live_client()
        if client is None:
            return  # (then wait() sleeps; the try will meet the trouble)
        self._rung.clear()
        self._waiting.watch(client, self._hold, self._rung)
        self._armed = True

    def wake(self) -> None:
        self._rung.set()

    def wait(self, seconds: float) -> bool:
        if not self._armed:
            self.arm()
        if not self._armed:
            return super().wait(seconds)
        rung = self._rung.wait(seconds)
        if rung:
            self._armed = False
        return rung and not self._waiting.closing.is_set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._waiting.unwatch(self._hold, self._rung)
            self._waiting.unmark(self._key)


def _ignore_refusal(request: Any) -> None:
    """(Deleting a queue that others still mark fails, as it should.)"""
    if not request.successful() and not isinstance(request.exception, (NotEmptyError, NoNodeError)):
        logger.debug("removing a queue failed: %s", request.exception)
