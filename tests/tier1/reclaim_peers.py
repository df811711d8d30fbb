"""The other side of test_reclaim_proof: programs that run in namespaces of their own.

``python reclaim_peers.py hold URL TABLE KEY TTL [--leader-exits]`` takes KEY with lease
TTL and prints ``{"pid", "token"}``; then, for each line it reads, ``{"owned"}``; at the
end of its input it releases KEY and exits. With ``--leader-exits``, another thread
holds, and the main thread ends by ``pthread_exit`` once it does: the process lives on
with a zombie leader.

``python reclaim_peers.py wait URL TABLE KEY TIMEOUT PID``, as root in a mount namespace
of its own, mounts ``/proc`` with ``hidepid=2``, becomes user nobody, tries to take KEY
within TIMEOUT, and prints ``{"acquired", "reclaims", "sees_holder"}`` (whether
``/proc/PID`` is there for it).

Each prints one JSON object a line.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading

import tierlock

NOBODY = 65534
MOUNT_HIDDEN_PROC = ("mount", "-t", "proc", "-o", "hidepid=2", "proc", "/proc")


def _say(**report: object) -> None:
    print(json.dumps(report), flush=True)


def _manager(url: str, table: str) -> tierlock.LockManager:
    return tierlock.LockManager(url, table=table, reaper_interval=None, poll_interval=0.01)


def hold(url: str, table: str, key: str, ttl: float, *, leader_exits: bool) -> None:
    manager = _manager(url, table)
    lock = manager.lock(key, ttl=ttl)
    held = threading.Event()

    def section() -> None:
        if not lock.acquire(timeout=ttl):
            raise SystemExit(f"could not take {key!r}")
        _say(pid=os.getpid(), token=lock.token)
        held.set()
        for _ in sys.stdin:
            _say(owned=lock.owned())
        lock.release()
        manager.close()

    if not leader_exits:
        section()
        return

    def section_then_exit() -> None:
        section()
        os._exit(0)  # (no main thread is left to end the interpreter)

    threading.Thread(target=section_then_exit).start()
    held.wait()
    ctypes.CDLL(None).pthread_exit(None)


def wait(url: str, table: str, key: str, timeout: float, holder: int) -> None:
    subprocess.run(MOUNT_HIDDEN_PROC, check=True)
    with _manager(url, table) as manager:
        # Everything the waiter needs is loaded first: nobody cannot read this
        # interpreter's installation.
        with manager.lock(f"{key}:warm-up", timeout=timeout):
            pass
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        lock = manager.lock(key)
        acquired = lock.acquire(timeout=timeout)
        _say(
            acquired=acquired,
            reclaims=manager.stats().reclaims,
            sees_holder=os.path.exists(f"/proc/{holder}"),
        )
        if acquired:
            lock.release()


if __name__ == "__main__":
    command, url, table, key, number = sys.argv[1:6]
    if command == "hold":
        hold(url, table, key, float(number), leader_exits="--leader-exits" in sys.argv)
    else:
        wait(url, table, key, float(number), int(sys.argv[6]))
