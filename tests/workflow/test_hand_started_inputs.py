"""Workflows started by hand with inputs only BSO itself gives them.

A batch (SprintSlaveWorkflow) or a resident (ResidentWorkflow) started by hand (`temporal workflow start --type
... --input`) with a number past what a workflow can hold: the Master refuses such knobs at a sprint's start
(bso.config.limits_error; tests/workflow/test_bad_input.py, "a timeout too long for a workflow"), but the Slave
never checks its own input's config, and ResidentRunInput.start_delay_seconds has no bound: the workflow task
fails on every retry ("Python int too large to convert to C int", "Value out of range"), the workflow hangs.
Expected: the workflow fails at once naming the knob; nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from tests.conftest import bso_worker
from tests.workflow.helpers import (
    how_it_ended,
    make_project,
    sprint_input,
    start_sprint,
    status_values,
    workflow_task_failures,
)
from workflows.sprint_master import CARRIED_STATE_BY_HAND

K1 = "1-1-login-form"


def _slave(root: Path, config: dict) -> dict:
    return {
        "batch_id": 1, "session_id": "by-hand", "project_root": str(root),
        "status_file": str(root / "_bmad-output/implementation-artifacts/sprint-status.yaml"),
        "stories": [{"key": K1, "epic": "epic-1", "short_key": "1-1", "state": "review",
                     "story_path": f"_bmad-output/implementation-artifacts/{K1}.md"}],
        "config": config,
    }


CASES = {
    "slave-agent-timeout": ("SprintSlaveWorkflow", lambda r: _slave(r, {"agent_timeout_seconds": {"code_review": 10**20}}),
                            "agent_timeout_seconds.code_review"),
    "slave-retry-interval": ("SprintSlaveWorkflow", lambda r: _slave(r, {"agent_retry": {"initial_interval_seconds": 1e20}}),
                             "agent_retry.initial_interval_seconds"),
    "resident-start-delay": ("ResidentWorkflow", lambda r: {"role": "debugger", "session_id": "by-hand", "master_id": "nobody",
                             "project_root": str(r), "start_delay_seconds": 10**20}, "start_delay_seconds"),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_hand_started_child_with_a_number_too_large_fails_cleanly(ts_env, tmp_path: Path, name: str):
    workflow_type, make_input, knob = CASES[name]
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    payload = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(make_input(tmp_path)).encode()))
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(workflow_type, payload, id=f"by-hand-{name}", task_queue=queue)
        outcome = await how_it_ended(handle)
        failures = await workflow_task_failures(ts_env.client, handle.id)
    assert failures == [], f"{name}: {failures[:1]} ({outcome})"
    assert knob in outcome, outcome
    assert status_values(tmp_path) == before


async def test_carried_state_given_at_a_fresh_start_is_refused(ts_env, tmp_path: Path):
    """A sprint started by hand (`temporal workflow start --input`) with a `carried_state`: a queue naming a story
    the state does not hold failed the Master's workflow task on every retry; the start's checks were skipped."""
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    carried = {
        "session_id": "hand-carried",
        "phase": "running",
        "queue": [{"batch_id": 1, "stories": ["9-9-not-in-the-state"]}],
    }
    inp = sprint_input(tmp_path, session_id="hand-carried", carried_state=carried)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        failed = await how_it_ended(handle, 20)
        failures = await workflow_task_failures(ts_env.client, handle.id)
    assert failures == [], f"the Master's workflow task failed on a hand-written carried_state: {failures[:2]}"
    assert failed == f"InvalidSprintInput: {CARRIED_STATE_BY_HAND}" or CARRIED_STATE_BY_HAND in failed, failed
    assert status_values(tmp_path) == before
