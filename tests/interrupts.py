"""Interrupting the main thread at a moment a test controls, as Ctrl-C would: a signal
delivered with ``signal.pthread_kill`` to the main thread (the only one that runs
signal handlers), whose handler raises."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

import procs

__all__ = ["Interrupted", "interrupting"]

# How long the signalling thread waits for the handler to have run before it signals
# again (see ``interrupting``).
RESEND_AFTER = 0.1

Steps = Callable[[], object]


class Interrupted(BaseException):
    """What a test's signal handler raises, as KeyboardInterrupt would."""


def interrupting(exception: type[BaseException]) -> Iterator[Callable[[Steps], None]]:
    """For a fixture: yields ``arm(steps)``, which runs ``steps()`` in a thread, then
    signals the main thread, whose handler raises ``exception``. ``steps`` waits for
    (and brings about) the moment to interrupt at, and must leave the main thread
    blocked there, so the signal lands exactly at that point; if ``steps`` fails, the
    handler raises an AssertionError that says how, instead of leaving the main thread
    blocked until something else ends its wait.

    A signal that comes after the main thread last looked for one and before it enters
    a blocking lock's system call is handled only once that call returns: so the signal
    is sent again until the handler has run, and the handler raises once per ``arm``
    (and once for a signal a test sends itself, with no ``arm``)."""
    assert threading.current_thread() is threading.main_thread()
    main = threading.get_ident()
    failed: list[BaseException] = []
    raised = threading.Event()  # since the last ``arm``

    def raise_it(signum: int, frame: object) -> None:
        if raised.is_set():
            return  # (a repeat of a signal whose interrupt was raised already)
        raised.set()
        if failed:  # (the main thread is blocked where the steps never saw it)
            raise AssertionError(f"the steps before the interrupt failed: {failed[0]!r}")
        raise exception

    previous = signal.signal(signal.SIGUSR1, raise_it)
    threads: list[threading.Thread] = []

    def arm(steps: Steps) -> None:
        def run() -> None:
            try:
                steps()
            except BaseException as exc:
                failed.append(exc)
            raised.clear()
            deadline = time.monotonic() + procs.WAIT_LIMIT
            signal.pthread_kill(main, signal.SIGUSR1)
            while not raised.wait(RESEND_AFTER) and time.monotonic() < deadline:
                signal.pthread_kill(main, signal.SIGUSR1)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)

    try:
        yield arm
    finally:
        for thread in threads:
            thread.join(procs.WAIT_LIMIT)
        signal.signal(signal.SIGUSR1, previous)
