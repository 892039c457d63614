"""message-schemas' delivery_failed and response_timeout on the time-skipping server: a Slave's DEBUG_REQUEST
to a debugger that does not exist (retried with the schema's bound, then delivery_failed) or that never
answers within the query's timeout_ms (response_timeout); the Master's PLAN_REQUEST carries timeout_ms; a send
the sender's cancel stops before it goes out."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.api.enums.v1 import EventType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bso.config import resolve_config
from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE, SlaveInput, SlaveResult, StoryMeta
from bso.roster import resident_workflow_id
from tests.conftest import bso_worker, terminate_left_running
from tests.workflow.helpers import has_event, in_one_task, make_project, poll_until, run_sprint, sprint_input, workflow_task_failures
from workflows.delivery import deliver
from workflows.sprint_slave import SprintSlaveWorkflow

K1 = "1-1-login-form"


@workflow.defn(name="SilentResident")
class SilentResident:
    """A resident that receives requests and never answers them."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="PingSender")
class PingSender:
    """Sends one `ping` signal with `deliver` once told to `go`."""

    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.run
    async def run(self, target: str, cancellable: bool) -> str:
        await workflow.wait_condition(lambda: self._go)
        return "delivered" if await deliver(target, "ping", cancellable=cancellable) is None else "failed"


