"""The check that a lock excluded: shared counters that lose updates when sections overlap."""

from __future__ import annotations

import ctypes
import multiprocessing
import time

CTX = multiprocessing.get_context("fork")


class Tally:
    """Per key, a counter bumped by an unprotected read-modify-write, and who is inside.

    A critical section reads the key's counter, busy-waits, and writes it back plus one,
    so two sections of a key that overlap lose an update: at the end the counters add up
    to fewer than the sections run. A section also marks the key as occupied and looks
    for someone else's mark, which catches an overlap in the act. Nothing guards either
    with a mutex, so the check adds no synchronisation that could hide a broken lock.
    """

    def __init__(self, keys: int) -> None:
        self.counters = CTX.RawArray(ctypes.c_longlong, keys)
        self.occupants = CTX.RawArray(ctypes.c_longlong, keys)

    def section(self, index: int, me: int, seconds: float) -> bool:
        """One critical section of ``seconds`` on key ``index`` by thread number ``me`` > 0.

        :returns: whether another thread was seen inside the same key's section.
        """
        clock = time.perf_counter
        occupants, counters = self.occupants, self.counters
        overlapped = occupants[index] != 0
        occupants[index] = me
        value = counters[index]
        end = clock() + seconds
        # A busy-wait: sleep() would overshoot 100 µs by tens of microseconds.
        while clock() < end:
            pass
        overlapped = overlapped or occupants[index] != me
        occupants[index] = 0
        counters[index] = value + 1
        return overlapped

    def lost(self, sections: int) -> int:
        """How many of ``sections`` run in all left no trace in the counters."""
        return sections - sum(self.counters)
