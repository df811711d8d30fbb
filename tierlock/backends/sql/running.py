"""Running statements: compiled once, sent straight to the driver on a pooled
connection, with failures sorted and retried.

Every operation runs on a connection taken from the pool for that operation only, in
autocommit mode, so no connection is held between polls or while a thread waits
(semantic 7). A few connections whose last statement went well are kept checked out
between operations (``SPARE_CONNECTIONS``), which spares each operation the pool's
checkout and return; the first sign of a disconnect drops them all.

A failed statement is sorted into one of three kinds:

* contention (MariaDB deadlock 1213, lock wait timeout 1205 or failed auto-increment
  read 1467, PostgreSQL serialization failure or deadlock, SQLite busy): nothing was
  written; an exclusive acquire reports the key as taken and backs off, other
  operations retry until ``database_timeout`` runs out;
* connection trouble (a dropped or refused connection): the statement may or may not
  have taken effect, so the retry first checks by owner id what really happened
  (semantic 9), and after ``ATTEMPTS`` tries a ``BackendError`` is raised;
* anything else (a missing table, bad SQL): ``BackendError`` at once.

A statement cut short by an interrupt (a signal handler that raised) or by the driver's
own failure leaves its connection in an unknown state: it is closed, never pooled again,
and an owner id it may have written a row for stays in doubt (see ``Runner.doubts``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import PoolProxiedConnection

from ...errors import BackendError, LockError
from ...stats import Counters
from ..gate import Gate
from .columns import MYSQL_FAMILY
from .engine import (
    has_connected,
    is_contention,
    unreachable,
)
from .link import Link
from .queries import Query

if TYPE_CHECKING:
    from .watchdog import Watchdog

__all__ = ["SPARE_CONNECTIONS", "Runner", "Unshared"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Tries of one operation when the connection fails, and the pauses between them:
# enough to ride over a pool of connections that a server restart made stale.
ATTEMPTS = 4
RETRY_PAUSE = 0.05
# The longest pause between two tries of an operation that meets contention (SQLite's
# one writer), which is retried until ``database_timeout`` runs out.
LONGEST_RETRY_PAUSE = 0.5
# Connections kept checked out between operations, from an engine of tierlock's own
# (never from the caller's, whose pool other code shares): as many as the threads of a
# busy process that ask the database at once (one per key, in tier 1). They take
# 0.1-0.2x off an uncontended acquire + release (the pool's checkout and return).
SPARE_CONNECTIONS = 4

_CONTENTION, _CONNECTION, _FATAL = "contention", "connection", "fatal"


class Unshared(Exception):
    """A statement shared between threads failed (see ``Runner.once``): each of them
    goes its own way. ``unsure``: it may have taken effect."""

    def __init__(self, unsure: bool) -> None:
        super().__init__("unsure" if unsure else "nothing written")
        self.unsure = unsure


class Runner:
    """Runs attempts of operations on one engine's pooled connections; see the module
    docstring. Its ``gate`` counts operations under way (for close and fork)."""

    def __init__(
        self,
        engine: Engine,
        *,
        counters: Counters,
        timeout: float,
        commit: bool,
        watchdog: Watchdog | None,
        spares: int,
    ) -> None:
        """``spares``: how many connections to keep checked out between operations (none
        for the caller's engine)."""
        self.engine = engine
        self.counters = counters
        self.timeout = timeout
        # An engine of the caller's may not be in autocommit mode: commit each statement.
        self.commit = commit
        self.dialect = engine.dialect
        self.dialect_name = engine.dialect.name
        self.dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        # SQLite: take the write lock at once, not at the first write of the transaction.
        self.begin = Query(
            "BEGIN IMMEDIATE" if self.dialect_name == "sqlite" else "BEGIN", {}, None
        )
        self._watchdog = watchdog
        self.gate = Gate()
        # Owner ids whose insert or hand-off may have reached the server unconfirmed,
        # with the server sessions that carried it (see ``SQLBackend.discard``).
        self.doubts: dict[str, list[object]] = {}
        # Connections kept checked out between operations, last in first out.
        self._spare: list[Link] = []
        self._spares = spares
        # Each connection keeps one cursor for the next statement, unless it belongs to
        # the caller's pool, which other code shares.
        self.reuses_cursors = spares > 0

    def after_fork(self) -> None:
        """Start afresh in a forked child: another thread may have held the gate's own
        mutex at the fork, the parent resolves its own doubts, and the spare
        connections' sockets are the parent's."""
        self.gate = Gate(shut=self.gate.shut)
        self.doubts = {}
        self._spare = []

    def put_back(self, link: Link) -> None:
        """Keep ``link``, whose statements went well, for the next operation, or return
        its connection to the pool if enough are kept."""
        if len(self._spare) < self._spares:
            self._spare.append(link)
        else:
            link.give_back()

    def close(self) -> None:
        """Return the spare connections to the pool (no operation runs any more)."""
        spare, self._spare = self._spare, []
        for link in spare:
            link.give_back()

    def failure(
        self, exc: Exception, query: Query | None, connection: PoolProxiedConnection | None
    ) -> DBAPIError:
        """``exc`` from the driver as SQLAlchemy's exception, with the connection (and,
        as SQLAlchemy does, every connection opened before it) invalidated if it broke."""
        disconnect = connection is not None and self.dialect.is_disconnect(
            exc,  # type: ignore[arg-type]  # the driver's Error, as caught
            connection,
            None,
        )
        if disconnect:
            assert connection is not None
            self.engine.pool._invalidate(connection, exc)
            # The spare connections were opened before it, and the server may be gone.
            spare, self._spare = self._spare, []
            for stale in spare:
                stale.invalidate()
        wrapped = DBAPIError.instance(
            None if query is None else query.sql,
            None,
            exc,
            self.dbapi_error,
            connection_invalidated=disconnect,
            dialect=self.dialect,
        )
        assert isinstance(wrapped, DBAPIError)
        return wrapped

    def _kind(self, exc: DBAPIError) -> str:
        if exc.connection_invalidated:
            return _CONNECTION
        if is_contention(exc):
            return _CONTENTION
        # SQLite has no connection to lose: "no such table" is an OperationalError too.
        if isinstance(exc, OperationalError) and self.dialect_name != "sqlite":
            return _CONNECTION
        return _FATAL

    def message(self, what: str, exc: DBAPIError, tries: int = 1) -> str:
        """What a ``BackendError`` says of ``exc``, which ended ``tries`` of ``what``. A
        database out of reach (a server's connection error, or SQLite unable to open
        its file) reads the same on every database: see ``_unreachable``."""
        orig = exc.orig
        if (
            self._kind(exc) == _CONNECTION
            or getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_CANTOPEN
        ):
            return unreachable(exc, self.engine.url)
        after = f" after {tries} tries" if tries > 1 else ""
        return f"{what} failed{after}: {orig}"

    def run(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[Link, bool], T],
        on_contention: Callable[[], T] | None = None,
        *,
        owner: str | None = None,
    ) -> T:
        """Run ``attempt(link, uncertain)`` with retries, on a pooled connection each try.

        ``uncertain`` is True once an earlier try failed in a way that may have taken
        effect; ``on_contention`` gives the result for contention (else it is retried).
        ``owner``: the owner id whose row the operation may create or take; a try cut
        short after sending leaves it in doubt (see ``discard``), and an operation for
        an owner id in doubt starts uncertain. Raises only tierlock errors, apart from
        what interrupts it (``KeyboardInterrupt`` and the like).
        """
        gate = self.gate
        gate.enter()
        try:
            return self._tries(what, key, attempt, on_contention, owner)
        finally:
            gate.leave()

    def _tries(
        self,
        what: str,
        key: str | None,
        attempt: Callable[[Link, bool], T],
        on_contention: Callable[[], T] | None,
        owner: str | None,
    ) -> T:
        uncertain = owner is not None and owner in self.doubts
        last: DBAPIError | None = None
        give_up = time.monotonic() + self.timeout
        tries = 0
        while True:
            tries += 1
            link: Link | None = None
            try:
                link = self._link()
                return self._watched(link, attempt, uncertain)
            except DBAPIError as exc:
                kind = self._kind(exc)
                if kind == _FATAL:
                    raise BackendError(self.message(what, exc), key) from exc
                if kind == _CONTENTION and on_contention is not None and not uncertain:
                    # (Once uncertain, retry instead: the next try checks by owner id.)
                    self.counters.add("contention_retries")  # (a miss its caller may try again)
                    return on_contention()
                self._retrying(what, key, kind, exc)
                if kind == _CONNECTION:
                    if link is None and not has_connected(self.engine):
                        # The first connection failed: told at once, as a wrong address
                        # or password would be, not tried again for database_timeout.
                        raise BackendError(self.message(what, exc), key) from exc
                    self._doubt(owner, link)
                    uncertain = True
                last = exc
            except LockError:
                raise
            except Exception as exc:  # e.g. the pool timed out, or a driver's own failure
                self._doubt(owner, link)
                raise BackendError(f"{what} failed: {exc}", key) from exc
            except BaseException:
                self._doubt(owner, link)
                raise
            finally:
                if link is not None:
                    link.close()
            now = time.monotonic()
            if now >= give_up or (kind == _CONNECTION and tries >= ATTEMPTS):
                raise BackendError(self.message(what, last, tries), key) from last
            time.sleep(min(RETRY_PAUSE * tries, LONGEST_RETRY_PAUSE, give_up - now))

    def _retrying(self, what: str, key: str | None, kind: str, exc: DBAPIError) -> None:
        logger.debug("%s of %r hit %s, retrying: %s", what, key, kind, exc.orig)
        if kind == _CONTENTION:
            self.counters.add("contention_retries")

    def once(
        self, what: str, keys: int, attempt: Callable[[Link], T], owners: Sequence[str] = ()
    ) -> T:
        """One try of ``attempt`` (operation ``what`` of ``keys`` keys), not retried, for
        a statement that threads share (see ``combining``): a failure is ``Unshared``, after which
        each thread tries its own way; one that may have taken effect leaves ``owners``
        in doubt, as ``run`` does, so that their next try starts by checking. As in
        ``run``, a first connection that fails is a ``BackendError`` at once (not tried
        again by each thread); interrupts pass."""
        gate = self.gate
        try:
            gate.enter()
        except LockError as exc:  # (closed: each thread is told so its own way)
            raise Unshared(unsure=False) from exc
        link: Link | None = None
        try:
            link = self._link()
            return self._watched(link, lambda link, _: attempt(link), False)
        except DBAPIError as exc:
            kind = self._kind(exc)
            if kind == _CONNECTION and link is None and not has_connected(self.engine):
                raise BackendError(self.message(what, exc)) from exc
            logger.debug("%s of %d keys hit %s, each alone now: %s", what, keys, kind, exc.orig)
            unsure = kind == _CONNECTION
            if unsure:
                self._doubt_all(owners, link)
            raise Unshared(unsure) from exc
        except Exception as exc:  # (the pool timed out, or the driver failed its own way)
            self._doubt_all(owners, link)
            raise Unshared(unsure=True) from exc
        except BaseException:
            self._doubt_all(owners, link)
            raise
        finally:
            if link is not None:
                link.close()
            gate.leave()

    def _doubt_all(self, owners: Sequence[str], link: Link | None) -> None:
        for owner in owners:
            self._doubt(owner, link)

    def _watched(self, link: Link, attempt: Callable[[Link, bool], T], uncertain: bool) -> T:
        """``attempt`` on ``link``, cut off by the watchdog if the server does not answer."""
        if self._watchdog is None:
            return attempt(link, uncertain)
        with self._watchdog.watch(link.fileno()):
            return attempt(link, uncertain)

    def _link(self) -> Link:
        """A pooled connection for one try; the caller closes it."""
        try:
            link = self._spare.pop()
        except IndexError:
            try:
                connection = self.engine.raw_connection()
            except self.dbapi_error as exc:
                raise self.failure(exc, None, None) from exc
            try:
                link = Link(self, connection)  # (which opens the connection's cursor)
            except BaseException as exc:
                connection.invalidate()  # (not pooled again: its state is unknown)
                if isinstance(exc, self.dbapi_error):
                    raise self.failure(exc, None, None) from exc
                raise
        link.restore_busy_wait()
        return link

    def _doubt(self, owner: str | None, link: Link | None) -> None:
        """Record that a statement for ``owner`` may have reached the server on
        ``link`` without an answer."""
        if owner is not None and link is not None:
            self.doubts.setdefault(owner, []).append(link.session)

    def session_of(self, connection: PoolProxiedConnection) -> object:
        driver_connection = connection.dbapi_connection
        try:
            if self.dialect_name in MYSQL_FAMILY:
                return driver_connection.thread_id()  # type: ignore[union-attr]
            if self.dialect_name == "postgresql":
                return driver_connection.info.backend_pid  # type: ignore[union-attr]
        except Exception:  # already closed: the server saw its end
            pass
        return None
