"""A batch's working time (slave_timeout_seconds), counted by its Slave: time paused or waiting for a human's
decision does not count, and a batch out of time ends after the agent in flight. It was the Slave's execution
timeout, which ran on through an overnight pause or decision and killed the batch, its agent in flight too."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import temporalio.workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from bso.constants import slave_workflow_id
from bso.data_converter import data_converter
from bso.models import SprintReport
from bso.states import SprintPhase
from tests.collapsed_history import collapsed
from tests.conftest import bso_worker, histories_of
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
from workers.main import WORKFLOW_INTERCEPTORS, WORKFLOWS
from workflows.sprint_slave import PATCH_WORKING_TIME_BY_TIMER, SprintSlaveWorkflow
from bso.dispatch import SLAVE_PATCH_ROLLUPS

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
    assert await workflow_task_failures(env.client, "night") == []


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
    assert await workflow_task_failures(env.client, "late") == []


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


async def _paused_mid_stretch(env, tmp_path: Path, session: str) -> tuple[SprintReport, WorkflowHistory]:
    """slave_timeout_seconds 60, K1's external dev agent in flight: at 20 s a malformed answer (a workflow task
    with no command), at 30 s a pause of ten minutes, then a resume; the agent answers after 3 min more."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    async with bso_worker(env.client) as queue:
        handle = await start_sprint(env.client, queue, sprint_input(
            tmp_path, session_id=session, agent_backend="external", config_overrides={"slave_timeout_seconds": 60}
        ))
        slave = env.client.get_workflow_handle(slave_workflow_id(session, 1))
        status = await wait_status(handle, lambda s: s.stories[K1].dispatch_id is not None, "K1's dev dispatched")
        await env.sleep(timedelta(seconds=20))
        await slave.signal("agent_complete", {"dispatch_id": "no-such-dispatch"})
        await env.sleep(timedelta(seconds=10))
        await handle.signal(SprintMasterWorkflow.pause, "lunch")
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "the pause")
        await env.sleep(timedelta(minutes=10))  # within the dev agent's own timeout (30 minutes)
        await handle.signal(SprintMasterWorkflow.resume, {})
        await env.sleep(timedelta(minutes=3))
        await slave.signal("agent_complete", {
            "dispatch_id": status.stories[K1].dispatch_id, "story_key": "1-1", "agent_type": "dev-runner",
            "mode": "dev", "status": "success",
        })
        report = await sprint_result(handle)
    (history,) = [h for h in await histories_of(env.client, [handle.id]) if h.workflow_id == slave.id]
    return report, history


async def test_the_working_time_is_up_when_its_timer_fires_also_on_a_replay_with_joined_tasks(own_ts_env, tmp_path: Path):
    """The batch runs out of time after 60 s of work, the ten minutes paused not counted; its history replays also with
    its workflow tasks joined (tests/collapsed_history.py): the task with no command at 20 s joined with the
    pause's, whose clock then reads 20 s, not 30 s. Only the next timer's length changes; the time is up when
    that timer fires."""
    report, history = await _paused_mid_stretch(own_ts_env, tmp_path, "joined-working-time")
    errors = [e for b in report.batches for e in b.errors]
    assert report.stories == {K1: "review", K2: "review"}, (report.stories, errors)
    assert len(errors) == 1 and errors[0].startswith("batch 1 out of time: it worked 60 s"), errors
    joined, moved = collapsed(history)
    assert moved > 0
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    assert (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure is None


@pytest.mark.unreplayable_on_purpose
async def test_the_working_time_summed_from_the_clock_fails_a_replay_with_joined_tasks(own_ts_env, tmp_path: Path, monkeypatch):
    """Before PATCH_WORKING_TIME_BY_TIMER the same run replayed with joined tasks counted 20 + 30 s of work when
    the last timer fired and started another one, where it had run out of time live: a nondeterminism error,
    the Slave's workflow task failing on every retry."""
    real_patched = temporalio.workflow.patched
    old_code = (PATCH_WORKING_TIME_BY_TIMER, *SLAVE_PATCH_ROLLUPS)  # a rollup would take the patch as applied
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch_id: patch_id not in old_code and real_patched(patch_id))
    report, history = await _paused_mid_stretch(own_ts_env, tmp_path, "joined-working-time-old")
    monkeypatch.setattr(temporalio.workflow, "patched", real_patched)
    assert report.stories == {K1: "review", K2: "review"}  # live, it ran out of time as it should
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    joined, _ = collapsed(history)
    failure = (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure
    assert failure is not None and "Nondeterminism" in str(failure), failure
