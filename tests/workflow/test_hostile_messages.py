"""Every signal and update of every BSO workflow, sent malformed payloads while a sprint runs: each is refused
or ignored, no workflow task fails, and the sprint then completes as if nothing had been sent.

The handlers are read from the workflow classes, so a handler added later is covered without a new test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from bench.histories import task_failures as history_task_failures
from bso.constants import slave_workflow_id
from bso.message_flow import message_flow
from bso.roster import RESIDENT_ROLES, resident_workflow_id
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, status_values, wait_status
from tests.workflow.test_external_agents import _complete, _pending
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

K1 = "1-1-login-form"
HOSTILE = [
    None,
    42,
    "nonsense",
    [1, 2, 3],
    {},
    {"story_key": 42, "batch_id": "one", "view": "done", "dispatch_id": 7, "agent_type": ["x"]},
    {"story_key": "../../etc/passwd", "dispatch_id": "x" * 10_000, "msg_type": "AGENT_COMPLETE"},
    {"a": {"b": {"c": {"d": [None, {"e": 1.5}]}}}},
]
# Signals whose name alone is the command (end the sprint, stop a resident): sending them ends things, as asked.
ENDS_SOMETHING = {"shutdown_request", "stop", "stop_now"}


def handler_names(cls: type) -> tuple[list[str], list[str]]:
    """The signal and update names a workflow class defines (the SDK's own reading of its decorators)."""
    definition = workflow._Definition.must_from_class(cls)
    signals = sorted(name for name in definition.signals if name and name not in ENDS_SOMETHING)
    return signals, sorted(name for name in definition.updates if name)


async def flood(handle: WorkflowHandle, cls: type) -> list[str]:
    """Every hostile payload to every signal and update; the updates' refusals, as text."""
    signals, updates = handler_names(cls)
    refusals = []
    for name in signals:
        for payload in HOSTILE:
            await handle.signal(name, payload)
        await handle.signal(name)  # no input at all
    for name in signals:  # (the SDK hands a handler without parameters no input at all: those above act)
        await handle.signal(name, args=[{}, {}])  # one input too many: `temporal workflow signal --input A --input B`
    for name in updates:
        for payload in HOSTILE:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await asyncio.wait_for(handle.execute_update(name, payload), 30)
            refusals.append(f"{name}: {refused.value.cause}")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(handle.execute_update(name, args=[{}, {}]), 30)
        assert "sent with 2 inputs, which it cannot take" in str(refused.value.cause), refused.value.cause
    return refusals


async def task_failures(client: Client, sprint_id: str) -> dict[str, list[str]]:
    """WorkflowTaskFailed events of every workflow of the sprint (a hand-over refused for a signal apart)."""
    histories = await fetch_sprint_histories(client, sprint_id)
    return {h.workflow_id: found for h in histories if (found := history_task_failures(h))}


async def running_residents(client: Client, session: str) -> list[WorkflowHandle]:
    handles = []
    for role in RESIDENT_ROLES:
        handle = client.get_workflow_handle(resident_workflow_id(session, role))
        try:
            if (await handle.describe()).status.name == "RUNNING":
                handles.append(handle)
        except RPCError:  # a role this sprint does not run
            continue
    return handles


async def test_every_handler_refuses_or_ignores_malformed_payloads(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="hostile"))
        slave_id = slave_workflow_id("hostile", 1)
        dispatch_id, agent, mode = await _pending(client, slave_id, ts_env)
        residents = await running_residents(client, "hostile")
        assert residents, "the sprint runs its residents"
        slave = client.get_workflow_handle(slave_id)

        refusals = await flood(handle, SprintMasterWorkflow)
        refusals += await flood(slave, SprintSlaveWorkflow)
        for resident in residents:
            refusals += await flood(resident, ResidentWorkflow)
        assert all(r.split(": ", 1)[1].strip() for r in refusals), refusals  # each refusal says why
        for target in (handle, slave, *residents):  # the signals no handler could take are recorded as rejected
            rejected = [r["reason"] for r in (await target.query("status"))["rejected_messages"]]
            assert any("sent with 2 inputs, which it cannot take" in r for r in rejected), (target.id, rejected)

        # Malformed pauses still pause (the reason falls back to the default): resume, and answer properly.
        await handle.signal("resume", {})
        await slave.signal("resume", {})
        await wait_status(handle, lambda s: s.phase == "running", "running again")
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))
        review_id, agent, mode = await _pending(client, slave_id, ts_env, after=dispatch_id)
        await slave.signal("agent_complete", _complete(review_id, agent, mode))
        report = await sprint_result(handle)
    assert report.stories == {K1: "done"}
    assert status_values(tmp_path)[K1] == "done"
    assert await task_failures(client, handle.id) == {}
    # bso messages marks the signals sent two inputs rejected, in the guard's words, at each workflow.
    flow = message_flow(await fetch_sprint_histories(client, handle.id))
    refused = {(m.workflow_id, m.type) for m in flow if m.rejected and "sent with 2 inputs, which it cannot take" in m.rejected}
    assert {("hostile", "RESUME"), ("hostile/batch-1", "AGENT_COMPLETE")} <= refused, refused
    assert any(wid.startswith("hostile/resident-") for wid, _ in refused), refused
