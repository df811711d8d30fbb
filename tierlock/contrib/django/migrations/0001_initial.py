"""The lock table, created as ``LockManager(create_table=True)`` creates it (see
``tierlock.contrib.django.schema``); its name is ``TIERLOCK["TABLE"]`` at migrate time."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from ..schema import CreateLockTable


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [CreateLockTable()]
