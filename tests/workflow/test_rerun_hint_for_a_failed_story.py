"""Asking to run a needs-intervention story again the natural ways was refused without naming `rearm`.

A user whose story ended needs-intervention mid-sprint tries `bso sprint decide ID 1-2 retry` (retry is one
of the four decisions `bso sprint decide` lists) and `bso sprint cc ID --add 1-2`. They are told

    bso: error: story '1-2-...' is not awaiting a decision (state needs-intervention)
    bso: error: CC_REJECTED: 1-2-... is already in this sprint

and nothing says that the one way to run it again in this sprint is `bso sprint decide ID 1-2 rearm [--state
STATE]` (README, "Human decisions"). Both refusals should name it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError

from bso.constants import slave_workflow_id
from tests.conftest import bso_worker
from tests.workflow.helpers import cancel_sprint, make_project, poll_until, sprint_input, start_sprint
from tests.workflow.test_external_agents import _pending
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"
K2 = "1-2-logout"


async def test_a_needs_intervention_story_s_refusals_name_rearm(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="rearm-hint"))
        slave_id = slave_workflow_id("rearm-hint", 1)
        dispatch_id, agent, mode = await _pending(client, slave_id, ts_env)
        await client.get_workflow_handle(slave_id).signal("agent_complete", {
            "dispatch_id": dispatch_id, "story_key": K1, "agent_type": agent, "mode": mode,
            "status": "failure", "error": "tests fail", "recoverable": False,
        })

        async def failed() -> bool:
            status = await handle.query(SprintMasterWorkflow.status)
            return status.stories[K1].state == "needs-intervention" and status.stories[K2].agent_in_flight is not None

        await poll_until(failed, "K1 needs intervention while K2 runs")
        with pytest.raises(WorkflowUpdateFailedError) as retry:
            await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "retry"})
        with pytest.raises(WorkflowUpdateFailedError) as add:
            await handle.execute_update("course_correct", {"reason": "user_request", "add_stories": ["1-1"]})
        await cancel_sprint(handle)
    refusals = {"decide retry": str(retry.value.cause), "cc --add": str(add.value.cause)}
    assert "already in this sprint" in refusals["cc --add"], refusals  # refused for that reason...
    assert [what for what, why in refusals.items() if "rearm" not in why] == [], refusals  # ...and both name rearm
    assert all("bso sprint decide rearm-hint 1-1 rearm" in why for why in refusals.values()), refusals
