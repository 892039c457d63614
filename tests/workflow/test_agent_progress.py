"""Agent-PO's PROGRESS_UPDATE (the agent activity's heartbeat detail) and TERMINATE_DIRECTIVE (a cancelled
dispatch, in the message flow), through the real activities and a sprint on the time-skipping server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.backends import command, simulated
from bso.agent_progress import percent_of, progress_update
from bso.constants import slave_workflow_id
from bso.message_flow import message_flow
from bso.messages import ProgressUpdatePayload, TerminateDirectivePayload, TaskAssignment, parse_message
from bso.states import AgentMode, AgentStatus, AgentType
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input, workflow_task_failures
from tests.workflow.test_command_backend import assignment, dev_project

K1 = "1-1-login-form"


def _progress(detail: dict) -> ProgressUpdatePayload:
    message = parse_message(detail)
    assert message.type == "PROGRESS_UPDATE"
    return message.payload


def test_progress_update_is_validated() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    detail = progress_update(agent_id="dev-runner", task_id="1-1", at=at, percent=40, current_activity="x" * 999,
                             eta_seconds=61, pid=7)
    body = _progress(detail)
    assert (body.progress_percent, body.eta_minutes, len(body.current_activity)) == (40, 2, 300)
    assert detail["pid"] == 7 and detail["timestamp"] == at.isoformat()
    assert percent_of(5, 10) == 50 and percent_of(20, 10) == 99 and percent_of(1, 0) == 0
    with pytest.raises(ValueError):
        progress_update(agent_id="a", task_id="t", at=at, percent=1, status="")


async def test_simulated_heartbeats_are_progress_updates(tmp_path: Path) -> None:
    make_project(tmp_path, {K1: "ready-for-dev"})
    a = TaskAssignment(
        dispatch_id="s/batch-1/1-1/1", agent_type=AgentType.DEV_RUNNER, mode=AgentMode.DEV, story_key=K1,
        story_path=f"_bmad-output/implementation-artifacts/{K1}.md", session_id="s", batch_id=1,
        report_to="s/batch-1", project_root=str(tmp_path), simulation={"duration_ms": 2200},
    )
    env = ActivityEnvironment()
    beats: list[dict] = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    done = await env.run(simulated.run, a)
    assert done.status is AgentStatus.SUCCESS
    assert len(beats) >= 2
    bodies = [_progress(b) for b in beats]
    assert all(b.agent_id == "dev-runner" and b.task_id == K1 and b.status == "in_progress" for b in bodies)
    assert [b.progress_percent for b in bodies] == sorted(b.progress_percent for b in bodies)
    assert bodies[0].progress_percent < 50 and bodies[0].eta_minutes == 1
    assert all(b["dispatch_id"] == a.dispatch_id for b in beats)


async def test_command_heartbeats_are_progress_updates(tmp_path: Path) -> None:
    root = dev_project(tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 4\n",  # (2 Python start-ups first)
                       FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(tmp_path / "pids.json"))
    env = ActivityEnvironment()
    beats: list[dict] = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    done = await env.run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "timed out" in done.error
    bodies = [_progress(b) for b in beats]
    assert bodies and all(b.agent_id == "dev-runner" and b.task_id == assignment(root).story_key for b in bodies)
    assert any(b.current_activity == "working very hard" for b in bodies)
    assert any({"pid", "elapsed_s", "last_line", "dispatch_id"} <= set(b) for b in beats)  # while the agent ran
    assert beats[-1]["phase"] == "checking"  # then BSO checked its work


async def test_a_cancelled_dispatch_is_a_terminate_directive(ts_env, tmp_path: Path) -> None:
    """The dev-runner outlives its time: the Slave cancels it; the message flow shows TERMINATE_DIRECTIVE."""
    make_project(tmp_path, {K1: "ready-for-dev"})
    inp = sprint_input(
        tmp_path, session_id="terminate", simulation={"stories": {"1-1": {"duration_ms": 30000}}},
        config_overrides={"agent_timeout_seconds": {"dev_execution": 2}},
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories == {K1: "needs-intervention"}
    slave = await ts_env.client.get_workflow_handle(slave_workflow_id("terminate", 1)).fetch_history()
    flow = message_flow([slave])
    [terminate] = [m for m in flow if m.type == "TERMINATE_DIRECTIVE"]
    assert (terminate.sender, terminate.recipient, terminate.story) == ("slave-batch-1", "dev-runner", K1)
    assert terminate.dispatch_id.endswith("/1-1/1")
    message = parse_message(
        {"message_type": "TERMINATE_DIRECTIVE", "timestamp": terminate.time.isoformat() + "Z", **terminate.payload}
    )
    assert isinstance(message.payload, TerminateDirectivePayload)
    assert "time is up" in message.payload.reason
    # It follows the assignment it ends, and no AGENT_COMPLETE came for that dispatch.
    kinds = [m.type for m in flow if m.dispatch_id == terminate.dispatch_id]
    assert kinds[:2] == ["TASK_ASSIGNMENT", "TERMINATE_DIRECTIVE"] and "AGENT_COMPLETE" not in kinds
    assert await workflow_task_failures(ts_env.client, "terminate") == []
