"""Rows read back as ``LockInfo``, and the parameters of statements that list rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ...keys import user_key
from ...records import LockInfo, Owner
from ..basics import fencing_token
from .layout import GROUP, PERMIT, SHARED

# What LockInfo.mode says of a row's mode: a group row stands for shared holds.
MODES = {None: "exclusive", GROUP: "shared", SHARED: "shared", PERMIT: "permit"}

__all__ = ["insert_params", "listed_params", "row_info"]


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
        key=user_key(row["lock_key"]),
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
        mode=MODES[row["mode"]],
    )


def insert_params(owner: Owner, ttl: float, lease: float | None) -> dict[str, Any]:
    """The parameters of an insert of an exclusive hold for ``owner`` (``key`` apart)."""
    return {
        "owner": owner.owner_id,
        "host_name": owner.host,
        "host_identity": owner.host_id,
        "proc": owner.pid,
        "proc_started": owner.proc_start,
        "thread": owner.thread_id,
        "thread_label": owner.thread_name,
        "ttl": ttl,
        "lease": lease,
        "mode": None,
        "members": None,
        "permits": None,
        "parent": None,
    }


def listed_params(
    holds: Sequence[tuple[str, str]], size: int, groups: Sequence[str] | None = None
) -> dict[str, str]:
    """Parameters of a listed statement with ``size`` places (see ``Statements``), and
    of the group keys ``g0``, ``g1``, ... if ``groups`` is given."""
    params = {f"k{index}": "" for index in range(len(holds), size)}
    params.update({f"o{index}": "" for index in range(len(holds), size)})
    for index, (key, owner) in enumerate(holds):
        params[f"k{index}"] = key
        params[f"o{index}"] = owner
    if groups is not None:
        params.update({f"g{index}": "" for index in range(len(groups), size)})
        params.update({f"g{index}": group for index, group in enumerate(groups)})
    return params
