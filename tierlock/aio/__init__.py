"""tierlock for asyncio: locks owned by tasks, with the same table and rows as
``tierlock.LockManager``::

    from tierlock.aio import AsyncLockManager

    async with AsyncLockManager("sqlite:///tierlock.db") as locks:
        async with locks.lock("user:42", timeout=5):
            ...
"""

from .handles import AsyncLock, AsyncReadLock, AsyncSemaphore
from .manager import AsyncLockManager, AsyncOnLost

__all__ = ["AsyncLock", "AsyncLockManager", "AsyncOnLost", "AsyncReadLock", "AsyncSemaphore"]
