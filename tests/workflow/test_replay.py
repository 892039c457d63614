"""Replay recorded histories of the example sprint against today's workflow code: a change that would
make running sprints non-deterministic fails here (re-record with scripts/record_histories.py only
for an intentional, versioned change)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workers.main import WORKFLOWS

HISTORIES = sorted((Path(__file__).resolve().parent.parent / "histories").glob("*.json"))


def test_histories_are_recorded():
    names = {p.name for p in HISTORIES}
    assert {"example-sprint.json", "example-sprint--batch-1.json"} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path):
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json(path.stem.replace("--", "/"), path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
