"""`story_priorities` (config_overrides) and the simulation script's `stories` keyed by a story the status file does
not have (a typo: `1-9`, `../x`): `bso sprint start` refuses them (README: "refuses a key that is not a story of the
status file"), but a sprint started by `temporal workflow start --input` takes them without a word: the priority or
the script the user meant is silently not applied. Expected: the Master refuses them too, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError

from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, status_values

K1 = "1-1-login-form"


@pytest.mark.parametrize(
    "overrides",
    [
        {"config_overrides": {"story_priorities": {"1-9": "critical"}}},
        {"simulation": {"stories": {"1-9": {"review": ["HIGH"]}}}},
    ],
    ids=["story_priorities", "simulation-stories"],
)
async def test_a_key_naming_no_story_is_refused(ts_env, tmp_path: Path, overrides):
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, **overrides))
        try:
            report = await sprint_result(handle)
            outcome = f"ran: {report.stories}"
        except WorkflowFailureError as err:
            outcome = str(err.cause)
    where = "story_priorities" if "config_overrides" in overrides else "simulation stories"
    assert f"{where}: unknown story key '1-9' (not a story of sprint-status.yaml)" in outcome, outcome
    assert status_values(tmp_path) == before
