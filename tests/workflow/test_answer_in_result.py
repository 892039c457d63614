"""The hot path of a dispatch (bench/): an agent that answers in-process returns its AGENT_COMPLETE as the
agent activity's result (no signal, no deadline timer), the U4 write is a local activity, the Slave's
story updates reach the Master batched, and the message flow still shows every answer and write."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import ActivityEnvironment

from activities.agents import WAITING_PHASE, run_agent
from activities.backends.simulated import LEDGER
from activities.session_files import SESSION_DIR, dispatch_answer_path, record_dispatch_answer, write_json_atomic
from bso.constants import slave_workflow_id
from bso.message_flow import message_flow
from bso.messages import AgentComplete, TaskAssignment
from bso.states import AgentMode, AgentStatus, AgentType
from tests.conftest import bso_worker
from tests.workflow.helpers import ledger, make_project, run_sprint, sprint_input, status_values, workflow_task_failures
from workflows.sprint_slave import STORY_UPDATES_HOLD_SUMMARY, WORKING_TIME_SUMMARY

K1, K2, K3 = "1-1-login-form", "1-2-logout", "1-3-profile"


async def test_in_process_answers_come_back_as_the_activity_result(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "ready-for-dev", K3: "review"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        report = await run_sprint(client, queue, sprint_input(tmp_path, session_id="in-result-1"))
        slave = await client.get_workflow_handle(slave_workflow_id("in-result-1", 1)).fetch_history()
        master = await client.get_workflow_handle("in-result-1").fetch_history()
        failures = await workflow_task_failures(client, slave_workflow_id("in-result-1", 1))
    assert report.stories == {K1: "done", K2: "done", K3: "done"}
    assert status_values(tmp_path)[K2] == "done"
    signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in slave.events
               if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    assert "agent_complete" not in signals
    # No deadline timer per dispatch: the timers hold story updates for the Master (at most one a second), and
    # one counts the batch's working time.
    timers = [e.user_metadata.summary.data for e in slave.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert sum(WORKING_TIME_SUMMARY.encode() in t for t in timers) == 1, timers
    assert all(STORY_UPDATES_HOLD_SUMMARY.encode() in t or WORKING_TIME_SUMMARY.encode() in t for t in timers), timers
    writes = [e for e in slave.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert len(writes) >= 5  # the status load; K2: dev then review; K1, K3: review (local activities)
    # The Slave's only activities are its agents, and simulated agents run on the sprint's own queue (where
    # the SDK starts them eagerly); the status load and the U4 writes are local activities.
    scheduled = [e.activity_task_scheduled_event_attributes for e in slave.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert {a.activity_type.name for a in scheduled} == {"run_agent"}
    assert {a.task_queue.name for a in scheduled} == {queue}
    assert failures == []
    flow = message_flow([master, slave])
    assignments = {m.dispatch_id for m in flow if m.type == "TASK_ASSIGNMENT"}
    answers = {m.dispatch_id for m in flow if m.type == "AGENT_COMPLETE"}
    assert assignments and assignments == answers
    k2 = [(m.payload["expected"], m.payload["new"], m.payload["outcome"]) for m in flow
          if m.type == "STATUS_WRITE" and m.story == K2]
    assert k2[0] == ("ready-for-dev", "review", "written") and k2[-1][1:] == ("done", "written")
    # The Slave ends without a last signal to wait for: its last updates (K3's done) come with its result.
    last_write = writes[-1].event_id
    assert not [e for e in slave.events if e.event_id > last_write
                and e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED]
    k3_views = [m.payload["view"]["state"] for m in flow if m.type == "STORY_UPDATE" and m.story == K3]
    assert k3_views[-1] == "done"
    # Every update the Slave made reached the Master, in order, whether or not batched into one signal.
    updates = [m for m in flow if m.type == "STORY_UPDATE" and m.story == K2]
    assert [m.payload["view"]["state"] for m in updates][-1] == "done"


async def test_an_agent_past_its_deadline_is_timed_out_by_the_server(ts_env, tmp_path: Path):
    # The 2 s limit is per agent type and counts real seconds here: it is K1's dev agent's alone, so K2's
    # review (on the default limit) cannot miss it on a busy machine.
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"duration_ms": 3_600_000}}}
    overrides = {"agent_timeout_seconds": {"dev_execution": 2}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, simulation=simulation, config_overrides=overrides)
        )
    assert report.stories == {K1: "needs-intervention", K2: "done"}
    errors = [r.error for b in report.batches for r in b.results.story_results if r.story_key == K1]
    assert errors and "no AGENT_COMPLETE within 2s" in errors[0]
    assert "started it" not in errors[0]  # its worker did: only an agent no worker took is said so


def _assignment(root: Path, answer_in_result: bool) -> TaskAssignment:
    return TaskAssignment(
        dispatch_id="s/batch-1/1-1/1", agent_type=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW,
        story_key=K1, story_path="x.md", session_id="s", batch_id=1, report_to="s/batch-1",
        project_root=str(root), answer_in_result=answer_in_result,
    )


async def test_a_recorded_answer_is_returned_again_on_a_retry(tmp_path: Path):
    """A worker killed after the agent answered: the retry returns the recorded answer, not the work again."""
    assignment = _assignment(tmp_path, answer_in_result=True)
    recorded = AgentComplete(
        dispatch_id=assignment.dispatch_id, story_key=K1, agent_type=AgentType.REVIEW_RUNNER,
        mode=AgentMode.REVIEW, status=AgentStatus.SUCCESS, tokens_used=7,
    )
    answer_file = dispatch_answer_path(str(tmp_path), assignment.dispatch_id)
    env = ActivityEnvironment()
    record_dispatch_answer(answer_file, recorded.model_dump(mode="json"), env.info.workflow_run_id)
    receipt = await env.run(run_agent, assignment)
    assert receipt.replayed_from_ledger and receipt.delivered
    assert AgentComplete.model_validate(receipt.answer) == recorded
    # An answer an older worker recorded (no run named) after this dispatch was scheduled: this run's too.
    write_json_atomic(answer_file, recorded.model_dump(mode="json"))
    assert (await env.run(run_agent, assignment)).replayed_from_ledger


def _recorded(assignment: TaskAssignment) -> AgentComplete:
    return AgentComplete(
        dispatch_id=assignment.dispatch_id, story_key=K1, agent_type=AgentType.REVIEW_RUNNER,
        mode=AgentMode.REVIEW, status=AgentStatus.FAILURE, error="the earlier sprint's failure",
    )


async def test_an_answer_another_run_recorded_is_not_replayed_but_replaced(tmp_path: Path):
    """A sprint started again under its id reuses its dispatch ids: the first run's answers are not this run's."""
    assignment = _assignment(tmp_path, answer_in_result=True)
    answer_file = dispatch_answer_path(str(tmp_path), assignment.dispatch_id)
    record_dispatch_answer(answer_file, _recorded(assignment).model_dump(mode="json"), "the-first-run")
    receipt = await ActivityEnvironment().run(run_agent, assignment)
    assert not receipt.replayed_from_ledger and AgentComplete.model_validate(receipt.answer).status is AgentStatus.SUCCESS
    assert _ledger(tmp_path) == [(1, "started"), (1, "finished")]
    again = await ActivityEnvironment().run(run_agent, assignment)  # a retry of this run re-delivers its own
    assert again.replayed_from_ledger and again.answer == receipt.answer


async def test_an_older_workers_answer_from_before_this_dispatch_is_not_replayed(tmp_path: Path):
    """No run named (a worker before answers named their run), written before this activity was scheduled: it
    was left by an earlier sprint under the same id."""
    assignment = _assignment(tmp_path, answer_in_result=True)
    write_json_atomic(
        dispatch_answer_path(str(tmp_path), assignment.dispatch_id), _recorded(assignment).model_dump(mode="json")
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, scheduled_time=datetime.now(UTC) + timedelta(seconds=1))
    receipt = await env.run(run_agent, assignment)
    assert not receipt.replayed_from_ledger and AgentComplete.model_validate(receipt.answer).status is AgentStatus.SUCCESS


async def test_a_sprint_started_again_under_its_id_runs_its_agents(ts_env, tmp_path: Path):
    """The workflow id is the session id, which Temporal lets a sprint reuse once the first run closed: the
    second run must not be handed the first run's recorded answers (its agents would never run)."""
    make_project(tmp_path, {K1: "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        failing = {"stories": {"1-1": {"fail": {"dev": "error"}}}}
        first = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="same-id", simulation=failing))
        assert first.stories[K1] == "needs-intervention"
        # The user fixes what made the agent fail, resets the story and runs the sprint again under its id.
        make_project(tmp_path, {K1: "ready-for-dev"})
        started_before = sum(e["event"] == "started" for e in ledger(tmp_path))
        second = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="same-id"))
        started_after = sum(e["event"] == "started" for e in ledger(tmp_path))
    assert second.stories[K1] == "done", f"the first run's failure was replayed; agents run: {started_after - started_before}"
    assert started_after > started_before


