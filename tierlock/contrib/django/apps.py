"""The app (label ``tierlock``): its migration creates the lock table, every ``migrate``
of that table's database creates it again if it is missing (``TABLE`` changed, or the
table dropped), and its command is ``manage.py tierlock``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate, pre_migrate

from .schema import check_before_migrate, create_missing_table


class TierlockConfig(AppConfig):  # type: ignore[misc]
    name = "tierlock.contrib.django"
    label = "tierlock"
    verbose_name = "tierlock"

    def ready(self) -> None:
        connection_created.connect(_let_go_before_database_changes, dispatch_uid="tierlock")
        pre_migrate.connect(check_before_migrate, sender=self, dispatch_uid="tierlock")
        post_migrate.connect(create_missing_table, sender=self, dispatch_uid="tierlock")


def _let_go_before_database_changes(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Close the manager's connections when Django connects to the server without a
    database, which it does to create or drop one, the test database at the end of
    ``manage.py test`` above all: PostgreSQL refuses to drop a database that others
    are connected to. The next use makes a new manager."""
    if connection.alias == NO_DB_ALIAS:
        from . import locks

        locks.reset()
