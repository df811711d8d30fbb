"""tierlock: a two-tier distributed lock.

Threads of one process queue for a key in memory (tier 1); the one at the head takes
the key by inserting a row into a SQL table (tier 2), whose lease, owner id and
fencing token keep the lock safe across processes and hosts.
"""

from .errors import BackendError, LockError, LockLostError, LockTimeout, NotHeldError
from .keys import MAX_KEY_LENGTH
from .lock import Lock
from .manager import LockManager
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
    "NotHeldError",
    "__version__",
]

__version__ = "0.1.0"
