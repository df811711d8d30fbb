"""The reaper's work in a lock directory: hold files whose lease has ended, the counter
files of keys left idle, the marks of pollers of keys nobody holds, and files whose
making a process did not finish."""

from __future__ import annotations

from .holdfile import Directory, milliseconds
from .names import COUNTER, HOLD, MAKING, WAITING

__all__ = ["COUNTER_LIFE", "MAKING_LIFE", "reap_ended"]

# How long a key's counter file outlives its last hold, in ms, before the reaper deletes
# it (so keys used once cost no file for good). The next number then comes from the file
# server's clock, above every earlier one unless the clock stepped back by more than
# the key was idle.
COUNTER_LIFE = 7 * 24 * 3600 * 1000
# A file being made is linked into place a few system calls later: one this old (ms)
# was left by a process that died or hung meanwhile.
MAKING_LIFE = 3600 * 1000


def reap_ended(files: Directory) -> int:
    """Delete every hold file whose lease has ended, each under its key's guard if it is
    still the file judged, the counters of keys idle for ``COUNTER_LIFE`` and the marks
    of keys nobody holds, and files left half made for ``MAKING_LIFE``; return how many
    holds went."""
    now = files.now()
    reaped = 0
    for entry in files.listing(HOLD):
        seen = files.peek(entry.path)
        if seen is None or seen.expires > now:
            continue
        with files.guard(entry.path[: -len(HOLD)] + COUNTER):
            if files.peek(entry.path) == seen and files.remove(entry.path):
                reaped += 1
    for entry in files.listing(COUNTER):
        if milliseconds(entry.stat().st_mtime_ns) + COUNTER_LIFE < now:
            with files.guard(entry.path):  # (the guard's holder may delete its file)
                if files.peek(entry.path[: -len(COUNTER)] + HOLD) is None:
                    files.remove(entry.path)
    for entry in files.listing(WAITING):
        if files.peek(entry.path[: -len(WAITING)] + HOLD) is None:
            files.remove(entry.path)  # (a hint: one lost costs a poller nothing)
    for entry in files.listing(prefix=MAKING):
        if milliseconds(entry.stat().st_mtime_ns) + MAKING_LIFE < now:
            files.remove(entry.path)
    return reaped
