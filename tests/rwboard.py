"""The shared-memory books of the read/write lock and semaphore tests' child processes,
and what the parent makes of them.

:class:`Board` holds the books of the soak's load (``rwsoak.RWLoad``): who is inside a
section lives in shared memory, one field per worker thread (a *slot*) and one writer
per field, so that a killed process leaves the books consistent: no cross-process mutex
is taken (a killed holder would keep it for good). Every section checks, as it enters
and again as it leaves, that no writer is beside anyone on its key and that no more
threads than ``permits`` are inside a semaphore's key at one moment. :class:`RWReport`
is what a load did and saw. :class:`Timeline` holds when the holds of the writer preference test's
readers were asked for, began and ended.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os

import procs

# What a slot is inside: nothing, a read hold, a write hold or a semaphore's permit.
NOTHING, READ, WRITE, PERMIT = 0, 1, 2, 3
MODE_NAMES = {READ: "read", WRITE: "write", PERMIT: "permit"}
# A slot's place is one number, written at once: mode * PLACES + key index.
PLACES = 1000

# Kinds of violation a section can see.
READ_BESIDE_WRITE = 0  # a reader and a writer inside one key at once
WRITE_BESIDE_WRITE = 1  # two writers inside one key at once
OVER_PERMITS = 2  # more holders inside a semaphore's key than it has permits
STALE_WRITE_TOKEN = 3  # a write hold's token not above every earlier hold's of its key
VIOLATIONS = ("read beside write", "write beside write", "over permits", "stale write token")


class Board:
    """Shared-memory books of the load: where each slot is, and what the sections saw."""

    def __init__(
        self, *, rw_keys: int, sem_keys: int, permits: int, processes: int, threads: int
    ) -> None:
        self.rw_keys, self.sem_keys, self.permits = rw_keys, sem_keys, permits
        self.threads = threads
        self.slots = slots = processes * threads
        self.stopping = procs.CTX.RawValue(ctypes.c_int, 0)
        self.place = procs.CTX.RawArray(ctypes.c_longlong, slots)  # 0: outside
        # Each slot's turns inside, counted as it enters and as it leaves: odd inside.
        self.turns = procs.CTX.RawArray(ctypes.c_longlong, slots)
        self.dying = procs.CTX.RawArray(ctypes.c_int, slots)
        self.sections = procs.CTX.RawArray(ctypes.c_longlong, slots * 4)  # by mode
        self.violations = procs.CTX.RawArray(ctypes.c_longlong, slots * len(VIOLATIONS))
        # A slot's first violation: kind, its place, the other slot, that slot's place,
        # its pid, the other's pid (-1: none yet).
        self.first = procs.CTX.RawArray(ctypes.c_longlong, [-1] * (slots * 6))
        self.pid = procs.CTX.RawArray(ctypes.c_longlong, slots)
        self.most_readers = procs.CTX.RawArray(ctypes.c_longlong, slots)
        self.most_permits = procs.CTX.RawArray(ctypes.c_longlong, slots)
        # The highest token each slot saw in its sections of each read/write key.
        self.tokens = procs.CTX.RawArray(ctypes.c_longlong, slots * rw_keys)
        self.token_modes = procs.CTX.RawArray(ctypes.c_int, slots * rw_keys)  # whose it was
        # A slot's first stale write token: its token, the highest before it, and the
        # slot and mode of the hold that had that one.
        self.stale = procs.CTX.RawArray(ctypes.c_longlong, slots * 4)
        self.longest_wait = procs.CTX.RawArray(ctypes.c_double, slots)
        self.timeouts = procs.CTX.RawArray(ctypes.c_longlong, slots)
        # The longest a try without waiting and a release took, and what it was.
        self.slowest_call = procs.CTX.RawArray(ctypes.c_double, slots)
        self.slowest_what = procs.CTX.RawArray(ctypes.c_int, slots)  # mode * 10 + call
        # Per process: the mode of the hold the parent wants it killed in (0: none),
        # and the slot (+1) of the thread that waits inside such a hold to be killed.
        self.kill_request = procs.CTX.RawArray(ctypes.c_int, processes)
        self.awaiting_kill = procs.CTX.RawArray(ctypes.c_int, processes)

    def process_slots(self, process: int) -> range:
        return range(process * self.threads, (process + 1) * self.threads)

    def _note(self, kind: int, slot: int, other: int) -> None:
        self.violations[slot * len(VIOLATIONS) + kind] += 1
        if self.first[slot * 6] < 0:
            other_place = self.place[other] if other >= 0 else -1
            other_pid = self.pid[other] if other >= 0 else -1
            note = [self.place[slot], other, other_place, self.pid[slot], other_pid]
            for offset, value in enumerate(note, start=1):
                self.first[slot * 6 + offset] = value
            self.first[slot * 6] = kind

    def _check(self, slot: int, mode: int, key: int) -> None:
        """Look at every other live slot inside ``key``; count what must not be."""
        if mode == PERMIT:
            self._count_permits(slot, key)
            return
        readers = 1
        for other in range(self.slots):
            if other == slot or self.dying[other]:
                continue
            place = self.place[other]
            if place == 0 or place % PLACES != key:
                continue
            other_mode = place // PLACES
            if other_mode == WRITE:
                kind = WRITE_BESIDE_WRITE if mode == WRITE else READ_BESIDE_WRITE
                self._note(kind, slot, other)
            elif other_mode == READ:
                if mode == WRITE:
                    self._note(READ_BESIDE_WRITE, slot, other)
                readers += 1
        if mode == READ:
            self.most_readers[slot] = max(self.most_readers[slot], readers)

    def _count_permits(self, slot: int, key: int) -> None:
        """Count the live slots inside semaphore ``key`` at one moment, this one among
        them: those whose turn was odd and the same in two readings of all, and whose
        place between them was the key's. (One reading of the places, slot by slot,
        may count a holder that left and, later in it, one that came after: a process
        switched out halfway through the reading counts more holders than there are.)"""
        before = self.turns[:]
        places = self.place[:]
        after = self.turns[:]
        inside = [
            other
            for other in range(self.slots)
            if before[other] == after[other]
            and before[other] % 2
            and places[other] == PERMIT * PLACES + key
            and not self.dying[other]
        ]
        if len(inside) > self.permits:
            self._note(OVER_PERMITS, slot, next(other for other in inside if other != slot))
        self.most_permits[slot] = max(self.most_permits[slot], len(inside))

    def enter(self, slot: int, mode: int, key: int, token: int | None) -> None:
        """Go inside ``key`` in ``mode``, held with ``token``, and check."""
        self.pid[slot] = os.getpid()
        self.place[slot] = mode * PLACES + key
        self.turns[slot] += 1
        self._check(slot, mode, key)
        if mode == PERMIT or token is None:
            return
        seen = range(key, self.slots * self.rw_keys, self.rw_keys)
        highest = max(seen, key=lambda cell: self.tokens[cell])
        if mode == WRITE and token <= self.tokens[highest]:
            if self.first[slot * 6] < 0:
                note = (token, self.tokens[highest], highest // self.rw_keys)
                self.stale[slot * 4 : slot * 4 + 4] = [*note, self.token_modes[highest]]
            self._note(STALE_WRITE_TOKEN, slot, -1)
        cell = slot * self.rw_keys + key
        if token > self.tokens[cell]:
            self.tokens[cell], self.token_modes[cell] = token, mode

    def leave(self, slot: int, mode: int, key: int) -> None:
        """Check once more and go outside."""
        self._check(slot, mode, key)
        self.turns[slot] += 1
        self.place[slot] = 0
        self.sections[slot * 4 + mode] += 1

    def clear(self, process: int) -> None:
        """Forget a dead process's slots (its holds are gone or being taken over)."""
        for slot in self.process_slots(process):
            self.place[slot] = 0
            self.turns[slot] = 0
            self.dying[slot] = 0
        self.kill_request[process] = 0
        self.awaiting_kill[process] = 0

    def describe_first(self) -> str:
        for slot in range(self.slots):
            kind, place, other, other_place, pid, other_pid = self.first[slot * 6 : slot * 6 + 6]
            if kind == STALE_WRITE_TOKEN:
                token, highest, other, other_mode = self.stale[slot * 4 : slot * 4 + 4]
                return (
                    f"{VIOLATIONS[kind]}: slot {slot} (pid {pid}) in {_place(place)} with "
                    f"token {token}; slot {other} had token {highest} in a "
                    f"{MODE_NAMES.get(other_mode, '?')} hold of the key before"
                )
            if kind >= 0:
                return (
                    f"{VIOLATIONS[kind]}: slot {slot} (pid {pid}) in {_place(place)} found "
                    f"slot {other} (pid {other_pid}) in {_place(other_place)}"
                )
        return "none"


