"""Who may use what the engine makes in a lock directory.

A lock directory may be shared by several users: what the engine makes in it gets the
group's and others' permissions of the lock directory itself and its setgid bit
(``Modes``), whatever the umask, so that whoever comes first, the others can use it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

__all__ = ["Modes", "give"]

# What a filesystem without modes (FAT, some SMB mounts) answers a chmod: its mount
# options decide instead.
_NO_MODES = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


class Modes(NamedTuple):
    """The modes of what the engine makes in a lock directory: the group's and others'
    permissions of the lock directory (files without ``x``), so that every user who
    may use the directory may use what another user made there, and its setgid bit on
    directories, so that their files keep the directory's group. Never the sticky bit:
    a waiter must be able to delete a dead holder's file, whoever made it."""

    directory: int
    file: int

    @classmethod
    def of(cls, lock_directory: int) -> Modes:
        """The modes below a lock directory of mode ``lock_directory`` (``st_mode``)."""
        shared = stat.S_IMODE(lock_directory) & 0o077
        setgid = lock_directory & stat.S_ISGID
        return cls(0o700 | shared | setgid, 0o600 | (shared & 0o066))


def give(target: int | str, mode: int) -> None:
    """``chmod`` what this process just made, be it a descriptor or a path."""
    try:
        if isinstance(target, int):
            os.fchmod(target, mode)
        else:
            os.chmod(target, mode)
    except OSError as exc:
        if exc.errno not in _NO_MODES:
            raise