async def test_a_fresh_answer_is_recorded_then_returned(tmp_path: Path):
    assignment = _assignment(tmp_path, answer_in_result=True)
    receipt = await ActivityEnvironment().run(run_agent, assignment)
    answer = AgentComplete.model_validate(receipt.answer)
    assert answer.dispatch_id == assignment.dispatch_id and not receipt.replayed_from_ledger
    on_disk = json.loads(dispatch_answer_path(str(tmp_path), assignment.dispatch_id).read_text())
    assert AgentComplete.model_validate(on_disk["answer"]) == answer
    assert on_disk["workflow_run_id"] == ActivityEnvironment().info.workflow_run_id


async def test_a_retry_waits_for_an_earlier_attempt_still_running(tmp_path: Path):
    """A worker that stood still past the agent's heartbeat timeout (a closed laptop) wakes with its attempt
    still running and the server's retry of it: the retry waits for the first attempt and returns its
    recorded answer; the agent works once."""
    assignment = _assignment(tmp_path, answer_in_result=True).model_copy(update={"simulation": {"duration_ms": 400}})
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    heartbeats: list[tuple] = []
    retry.on_heartbeat = lambda *details: heartbeats.append(details)
    running = asyncio.ensure_future(first.run(run_agent, assignment))
    await asyncio.sleep(0.1)  # the first attempt is working
    again = await asyncio.wait_for(retry.run(run_agent, assignment), 10)
    done = await running
    assert not done.replayed_from_ledger and again.replayed_from_ledger and again.answer == done.answer
    assert _ledger(tmp_path) == [(1, "started"), (1, "finished")]
    # The retry kept its heartbeat while it waited, each a PROGRESS_UPDATE saying so.
    assert heartbeats and all(d[0]["phase"] == WAITING_PHASE for d in heartbeats), heartbeats
    assert all(d[0]["message_type"] == "PROGRESS_UPDATE" for d in heartbeats)


async def test_a_cancelled_attempt_lets_the_retry_run_the_agent(tmp_path: Path):
    """The earlier attempt was told it had been superseded (cancelled) before its agent answered: it lets go of
    the lock, and the retry, with no answer recorded, runs the agent itself."""
    assignment = _assignment(tmp_path, answer_in_result=True).model_copy(update={"simulation": {"duration_ms": 3000}})
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    running = asyncio.ensure_future(first.run(run_agent, assignment))
    await asyncio.sleep(0.2)  # the first attempt is working
    waiting = asyncio.ensure_future(retry.run(run_agent, assignment.model_copy(update={"simulation": {}})))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # held back by the first attempt's lock
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    again = await asyncio.wait_for(waiting, 10)
    assert not again.replayed_from_ledger and again.answer is not None
    assert _ledger(tmp_path) == [(1, "started"), (2, "started"), (2, "finished")]


def _ledger(project_root: Path) -> list[tuple[int, str]]:
    lines = (project_root / SESSION_DIR / LEDGER).read_text().splitlines()
    return [(json.loads(line)["attempt"], json.loads(line)["event"]) for line in lines]