def _place(place: int) -> str:
    if place <= 0:
        return "nothing"
    return f"{MODE_NAMES[place // PLACES]} of key {place % PLACES}"


@dataclasses.dataclass
class RWReport:
    """What a load did and saw."""

    seconds: float = 0.0
    sections: dict[str, int] = dataclasses.field(default_factory=dict)
    kills: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(MODE_NAMES.values(), 0)
    )
    violations: dict[str, int] = dataclasses.field(default_factory=dict)
    first_violation: str = "none"
    most_readers: int = 0  # the most readers seen inside one key at once
    most_permits: int = 0  # the most permit holders seen inside one key at once
    longest_wait: float = 0.0  # the longest blocking acquire that succeeded, seconds
    timeouts: int = 0  # blocking acquires that failed after rwsoak.SOAK_WAIT
    slowest_call: float = 0.0  # the longest a try without waiting or a release took
    slowest_what: str = "none"
    failures: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        return "\n".join(
            [
                f"ran for {self.seconds:.1f} s",
                f"sections: {self.sections}",
                f"kills inside a hold: {self.kills}",
                f"violations: {self.violations}",
                f"first violation: {self.first_violation}",
                f"most readers inside a key at once: {self.most_readers}",
                f"most permit holders inside a key at once: {self.most_permits}",
                f"longest acquire: {self.longest_wait:.3f} s; timeouts: {self.timeouts}",
                f"slowest call that never waits: {self.slowest_what}, {self.slowest_call:.3f} s",
                f"failures: {len(self.failures)}",
                *self.failures,
            ]
        )


