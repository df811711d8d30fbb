"""Everything tierlock raises, under one base.

::

    LockError                  base of every tierlock error; has .key
     +-- LockTimeout           also TimeoutError: the wait ran out
     +-- NotHeldError          also RuntimeError: release/extend without a hold
     +-- LockLostError         the row is no longer ours at release/extend
     +-- BackendError          the database failed after retries; __cause__ is the driver error
     +-- MissingDriverError    also ImportError: a URL's driver is missing; says what to install
     +-- PartialRenewal        (internal) a renewal reached only some of the store's nodes

Bad arguments raise the builtin ``ValueError`` or ``TypeError`` instead.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "LockError",
    "LockLostError",
    "LockTimeout",
    "MissingDriverError",
    "NotHeldError",
]


class LockError(Exception):
    """Base of every error tierlock raises."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*self.args), which would lose ``key`` and break
        # subclasses whose __init__ takes other arguments; errors cross processes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[LockError], args: tuple[Any, ...], state: dict[str, Any]) -> LockError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class LockTimeout(LockError, TimeoutError):
    """The lock was not acquired within ``timeout`` seconds."""

    def __init__(self, key: str, timeout: float) -> None:
        super().__init__(f"lock {key!r} not acquired within {timeout:g} s", key)
        self.timeout = timeout


class NotHeldError(LockError, RuntimeError):
    """The calling thread does not hold the lock it tried to release or extend."""

    def __init__(self, key: str) -> None:
        super().__init__(f"cannot release or extend un-acquired lock {key!r}", key)


class LockLostError(LockError):
    """The hold's row is gone or belongs to someone else: its lease ran out and it
    was reaped or taken over, or an administrator force-released it."""

    def __init__(self, key: str, token: int | None = None) -> None:
        super().__init__(
            f"lock {key!r} (token {token}) was lost: its row was reaped, taken over "
            "or force-released",
            key,
        )
        self.token = token


#: How a ``BackendError`` begins on every engine when the server is out of reach: the
#: same words everywhere, for people and log searches.
UNREACHABLE = "cannot reach the database: "


class BackendError(LockError):
    """The database failed and retrying did not help; the driver error is chained."""


class MissingDriverError(LockError, ImportError):
    """The client library of a URL's engine, or the driver of its SQL database, cannot
    be imported; the message says what to install, e.g. ``pip install "tierlock[redis]"``.
    Also an ``ImportError`` whose ``name`` is that library's module.

    :param scheme: the URL's scheme, as the user wrote it (``"mysql"``).
    :param module: what it needs (``"pymysql"``).
    :param fix: how to get it.
    :param reason: why the import failed, if not because the module is not installed.
    """

    def __init__(self, scheme: str, module: str, fix: str, reason: str | None = None) -> None:
        problem = "is not installed" if reason is None else f"cannot be imported ({reason})"
        super().__init__(f"{scheme}:// URLs need the {module} package, which {problem}: {fix}")
        self.scheme = scheme
        self.name = module
        self.fix = fix
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # ImportError keeps ``name`` outside __dict__, where LockError's pickling looks.
        return (type(self), (self.scheme, self.name, self.fix, self.reason))


class PartialRenewal(LockError):
    """A renewal reached only part of the store (some nodes of a cluster): the holds in
    ``renewed`` were renewed, and those in ``unreached`` (owner ids) may or may not
    have been; none of them is known lost. Raised by ``LockBackend.renew`` only."""

    def __init__(self, message: str, renewed: set[str], unreached: set[str]) -> None:
        super().__init__(message)
        self.renewed = renewed
        self.unreached = unreached
