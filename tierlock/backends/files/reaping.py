"""The reaper's work in a lock directory: hold files whose lease has ended, the counter
files of keys left idle, and the marks of pollers of keys nobody holds."""

from __future__ import annotations

from .holdfile import Directory, milliseconds
from .names import COUNTER, HOLD, WAITING

__all__ = ["COUNTER_LIFE", "reap_ended"]

# How long a key's counter file outlives its last hold, in ms, before the reaper deletes
# it (so keys used once cost no file for good). The next number then comes from the file
# server's clock, above every earlier one unless the clock stepped back by more than
# the key was idle.
COUNTER_LIFE = 7 * 24 * 3600 * 1000


def reap_ended(files: Directory) -> int:
    """Delete every hold file whose lease has ended, each under its key's guard if it is
    still the file judged, the counters of keys idle for ``COUNTER_LIFE`` and the marks
    of keys nobody holds; return how many holds went."""
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
    return reaped
