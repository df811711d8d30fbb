"""Who a holder process is, precisely enough to prove it is gone.

A row records its holder's host identity, pid and process start time. A waiter on the
same host can then tell, from ``/proc``, that the holder has exited (or that its pid now
belongs to a younger process) and take the row over at once instead of waiting for the
lease. The host identity is the kernel's boot id (new at every boot) and the pid
namespace (so containers that share a host name never judge each other's pids); where
``/proc`` is missing, there is no identity and rows are only ever freed by their leases.
"""

from __future__ import annotations

import functools
import os

__all__ = ["Unknown", "host_identity", "is_gone", "own_start_time", "start_time"]

BOOT_ID = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"


@functools.cache
def host_identity() -> str | None:
    """``"<boot id>/<pid namespace>"``, or ``None`` where the system does not tell."""
    try:
        with open(BOOT_ID, encoding="ascii") as file:
            boot = file.read().strip()
        namespace = os.stat(PID_NAMESPACE).st_ino
    except OSError:
        return None
    return f"{boot}/{namespace}"


class Unknown(Exception):
    """The system could not tell about a process (no ``/proc``, or a read failed)."""


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; ``None`` if it does not
    exist or has exited (a zombie). Raises :class:`Unknown` when the system cannot tell:
    a failed read (too many open files, say) proves nothing about the process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise Unknown(str(exc)) from exc
    # "pid (command) state ppid ... starttime ...": the command may hold spaces and
    # parentheses, so fields are counted from the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        raise Unknown(f"/proc/{pid}/stat is not what it should be")
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


@functools.lru_cache(maxsize=1)
def _own_start_time(pid: int) -> int | None:
    try:
        return start_time(pid)
    except Unknown:
        return None  # (then this process's rows are freed by their leases only)


def own_start_time() -> int | None:
    """This process's start time (cached per pid, so a forked child reads its own)."""
    return _own_start_time(os.getpid())


def is_gone(host: str | None, pid: int | None, started: int | None) -> bool:
    """Whether the holder recorded as (``host``, ``pid``, ``started``) has surely exited:
    it ran on this host, and no process with that pid and start time exists now."""
    if host is None or pid is None or started is None or host != host_identity():
        return False
    try:
        return start_time(pid) != started
    except Unknown:
        return False
