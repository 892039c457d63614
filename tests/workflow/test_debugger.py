"""The debugger resident on the time-skipping server: a dev-runner failure goes through DEBUG_REQUEST /
DEBUG_RESULT; a fixable analysis rescues the story (fix dispatch with the root cause), an unfixable one
does not, max_debug_attempts caps the rounds, known error patterns come from the journal."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.worker import Worker

from bso.cli import _stories_table
from bso.message_flow import message_flow
from bso.constants import (
    AGENTS_TASK_QUEUE,
    SIGNAL_DEBUG_REQUEST,
    SIGNAL_DEBUG_RESULT,
    SIGNAL_STOP_NOW,
    SPRINT_TASK_QUEUE,
    slave_workflow_id,
)
from bso.debugging import DebugRequest
from bso.roster import resident_workflow_id
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.holds import SignalDeliveredFirst, in_the_hold, replay_with, workers_with
from tests.workflow.resident_host import HostInput, ResidentHost
from tests.workflow.helpers import (
    fix_assignments,
    ledger,
    poll_until,
    make_project,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    wait_status,
)
from workers.main import build_workers
from workflows.residents import ResidentWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

K1, K2 = "1-1-login-form", "1-2-logout"


def journal(root: Path) -> str:
    path = root / ".sprint-session" / "debug-journal.md"
    return path.read_text() if path.exists() else ""


def story_error(report, key):
    return next(r.error for b in report.batches for r in b.results.story_results if r.story_key == key)


async def test_a_fixable_analysis_rescues_the_story(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-1", simulation=simulation))
        fixes = await fix_assignments(ts_env.client, slave_workflow_id("dbg-1", 1))
        debugger = await ts_env.client.get_workflow_handle(resident_workflow_id("dbg-1", "debugger")).query(
            ResidentWorkflow.status
        )
        history = await ts_env.client.get_workflow_handle(slave_workflow_id("dbg-1", 1)).fetch_history()
    assert report.stories == {K1: "done"}
    assert status_values(tmp_path)[K1] == "done"
    # dev (failed), fix (with the analysis), code review
    assert report.batches[0].results.story_results[0].agents_dispatched == 3
    assert len(fixes) == 1
    summary = fixes[0]["fix_findings"][0]["summary"]
    assert summary.startswith("DBG-b1-1-1-001 root cause: simulated root cause of: simulated dev agent error")
    assert "Fix suggestion:" in summary
    assert debugger.requests_served == 1
    signals = [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert SIGNAL_DEBUG_RESULT in signals  # DEBUG_RESULT came back as a signal
    text = journal(tmp_path)
    assert "## DBG-b1-1-1-001-dbg-1" in text and "- confidence: high" in text and "- known_pattern: no" in text


async def test_a_story_waiting_on_the_debugger_shows_it_not_its_finished_agent(ts_env, tmp_path: Path):
    """The analysis runs on the agents queue: with no worker serving it yet, the story waits on the debugger,
    and every status view says so (the dev-runner that failed is no longer in flight)."""
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}}}
    async with bso_worker(ts_env.client, queues=(SPRINT_TASK_QUEUE,)) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-wait", simulation=simulation))
        status = await wait_status(handle, lambda s: s.stories[K1].debug_in_flight is not None, "debug wait shown")
        story = status.stories[K1]
        assert (story.debug_in_flight, story.agent_in_flight) == ("DBG-b1-1-1-001", None)
        assert story.in_flight == "debugger (DBG-b1-1-1-001)"
        assert "debugger (DBG-b1-1-1-001)" in "".join(str(cell) for cell in _stories_table(status, 200).columns[5].cells)
        slave = await ts_env.client.get_workflow_handle(slave_workflow_id("dbg-wait", 1)).query(SprintSlaveWorkflow.status)
        assert slave.stories[K1].debug_in_flight == "DBG-b1-1-1-001"
        # The agents' worker comes: the analysis runs, the fix follows, and the wait is no longer shown.
        agents = build_workers(ts_env.client, (AGENTS_TASK_QUEUE,), queue_prefix=queue.removesuffix(SPRINT_TASK_QUEUE))
        async with agents[0]:
            report = await sprint_result(handle)
            final = await handle.query("status")
    assert report.stories == {K1: "done"}
    assert final["stories"][K1].get("debug_in_flight") is None


async def test_a_cancel_while_the_debugger_waits_for_a_worker_ends_the_sprint(own_ts_env, tmp_path: Path, monkeypatch):
    """No worker serves the agents queue, so the debugger's analysis is never picked up (`bso sprint status`
    says so). Cancelling the sprint stops the debugger at once: its analysis is cancelled, and the sprint ends
    cancelled. Before, the stop waited for that analysis to be answered, and the cancelled sprint never ended.
    (A server of its own: what the cancel leaves held the shared server's clock for later tests.)"""
    from datetime import timedelta

    import bso.cli
    from bso.cli import _waiting_for_a_worker

    # The time-skipping server's clock is not ours: how long the analysis waited is not what is checked here.
    monkeypatch.setattr(bso.cli, "AGENT_START_PATIENCE", timedelta.min)
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}}}
    async with bso_worker(own_ts_env.client, queues=(SPRINT_TASK_QUEUE,)) as queue:
        handle = await start_sprint(own_ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-cancel", simulation=simulation))
        view = await wait_status(handle, lambda s: s.stories[K1].debug_in_flight is not None, "debug wait shown")
        waiting = await _waiting_for_a_worker(own_ts_env.client, await handle.describe(), view)
        assert waiting is not None and waiting.activity_type == "analyze_failure", waiting
        assert waiting.workflow_id == resident_workflow_id("dbg-cancel", "debugger")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
        status = await handle.query("status")
        debugger = own_ts_env.client.get_workflow_handle(resident_workflow_id("dbg-cancel", "debugger"))
        described = await debugger.describe()
        events = [e.event_type for e in (await debugger.fetch_history()).events]
        flow = message_flow(await fetch_sprint_histories(own_ts_env.client, handle.id))
    assert isinstance(failure.value.cause, CancelledError), failure.value.cause
    assert status["phase"] == "canceled", status
    assert described.status is WorkflowExecutionStatus.COMPLETED, described.status
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in events
    stops = [(m.sender, m.recipient) for m in flow if m.type.startswith("STOP")]
    assert stops == [("sprint-master", r) for r in ("debugger", "knowledge-researcher", "scrum-master")], stops
    assert {m.type for m in flow if m.type.startswith("STOP")} == {"STOP_NOW"}
    assert status_values(tmp_path)[K1] == "ready-for-dev"  # the story keeps its last state for the next sprint


async def test_an_unfixable_analysis_gives_needs_intervention(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["unfixable"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-2", simulation=simulation))
    assert report.stories == {K1: "needs-intervention"}
    error = story_error(report, K1)
    assert "simulated dev agent error" in error and "debugger DBG-b1-1-1-001 found no fix" in error
    assert "- confidence: none" in journal(tmp_path)


async def test_max_debug_attempts_caps_the_rounds(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    # The fix fails too: the one debug attempt is spent, so the story needs intervention.
    simulation = {"stories": {"1-1": {"fail": {"dev": "error", "fix": "error"}, "debug": ["fixable", "fixable"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
        assert report.stories == {K1: "needs-intervention"}
        assert "simulated fix agent error" in story_error(report, K1)
        assert journal(tmp_path).count("## DBG-") == 1
        # With two attempts the second failure is analysed too.
        other = tmp_path / "two"
        make_project(other, {K1: "ready-for-dev"})
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(other, simulation=simulation, config_overrides={"max_debug_attempts": 2}),
        )
    assert report.stories == {K1: "needs-intervention"}
    assert journal(other).count("## DBG-") == 2


async def test_known_error_pattern_is_matched_from_the_journal(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    # Both dev runs fail with the same error; only 1-1's analysis is scripted fixable (1-2's would not be).
    same = "TypeError: cannot read properties of undefined (reading 'id') at line 42"
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"], "error": same},
                              "1-2": {"fail": {"dev": "error"}, "error": same.replace("42", "43")}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-4", simulation=simulation))
    assert report.stories == {K1: "done", K2: "done"}
    text = journal(tmp_path)
    assert text.count("## DBG-") == 2
    assert text.count("- known_pattern: yes") == 1


async def test_each_storys_scripted_failure_is_its_own_pattern(ts_env, tmp_path: Path):
    """Two stories failing by default text: 1-2 gets its own (unscripted: unfixable) analysis, not 1-1's fix."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}, "1-2": {"fail": {"dev": "error"}}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="dbg-5", simulation=simulation))
    assert report.stories == {K1: "done", K2: "needs-intervention"}
    assert "simulated dev agent error in 1-2-logout" in story_error(report, K2)
    assert "- known_pattern: yes" not in journal(tmp_path)


async def test_without_a_debugger_the_failure_needs_intervention(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"residents_fail_start": ["debugger"], "stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    assert report.stories == {K1: "needs-intervention"}
    assert "debugger unavailable: no debugger resident in this sprint" in story_error(report, K1)


async def test_a_debugger_stopped_now_drops_what_it_holds_and_what_comes_after(local_env, tmp_path: Path):
    """stop_now (a cancelled sprint): the analysis in hand, which no worker picks up, is cancelled and not
    answered; a request that comes after it is dropped (recorded as rejected), not served; the debugger ends.
    The two signals reach it in one workflow task (its worker is away meanwhile), so the second comes after.
    On the dev server: the time-skipping one leaves a task on the stopped worker's sticky queue."""
    session = "stop-now"
    prefix, host_queue, debugger, request = _debugger_names(local_env.client, session)
    async with Worker(local_env.client, task_queue=host_queue, workflows=[ResidentHost]):
        async with _sprint_queue_worker(local_env.client, prefix):
            host = await _analysis_in_hand(local_env.client, session, tmp_path, prefix, host_queue, request)
        await debugger.signal(SIGNAL_STOP_NOW)
        await debugger.signal(SIGNAL_DEBUG_REQUEST, request.model_copy(update={"debug_id": "dbg-2"}).model_dump(mode="json"))
        async with _sprint_queue_worker(local_env.client, prefix):
            await host.signal(ResidentHost.finish)
            (summary,) = await asyncio.wait_for(host.result(), 60)
            status = await debugger.query(ResidentWorkflow.status)
            seen = await host.query(ResidentHost.seen)
            events = [e.event_type for e in (await debugger.fetch_history()).events]
    assert seen.answers["debug"] == [] and summary.requests_served == 0, (seen, summary)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in events
    assert events.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 1  # dbg-2's analysis never scheduled
    assert [(r.msg_type, r.reason) for r in status.rejected_messages] == [
        ("DEBUG_REQUEST", "the sprint was cancelled: this resident is stopping")
    ], status.rejected_messages


async def test_a_debugger_cancelled_while_its_analysis_is_in_hand_ends_cancelled(local_env, tmp_path: Path):
    """A cancel that comes while an analysis is in hand fails that analysis (the activity is cancelled) and is
    not raised again: the debugger answered and served on for ever, nothing else stopping it (a Master cancels
    a resident not ready in time; its ready signal can take the cancel the same way). It ends cancelled."""
    session = "cancel-busy"
    prefix, host_queue, debugger, request = _debugger_names(local_env.client, session)
    async with Worker(local_env.client, task_queue=host_queue, workflows=[ResidentHost]):
        async with _sprint_queue_worker(local_env.client, prefix):
            host = await _analysis_in_hand(local_env.client, session, tmp_path, prefix, host_queue, request)
            await debugger.cancel()
            ended = await poll_until(lambda: _ended(debugger), "the cancelled debugger ended", timeout=20)
            await host.terminate("test over")
    assert ended is WorkflowExecutionStatus.CANCELED


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the sprint's histories with it
async def test_a_cancel_the_delivered_debug_request_swallowed_still_ends_the_batch(local_env, tmp_path: Path):
    """The cancel comes while the Slave's DEBUG_REQUEST is being delivered, and the delivery wins: the batch ran
    on (the debugger's answer, the fix, the code review) until the Master, done waiting for it, closed. It ends
    cancelled, and no agent runs after the cancel."""
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]}}}
    session = f"dbg-swallowed-{uuid.uuid4().hex[:6]}"
    slave = local_env.client.get_workflow_handle(slave_workflow_id(session, 1))
    hold = SignalDeliveredFirst(SIGNAL_DEBUG_REQUEST)
    async with workers_with(local_env.client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id=session, simulation=simulation))
        await poll_until(lambda: in_the_hold(slave, hold), "the Slave held after its debug request")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
        ended = (await slave.describe()).status
    assert isinstance(failure.value.cause, CancelledError), failure.value.cause
    assert ended is WorkflowExecutionStatus.CANCELED, ended
    started = [e["dispatch_id"] for e in ledger(tmp_path) if e["event"] == "started"]
    assert started == [f"{session}/batch-1/1-1/1"], started  # the dev-runner only: no fix, no code review
    assert status_values(tmp_path)[K1] == "ready-for-dev"  # its last state: the dev failed
    await replay_with(local_env.client, handle, hold)  # the Master, its Slaves and residents


def _sprint_queue_worker(client, prefix: str) -> Worker:
    """BSO's sprint-queue worker on `prefix` (the debugger's analyses wait: no agents worker)."""
    (worker,) = build_workers(client, (SPRINT_TASK_QUEUE,), queue_prefix=prefix)
    return worker


async def _ended(handle) -> WorkflowExecutionStatus | None:
    status = (await handle.describe()).status
    return None if status is WorkflowExecutionStatus.RUNNING else status


def _debugger_names(client, session: str):
    """A debugger test's sprint-queue prefix, its host's queue, the debugger's handle and a first request."""
    prefix, host_queue = f"t-{uuid.uuid4().hex[:8]}-", f"host-{uuid.uuid4().hex[:8]}"
    debugger = client.get_workflow_handle(resident_workflow_id(session, "debugger"))
    request = DebugRequest(debug_id="dbg-1", story_key=K1, report_to=f"{session}-host", error_summary="boom")
    return prefix, host_queue, debugger, request


async def _analysis_in_hand(client, session: str, root: Path, prefix: str, host_queue: str, request: DebugRequest):
    """The debugger up (`_debugger_up`) with `request`'s analysis scheduled, which no worker picks up (the
    sprint queue's worker serves no agents): the host's handle."""
    host = await _debugger_up(client, session, root, prefix, host_queue)
    debugger = client.get_workflow_handle(resident_workflow_id(session, "debugger"))
    await debugger.signal(SIGNAL_DEBUG_REQUEST, request.model_dump(mode="json"))
    await poll_until(lambda: _analysis_pending(debugger), "the analysis scheduled (no agents worker)")
    return host


async def _debugger_up(client, session: str, root: Path, prefix: str, host_queue: str):
    """A ResidentHost (on `host_queue`) whose one resident, the debugger, runs on the `prefix` sprint queue."""
    host = await client.start_workflow(
        ResidentHost.run,
        HostInput(session_id=session, project_root=str(root), roles=["debugger"],
                  resident_task_queue=prefix + SPRINT_TASK_QUEUE),
        id=f"{session}-host",
        task_queue=host_queue,
    )
    await poll_until(lambda: _ready(host), "the debugger up")
    return host


async def _analysis_pending(handle) -> bool:
    return bool((await handle.describe()).raw_description.pending_activities)


async def _ready(host) -> bool:
    return (await host.query(ResidentHost.seen)).ready == ["debugger"]



async def test_a_debug_request_by_hand_is_journalled_under_the_sprint(local_env, tmp_path: Path):
    """The README's DEBUG_REQUEST by hand carries no session_id: its journal section was `## DBG-001-sprint` with
    an empty `- session:` line; it is named after the resident's sprint."""
    session, prefix = f"by-hand-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:8]}-"
    host_queue = f"host-{uuid.uuid4().hex[:8]}"
    debugger = local_env.client.get_workflow_handle(resident_workflow_id(session, "debugger"))
    request = DebugRequest(debug_id="DBG-001", story_key=K1, report_to=f"{session}-host", error_summary="boom")
    async with Worker(local_env.client, task_queue=host_queue, workflows=[ResidentHost]):
        async with bso_worker(local_env.client, queue_prefix=prefix):
            host = await _debugger_up(local_env.client, session, tmp_path, prefix, host_queue)
            await debugger.signal(SIGNAL_DEBUG_REQUEST, request.model_dump(mode="json", exclude={"session_id"}))

            async def answered() -> bool:
                return (await host.query(ResidentHost.seen)).answers["debug"] == ["DBG-001"]

            await poll_until(answered, "the DEBUG_RESULT")
            await host.signal(ResidentHost.finish)
            await asyncio.wait_for(host.result(), 60)
    text = journal(tmp_path)
    assert f"## DBG-001-{session}\n" in text and f"- session: {session}\n" in text, text
