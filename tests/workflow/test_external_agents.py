"""The external backend driven by test signals, as an agent outside the worker would answer:
`temporal workflow signal --workflow-id <slave id> --name agent_complete --input '{...}'`."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.agents import run_agent
from bso.constants import SIGNAL_DEBUG_REQUEST, SPRINT_TASK_QUEUE, agents_task_queue_for, slave_workflow_id
from bso.messages import DispatchReceipt, TaskAssignment
from workers.main import AGENT_ACTIVITIES, build_workers

from bso.models import SprintReport
from bso.cli import message_record
from bso.message_flow import agent_performance, message_flow
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.helpers import (
    make_project,
    poll_until,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_is,
    status_values,
    cancelled_while_no_sprint_worker_runs,
    in_one_task,
    signals_sent,
    wait_status,
    workflow_task_failures,
)
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

K1 = "1-1-login-form"
K2 = "1-2-logout"


async def _pending(
    client: Client, slave_id: str, env, after: str | None = None, tries: int = 300
) -> tuple[str, str, str]:
    """Wait until the Slave has a new dispatch open (not `after`); its id, agent type and mode. `tries` queries,
    0.2 s apart (fewer where none may come: each is a query, slow on a busy machine)."""
    handle = client.get_workflow_handle(slave_id)
    for _ in range(tries):
        try:
            status = await handle.query(SprintSlaveWorkflow.status)
        except Exception:  # the Slave may not have started yet
            status = None
        if status and status.current_story:
            view = status.stories[status.current_story]
            if view.dispatch_id and view.dispatch_id != after:
                return view.dispatch_id, view.agent_in_flight, view.mode_in_flight
        await env.sleep(0.2)
    raise AssertionError("no dispatch became pending")


async def _completed(handle) -> bool:
    return await status_is(handle, WorkflowExecutionStatus.COMPLETED)


async def _published(root: Path, dispatch_id: str) -> dict:
    """The assignment file of a dispatch: the Slave opens the dispatch (its status shows it) before the agent
    activity has written the file, so wait for it."""

    async def find() -> dict | None:
        for path in (root / ".sprint-session" / "assignments").glob("*.json"):
            try:
                assignment = json.loads(path.read_text())
            except ValueError:  # being written
                continue
            if assignment.get("dispatch_id") == dispatch_id:
                return assignment
        return None

    return await poll_until(find, f"the assignment file of {dispatch_id}", timeout=30)


async def _shutdown_requested(slave) -> bool:
    return (await slave.query(SprintSlaveWorkflow.status)).shutdown_requested


def _complete(dispatch_id: str, agent: str, mode: str, **extra) -> dict:
    return {
        "dispatch_id": dispatch_id,
        "story_key": "1-1",  # the short key is accepted too
        "agent_type": agent,
        "mode": mode,
        "status": "success",
        "tokens_used": 100,
        **extra,
    }


async def test_external_agent_answers_by_signal_and_bad_answers_are_ignored(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="ext-1"))
        slave_id = slave_workflow_id("ext-1", 1)
        slave = client.get_workflow_handle(slave_id)

        dispatch_id, agent, mode = await _pending(client, slave_id, ts_env)
        assert (agent, mode) == ("dev-runner", "dev")
        assignment = await _published(tmp_path, dispatch_id)
        assert assignment["report_to"] == slave_id

        await slave.signal("agent_complete", {"dispatch_id": dispatch_id, "status": "bogus"})  # malformed
        await slave.signal("agent_complete", "not even an object")
        await slave.signal("agent_complete", _complete("unknown-dispatch", agent, mode))  # stale / unknown
        await slave.signal("agent_complete", _complete(dispatch_id, "review-runner", "review"))  # mixed up
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode, tokens_used=10**30))  # garbled
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))  # the real answer
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))  # a repeated delivery

        review_id, agent, mode = await _pending(client, slave_id, ts_env, after=dispatch_id)
        assert (agent, mode) == ("review-runner", "review")
        status = await slave.query(SprintSlaveWorkflow.status)
        reasons = [r.reason for r in status.rejected_messages]
        assert len(reasons) == 6 and status.rejected_total == 6
        assert reasons[0].startswith("validation_failed") and "status: invalid value: bogus" in reasons[0]
        assert "story_key: required field missing" in reasons[0]  # message-schemas' (field, error)
        assert reasons[1] == "validation_failed: (message): must be an object"
        assert reasons[2] == f"unknown dispatch id 'unknown-dispatch'; open: {dispatch_id}"  # the one to use
        assert reasons[3] == "agent_type/mode review-runner/review does not match dispatch (dev-runner/dev)"
        # A count that would have ended the sprint on its token budget (2,000,000): refused, the dispatch kept open.
        assert reasons[4] == f"tokens_used {10**30} is more than any agent run uses (at most 1,000,000,000)"
        assert reasons[5] == "already answered"
        assert status_values(tmp_path)[K1] == "review"

        # The review finds a MEDIUM issue: the Slave (not the agent) decides a fix is needed.
        findings = [{"severity": "medium", "summary": "missing input validation", "file": "src/login.py", "line": 3}]
        await slave.signal("agent_complete", _complete(review_id, agent, mode, findings=findings))
        fix_id, agent, mode = await _pending(client, slave_id, ts_env, after=review_id)
        assert (agent, mode) == ("dev-runner", "fix")
        fix_assignment = await _published(tmp_path, fix_id)
        assert fix_assignment["fix_findings"][0]["summary"] == "missing input validation"
        await slave.signal("agent_complete", _complete(fix_id, agent, mode))
        review2_id, agent, mode = await _pending(client, slave_id, ts_env, after=fix_id)
        await slave.signal("agent_complete", _complete(review2_id, agent, mode))

        report = await sprint_result(handle)
        master_status = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "done"}
    assert report.batches[0].results.review_fix_rounds == {K1: 1}
    assert report.tokens_used == 400
    assert master_status.stories[K1].state == "done"
    for workflow_id in (handle.id, slave_id):
        assert await workflow_task_failures(client, workflow_id) == []

    # bso messages marks what the Slave rejected, with the Slave's own reason, from the histories alone.
    flow = message_flow(await fetch_sprint_histories(client, handle.id))
    answers = [m for m in flow if m.type == "AGENT_COMPLETE"]
    assert [m.rejected for m in answers[:7]] == [*reasons[:5], None, reasons[5]]
    assert all(m.rejected is None for m in answers[7:]) and len(answers) == 10
    unknown = answers[2]
    assert unknown.dispatch_id == "unknown-dispatch" and unknown.detail.startswith("REJECTED (unknown dispatch id ")
    assert message_record(unknown)["rejected"] == reasons[2]
    assert message_record(answers[5])["rejected"] is None
    assert {s.agent: s.answered for s in agent_performance(flow)} == {"dev-runner": 2, "review-runner": 2}


async def test_shutdown_request_finishes_story_in_hand(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", "1-2-logout": "review"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="ext-2"))
        slave_id = slave_workflow_id("ext-2", 1)
        dispatch_id, agent, mode = await _pending(client, slave_id, ts_env)
        await handle.signal("shutdown_request")
        # The Master forwards the shutdown to the Slave; the answer must come while the story is in hand.
        slave = client.get_workflow_handle(slave_id)
        await poll_until(lambda: _shutdown_requested(slave), "the Slave hears the shutdown")
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", "1-2-logout": "review"}
    assert report.status == "sprint-partial"
    assert report.batches[0].results.stories_skipped == 1


# The Master's history is ~110 events when the first batch's agent is out (the limit must be above that).
HAND_OVER_AFTER = 140


async def test_a_pause_crosses_the_masters_hand_over_and_holds_in_the_new_run(own_ts_env, tmp_path: Path):
    """The Master continues as new only between batches; a pause sent while the last batch before the hand-over
    still has an agent out must be carried into the new run (still paused, no new batch) and end there."""
    ts_env = own_ts_env  # 3 s; 34 s on the shared server once earlier tests hold its clock
    make_project(tmp_path, {"1-1-first": "review", "1-2-second": "review"})
    client = ts_env.client
    overrides = {"batch_size": 1, "max_concurrent_slaves": 1, "continue_as_new_after_events": HAND_OVER_AFTER}
    async with bso_worker(client) as queue:
        handle = await start_sprint(
            client, queue, sprint_input(tmp_path, agent_backend="external", session_id="ext-can", config_overrides=overrides)
        )
        first = slave_workflow_id("ext-can", 1)
        dispatch_id, agent, mode = await _pending(client, first, ts_env)
        runs_before = (await handle.query(SprintMasterWorkflow.status)).runs
        await handle.signal("pause", "operator check")
        await wait_status(handle, lambda s: s.phase == "paused", "paused")
        assert (await handle.describe()).history_length < HAND_OVER_AFTER  # the batch started before it
        # Repeated pauses (harmless) make the history long while the batch runs; the hand-over must wait for it.
        while (await handle.describe()).history_length < HAND_OVER_AFTER:
            await handle.signal("pause", "operator check")
            await asyncio.sleep(0.1)
        assert (await handle.query(SprintMasterWorkflow.status)).runs == runs_before

        # The batch's last answer ends it: the Master's history is now long, and it hands over while paused.
        await client.get_workflow_handle(first).signal("agent_complete", _complete(dispatch_id, agent, mode, story_key="1-1"))
        status = await wait_status(handle, lambda s: s.runs > runs_before, "the hand-over")
        assert status.phase == "paused" and status.pause_reason == "operator check"
        assert status.stories["1-1-first"].state == "done"
        await asyncio.sleep(1)  # a paused Master starts no batch, in the new run either
        with pytest.raises(RPCError):
            await client.get_workflow_handle(slave_workflow_id("ext-can", 2)).describe()

        await handle.signal("resume")
        second = slave_workflow_id("ext-can", 2)
        dispatch_id, agent, mode = await _pending(client, second, ts_env)
        await client.get_workflow_handle(second).signal("agent_complete", _complete(dispatch_id, agent, mode, story_key="1-2"))
        # Not handle.result(): on the time-skipping test server, its long poll following the continue-as-new to
        # the run that then completes sometimes never returned (2 of ~10 full CI runs hung here for 600 s while
        # the sprint had completed). Wait for the latest run to complete, then read its result.
        latest = client.get_workflow_handle(handle.id, result_type=SprintReport)
        await poll_until(lambda: _completed(latest), "the sprint completes", timeout=120)
        report = await latest.result()
    assert report.stories == {"1-1-first": "done", "1-2-second": "done"}
    assert await workflow_task_failures(client, handle.id) == []


async def test_status_names_the_agent_no_worker_starts(local_env, tmp_path: Path, monkeypatch):
    """A worker serves the sprint queue only: the external agent's activity waits on the agents queue, and the
    status showed it in flight and nothing else, for ever. `bso sprint status` / `watch` name it, how long it
    has waited, and the worker to start, until one takes it. (AGENT_START_PATIENCE, 90 s, cut to 1 s here.)"""
    import io
    import uuid
    from datetime import timedelta

    from rich.console import Console

    import bso.cli
    from bso.cli import _progress, _waiting_for_a_worker
    from bso.constants import AGENTS_TASK_QUEUE, SPRINT_TASK_QUEUE
    from workers.main import build_workers

    monkeypatch.setattr(bso.cli, "AGENT_START_PATIENCE", timedelta(seconds=1))
    client = local_env.client
    make_project(tmp_path, {K1: "review"})
    session, prefix = f"unserved-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:8]}-"
    (sprint_worker,) = build_workers(client, (SPRINT_TASK_QUEUE,), queue_prefix=prefix)
    async with sprint_worker:
        handle = await start_sprint(client, prefix + SPRINT_TASK_QUEUE, sprint_input(
            tmp_path, session_id=session, agent_backend="external"
        ))
        await wait_status(handle, lambda s: s.stories[K1].dispatch_id is not None, "K1's agent dispatched")
        await asyncio.sleep(1.5)
        view = await handle.query(SprintMasterWorkflow.status)
        waiting = await _waiting_for_a_worker(client, await handle.describe(), view)
        assert waiting is not None and waiting.activity_id == view.stories[K1].dispatch_id, waiting
        console = Console(width=300, record=True, file=io.StringIO())
        console.print(_progress(view, None, "running", {}, waiting))
        text = console.export_text()
        assert f"agent {waiting.activity_id} has waited" in text and f"for a worker of {prefix}bso-agents" in text
        assert f"`bso worker --queue bso-agents --queue-prefix {prefix}`" in text, text
        (agents_worker,) = build_workers(client, (AGENTS_TASK_QUEUE,), queue_prefix=prefix)
        async with agents_worker:  # an agents worker comes: the agent starts
            for _ in range(100):
                if await _waiting_for_a_worker(client, await handle.describe(), view) is None:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the agent still shown waiting once a worker serves its queue")
        await handle.cancel()


@activity.defn(name="run_agent")
async def run_agent_until_told(assignment: TaskAssignment) -> DispatchReceipt:
    """The external agent's activity, kept running (its answer may come meanwhile) until the test says."""
    receipt = await run_agent(assignment)
    while not Path(assignment.project_root, "agent-activity-may-end").exists():
        await asyncio.sleep(0.1)
    return receipt


