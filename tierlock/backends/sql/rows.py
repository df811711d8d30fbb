"""Rows read back as ``LockInfo``, and the parameters of statements that list rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ...records import LockInfo
from .table import fencing_token

__all__ = ["listed_params", "row_info"]


def _utc(value: datetime | str) -> datetime:
    # PostgreSQL returns aware datetimes in the session's zone, MySQL naive ones and
    # SQLite text; the naive ones hold UTC because only UTC is ever stored.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def row_info(row: dict[str, Any]) -> LockInfo:
    return LockInfo(
        key=row["lock_key"],
        token=fencing_token(row["token"], row["handoffs"]),
        owner=row["owner_id"],
        host=row["host"],
        pid=row["pid"],
        thread_id=row["thread_id"],
        thread_name=row["thread_name"],
        acquired_at=_utc(row["acquired_at"]),
        expires_at=_utc(row["expires_at"]),
        expired=bool(row["expired"]),
        lease=row["lease"],
        host_id=row["host_id"],
        process_start=row["proc_start"],
    )


def listed_params(holds: Sequence[tuple[str, str]], size: int) -> dict[str, str]:
    """Parameters of a listed statement with ``size`` places (see ``Statements``)."""
    params = {f"k{index}": "" for index in range(len(holds), size)}
    params.update({f"o{index}": "" for index in range(len(holds), size)})
    for index, (key, owner) in enumerate(holds):
        params[f"k{index}"] = key
        params[f"o{index}"] = owner
    return params
