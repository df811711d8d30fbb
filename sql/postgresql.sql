-- The tierlock lock table on PostgreSQL, for the default table name tierlock_locks.
--
-- tierlock.LockManager creates this table and index itself; run this file only when
-- the application must not create tables, and pass create_table=False. For another
-- table name, replace tierlock_locks everywhere, the constraint and index names too.
--
-- token        fencing token; its sequence never hands out a value twice
-- lock_key     the key, e.g. 'user:42'; unique, compared byte for byte (COLLATE "C")
-- handoffs     times the row passed between threads of its process; the fencing
--              token is token * 65536 + handoffs
-- owner_id     random id of the row; release and extend touch the row only with it
-- host, pid, thread_id, thread_name   who holds it (after hand-offs that sent no
--              statement, the holder's heartbeat writes the new thread within a beat)
-- acquired_at  when the hold began (the database's clock)
-- expires_at   when the lease ends (the database's clock); the reaper's index
-- lease        seconds the holder's heartbeat renews the row by; NULL: a fixed lease
-- host_id, proc_start   the holder's host (boot id, pid and time namespaces) and process
--              start time: a waiter on that host takes the row over at once once the
--              process is proven gone
-- mode         NULL for an exclusive hold; 'shared' for a reader's row, kept under
--              '<key>' || chr(1) || 'r' || owner; 'group' for the row under the key
--              itself that stands for all its readers; 'permit' for a semaphore's
--              slot, kept under '<key>' || chr(1) || 'p' || slot; 'reserved' for a
--              group whose readers left while a writer waited
-- members, waiting   a group's count of readers, and until when a waiting writer
--              keeps new readers out
-- permits      a semaphore's number of permits, on each of its slots
-- parent       a reader's group (its token)

CREATE TABLE tierlock_locks (
    token       BIGSERIAL NOT NULL,
    lock_key    VARCHAR(300) COLLATE "C" NOT NULL,
    handoffs    INTEGER DEFAULT 0 NOT NULL,
    owner_id    VARCHAR(32) NOT NULL,
    host        VARCHAR(255) NOT NULL,
    pid         INTEGER NOT NULL,
    thread_id   BIGINT NOT NULL,
    thread_name VARCHAR(255) NOT NULL,
    acquired_at TIMESTAMP WITH TIME ZONE NOT NULL,
    expires_at  TIMESTAMP WITH TIME ZONE NOT NULL,
    lease       DOUBLE PRECISION,
    host_id     VARCHAR(64),
    proc_start  BIGINT,
    mode        VARCHAR(8),
    members     INTEGER,
    waiting     TIMESTAMP WITH TIME ZONE,
    permits     INTEGER,
    parent      BIGINT,
    PRIMARY KEY (token),
    CONSTRAINT uq_tierlock_locks_lock_key UNIQUE (lock_key)
);

CREATE INDEX ix_tierlock_locks_expires_at ON tierlock_locks (expires_at);
