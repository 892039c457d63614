"""CI form of the crash and restart trials (bench/crash_trials.py): 3 kill -9 of the worker, 1 of the
server and 2 closed laptops (SIGSTOP/SIGCONT of the worker, once with the server), each sprint identical to
the uninterrupted one and no finished agent work redone.
The long form: `.venv/bin/python -m bench.crash_trials` (10 worker kills, 3 server kills, 4 suspensions)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from bench.crash_trials import (
    STORIES,
    TIMEOUT_MEANINGS,
    print_summary,
    run_trials,
    sets_for,
    sprint_simulation,
    sprint_stories,
)

pytestmark = pytest.mark.e2e


async def test_sprint_survives_worker_and_server_kills_and_a_closed_laptop(tmp_path: Path, capsys):
    seed = random.randrange(1 << 30)

    def log(line: str) -> None:  # as it happens, so that a trial that fails or hangs shows its seed
        with capsys.disabled():
            print(("\ncrash trials: " if line.startswith("seed ") else "  ") + line)

    summary = await run_trials(worker_kills=3, server_kills=1, seed=seed, workdir=tmp_path, log=log, suspensions=2)
    print_summary(summary, log=log)
    assert summary["problems"] == []
    kinds = {t["kind"]: t for t in summary["trials"]}
    assert set(kinds) == {"worker", "server", "suspend"}
    # At least one kill landed while the sprint was still running, and it recovered.
    assert kinds["worker"]["recovery_seconds"], "no worker kill happened during the sprint"
    assert 1 <= kinds["worker"]["interruptions_done"] <= kinds["worker"]["interruptions_asked"] == 3
    assert kinds["suspend"]["recovery_seconds"], "no suspension happened during the sprint"
    # Workflow tasks the kills left behind are told apart: on a sticky queue, or held by the killed worker.
    assert set(kinds["worker"]["workflow_task_timeouts"]) <= set(TIMEOUT_MEANINGS)
    assert set(kinds["suspend"]["workflow_task_timeouts"]) <= set(TIMEOUT_MEANINGS)
    # The server's file ran in write-ahead-log mode (bso/dev_server.py), through its kill -9 and restart.
    with sqlite3.connect(f"file:{tmp_path / 'temporal.db'}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_long_form_gets_a_sprint_its_kills_fit_into():
    assert sets_for(3, 1) == 1 and sets_for(10, 3) == 3 and sets_for(3, 1, 2) == 1 and sets_for(0, 0, 8) == 2
    stories = sprint_stories(3)
    assert len(stories) == 36 and stories["1-2-log-in"] == stories["4-2-log-in"] == stories["7-2-log-in"]
    assert sorted({key.split("-")[0] for key in stories}, key=int) == [str(e) for e in range(1, 10)]
    assert sprint_stories(1) == STORIES
    scripts = sprint_simulation(2)["stories"]
    assert scripts["4-1"] == scripts["1-1"] and scripts["6-2"] == scripts["3-2"] and "7-1" not in scripts
