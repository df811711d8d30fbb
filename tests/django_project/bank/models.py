from __future__ import annotations

from django.db import models


class Account(models.Model):  # type: ignore[misc]
    balance = models.IntegerField()


class Transfer(models.Model):  # type: ignore[misc]
    """One done transfer, written in the transfer's transaction: the ledger that each
    balance must agree with."""

    src = models.IntegerField()
    dst = models.IntegerField()
    amount = models.IntegerField()
