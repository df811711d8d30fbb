"""``locks``: the process's manager, made on first use from Django's settings."""

from __future__ import annotations

from collections.abc import Hashable

from ...keys import KeyLike
from ...manager import LockManager
from ...tier1.tiers import OnLost
from ..lazy import LazyLockManager
from . import conf
from .schema import open_manager
from .transactions import TransactionLock

__all__ = ["SettingsLockManager"]


class SettingsLockManager(LazyLockManager):
    """Behaves as the process's :class:`tierlock.LockManager`, made from Django's
    settings at first use (see ``tierlock.contrib.lazy``).

    It is made again, and the old one closed, when the settings it was made from
    change: Django's test runner points ``DATABASES`` at the test database after the
    project's modules are imported, and ``override_settings`` may change ``TIERLOCK``.
    ``lock()``, ``lock_all()`` and ``synchronized()`` follow the transaction rule (see
    ``transactions``): the last two take their keys through ``lock()``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._target: conf.Target | None = None  # what the manager was made for

    def _wanted(self) -> Hashable:
        return conf.snapshot()

    def _make(self) -> LockManager:
        target = conf.resolve()
        made = self.made
        if made is not None and target == self._target:  # (some other setting changed)
            return made
        self._target = target
        return open_manager(target)

    def lock(
        self,
        key: KeyLike,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> TransactionLock:
        """:meth:`LockManager.lock`, whose release waits for the transaction's end."""
        manager = self.manager
        manager._tiers.check_open()
        return TransactionLock(manager, key, ttl=ttl, timeout=timeout, renew=renew, on_lost=on_lost)
