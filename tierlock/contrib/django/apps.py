"""The app (label ``tierlock``): its migration creates the lock table, and its command
is ``manage.py tierlock``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created


class TierlockConfig(AppConfig):  # type: ignore[misc]
    name = "tierlock.contrib.django"
    label = "tierlock"
    verbose_name = "tierlock"

    def ready(self) -> None:
        connection_created.connect(_let_go_before_database_changes, dispatch_uid="tierlock")


def _let_go_before_database_changes(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Close the manager's connections when Django connects to the server without a
    database, which it does to create or drop one, the test database at the end of
    ``manage.py test`` above all: PostgreSQL refuses to drop a database that others
    are connected to. The next use makes a new manager."""
    if connection.alias == NO_DB_ALIAS:
        from . import locks

        locks.reset()
