"""The soak script runs as a user would run it, for a short while; ``pytest -m soak``."""

from __future__ import annotations

import re
from pathlib import Path

import procs
import pytest

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.multiprocess]


def test_soak_runs_and_reports(db_url: str, tmp_path: Path) -> None:
    result = procs.run_python(
        "-m", "tests.soak", "--url", db_url, "--minutes", "0.15", cwd=procs.ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout
    assert re.search(r"^violations: 0 ", summary, re.MULTILINE), summary
    sections = re.search(r"^critical sections: (\d+)$", summary, re.MULTILINE)
    kills = re.search(r"^kills: (\d+) ", summary, re.MULTILINE)
    assert sections is not None and int(sections.group(1)) > 0, summary
    assert kills is not None and int(kills.group(1)) > 0, summary
    assert "longest a key stayed blocked after its holder died" in summary