@pytest.mark.parametrize("cancellable", [True, False], ids=["cancellable", "not-cancellable"])
async def test_a_send_the_senders_cancel_stops_before_it_goes_out(local_env, cancellable: bool) -> None:
    """`go` and the sender's cancel reach it in one workflow task (both sent while no worker runs): the SDK runs
    the signal first, so the ping is sent in that task, and the cancel cancels it before it goes out. A
    cancellable send ends the sender cancelled, nothing sent; any other is taken for a failed delivery and sent
    again a second later (a broadcast or a result the sender still owes). On the dev server: the time-skipping
    one leaves the task on the stopped worker's sticky queue."""
    client, queue, tag = local_env.client, f"ping-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    target_id, sender_id = f"ping-target-{tag}", f"ping-sender-{tag}"

    def worker() -> Worker:
        return Worker(client, task_queue=queue, workflows=[PingSender, SilentResident], workflow_runner=UnsandboxedWorkflowRunner())

    try:
        async with worker():
            target = await client.start_workflow("SilentResident", id=target_id, task_queue=queue)
            sender = await client.start_workflow("PingSender", args=[target_id, cancellable], id=sender_id, task_queue=queue)
            # The target's first task too: one left in flight by the stopping worker holds the ping back
            # (buffered, out of its history) until the task times out, while the sender already has it delivered.
            await poll_until(lambda: has_event(target, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED), "the target waits")
            await poll_until(lambda: has_event(sender, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED), "the sender waits")
        await sender.signal(PingSender.go)
        await sender.cancel()
        async with worker():
            if cancellable:
                with pytest.raises(WorkflowFailureError) as ended:
                    await sender.result()
                assert isinstance(ended.value.cause, CancelledError)
            else:
                assert await sender.result() == "delivered"
            pings = [e for e in await events(client, target_id) if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    finally:
        await terminate_left_running(client, [target_id, sender_id])
    assert len(pings) == (0 if cancellable else 1)
    # The race happened (`go` and the cancel in one task), and a cancellable send took the patched way.
    assert await in_one_task(sender, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
    markers = [e for e in await events(client, sender_id) if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert len(markers) == (1 if cancellable else 0)
    assert await workflow_task_failures(client, sender_id) == []


def slave_input(root: Path, session: str, debugger: str, **overrides) -> SlaveInput:
    make_project(root, {K1: "ready-for-dev"})
    return SlaveInput(
        batch_id=1, session_id=session, project_root=str(root), status_file=DEFAULT_STATUS_FILE,
        stories=[StoryMeta(key=K1, epic="1", short_key="1-1", state="ready-for-dev",
                           story_path=f"_bmad-output/implementation-artifacts/{K1}.md")],
        config=resolve_config(overrides), config_overrides=overrides,
        simulation={"stories": {"1-1": {"fail": {"dev": "error"}}}},
        resident_contacts={"debugger": debugger},
    )


async def run_slave(client, queue: str, inp: SlaveInput) -> SlaveResult:
    return await client.execute_workflow(
        SprintSlaveWorkflow.run, inp, id=slave_workflow_id(inp.session_id, 1), task_queue=queue
    )


async def events(client, workflow_id: str) -> list:
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


async def test_an_undeliverable_request_is_retried_then_delivery_failed(ts_env, tmp_path: Path) -> None:
    async with bso_worker(ts_env.client) as queue:
        result = await run_slave(ts_env.client, queue, slave_input(tmp_path, "dlv-gone", "dlv-gone/no-such-debugger"))
    [story] = result.results.story_results
    assert story.final_state == "needs-intervention"
    assert "debugger unavailable: delivery_failed: agent_unavailable" in story.error
    assert "(after 3 of 3 retries)" in story.error
    [error] = result.message_errors
    assert (error["type"], error["error_type"], error["retry_count"], error["max_retries"]) == (
        "error", "delivery_failed", 3, 3,
    )
    history = await events(ts_env.client, slave_workflow_id("dlv-gone", 1))
    tries = [e for e in history if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED]
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.seconds
        for e in history
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and e.event_id > tries[0].event_id
    ]
    assert len(tries) == 4 and timers == [1, 2, 4]  # the first try and 3 retries, a backoff before each retry
    assert await workflow_task_failures(ts_env.client, slave_workflow_id("dlv-gone", 1)) == []


async def test_an_unanswered_query_is_a_response_timeout(ts_env, tmp_path: Path) -> None:
    silent_queue = f"silent-{uuid.uuid4().hex[:8]}"
    silent_id = f"dlv-silent/resident-debugger-{uuid.uuid4().hex[:6]}"
    async with Worker(ts_env.client, task_queue=silent_queue, workflows=[SilentResident],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await ts_env.client.start_workflow("SilentResident", id=silent_id, task_queue=silent_queue)
        try:
            async with bso_worker(ts_env.client) as queue:
                inp = slave_input(tmp_path, "dlv-silent", silent_id, resident_query_timeout_ms=2000)
                result = await run_slave(ts_env.client, queue, inp)
                status = await ts_env.client.get_workflow_handle(slave_workflow_id("dlv-silent", 1)).query("status")
        finally:
            # Alone on the time-skipping server, time may skip past the silent workflow's 10-year timeout once
            # the Slave is done: then it has ended by itself.
            await terminate_left_running(ts_env.client, [silent_id])
    [story] = result.results.story_results
    assert story.final_state == "needs-intervention"
    assert "no DEBUG_RESULT within 2s: response_timeout" in story.error
    [error] = result.message_errors
    assert (error["error_type"], error["waited_ms"], error["recipient"]) == ("response_timeout", 2000, silent_id)
    assert status["message_errors"] == result.message_errors
    # The request was delivered, with its timeout_ms.
    received = [
        e for e in await events(ts_env.client, silent_id)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    [request] = [json.loads(e.workflow_execution_signaled_event_attributes.input.payloads[0].data) for e in received]
    assert request["msg_type"] == "DEBUG_REQUEST" and request["timeout_ms"] == 2000


async def test_the_plan_request_carries_timeout_ms_and_is_answered_in_time(ts_env, tmp_path: Path) -> None:
    make_project(tmp_path, {K1: "ready-for-dev"})
    inp = sprint_input(tmp_path, session_id="dlv-plan", config_overrides={"resident_query_timeout_ms": 5000})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories == {K1: "done"} and report.planner == "scrum-master"
    assert report.message_errors == []
    sm = await events(ts_env.client, resident_workflow_id("dlv-plan", "scrum-master"))
    plans = [
        json.loads(e.workflow_execution_signaled_event_attributes.input.payloads[0].data)
        for e in sm
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == "plan_request"
    ]
    assert [p["timeout_ms"] for p in plans] == [5000]
