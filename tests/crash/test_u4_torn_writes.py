"""U4 under kill -9: a tight loop of status-file writes, killed at random points many times, always
leaves a file that parses and holds the old or the new value (never torn, never empty)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.infra import REPO, make_project
from bso.models import DEFAULT_STATUS_FILE
from bso.sprint_status import parse_status_text

KILLS = int(os.environ.get("BSO_U4_KILLS", "40"))
KEY = "1-2-toggle-me"


def test_status_file_survives_kill9_during_u4_writes(tmp_path: Path):
    make_project(tmp_path, {"1-1-other": "done", KEY: "review", "1-3-third": "backlog"})
    status = tmp_path / DEFAULT_STATUS_FILE
    original_lines = len(status.read_text().splitlines())
    rng = random.Random()
    kills_mid_loop = 0
    for _ in range(KILLS):
        before = parse_status_text(status.read_text(encoding="utf-8"), str(status)).get(KEY).value
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("u4_write_loop.py")), str(tmp_path), str(status),
             KEY, before, "done" if before == "review" else "review"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready", "the write loop did not start"
            time.sleep(rng.uniform(0, 0.05))
            kills_mid_loop += proc.poll() is None
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        data = status.read_bytes()
        assert data, "status file empty after kill -9"
        parsed = parse_status_text(data.decode("utf-8"), str(status))  # raises on a torn file
        assert parsed.get(KEY).value in {"review", "done"}
        assert parsed.get("1-1-other").value == "done" and parsed.get("1-3-third").value == "backlog"
        assert len(data.decode().splitlines()) == original_lines
    assert kills_mid_loop == KILLS
