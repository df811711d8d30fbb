"""The scenarios of ``python -m bench.shared``, what they share, and the names of the
implementations they run."""

from __future__ import annotations

from dataclasses import dataclass

READ_MOSTLY, SEMAPHORE = "read-mostly", "semaphore"
WRITE_SHARE = 0.05  # of read-mostly's operations
PERMITS = 5  # of the semaphore
SECTION = 200e-6  # seconds asleep in every section
BACKOFF = 1e-3  # the Redis slot semaphore's sleep when every slot is taken, +-50%
IMPLEMENTATIONS = ("tierlock", "tierlock-exclusive", "advisory", "redis-slots", "none")


@dataclass(frozen=True)
class Scenario:
    name: str
    processes: int
    threads: int  # per process
    keys: int  # contended keys; each thread warms up on one of its own beyond them
    semaphore: bool

    @property
    def description(self) -> str:
        shape = f"{self.processes} processes x {self.threads} threads"
        if self.semaphore:
            return f"{shape}, one semaphore of {PERMITS} permits"
        keys = "one key" if self.keys == 1 else f"{self.keys} keys, a random one per operation"
        return f"{shape}, {keys}; {1 - WRITE_SHARE:.0%} reads, {WRITE_SHARE:.0%} writes"


SCENARIOS = {
    READ_MOSTLY: Scenario(READ_MOSTLY, 4, 4, 10, semaphore=False),
    SEMAPHORE: Scenario(SEMAPHORE, 4, 4, 1, semaphore=True),
}
