"""Replay recorded histories of the example sprint against today's workflow code: a change that would
make running sprints non-deterministic fails here (re-record with scripts/record_histories.py only
for an intentional, versioned change)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from bso.data_converter import data_converter
from temporalio.worker import Replayer

from workers.main import WORKFLOW_INTERCEPTORS, WORKFLOWS

ROOT = Path(__file__).resolve().parent.parent / "histories"
# Sub-folders keep histories recorded by earlier versions: sprints those versions started must still replay.
HISTORIES = sorted(ROOT.glob("**/*.json"))


def test_histories_are_recorded():
    names = {str(p.relative_to(ROOT)) for p in HISTORIES}
    assert {"example-sprint.json", "example-sprint--batch-1.json", "before-2026-11-23/example-sprint--batch-1.json"} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[str(p.relative_to(ROOT).with_suffix("")) for p in HISTORIES])
async def test_replay(path: Path):
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    history = WorkflowHistory.from_json(path.stem.replace("--", "/"), path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
