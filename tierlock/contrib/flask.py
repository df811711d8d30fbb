"""Flask integration: the app's ``LockManager``, made on first use, and ``flask tierlock``.

::

    from tierlock.contrib.flask import TierLock

    locks = TierLock()

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config["TIERLOCK_URL"] = "postgresql+psycopg://app@db/app"
        locks.init_app(app)
        return app

    @locks.synchronized("user:{user_id}")   # the lock is taken at each call
    def pay(user_id: int, amount: int) -> None: ...

Settings, read by ``init_app``: ``TIERLOCK_URL`` (default: ``SQLALCHEMY_DATABASE_URI``),
``TIERLOCK_TABLE``, ``TIERLOCK_TTL``, ``TIERLOCK_OPTIONS``, a dict of the rest of
``LockManager``'s keyword options, and ``TIERLOCK_HOLD_UNTIL_COMMIT`` (below).
``app.extensions["tierlock"]`` is an :class:`AppLockManager` (see
``tierlock.contrib.lazy``): it has the manager's methods but makes the manager, and so
connects, only when first used, so that an app starts while its database is down and
a module can decorate functions at import. The manager is closed at interpreter exit.

With Flask-SQLAlchemy on the app, a lock released while the request's ``db.session``
has a transaction in progress (any query through it begins one) stays held until that
transaction commits or rolls back, ``db.session.remove()`` at the end of the request
included: otherwise the next holder would read what this one wrote but has not yet
committed, and overwrite it (``tierlock.contrib.sqlalchemy``). It is on unless
``TIERLOCK_HOLD_UNTIL_COMMIT`` is ``False``, for every exclusive lock of the app's
manager (read locks and semaphores release at once), whichever extension is set up
first: ``init_app`` watches ``db.session`` if Flask-SQLAlchemy is set up already, else
from the first app context pushed once it is (``db.session`` is used in app contexts
only).

Under gunicorn, each worker uses a manager of its own: one made in the master before
the fork (``--preload``) starts afresh in each worker, as every ``LockManager`` does.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import click
from flask import Flask, appcontext_pushed, current_app, has_app_context
from flask.cli import AppGroup
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from ..backends.basics import check_table_name
from ..base import DEFAULT_TABLE, DEFAULT_TTL
from ..errors import BackendError, LockError
from ..keys import KeyLike
from ..lock import Lock, flag, seconds
from ..manager import LockManager
from ..tier1.tiers import OnLost
from ..tools import admin
from ..urls import shown_url
from .lazy import LazyLockManager, synchronized_by
from .sqlalchemy import TransactionRule

__all__ = ["AppLockManager", "TierLock"]

F = TypeVar("F", bound=Callable[..., Any])

EXTENSION = "tierlock"
# LockManager's options that have settings of their own (engine: a URL is required).
RESERVED_OPTIONS = ("url", "engine", "table", "ttl")


class AppLockManager(LazyLockManager):
    """An app's manager, made from its settings at first use; ``url``, ``table`` and
    ``ttl`` are the settings' own, read without connecting. If making it fails
    (``BackendError``: the database is down), the next use tries again.

    :param rule: the transaction rule its manager follows (see the module); ``None``:
        releases are at once.
    """

    def __init__(
        self,
        url: str,
        *,
        table: str,
        ttl: float,
        options: Mapping[str, Any],
        rule: TransactionRule | None = None,
    ) -> None:
        super().__init__()
        self._url = url
        self._options = {"table": table, "ttl": ttl, **options}
        self._shown = shown_url(url)
        self._table, self._ttl = table, ttl
        self._rule = rule

    def _make(self) -> LockManager:
        manager = LockManager(self._url, **self._options)
        manager._release_rule = self._rule
        return manager

    @property
    def url(self) -> str:
        return self._shown

    @property
    def table(self) -> str:
        return self._table

    @property
    def ttl(self) -> float:
        return self._ttl


class TierLock:
    """The Flask extension: ``TierLock(app)``, or ``TierLock()`` then ``init_app(app)``.

    Its ``lock()`` and ``synchronized()`` use the manager of the app in context, or,
    outside any app context, of the one app it was set up for.
    """

    def __init__(self, app: Flask | None = None) -> None:
        self._managers: list[AppLockManager] = []
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the app's settings, put its lazy manager at ``app.extensions["tierlock"]``
        and add ``flask tierlock``; connects to nothing. With ``TIERLOCK_HOLD_UNTIL_COMMIT``
        (the default), the manager follows the transaction rule for Flask-SQLAlchemy's
        ``db.session``, whether it is set up before or after (see the module).

        :raises RuntimeError: neither ``TIERLOCK_URL`` nor ``SQLALCHEMY_DATABASE_URI``
            is set.
        :raises ValueError: a bad setting; the message names it.
        :raises TypeError: a setting of the wrong type; the message names it.
        """
        if EXTENSION in app.extensions:
            raise RuntimeError(f"tierlock is already set up for app {app.name!r}")
        config = app.config
        table = check_table_name(config.get("TIERLOCK_TABLE", DEFAULT_TABLE))
        ttl = seconds("TIERLOCK_TTL", config.get("TIERLOCK_TTL", DEFAULT_TTL))
        holding = flag("TIERLOCK_HOLD_UNTIL_COMMIT", config.get("TIERLOCK_HOLD_UNTIL_COMMIT", True))
        options = dict(config.get("TIERLOCK_OPTIONS") or {})
        for name in RESERVED_OPTIONS:
            if name in options:
                raise ValueError(
                    f"TIERLOCK_OPTIONS cannot set {name!r}; see TIERLOCK_{name.upper()}"
                )
        # Unknown options fail now rather than at the first request.
        inspect.signature(LockManager).bind_partial(**options)
        url = _database_url(app)
        rule = _hold_until_commit(app) if holding else None
        lazy = AppLockManager(url, table=table, ttl=ttl, options=options, rule=rule)
        app.extensions[EXTENSION] = lazy
        app.cli.add_command(cli)
        self._managers.append(lazy)

    @property
    def locks(self) -> AppLockManager:
        """The lazy manager of the app in context, or of the only app set up."""
        if has_app_context():
            try:
                return cast(AppLockManager, current_app.extensions[EXTENSION])
            except KeyError:
                raise RuntimeError(
                    f"tierlock is not set up for app {current_app.name!r}: call init_app(app)"
                ) from None
        if len(self._managers) == 1:
            return self._managers[0]
        if not self._managers:
            raise RuntimeError("tierlock is not set up for any app yet: call init_app(app)")
        raise RuntimeError(
            f"outside an application context, tierlock cannot tell which of its "
            f"{len(self._managers)} apps to use: push one with `with app.app_context():`"
        )

    def lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Lock:
        """``LockManager.lock`` on the app's manager."""
        return self.locks.lock(key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)

    def synchronized(
        self,
        key: str,
        *keys: str,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> Callable[[F], F]:
        """``LockManager.synchronized`` (several templates too), with the app's manager
        found at each call."""
        return synchronized_by(
            self, key, *keys, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost
        )

    def close(self) -> None:
        """Close the managers of every app set up (tests; exit does it by itself)."""
        for lazy in self._managers:
            lazy.close()


def _hold_until_commit(app: Flask) -> TransactionRule:
    """The transaction rule for Flask-SQLAlchemy's ``db.session``: it watches the
    session now if Flask-SQLAlchemy is set up, else from the first app context pushed
    once it is, before any use of the session there."""
    rule = TransactionRule(tasks=False)

    def watch(sender: Flask, **_: object) -> bool:
        db = app.extensions.get("sqlalchemy")
        if db is None:
            return False
        rule.watch(db.session)
        appcontext_pushed.disconnect(watch, app)
        return True

    if not watch(app):
        appcontext_pushed.connect(watch, app, weak=False)
    return rule


def _database_url(app: Flask) -> str:
    """``TIERLOCK_URL``, or else the app's SQLAlchemy database, as a string."""
    url: str | URL | None = app.config.get("TIERLOCK_URL")
    if url is None:
        url = app.config.get("SQLALCHEMY_DATABASE_URI")
        if url is None:
            raise RuntimeError(
                "tierlock needs a database: set TIERLOCK_URL (or SQLALCHEMY_DATABASE_URI, "
                "which it uses when TIERLOCK_URL is not set)"
            )
        parsed = make_url(url)
        path = parsed.database
        if parsed.get_backend_name() == "sqlite" and path and not os.path.isabs(path):
            # Flask-SQLAlchemy opens a relative SQLite path in the instance folder.
            parsed = parsed.set(database=os.path.join(app.instance_path, path))
        url = parsed
    if isinstance(url, URL):
        return url.render_as_string(hide_password=False)
    return url


# -- flask tierlock ls|release|reap ---------------------------------------------------


def _reported(command: Callable[..., None]) -> Callable[..., None]:
    """Turn the errors a user can cause or fix into one line on stderr, exit code 1."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except BackendError as exc:
            locks = _app_locks()
            raise admin.Failure(admin.failure(exc, table=locks.table, where=locks.url)) from exc
        except (LockError, ValueError, TypeError, SQLAlchemyError) as exc:
            raise admin.Failure(str(exc)) from exc

    return run


@click.group("tierlock", cls=AppGroup)
def cli() -> None:
    """The app's lock table: who holds what; release a key; delete expired rows.

    Exit codes: 0 success; 1 the database or the table failed; 2 bad usage.
    """
    # The commands say what they did; the library's warnings (a force-release, a reap)
    # would otherwise reach stderr through logging's last resort.
    library_logger = logging.getLogger("tierlock")
    if not library_logger.handlers:
        library_logger.addHandler(logging.NullHandler())


def _app_locks() -> AppLockManager:
    return cast(AppLockManager, current_app.extensions[EXTENSION])


@cli.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row, in a list.")
@_reported
def list_holders(as_json: bool) -> None:
    """List the lock table's rows: who holds what, and for how long (away from a
    terminal, one plain line per row)."""
    locks = _app_locks()
    holders = locks.holders()
    if as_json:
        click.echo(json.dumps([admin.holder_record(info) for info in holders], indent=2))
        return
    admin.show_holders(holders, table=locks.table, where=locks.url, out=sys.stdout)


@cli.command()
@click.argument("key")
@click.option("--force", is_flag=True, help="Really delete the row, whoever holds it.")
@_reported
def release(key: str, force: bool) -> None:
    """Delete KEY's lock row, whoever holds it."""
    if not force:
        raise click.UsageError(admin.FORCE_NEEDED.format(key=key))
    admin.console().print(admin.released(key, _app_locks().force_release(key)))


@cli.command()
@_reported
def reap() -> None:
    """Delete the rows whose lease has ended, now (the app's reaper also does, by itself)."""
    locks = _app_locks()
    admin.console().print(admin.reaped(locks.reap(), locks.table))
