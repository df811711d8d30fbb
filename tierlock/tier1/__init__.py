"""Tier 1: inside one process, who holds a key, who waits for it, and what the heartbeat
renews. Nothing here knows an engine: it speaks to ``backends.LockBackend`` only.

How a thread's ``lock.acquire()`` flows through it::

    Lock.acquire ──> tiers.Tiers.acquire
                       │
                       ├─ local.Registry: the key held by this thread? (reentrant: done)
                       │  held or awaited by another thread of the process? wait here,
                       │  first come first served, woken one at a time
                       │
                       ├─ keeping / cohorts: a hold kept or passed on in memory?
                       │  (no statement; a fresh one only within CONFIRMED_WITHIN)
                       │
                       └─ the head of the queue asks the store ──> backends.LockBackend
                             try_acquire, polling between tries on the key's doorbell
                                   │
                       leases.Heartbeat <─┘ renews every renewed hold; its lease
                       clock ends belief in a hold whose lease runs out unconfirmed

    Lock.release ──> tiers.Tiers.release: to the next local waiter (in memory, or one
                     UPDATE), kept for a moment (keeping), or back to the store

Read holds (``reading``; the process's holds by key, and those it keeps between
readers, in ``readholds``) and permits (``permits``) have a tier 1 of their own, with
one poller per key (``pollers``). Kept holds go back from ``later``'s timed calls.
"""