@pytest.mark.parametrize(
    ("answer", "activity_running"),
    [("review-passes", False), ("review-passes", True), ("dev-fails", False)],
    ids=["activity-ended", "activity-running", "failing-answer"],
)
async def test_a_cancel_that_comes_with_the_agents_answer_writes_the_answer_first(
    local_env, tmp_path: Path, answer: str, activity_running: bool
):
    """The agent's AGENT_COMPLETE and the batch's cancel reach the Slave in one workflow task (both sent while no
    sprint worker ran), its agent's activity ended or still running (the Slave then awaits the answer in another
    way): the answer's state is written, then the batch ends cancelled. Before, the cancel was raised first and
    the answer lost, or the write it met was cancelled: the story stayed in review, its finished review to be run
    again.

    A failing answer for the debugger: the SDK runs the task's signal before its cancel, so the Slave sends the
    DEBUG_REQUEST in that task, and the cancel cancels the signal before it goes out. No analysis starts: before,
    the cancelled send was taken for a failed delivery and sent again a second later."""
    first = "review" if answer == "review-passes" else "ready-for-dev"
    make_project(tmp_path, {K1: first, K2: "review"})
    client = local_env.client
    session, prefix = f"answer-cancel-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:8]}-"
    if not activity_running:
        (tmp_path / "agent-activity-may-end").touch()
    inp = sprint_input(tmp_path, agent_backend="external", session_id=session, config_overrides={"batch_size": 2})
    slave = client.get_workflow_handle(slave_workflow_id(session, 1))
    agents_worker = Worker(
        client,
        task_queue=agents_task_queue_for(prefix + SPRINT_TASK_QUEUE),
        activities=[run_agent_until_told, *(a for a in AGENT_ACTIVITIES if a is not run_agent)],
    )
    async with agents_worker:
        (sprint_worker,) = build_workers(client, [SPRINT_TASK_QUEUE], queue_prefix=prefix)
        async with sprint_worker:
            handle = await start_sprint(client, prefix + SPRINT_TASK_QUEUE, inp)
            dispatch_id, agent, mode = await _pending(client, slave.id, local_env)
            await _published(tmp_path, dispatch_id)
            if not activity_running:
                await poll_until(lambda: _task_after(slave, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED), "the activity's end taken")
        failed = {"status": "failure", "error": "ImportError: no module named 'auth'"} if answer == "dev-fails" else {}
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode, **failed))
        await cancelled_while_no_sprint_worker_runs(client, prefix, handle, slave)
        (tmp_path / "agent-activity-may-end").touch()
    states = status_values(tmp_path)
    assert (states[K1], states[K2]) == ("done" if answer == "review-passes" else first, "review"), states
    # The race happened: the answer and the cancel came in one workflow task of the Slave.
    assert await in_one_task(slave, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
    assert SIGNAL_DEBUG_REQUEST not in await signals_sent(slave)
    assert await workflow_task_failures(client, slave.id) == []


async def _task_after(handle, event_type: EventType.ValueType) -> bool:
    """A workflow task of the workflow has ended after its first event of `event_type`."""
    events = list((await handle.fetch_history()).events)
    first = next((e.event_id for e in events if e.event_type == event_type), None)
    return first is not None and any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id > first for e in events
    )


