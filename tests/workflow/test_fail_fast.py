"""Gear 2's AGENT_ERROR with `recoverable: false`: fail_fast stops the sprint, otherwise the story is marked."""

from __future__ import annotations

from pathlib import Path

from bso.config import resolve_config
from bso.constants import slave_workflow_id
from bso.dispatch import DEV, agent_error_to_complete, apply_agent_result, fatal_error
from bso.messages import AgentComplete, AgentErrorPayload
from bso.models import StoryProgress
from bso.simulation import StoryScript, scripted_answer
from bso.states import AgentMode, AgentType, SprintStatus
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input, sprint_result, start_sprint, status_values
from tests.workflow.test_external_agents import _pending
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

K1 = "1-1-login-form"
K2 = "1-2-logout"
K3 = "1-3-profile-page"


def _failure(**kw) -> AgentComplete:
    return AgentComplete(dispatch_id="d", story_key=K1, agent_type="dev-runner", mode="dev", status="failure",
                         error="CLI timed out", **kw)


def test_fatal_only_with_fail_fast_and_unrecoverable() -> None:
    on, off = resolve_config({"fail_fast": True}), resolve_config()
    assert fatal_error(_failure(recoverable=False, error_type="backend_failure"), on) == (
        f"unrecoverable backend_failure from dev-runner/dev on {K1}: CLI timed out"
    )
    assert fatal_error(_failure(recoverable=False), off) is None
    assert fatal_error(_failure(), on) is None  # recoverable by default
    ok = AgentComplete(dispatch_id="d", story_key=K1, agent_type="dev-runner", mode="dev", status="success",
                       recoverable=False)
    assert fatal_error(ok, on) is None
    # Either way the story itself is marked needs-intervention, naming the error.
    t = apply_agent_result(StoryProgress(key=K1, state="ready-for-dev"), DEV,
                           _failure(recoverable=False, error_type="backend_failure"), off, [])
    assert t.progress.state == "needs-intervention" and "unrecoverable backend_failure" in (t.progress.error or "")


def test_agent_error_payload_becomes_a_failed_answer() -> None:
    error = AgentErrorPayload(error_type="backend_failure", error_message="boom", task_id="d-1", recoverable=False)
    complete = agent_error_to_complete(error, "d-1", K1, AgentType.DEV_RUNNER, AgentMode.DEV)
    assert complete.status.value == "failure" and not complete.recoverable and complete.error == "boom"


def test_simulated_fatal() -> None:
    answer = scripted_answer(StoryScript(fail={"dev": "fatal"}), "dev", 1)
    assert answer.status.value == "failure" and not answer.recoverable and answer.error_type == "backend_failure"


async def test_fail_fast_stops_the_sprint(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"})
    inp = sprint_input(tmp_path, simulation={"stories": {"1-1": {"fail": {"dev": "fatal"}}}},
                       config_overrides={"fail_fast": True, "batch_size": 2})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        report = await sprint_result(handle)
        master = await handle.query(SprintMasterWorkflow.status)
    assert report.stories[K1] == "needs-intervention"
    assert any(e.endswith("sprint stopped (fail_fast)") for e in master.errors)
    assert status_values(tmp_path)[K2] == status_values(tmp_path)[K3] == "ready-for-dev"  # never started
    assert report.status is SprintStatus.PARTIAL
    assert len(report.batches) == 1 and report.batches[0].fatal_error
    assert report.batches[0].results.story_results[1].agents_dispatched == 0


async def test_without_fail_fast_only_the_story_is_marked(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    inp = sprint_input(tmp_path, simulation={"stories": {"1-1": {"fail": {"dev": "fatal"}}}})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories == {K1: "needs-intervention", K2: "done"}
    assert report.batches[0].fatal_error is None
    # Unrecoverable: no debugger round (and fix) first, and the reason says so.
    [story] = [r for r in report.batches[0].results.story_results if r.story_key == K1]
    assert story.error == f"dev-runner/dev failed: unrecoverable backend_failure: simulated dev backend failure in {K1}"
    assert story.agents_dispatched == 1


async def test_external_agent_error_message_by_signal(ts_env, tmp_path: Path):
    """An external agent may answer with Gear 2's agent_error (its task_id is the dispatch id)."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    inp = sprint_input(tmp_path, agent_backend="external", session_id="ext-err", config_overrides={"fail_fast": True})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, inp)
        slave_id = slave_workflow_id("ext-err", 1)
        slave = client.get_workflow_handle(slave_id)
        dispatch_id, _, _ = await _pending(client, slave_id, ts_env)
        bad = {"message_id": "msg_err001", "message_type": "agent_error", "from_agent": "techlead",
               "to_agent": "moderator", "timestamp": "2024-10-15T10:35:00", "payload": {"task_id": dispatch_id}}
        await slave.signal("agent_complete", bad)  # no error_type / error_message: rejected, recorded
        await slave.signal("agent_complete", {**bad, "payload": {
            "error_type": "backend_failure", "error_message": "Claude CLI execution failed", "task_id": dispatch_id,
            "recoverable": False}})
        report = await sprint_result(handle)
        status = await slave.query(SprintSlaveWorkflow.status)
    assert report.stories[K1] == "needs-intervention" and report.status is SprintStatus.PARTIAL
    assert status_values(tmp_path)[K2] == "ready-for-dev"
    reasons = [r.reason for r in status.rejected_messages]
    assert reasons and "payload.error_type: required field missing" in reasons[0]
    assert "Claude CLI execution failed" in (report.batches[0].fatal_error or "")


async def test_fail_fast_shuts_down_the_other_running_slaves(ts_env, tmp_path: Path):
    k4 = "1-4-settings"
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev", k4: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "fatal"}}, "1-3": {"duration_ms": 3000}}}
    inp = sprint_input(tmp_path, simulation=simulation,
                       config_overrides={"fail_fast": True, "batch_size": 2, "max_concurrent_slaves": 2})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories[K1] == "needs-intervention"
    values = status_values(tmp_path)
    assert values[K2] == "ready-for-dev"  # after the fatal story, in its own batch
    assert values[k4] == "ready-for-dev"  # the other Slave finished the story in hand (1-3) and stopped
    assert report.status is SprintStatus.PARTIAL
