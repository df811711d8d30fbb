"""``python -m bench`` keeps working: it measures each database and prints the table.

Only that it runs is checked here; timings are for people to read, not for tests.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import procs
import pytest
from sqlalchemy import create_engine, inspect

HEADER = "| database | tierlock median µs | tierlock p90 µs | raw median µs | raw p90 µs | ratio |"


def row(name: str) -> str:
    return rf"\| {name} \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|"


def run_bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m bench`` from this checkout, with a tiny workload."""
    result = procs.run_python("-m", "bench", "--rounds", "2", "--iterations", "3", *args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.multiprocess
def test_bench_measures_the_database(db: str, db_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.md"
    table = f"bench_{uuid.uuid4().hex[:12]}"
    result = run_bench(
        *("--db", db, "--dburi", f"{db}={db_url}", "--table", table, "--output", str(output)),
        cwd=tmp_path,
    )
    assert HEADER in result.stdout
    assert re.search(row(db), result.stdout), result.stdout
    written = output.read_text(encoding="utf-8")
    assert HEADER in written
    assert re.search(row(db), written)
    engine = create_engine(db_url)
    try:
        assert not inspect(engine).has_table(table), "the scratch table is dropped afterwards"
    finally:
        engine.dispose()


@pytest.mark.multiprocess
def test_unreachable_server_is_skipped_with_a_note(tmp_path: Path) -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    result = run_bench(
        *("--db", "sqlite", "--dburi", f"sqlite=sqlite:///{tmp_path / 'bench.db'}"),
        *("--db", "postgresql", "--dburi", f"postgresql={dead}"),
        cwd=tmp_path,
    )
    assert f"postgresql: skipped, cannot use {dead}" in result.stdout
    assert re.search(row("sqlite"), result.stdout)
    assert not re.search(row("postgresql"), result.stdout)