async def _agent_unstarted_past_its_deadline(client: Client, tmp_path: Path) -> None:
    """No agents worker for the whole of the agent's time: the server times the activity out before it starts
    (SCHEDULE_TO_START, which defaults to the deadline). The story was reported "agent activity failed:
    Timeout", as if the agent had broken; it is the agent's deadline passing, said as such, naming the queue no
    worker took it from. (A busy worker that starts a simulated agent only after its deadline meets the same.)"""
    make_project(tmp_path, {K1: "review"})
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    (sprint_worker,) = build_workers(client, (SPRINT_TASK_QUEUE,), queue_prefix=prefix)
    overrides = {"agent_timeout_seconds": {"code_review": 2}}
    async with sprint_worker:
        report = await run_sprint(client, prefix + SPRINT_TASK_QUEUE, sprint_input(
            tmp_path, agent_backend="external", config_overrides=overrides
        ))
    assert report.stories == {K1: "needs-intervention"}
    errors = [r.error for b in report.batches for r in b.results.story_results if r.story_key == K1]
    assert errors and "no AGENT_COMPLETE within 2s" in (errors[0] or ""), errors
    # The queue no worker served is named when the server says so (SCHEDULE_TO_START); when both timeouts fall due
    # at once it may report SCHEDULE_TO_CLOSE, an agent that ran out of time.
    assert errors[0].endswith(("within 2s", f"within 2s (no worker of {prefix}bso-agents started it)")), errors


async def test_an_agent_no_worker_starts_before_its_deadline_is_out_of_time(ts_env, tmp_path: Path):
    await _agent_unstarted_past_its_deadline(ts_env.client, tmp_path)


async def test_an_agent_no_worker_starts_before_its_deadline_is_out_of_time_on_the_dev_server(
    local_env, tmp_path: Path
):
    await _agent_unstarted_past_its_deadline(local_env.client, tmp_path)
