"""``tierlock`` as a real program: the console script and ``python -m tierlock``, and
``tierlock reap --every`` as a service that reaps until SIGTERM or Ctrl-C."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import procs
import pytest
from test_cli import invoke

import tierlock


def console_script() -> str:
    return str(Path(sys.executable).with_name("tierlock"))


@pytest.mark.multiprocess
def test_console_script_and_module_print_the_version(tmp_path: Path) -> None:
    script = subprocess.run(
        [console_script(), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (script.returncode, script.stdout) == (0, f"tierlock {tierlock.__version__}\n")
    module = procs.run_python("-m", "tierlock", "--version", cwd=tmp_path)
    assert (module.returncode, module.stdout) == (0, f"tierlock {tierlock.__version__}\n")


class Lines:
    """The lines a child process prints, read by a thread so a wait can time out."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + procs.WAIT_LIMIT
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}; got {self.seen}") from None
            self.seen.append(line)
            if text in line:
                return line


@pytest.fixture
def start_reaper() -> Iterator[Callable[[str, str], subprocess.Popen[str]]]:
    """Start ``tierlock reap --every``; whatever the test leaves running is killed."""
    started: list[subprocess.Popen[str]] = []

    def start(url: str, table: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [console_script(), "--url", url, "--table", table, "reap", "--every", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(procs.WAIT_LIMIT)


def stop(reaper: subprocess.Popen[str], lines: Lines, signum: signal.Signals) -> None:
    """Send ``signum``; the service must say so and exit 0 without a traceback."""
    reaper.send_signal(signum)
    assert reaper.wait(procs.WAIT_LIMIT) == 0
    lines.wait_for("stopped")
    assert reaper.stderr is not None
    assert "Traceback" not in reaper.stderr.read()


@pytest.mark.multiprocess
@pytest.mark.keeps_expired
def test_reaper_service_reaps_and_stops_on_sigterm(
    make_manager: Callable[..., tierlock.LockManager],
    start_reaper: Callable[[str, str], subprocess.Popen[str]],
    db_url: str,
    table: str,
    key: str,
) -> None:
    locks = make_manager()  # makes the table
    reaper = start_reaper(db_url, table)
    assert reaper.stdout is not None
    lines = Lines(reaper.stdout)
    lines.wait_for("every 0.05 s")  # ready: the first pass ran and the signals are handled

    stale = locks.lock(key, ttl=0.05, renew=False)
    assert stale.acquire(timeout=procs.WAIT_LIMIT)
    lines.wait_for("reaped 1 expired lock(s)")
    assert locks.info(key) is None
    with pytest.raises(tierlock.LockLostError):
        stale.release()
    stop(reaper, lines, signal.SIGTERM)


@pytest.mark.multiprocess
def test_reaper_service_stops_on_ctrl_c(
    start_reaper: Callable[[str, str], subprocess.Popen[str]], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    assert invoke("--url", url, "init").exit_code == 0
    reaper = start_reaper(url, "tierlock_locks")
    assert reaper.stdout is not None
    lines = Lines(reaper.stdout)
    lines.wait_for("every 0.05 s")
    stop(reaper, lines, signal.SIGINT)
