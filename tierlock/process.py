"""Who a holder process is, precisely enough to prove it is gone.

A row records its holder's host identity, pid and process start time, so that a waiter
on the same host can take the row over at once instead of waiting for the lease, but
only on proof that the holder has exited. The host identity is ``"<boot id>/<pid
namespace>/<time namespace>"``: the boot id is new at every boot, the pid namespace says
whose numbering the pid is in, and the time namespace whose clock read the start time
(``/proc`` shifts start times by the time namespace of the process that *reads* them).
Where ``/proc`` is missing there is no identity, and rows are only freed by their leases.

For a holder of this boot and pid namespace, these alone are proof:

- no process has its pid: ``/proc/<pid>`` is missing *and* ``kill(pid, 0)`` finds no such
  process (``/proc`` mounted with ``hidepid`` hides other users' live processes, which
  ``kill`` still sees);
- the process with its pid has exited: a zombie with no thread left (a main thread that
  ended while other threads run leaves a zombie leader of a live process);
- the process with its pid started at another time than the row says (the pid was
  reused), when the holder was in this time namespace too.

Anything else proves nothing, and the row waits for its lease: an unreadable ``/proc``,
another host or namespace, an unknown start time. A row of an older version, whose
identity has no time namespace, gets the first two proofs only.
"""

from __future__ import annotations

import functools
import os

__all__ = ["Unknown", "host_identity", "is_gone", "own_start_time", "start_time"]

BOOT_ID = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"
TIME_NAMESPACE = "/proc/self/ns/time"
# The time namespace of a kernel without them: the same for every process of its boot.
NO_TIME_NAMESPACES = "-"


@functools.cache
def host_identity() -> str | None:
    """``"<boot id>/<pid namespace>/<time namespace>"`` (at most 58 characters: the
    ``host_id`` column holds 64), or ``None`` where the system does not tell."""
    try:
        with open(BOOT_ID, encoding="ascii") as file:
            boot = file.read().strip()
        pids = os.stat(PID_NAMESPACE).st_ino
    except OSError:
        return None
    try:
        clocks = str(os.stat(TIME_NAMESPACE).st_ino)
    except FileNotFoundError:
        clocks = NO_TIME_NAMESPACES
    except OSError:
        return None
    return f"{boot}/{pids}/{clocks}"


# Worked out again in a child: one forked after its parent made a time namespace (for
# its children) is born into that one.
os.register_at_fork(after_in_child=host_identity.cache_clear)


class Unknown(Exception):
    """The system could not tell about a process (no ``/proc``, or a read failed)."""


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot as this process's time
    namespace sees it; ``None`` if surely no process has that pid, or it has exited (a
    zombie with no thread left). Raises :class:`Unknown` when the system cannot tell: a
    failed read (too many open files, say) proves nothing about the process, and neither
    does a missing ``/proc/<pid>`` while ``kill`` still finds the pid (``hidepid``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except (FileNotFoundError, ProcessLookupError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # (it exists, and belongs to another user)
        raise Unknown(f"/proc/{pid} is hidden from this process") from None
    except OSError as exc:
        raise Unknown(str(exc)) from exc
    # "pid (command) state ppid ... num_threads ... starttime ...": the command may hold
    # spaces and parentheses, so fields are counted from the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        raise Unknown(f"/proc/{pid}/stat is not what it should be")
    # A zombie leader counts itself among its threads until it is reaped: more than one
    # means that threads of the process still run.
    if fields[0] in (b"Z", b"X") and int(fields[17]) <= 1:
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
    """Whether the holder recorded as (``host``, ``pid``, ``started``) has surely exited,
    by the proofs in the module's docstring."""
    here = host_identity()
    if here is None or host is None or pid is None or started is None or pid < 1:
        return False  # (kill() takes a pid below 1 for a process group)
    if host.split("/")[:2] != here.split("/")[:2]:
        return False  # another boot or pid namespace: its pids are not ours to look up
    try:
        now = start_time(pid)
    except Unknown:
        return False
    # Two time namespaces read two different start times of one process.
    return now is None or (host == here and now != started)
