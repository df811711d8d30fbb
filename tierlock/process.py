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

__all__ = ["host_identity", "is_gone", "own_start_time", "start_time"]

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


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; ``None`` if it does not
    exist, has exited (a zombie), or the system does not tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # "pid (command) state ppid ... starttime ...": the command may hold spaces and
    # parentheses, so fields are counted from the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


@functools.lru_cache(maxsize=1)
def _own_start_time(pid: int) -> int | None:
    return start_time(pid)


def own_start_time() -> int | None:
    """This process's start time (cached per pid, so a forked child reads its own)."""
    return _own_start_time(os.getpid())


def is_gone(host: str | None, pid: int | None, started: int | None) -> bool:
    """Whether the holder recorded as (``host``, ``pid``, ``started``) has surely exited:
    it ran on this host, and no process with that pid and start time exists now."""
    if host is None or pid is None or started is None or host != host_identity():
        return False
    return start_time(pid) != started
