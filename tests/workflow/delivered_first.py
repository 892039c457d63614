"""A cancel that a signal already sent swallows, made certain.

When a workflow is cancelled while a signal it sent is on its way (SignalExternalWorkflowExecutionInitiated
written, not yet resolved), the SDK asks the server to cancel the signal; when the signal was delivered all
the same, that delivery decides the await, and the cancel is never raised. The window is a few milliseconds.
`SignalDeliveredFirst` widens it: once a workflow's signal of one name is delivered, it holds the workflow on
a timer, and a cancel in that hold is not raised either; the workflow then goes on exactly as after the
SDK's own swallowed cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    Interceptor,
    Replayer,
    SignalExternalWorkflowInput,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.agents import run_agent
from bso.constants import AGENTS_TASK_QUEUE, SPRINT_TASK_QUEUE
from bso.data_converter import data_converter
from workers.main import SPRINT_ACTIVITIES, WORKFLOW_INTERCEPTORS, WORKFLOWS, build_workers

HOLD_SECONDS = 120  # far longer than a test takes to cancel: the cancel ends the hold


def hold_summary(signal: str) -> str:
    return f"test: held after {signal} was delivered"


class SignalDeliveredFirst(Interceptor):
    def __init__(self, signal: str) -> None:
        self.signal = signal

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        signal = self.signal

        class HoldAfterSignal(WorkflowOutboundInterceptor):
            async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
                await super().signal_external_workflow(input)
                if input.signal == signal:
                    try:
                        await workflow.sleep(HOLD_SECONDS, summary=hold_summary(signal))
                    except asyncio.CancelledError:
                        pass  # the delivered signal decides: the workflow goes on

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(HoldAfterSignal(outbound))

        return Inbound


@asynccontextmanager
async def workers_delivering_first(client: Client, signal: str, prefix: str) -> AsyncIterator[str]:
    """BSO's workers on the `prefix` task queues, their workflows held after `signal` is delivered; yields the
    sprint task queue."""
    (agents_worker,) = build_workers(client, [AGENTS_TASK_QUEUE], queue_prefix=prefix)
    sprint_worker = Worker(
        client,
        task_queue=prefix + SPRINT_TASK_QUEUE,
        workflows=WORKFLOWS,
        activities=[*SPRINT_ACTIVITIES, run_agent],
        interceptors=[*WORKFLOW_INTERCEPTORS, SignalDeliveredFirst(signal)],
    )
    async with sprint_worker, agents_worker:
        yield prefix + SPRINT_TASK_QUEUE


async def in_the_hold(handle: WorkflowHandle[Any, Any], signal: str) -> bool:
    """A poll_until probe: the workflow (started or not yet) is held after `signal` was delivered."""
    summary = f'"{hold_summary(signal)}"'.encode()
    try:
        events = (await handle.fetch_history()).events
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return any(e.user_metadata.summary.data == summary for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


async def replay_with_the_hold(handle: WorkflowHandle[Any, Any], signal: str) -> None:
    """Replay the workflow's history with the hold it ran with (the suite's replay has none); a
    nondeterminism error fails the test."""
    replayer = Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, interceptors=[*WORKFLOW_INTERCEPTORS, SignalDeliveredFirst(signal)]
    )
    await replayer.replay_workflow(await handle.fetch_history())

