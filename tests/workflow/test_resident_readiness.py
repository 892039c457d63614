"""A resident not ready within the Master's 60 s readiness window is left out of the sprint and cancelled, so
nothing lingers (time-skipping server: the window passes at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import CancelledError

from bso.roster import resident_workflow_id
from bso.states import SprintStatus
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"


async def test_a_resident_not_ready_in_time_is_cancelled_and_the_sprint_degrades(own_ts_env, tmp_path: Path):
    ts_env = own_ts_env  # its 60 s wait is skipped only on a server whose clock no earlier test holds
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id="slow-1", simulation={"residents_slow_start": ["knowledge-researcher"]}),
        )
        slow_handle = ts_env.client.get_workflow_handle(resident_workflow_id("slow-1", "knowledge-researcher"))
        # the Master's cancel request is recorded before its report; the resident takes it in a task of its own
        with pytest.raises(WorkflowFailureError) as ended:
            await asyncio.wait_for(slow_handle.result(), timeout=30)
        slow = await slow_handle.describe()
        status = await ts_env.client.get_workflow_handle("slow-1").query(SprintMasterWorkflow.status)
        others = [
            (await ts_env.client.get_workflow_handle(resident_workflow_id("slow-1", role)).describe()).status
            for role in ("scrum-master", "debugger")
        ]
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done"}
    reason = report.unavailable_residents["knowledge-researcher"]
    assert reason == "resident knowledge-researcher unavailable: not ready within 60s; cancelled"
    assert status.unavailable_residents == report.unavailable_residents
    assert "knowledge-researcher" not in (status.roster.residents if status.roster else [])
    assert isinstance(ended.value.cause, CancelledError)
    assert slow.status is WorkflowExecutionStatus.CANCELED  # nothing lingers
    assert others == [WorkflowExecutionStatus.COMPLETED] * 2  # the others ran and stopped as usual
