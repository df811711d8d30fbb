"""``python -m bench.shared``: read/write locks and semaphores next to their peers.

Two scenarios, each run as a cell per implementation and database, ``--repeats`` times
interleaved (every cell of a repeat before the next repeat), reported as medians with
ratios to tierlock's row on the same database:

- ``read-mostly``: 4 processes x 4 threads, 10 keys (``--keys``), a random key per
  operation; 95% of operations read, 5% write. tierlock takes ``read_lock(key)`` to read and
  ``lock(key)`` to write; "tierlock lock only" takes ``lock(key)`` for both, as before
  read locks existed; on PostgreSQL, ``pg_advisory_lock_shared`` and
  ``pg_advisory_lock`` on one psycopg connection per thread. redis-py has no read/write
  lock (its one lock, ``redis.lock.Lock``, is exclusive) and MariaDB's ``GET_LOCK`` has
  no shared mode, so neither has a row.
- ``semaphore``: 4 processes x 4 threads on one key with 5 permits. tierlock's
  ``semaphore(key, permits=5)`` next to a Redis slot semaphore: a thread tries
  ``SET key:<slot> token NX PX ttl`` for slots 0..4 in turn and, when all are taken,
  sleeps about a millisecond and tries again; it frees its slot with a Lua
  compare-and-delete.

Every section sleeps ``--section`` seconds (200 µs; I/O: the GIL is released, so readers of one
process can overlap). What is checked, with shared memory and no mutex: each thread marks
which key it is inside and how; a writer that finds anyone else inside its key, a reader
that finds a writer, a write that lands during a read, or a writer's lost update counts
as a violation, and so does a semaphore section that sees more holders than permits. A
run with no lock at all, shown as a note under each scenario, proves that the check
catches what it should. Rows left in the lock table after a cell count as violations too.

::

    python -m bench.shared                              # into bench/results/shared.md
    python -m bench.shared --db postgresql --scenario read-mostly --seconds 5
    python -m bench.shared --scenario read-mostly --keys 1   # one hot key instead of 10
"""
