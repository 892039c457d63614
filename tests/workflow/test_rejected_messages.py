"""Malformed signals to a resident and to the Master are recorded the seed's way (validation_failed naming
the field) in their status, change nothing, and never fail a workflow task."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bso.cli import _children_status, _rejections, _with_rejections
from bso.message_flow import message_flow
from bso.roster import resident_workflow_id
from bso.states import SprintPhase, SprintStatus
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, workflow_task_failures
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"


async def _eventually(query, check, what: str):
    for _ in range(200):
        try:
            value = await query()
        except Exception:  # not started yet
            value = None
        if value is not None and check(value):
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what} (last: {value})")


async def test_malformed_signals_are_recorded_by_residents_and_the_master(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="rejects"), paused="hold while we send bad signals"
        )
        await _eventually(lambda: handle.query(SprintMasterWorkflow.status), lambda s: s.phase is SprintPhase.PAUSED,
                          "paused")
        debugger = ts_env.client.get_workflow_handle(resident_workflow_id("rejects", "debugger"))
        before = await _eventually(lambda: debugger.query(ResidentWorkflow.status), lambda s: True, "debugger up")
        await debugger.signal("debug_request", {"debug_id": "DBG-1", "story_key": K1})  # no report_to
        await debugger.signal("roster_broadcast", {"session_id": "rejects", "seq": "first"})
        await handle.signal("story_update", {"batch_id": 1, "story_key": K1})  # no view
        await handle.signal("resume", {"token_limit": -5})
        resident = await _eventually(lambda: debugger.query(ResidentWorkflow.status),
                                     lambda s: s.rejected_total == 2, "debugger rejections")
        master = await _eventually(lambda: handle.query(SprintMasterWorkflow.status),
                                   lambda s: s.rejected_total == 2, "Master rejections")
        # `bso sprint status` shows them all, the residents' (children of the Master) with the Master's own.
        children = _with_rejections(await _children_status(ts_env.client, await handle.describe()))
        debugger_id = resident_workflow_id("rejects", "debugger")
        assert {wid: r.rejected_total for wid, r in children.items()} == {debugger_id: 2}
        shown = [line.plain for line in _rejections(master, children)]
        assert shown[0] == f"rejected messages: 4 (rejects: 2, {debugger_id}: 2); the last of each:", shown
        assert shown[1].startswith("  rejects: RESUME: ") and "token_limit" in shown[1], shown
        assert shown[2].startswith(f"  {debugger_id}: AGENT_ROSTER_BROADCAST: "), shown
        assert "bso messages rejects" in shown[3]
        # Nothing changed: the debugger served nothing new, the sprint is still paused.
        assert resident.requests_served == before.requests_served
        assert master.phase is SprintPhase.PAUSED and master.pause_reason == "hold while we send bad signals"
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done"}
    by_type = {m.msg_type: m for m in resident.rejected_messages}
    assert {e["field"] for e in by_type["DEBUG_REQUEST"].error["errors"]} == {"report_to"}
    assert by_type["DEBUG_REQUEST"].error["error_type"] == "validation_failed"
    assert any(e["field"].startswith("seq") for e in by_type["AGENT_ROSTER_BROADCAST"].error["errors"])
    by_type = {m.msg_type: m for m in master.rejected_messages}
    assert any(e["field"] == "view" for e in by_type["STORY_UPDATE"].error["errors"])
    assert any(e["field"] == "token_limit" for e in by_type["RESUME"].error["errors"])
    assert await workflow_task_failures(ts_env.client, "rejects") == []


async def test_an_agent_answer_sent_to_the_sprint_is_recorded_with_where_it_belongs(ts_env, tmp_path: Path):
    """An agent author's easy mistake: AGENT_COMPLETE sent to the sprint id instead of its batch (report_to). The
    Master has no such signal: it was dropped without a trace. It is now rejected, naming the batch, in the
    status and in `bso messages`; an unknown signal name too. The residents' ready signals name the role."""
    make_project(tmp_path, {K1: "review"})
    answer = {"dispatch_id": "wrong-way/batch-1/1-1/1", "story_key": K1, "agent_type": "code-reviewer",
              "mode": "review", "status": "success"}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="wrong-way"), paused="hold")
        await handle.signal("agent_complete", answer)
        await handle.signal("agent_completed", answer)
        await handle.signal("decision", {"story_key": K1, "decision": "skip_story"})
        master = await _eventually(lambda: handle.query(SprintMasterWorkflow.status),
                                   lambda s: s.rejected_total == 3, "Master rejections")
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        flow = message_flow(await fetch_sprint_histories(ts_env.client, handle.id))
    assert report.stories == {K1: "done"}  # the batch ran as usual
    first, second, third = master.rejected_messages
    assert third.msg_type == "DECISION" and "`decide` update (`bso sprint decide`)" in third.reason, third
    assert (first.msg_type, first.dispatch_id) == ("AGENT_COMPLETE", "wrong-way/batch-1/1-1/1"), first
    assert "send it to wrong-way/batch-1 (the TASK_ASSIGNMENT's report_to)" in first.reason, first.reason
    assert second.msg_type == "AGENT_COMPLETED" and "no signal 'agent_completed'" in second.reason, second
    to_master = [m for m in flow if m.recipient == "sprint-master" and m.rejected]
    assert [(m.type, m.rejected) for m in to_master] == [(r.msg_type, r.reason) for r in (first, second, third)]
    assert [m.sender for m in to_master] == ["code-reviewer", "code-reviewer", "operator"]  # who sent it
    ready = [m.sender for m in flow if m.type == "RESIDENT_READY"]
    assert ready == ["scrum-master", "knowledge-researcher", "debugger"], ready
    assert await workflow_task_failures(ts_env.client, "wrong-way") == []
