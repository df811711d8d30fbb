"""Django integration: ``INSTALLED_APPS += ["tierlock.contrib.django"]``, then::

    from tierlock.contrib.django import locks, synchronized

    @synchronized("account:{account_id}")
    def withdraw(account_id: int, amount: int) -> None: ...

``locks`` behaves as the process's :class:`tierlock.LockManager`, made on first use
from ``settings.TIERLOCK`` (``DATABASE``: an alias of ``DATABASES``, ``"default"``
unless given, or ``URL``; ``TABLE``, ``TTL``, ``RENEW``, ``REAPER_INTERVAL``,
``POLL_INTERVAL``, ``DATABASE_TIMEOUT``; ``CREATE_TABLE``, ``False`` unless given, as
``manage.py migrate`` creates the table, and again after a change). It follows the
test database, survives forks (gunicorn, uwsgi: a child starts afresh) and is closed
at exit; importing this package or code that uses it never connects.
``synchronized`` is ``locks.synchronized``.

A lock released inside ``transaction.atomic()`` (``ATOMIC_REQUESTS`` included) is held
until the thread's outermost atomic block commits or rolls back (``transactions``).
Where the locks live, SQLite's file of their own included, is said in ``conf``; the
migration, what every ``migrate`` makes sure of and the table check in ``schema``;
``manage.py tierlock`` in ``management/commands/tierlock.py``.
"""

from __future__ import annotations

from .proxy import SettingsLockManager
from .schema import LockTableError
from .transactions import TransactionLock

__all__ = ["LockTableError", "SettingsLockManager", "TransactionLock", "locks", "synchronized"]

locks = SettingsLockManager()
synchronized = locks.synchronized
