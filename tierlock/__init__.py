"""tierlock: a two-tier distributed lock.

Threads of one process queue for a key in memory (tier 1); the one at the head takes
the key by inserting a row into a SQL table (tier 2), whose lease, owner id and
fencing token keep the lock safe across processes and hosts.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .errors import (
        BackendError,
        LockError,
        LockLostError,
        LockTimeout,
        MissingDriverError,
        NotHeldError,
    )
    from .handles import ReadLock, Semaphore
    from .keys import MAX_KEY_LENGTH
    from .lock import Lock
    from .manager import LockManager
    from .multi import MultiLock
    from .records import LockInfo
    from .stats import LockStats

__all__ = [
    "MAX_KEY_LENGTH",
    "BackendError",
    "Lock",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockManager",
    "LockStats",
    "LockTimeout",
    "MissingDriverError",
    "MultiLock",
    "NotHeldError",
    "ReadLock",
    "Semaphore",
    "__version__",
]

__version__ = "0.1.0"

# Where each public name lives. They are imported on first use, so that importing the
# package alone, as pytest does for the plugin in every run, loads no database code.
_HOMES = {
    "BackendError": "errors",
    "LockError": "errors",
    "LockLostError": "errors",
    "LockTimeout": "errors",
    "MissingDriverError": "errors",
    "NotHeldError": "errors",
    "MAX_KEY_LENGTH": "keys",
    "Lock": "lock",
    "LockManager": "manager",
    "MultiLock": "multi",
    "LockInfo": "records",
    "ReadLock": "handles",
    "Semaphore": "handles",
    "LockStats": "stats",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
