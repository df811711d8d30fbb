"""tierlock for asyncio: locks owned by tasks, with the same table and rows as
``tierlock.LockManager``::

    from tierlock.aio import AsyncLockManager

    async with AsyncLockManager("sqlite:///tierlock.db") as locks:
        async with locks.lock("user:42", timeout=5):
            ...
        async with locks.lock_all(["user:1", "user:2"], timeout=5):
            ...
"""

from .handles import AsyncLock, AsyncReadLock, AsyncSemaphore
from .manager import AsyncLockManager, AsyncOnLost
from .multi import AsyncMultiLock

__all__ = [
    "AsyncLock",
    "AsyncLockManager",
    "AsyncMultiLock",
    "AsyncOnLost",
    "AsyncReadLock",
    "AsyncSemaphore",
]
