"""Holds that make a race of a few milliseconds certain, for the tests of what a cancel meets.

- `SignalDeliveredFirst`: when a workflow is cancelled while a signal it sent is on its way, the SDK asks the
  server to cancel the signal; when the signal was delivered all the same, that delivery decides the await,
  and the cancel is never raised. The hold keeps the workflow on a timer once its signal of one name is
  delivered, and a cancel in that hold is not raised either: the workflow then goes on exactly as after the
  SDK's own swallowed cancel.
- `ChildStartHeld`: a child workflow's start waits on a timer first. With the worker stopped while the timer
  fires and the cancel sent then, the next worker gets both in one workflow task: the child's start and the
  cancel, together.

A history made with a hold replays only with it (`replay_with`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
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
    StartChildWorkflowInput,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.agents import run_agent
from bso.constants import AGENTS_TASK_QUEUE, SPRINT_TASK_QUEUE
from bso.data_converter import data_converter
from tests.collapsed_history import collapsed
from tests.conftest import histories_of
from workers.main import SPRINT_ACTIVITIES, STICKY_SCHEDULE_TO_START, WORKFLOW_INTERCEPTORS, WORKFLOWS, build_workers

SIGNAL_HOLD_SECONDS = 120  # far longer than a test takes to cancel: the cancel ends the hold


class Hold(Interceptor, ABC):
    """An outbound interceptor class around every workflow of the worker; `summary` names its timer."""

    summary: str

    @abstractmethod
    def outbound(self, next: WorkflowOutboundInterceptor) -> WorkflowOutboundInterceptor:
        """The hold's outbound interceptor, calling `next`."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        outbound = self.outbound

        class Inbound(WorkflowInboundInterceptor):
            def init(self, next: WorkflowOutboundInterceptor) -> None:
                super().init(outbound(next))

        return Inbound


class SignalDeliveredFirst(Hold):
    """`first_only`: a workflow is held after its first such signal only (the wind-down may send more)."""

    def __init__(self, signal: str, *, first_only: bool = False) -> None:
        self.signal = signal
        self.first_only = first_only
        self.summary = f"test: held after {signal} was delivered"

    def outbound(self, next: WorkflowOutboundInterceptor) -> WorkflowOutboundInterceptor:
        hold = self

        class HoldAfterSignal(WorkflowOutboundInterceptor):
            held = False  # this workflow's (an interceptor per workflow run)

            async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
                await super().signal_external_workflow(input)
                if input.signal == hold.signal and not (hold.first_only and self.held):
                    self.held = True
                    try:
                        await workflow.sleep(SIGNAL_HOLD_SECONDS, summary=hold.summary)
                    except asyncio.CancelledError:
                        pass  # the delivered signal decides: the workflow goes on

        return HoldAfterSignal(next)


class ChildStartHeld(Hold):
    def __init__(self, workflow_type: str, seconds: float) -> None:
        self.workflow_type = workflow_type
        self.seconds = seconds
        self.summary = f"test: {workflow_type} start held"

    def outbound(self, next: WorkflowOutboundInterceptor) -> WorkflowOutboundInterceptor:
        hold = self

        class HoldBeforeChildStart(WorkflowOutboundInterceptor):
            async def start_child_workflow(self, input: StartChildWorkflowInput) -> workflow.ChildWorkflowHandle[Any, Any]:
                if input.workflow == hold.workflow_type:
                    await workflow.sleep(hold.seconds, summary=hold.summary)
                return await super().start_child_workflow(input)

        return HoldBeforeChildStart(next)


@asynccontextmanager
async def workers_with(client: Client, hold: Hold, prefix: str) -> AsyncIterator[str]:
    """BSO's workers on the `prefix` task queues, their workflows under `hold`; yields the sprint task queue."""
    (agents_worker,) = build_workers(client, [AGENTS_TASK_QUEUE], queue_prefix=prefix)
    sprint_worker = Worker(
        client,
        task_queue=prefix + SPRINT_TASK_QUEUE,
        workflows=WORKFLOWS,
        activities=[*SPRINT_ACTIVITIES, run_agent],
        interceptors=[*WORKFLOW_INTERCEPTORS, hold],
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,  # as BSO's worker: a stopped one's tasks move on
    )
    async with sprint_worker, agents_worker:
        yield prefix + SPRINT_TASK_QUEUE


async def timer_of(handle: WorkflowHandle[Any, Any], hold: Hold, event: EventType.ValueType) -> bool:
    """A poll_until probe: the workflow (started or not yet) has the hold's timer `event` (started, fired)."""
    summary = f'"{hold.summary}"'.encode()
    try:
        events = list((await handle.fetch_history()).events)
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    started = {e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and e.user_metadata.summary.data == summary}
    if event == EventType.EVENT_TYPE_TIMER_STARTED:
        return bool(started)
    return any(
        e.event_type == event and e.timer_fired_event_attributes.started_event_id in started for e in events
    )


async def in_the_hold(handle: WorkflowHandle[Any, Any], hold: Hold) -> bool:
    return await timer_of(handle, hold, EventType.EVENT_TYPE_TIMER_STARTED)


async def replay_with(client: Client, handle: WorkflowHandle[Any, Any], hold: Hold, *, handle_run_only: bool = False) -> None:
    """Replay with the hold they ran with (the suite's replay has none) every run of the workflow, of its residents
    and of the children they started (`handle_run_only`: the handle's run alone, the one the hold ran in), as
    recorded and in the shape whose tasks sdk-core joins (tests/collapsed_history.py); a nondeterminism error fails
    the test."""
    histories = [await handle.fetch_history()] if handle_run_only else await histories_of(client, [handle.id])
    assert histories, handle.id
    shapes = [(history, "as recorded") for history in histories]
    shapes += [(joined, "joined") for joined, moved in map(collapsed, histories) if moved]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=[*WORKFLOW_INTERCEPTORS, hold])
    for history, shape in shapes:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (history.workflow_id, history.run_id, shape, result.replay_failure)
