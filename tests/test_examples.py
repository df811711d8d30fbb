"""The scripts in examples/ run as documented, on every database, and say what they show."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import procs
import pytest

QUICKSTART = procs.ROOT / "examples" / "quickstart.py"


def run_example(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return procs.run_python(str(script), *args, cwd=cwd, timeout=60)


def check_quickstart_output(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"holding 'user:42', fencing token \d+", out)
    assert "another thread trying it without waiting gets it: False" in out
    assert "released; locked now: False" in out
    # The counter survives the contention only because of the lock.
    assert re.search(r"with the lock: +100 of 100", out)
    assert "rising with every hold: True" in out
    assert "user 42: 100 - 5 x 10 = 50" in out
    assert "user 7: 100 - 5 x 10 = 50" in out
    assert re.search(r"order:7 +token \d+ +MainThread .*lease 30 s", out)
    assert re.search(r"user:42:pay +token \d+ +MainThread .*lease 10 s", out)
    assert "Traceback" not in result.stderr


@pytest.mark.multiprocess
def test_quickstart(db_url: str, tmp_path: Path) -> None:
    check_quickstart_output(run_example(QUICKSTART, db_url, cwd=tmp_path))


@pytest.mark.multiprocess
def test_quickstart_defaults_to_a_sqlite_file(tmp_path: Path) -> None:
    check_quickstart_output(run_example(QUICKSTART, cwd=tmp_path))
    assert (tmp_path / "tierlock.db").is_file()
