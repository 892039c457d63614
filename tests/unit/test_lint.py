"""Static checks over the whole code base (ruff, pyflakes rules; settings in pyproject.toml).

An undefined name in a workflow's rarely taken branch (a malformed signal's error path) passes every test
that does not take it, then fails that workflow's task on every retry; a linter finds it without running it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = ["bso", "workflows", "activities", "workers", "bench", "scripts", "tests"]


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [str(ruff), "check", "--no-cache", *CHECKED], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
