"""A batch's working time (slave_timeout_seconds), counted by its Slave: time paused or waiting for a human's
decision does not count, and a batch out of time ends after the agent in flight. It was the Slave's execution
timeout, which ran on through an overnight pause or decision and killed the batch, its agent in flight too."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from bso.constants import slave_workflow_id
from bso.states import SprintPhase
from tests.conftest import bso_worker
from tests.workflow.helpers import (
    make_project,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    wait_status,
    workflow_task_failures,
)
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

K1, K2 = "1-1-login-form", "1-2-logout"


async def test_a_batch_paused_overnight_goes_on_when_resumed(own_ts_env, tmp_path: Path):
    """The first-story checkpoint pauses the sprint with K2 not started; 8 hours later it is resumed."""
    env = own_ts_env
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(env.client) as queue:
        handle = await start_sprint(
            env.client, queue,
            sprint_input(tmp_path, session_id="night", config_overrides={"first_story_checkpoint": "pause"}),
        )
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "the checkpoint's pause")
        await env.sleep(timedelta(hours=8))
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        slave = await env.client.get_workflow_handle(slave_workflow_id("night", 1)).describe()
    errors = [e for b in report.batches for e in b.errors]
    assert (report.stories, errors) == ({K1: "done", K2: "done"}, []), errors
    # No execution timeout (the time-skipping server shows its ten-year stand-in for none).
    assert slave.raw_description.execution_config.workflow_execution_timeout.seconds in (0, 10 * 365 * 86400)
    assert await workflow_task_failures(env.client, "night") == 0


async def test_a_decision_taken_the_next_morning_is_applied(own_ts_env, tmp_path: Path):
    """story_review_fallback ask_user waits for the human with no timeout: 10 hours, then the decision."""
    env = own_ts_env
    make_project(tmp_path, {K1: "story-doc-review"})
    simulation = {"stories": {"1-1": {"story_review": ["needs-improve", "needs-improve"]}}}
    async with bso_worker(env.client) as queue:
        handle = await start_sprint(env.client, queue, sprint_input(
            tmp_path, session_id="morning", config_overrides={"max_story_review_rounds": 1}, simulation=simulation
        ))
        await wait_status(handle, lambda s: K1 in s.awaiting_decision, "the story waiting for a decision")
        await env.sleep(timedelta(hours=10))
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
        report = await sprint_result(handle)
    errors = [e for b in report.batches for e in b.errors]
    assert (report.stories, errors) == ({K1: "done"}, []), errors


async def test_a_batch_out_of_working_time_ends_after_the_agent_in_flight(own_ts_env, tmp_path: Path):
    """slave_timeout_seconds 60: K1's external dev agent answers after two minutes of work. Its answer is
    written (K1 to review), no agent starts after it, K2 is not started, and the sprint says why."""
    env = own_ts_env
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    async with bso_worker(env.client) as queue:
        handle = await start_sprint(env.client, queue, sprint_input(
            tmp_path, session_id="late", agent_backend="external", config_overrides={"slave_timeout_seconds": 60}
        ))
        slave = env.client.get_workflow_handle(slave_workflow_id("late", 1))
        status = await wait_status(handle, lambda s: s.stories[K1].dispatch_id is not None, "K1's dev dispatched")
        dispatch_id = status.stories[K1].dispatch_id
        await env.sleep(timedelta(minutes=2))
        shown = await slave.query(SprintSlaveWorkflow.status)
        assert shown.stories[K1].agent_in_flight == "dev-runner"  # the agent in flight is not cut short
        await slave.signal("agent_complete", {
            "dispatch_id": dispatch_id, "story_key": "1-1", "agent_type": "dev-runner", "mode": "dev",
            "status": "success",
        })
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    errors = [e for b in report.batches for e in b.errors]
    assert report.stories == {K1: "review", K2: "review"}, (report.stories, errors)
    assert len(errors) == 1 and errors[0].startswith("batch 1 out of time: it worked 60 s"), errors
    assert status.batch_errors == {1: errors}  # `bso sprint status` shows it
    assert status_values(tmp_path)[K1] == "review"
    assert await workflow_task_failures(env.client, "late") == 0


async def test_a_decision_asked_for_after_the_limit_is_still_taken(local_env, tmp_path: Path):
    """The story reviewer in flight when the time is up spends the review rounds (ask_user): the story waits
    for the human (that time is theirs), takes the decision, and only then the batch stops, no dev started.
    It stopped at once, the story left awaiting a decision that `decide` refused (its batch had ended)."""
    import uuid

    make_project(tmp_path, {K1: "story-doc-review"})
    session = f"late-decision-{uuid.uuid4().hex[:6]}"
    async with bso_worker(local_env.client) as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(
            tmp_path, session_id=session, config_overrides={"max_story_review_rounds": 1, "slave_timeout_seconds": 1},
            simulation={"stories": {"1-1": {"story_review": ["needs-improve"], "duration_ms": 3000}}},
        ))
        await wait_status(handle, lambda s: K1 in s.awaiting_decision, "the story waiting for a decision")
        view = await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    errors = [e for b in report.batches for e in b.errors]
    assert view.state == "ready-for-dev" and report.stories == {K1: "ready-for-dev"}, (report.stories, errors)
    assert len(errors) == 1 and "out of time" in errors[0], errors
    assert status.awaiting_decision == {}