# -- writer preference -----------------------------------------------------------------


class Timeline:
    """Per slot, in shared memory: when each of its holds was asked for, began and
    ended (``time.monotonic()``, one clock for every process of the host)."""

    def __init__(self, slots: int, capacity: int = 2000) -> None:
        self.slots, self.capacity = slots, capacity
        self.count = procs.CTX.RawArray(ctypes.c_longlong, slots)
        self.asked = procs.CTX.RawArray(ctypes.c_double, slots * capacity)
        self.entered = procs.CTX.RawArray(ctypes.c_double, slots * capacity)
        self.left = procs.CTX.RawArray(ctypes.c_double, slots * capacity)
        self.inside_since = procs.CTX.RawArray(ctypes.c_double, slots)  # 0: outside

    def add(self, slot: int, asked: float, entered: float, left: float) -> None:
        index = self.count[slot]
        if index >= self.capacity:
            raise AssertionError(f"slot {slot} has no room for more holds")
        cell = slot * self.capacity + index
        self.asked[cell], self.entered[cell], self.left[cell] = asked, entered, left
        self.count[slot] = index + 1

    def holds(self) -> list[tuple[int, float, float, float]]:
        """Every hold: (slot, asked, entered, left)."""
        return [
            (slot, self.asked[cell], self.entered[cell], self.left[cell])
            for slot in range(self.slots)
            for cell in range(slot * self.capacity, slot * self.capacity + self.count[slot])
        ]


def uncovered(holds: list[tuple[int, float, float, float]], start: float, end: float) -> float:
    """The longest stretch of [start, end] in which no hold of ``holds`` was inside."""
    longest, covered_to = 0.0, start
    for _, _, entered, left in sorted(holds, key=lambda hold: hold[2]):
        if left <= covered_to:
            continue
        if entered >= end:
            break
        longest = max(longest, entered - covered_to)
        covered_to = left
    return max(longest, end - covered_to)
