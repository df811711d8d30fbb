"""The package as users get it: ``python -m build`` makes a wheel and an sdist that
``twine check`` accepts, and the wheel, installed into a fresh virtual environment,
runs a program and gives ``mypy --strict`` the types of the public API (``py.typed``
ships).

The fresh environment has no mypy of its own: the suite's mypy reads its packages
through ``--python-executable``, which saves installing mypy for every run. Everything
runs in a temporary directory, so nothing of this checkout is on the program's path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import procs
import pytest

import tierlock

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("package")]

# Turns a hung build, install or check into a failure; each takes seconds.
STEP_LIMIT = 240
# What the build may leave out of the copy of the checkout it builds from.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "*.egg-info", "__pycache__", ".*_cache", "build", "dist", "site"
)

# Every name the program uses, typed; it runs on SQLite, which needs no extra.
PROGRAM = """\
import asyncio
import sys

import tierlock
from tierlock.aio import AsyncLockManager


def take(locks: tierlock.LockManager) -> int:
    lock: tierlock.Lock = locks.lock(("user", 42), ttl=10)
    assert lock.acquire(timeout=5)
    try:
        token: int | None = lock.token
        assert token is not None
        return token
    finally:
        lock.release()


async def take_async(url: str) -> int:
    async with AsyncLockManager(url) as locks:
        async with locks.lock("order:7", timeout=5) as lock:
            token = lock.token
            assert token is not None
            return token


url = f"sqlite:///{sys.argv[1]}"
with tierlock.LockManager(url, reaper_interval=None) as locks:
    first = take(locks)
second = asyncio.run(take_async(url))
print(tierlock.__file__, first, second)
"""

# What mypy must refuse, so that a pass above cannot come from types read as Any.
WRONG = """\
import tierlock
from tierlock.aio import AsyncLockManager

locks = tierlock.LockManager("sqlite:///x.db")
token: str = locks.lock("k").token
manager: AsyncLockManager = locks
"""


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with none of this checkout's paths in its environment."""
    env = {
        name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "MYPYPATH")
    }
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_LIMIT,
        check=False,
    )


def succeed(*command: str | Path, cwd: Path) -> str:
    done = run(*command, cwd=cwd)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_runs_and_is_typed(tmp_path: Path) -> None:
    source, dist, venv = tmp_path / "source", tmp_path / "dist", tmp_path / "venv"
    shutil.copytree(procs.ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    # The fresh environment is made while the package builds.
    making_venv = subprocess.Popen([sys.executable, "-m", "venv", venv])
    succeed(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp_path)
    assert making_venv.wait(timeout=STEP_LIMIT) == 0

    version = tierlock.__version__
    wheel = dist / f"tierlock-{version}-py3-none-any.whl"
    sdist = dist / f"tierlock-{version}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([sdist, wheel])
    succeed(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"tierlock-{version}.dist-info/METADATA").decode()
    assert {name.split("/")[0] for name in names} == {"tierlock", f"tierlock-{version}.dist-info"}
    assert "tierlock/py.typed" in names
    assert "Project-URL: Documentation, https://tierlock.readthedocs.io" in metadata
    assert "Description-Content-Type: text/markdown" in metadata

    python = venv / "bin" / "python"
    succeed(python, "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "program.py").write_text(PROGRAM)
    (work / "wrong.py").write_text(WRONG)

    printed = succeed(python, "program.py", work / "locks.db", cwd=work).split()
    assert Path(printed[0]).is_relative_to(venv)
    assert int(printed[1]) > 0 and int(printed[2]) > 0

    mypy: list[str | Path] = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--python-executable",
        python,
    ]
    mypy += ["--cache-dir", os.devnull, "--no-error-summary"]
    assert succeed(*mypy, "program.py", cwd=work) == ""
    wrong = run(*mypy, "wrong.py", cwd=work)
    assert wrong.returncode == 1
    errors = wrong.stdout.splitlines()
    assert [line.split(": error: ")[0] for line in errors] == ["wrong.py:5", "wrong.py:6"]
    assert all(line.endswith("[assignment]") for line in errors)
