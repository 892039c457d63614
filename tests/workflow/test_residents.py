"""Residents and the roster on the time-skipping server: residents start with the sprint and stop in reverse
order, every roster change reaches each resident (and no Slave; changes made while a broadcast is on its
way go out together in the next), agent counts come from the roster, a
resident that fails to start degrades the sprint (the scrum-master's failure fails it), and the two-phase
AGENT_CREATE_REQUEST / AGENT_DESTROY_REQUEST sequence."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from bso.constants import SIGNAL_ROSTER_BROADCAST, slave_workflow_id
from bso.roster import resident_workflow_id
from bso.states import SprintStatus
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input, sprint_result, start_sprint, wait_status
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow

K1, K2 = "1-1-login-form", "1-2-logout"


async def signal_names(client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


async def completed_at(client, workflow_id: str):
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return history.events[-1].event_id, history.events[-1].event_time.ToDatetime()


async def test_roster_broadcasts_follow_every_change_and_reach_residents_only(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="roster-1", config_overrides={"batch_size": 1})
        )
        debugger = ts_env.client.get_workflow_handle(resident_workflow_id("roster-1", "debugger"))
        status = await debugger.query(ResidentWorkflow.status)
        scrum_master = await ts_env.client.get_workflow_handle(
            resident_workflow_id("roster-1", "scrum-master")
        ).query(ResidentWorkflow.status)
        slave_signals = await signal_names(ts_env.client, slave_workflow_id("roster-1", 1))
        stops = [await completed_at(ts_env.client, resident_workflow_id("roster-1", r))
                 for r in ("scrum-master", "knowledge-researcher", "debugger")]
    assert report.status is SprintStatus.COMPLETE
    # One broadcast at a time: changes made while one is on its way go out together in the next (the
    # full roster, `change` naming each change). None is missed: the seqs follow each other.
    seqs = [b.seq for b in status.broadcasts]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    changes = [c for b in status.broadcasts for c in b.change.split("; ")]
    # The debugger (third resident) hears from its own start on (with the second one's, when it was held with
    # it); every change after it, in order.
    assert changes[: changes.index("resident debugger started")] in ([], ["resident knowledge-researcher started"])
    assert changes[changes.index("resident debugger started") :] == [
        "resident debugger started",
        "slave-batch-1 started",
        "review-runner-1-1-1 dispatched",
        "review-runner-1-1-1 finished",
        "slave-batch-1 finished",
        "slave-batch-2 started",
        "review-runner-1-2-1 dispatched",
        "review-runner-1-2-1 finished",
        "slave-batch-2 finished",
    ]
    rosters = {b.change.split("; ")[-1]: b.roster for b in status.broadcasts}  # the roster after each last change
    assert status.broadcasts[0].roster.residents == ["scrum-master", "knowledge-researcher", "debugger"]
    if "review-runner-1-1-1 dispatched" in rosters:  # unless it went out together with the agent's end
        assert rosters["review-runner-1-1-1 dispatched"].model_dump() == {
            "residents": ["scrum-master", "knowledge-researcher", "debugger"],
            "slaves": ["slave-batch-1"],
            "temps": ["review-runner-1-1-1"],
        }
    assert rosters["slave-batch-2 finished"].slaves == [] and rosters["slave-batch-2 finished"].temps == []
    # Stopping in reverse order: the debugger hears nothing of its own stop; the scrum-master, last, hears
    # the others stop.
    heard = [c for b in scrum_master.broadcasts for c in b.change.split("; ")]
    assert heard[-2:] == ["resident debugger stopped", "resident knowledge-researcher stopped"]
    assert stops[2][1] <= stops[1][1] <= stops[0][1]
    assert SIGNAL_ROSTER_BROADCAST not in slave_signals  # P54: never to Slaves
    # 3 residents + 2 Slaves + 2 temps, all created and destroyed.
    assert report.total_agents_created == report.total_agents_destroyed == 7


async def test_a_failed_resident_degrades_the_sprint(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id="degraded-1", simulation={"residents_fail_start": ["debugger"]}),
        )
    assert report.status is SprintStatus.COMPLETE
    assert list(report.unavailable_residents) == ["debugger"]
    assert "failed to start (simulated)" in report.unavailable_residents["debugger"]


async def test_the_sprint_fails_without_its_scrum_master(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        with pytest.raises(WorkflowFailureError) as info:
            await run_sprint(
                ts_env.client,
                queue,
                sprint_input(tmp_path, session_id="no-sm-1", simulation={"residents_fail_start": ["scrum-master"]}),
            )
    assert "cannot run without its scrum-master" in str(info.value.cause)


async def test_two_phase_agent_creation(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    # The pause keeps the sprint open while the test talks to it.
    overrides = {"first_story_checkpoint": "pause", "max_external_agents": 2}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="two-phase-1", config_overrides=overrides)
        )
        await wait_status(handle, lambda s: s.phase == "paused" and s.batches_done == 1, "the checkpoint pause")
        created = await handle.execute_update(
            SprintMasterWorkflow.agent_create_request,
            {"msg_type": "AGENT_CREATE_REQUEST", "agent_type": "dev-runner", "role_hint": "Dev", "requested_by": "ext-slave"},
        )
        assert created.msg_type == "AGENT_CREATED" and created.agent_name.startswith("dev-runner-")
        assert created.agent_name in (await handle.query(SprintMasterWorkflow.status)).roster.temps
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(SprintMasterWorkflow.agent_destroy_request, {"agent_name": "nobody"})
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(SprintMasterWorkflow.agent_create_request, {"agent_type": "wizard"})
        # A client that never destroys its agents: the roster holds at most max_external_agents of them.
        more = {"agent_type": "dev-runner", "requested_by": "ext-slave"}
        second = await handle.execute_update(SprintMasterWorkflow.agent_create_request, more)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(SprintMasterWorkflow.agent_create_request, more)
        assert "2 agents it created are still on the roster" in str(refused.value.cause), refused.value.cause
        await handle.execute_update(
            SprintMasterWorkflow.agent_destroy_request, {"agent_name": second.agent_name, "requested_by": "ext-slave"}
        )
        destroyed = await handle.execute_update(
            SprintMasterWorkflow.agent_destroy_request, {"agent_name": created.agent_name, "requested_by": "ext-slave"}
        )
        assert destroyed.agent_name == created.agent_name
        debugger = ts_env.client.get_workflow_handle(resident_workflow_id("two-phase-1", "debugger"))
        wanted = {f"{created.agent_name} created for ext-slave", f"{created.agent_name} destroyed"}
        for _ in range(100):  # the broadcasts are signals: they arrive shortly after the updates
            broadcasts = (await debugger.query(ResidentWorkflow.status)).broadcasts
            changes = [c for b in broadcasts for c in b.change.split("; ")]  # changes may go out together
            if wanted <= set(changes):
                break
            await asyncio.sleep(0.1)
        assert f"{created.agent_name} created for ext-slave" in changes and f"{created.agent_name} destroyed" in changes
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    # 3 residents + 1 Slave + 1 temp + 2 two-phase agents
    assert report.total_agents_created == report.total_agents_destroyed == 7


async def test_a_sprint_started_again_after_its_master_was_terminated_replaces_the_lingering_residents(
    local_env, tmp_path: Path
):
    """`temporal workflow terminate` of a Master leaves its residents running (ABANDON: an ended sprint stops them
    itself), the debugger here busy with an analysis no worker takes (no agents worker); the sprint started
    again under its id stops them and starts its own. It failed: "the sprint cannot run without its
    scrum-master: ... could not start: Workflow execution already started"; cancelled only, the busy debugger
    served on and was left out of the new run."""
    import uuid

    from temporalio.client import WorkflowExecutionStatus

    from bso.constants import SIGNAL_DEBUG_REQUEST, SPRINT_TASK_QUEUE
    from bso.debugging import DebugRequest
    from workers.main import build_workers

    client = local_env.client
    make_project(tmp_path, {K1: "review"})
    session, prefix = f"again-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:8]}-"
    roles = ("scrum-master", "knowledge-researcher", "debugger")
    (worker,) = build_workers(client, (SPRINT_TASK_QUEUE,), queue_prefix=prefix)  # the sprint's queue only
    queue = prefix + SPRINT_TASK_QUEUE
    async with worker:
        slow = sprint_input(tmp_path, session_id=session, simulation={"stories": {"1-1": {"duration_ms": 60000}}})
        first = await start_sprint(client, queue, slow)
        await wait_status(first, lambda s: s.stories[K1].agent_in_flight is not None, "K1's agent in flight")
        await first.terminate("by hand")
        debugger = client.get_workflow_handle(resident_workflow_id(session, "debugger"))
        request = DebugRequest(debug_id="dbg-1", story_key=K1, report_to=f"{session}/batch-1", error_summary="boom")
        await debugger.signal(SIGNAL_DEBUG_REQUEST, request.model_dump(mode="json"))
        await wait_until_busy(debugger)
        lingering = {r: await client.get_workflow_handle(resident_workflow_id(session, r)).describe() for r in roles}
        assert all(d.status is WorkflowExecutionStatus.RUNNING for d in lingering.values())
        report = await run_sprint(client, queue, sprint_input(tmp_path, session_id=session))
        ended = {
            r: await client.get_workflow_handle(resident_workflow_id(session, r), run_id=d.run_id).describe()
            for r, d in lingering.items()
        }
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done"}, report
    assert report.unavailable_residents == {}, report.unavailable_residents
    assert all(d.status is not WorkflowExecutionStatus.RUNNING for d in ended.values()), ended


async def wait_until_busy(resident, seconds: float = 30) -> None:
    """Until the resident's analysis activity is scheduled (and, with no agents worker, never started)."""
    for _ in range(int(seconds * 10)):
        if (await resident.describe()).raw_description.pending_activities:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the resident never took the request in hand")
