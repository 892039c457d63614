"""Building small BMAD projects and running sprints against a test environment."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from bso.constants import SPRINT_TASK_QUEUE
from bso.models import DEFAULT_STATUS_FILE, SprintInput, SprintReport, SprintStatusView
from workers.main import build_workers
from workflows.sprint_master import SprintMasterWorkflow

HEADER = """# generated: 2026-01-05
# project: Test
# story_location: _bmad-output/implementation-artifacts

generated: 2026-01-05
last_updated: 2026-01-05
project: Test
project_key: TEST
tracking_system: file-system
story_location: _bmad-output/implementation-artifacts

development_status:
"""


def make_project(root: Path, stories: dict[str, str], story_files: dict[str, str] | None = None) -> Path:
    """A project whose status file lists `stories` (full key -> value) under their epics."""
    lines = [HEADER.rstrip("\n")]
    epics: dict[str, list[str]] = {}
    for key in stories:
        epics.setdefault(key.split("-")[0], []).append(key)
    for epic, keys in epics.items():
        lines.append(f"  # Epic {epic}")
        lines.append(f"  epic-{epic}: backlog")
        lines.extend(f"  {key}: {stories[key]}  # story {key}" for key in keys)
        lines.append(f"  epic-{epic}-retrospective: optional")
    status = root / DEFAULT_STATUS_FILE
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for key, text in (story_files or {}).items():
        (status.parent / f"{key}.md").write_text(text, encoding="utf-8")
    return status


def sprint_input(root: Path, **kwargs: Any) -> SprintInput:
    return SprintInput(project_root=str(root), **kwargs)


def slow_down_merges(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """command backend: each squash-and-merge (finish_story_git) starts `seconds` later, so a story is done in
    the status file well before its work lands (activities of the in-process test worker only)."""
    import activities.git_ops as git_ops  # the command backend's module: only the tests that use it load it

    unhurried = git_ops.repo_lock

    @asynccontextmanager
    async def lock(project_root: str) -> AsyncIterator[None]:
        if activity.in_activity() and activity.info().activity_type == "finish_story_git":
            await asyncio.sleep(seconds)
        async with unhurried(project_root):
            yield

    monkeypatch.setattr(git_ops, "repo_lock", lock)


async def start_sprint(
    client: Client, task_queue: str, inp: SprintInput, paused: str | None = None
) -> WorkflowHandle[Any, SprintReport]:
    """`paused`: a pause with this reason sent with the start (signal-with-start: there before the Master reads
    its status file)."""
    with_pause: dict[str, Any] = {"start_signal": "pause", "start_signal_args": [paused]} if paused is not None else {}
    return await client.start_workflow(
        SprintMasterWorkflow.run,
        inp,
        id=inp.session_id or f"sprint-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        **with_pause,
    )


RESULT_WAIT_SECONDS = 150.0


async def run_sprint(client: Client, task_queue: str, inp: SprintInput) -> SprintReport:
    handle = await start_sprint(client, task_queue, inp)
    return await sprint_result(handle)


async def cancel_sprint(handle: WorkflowHandle[Any, SprintReport]) -> None:
    """Cancel the sprint and wait for its end, its worker still running. Cancelled just before the worker stopped,
    the stopping worker could take a workflow task it never answered: the shared time-skipping server then held
    its clock for every later test (a 60 s readiness wait ran in real time), termination notwithstanding."""
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as ended:
        await sprint_result(handle)
    # ended by the cancel, not failed otherwise (a failure would pass for the cancel's end, unseen)
    assert isinstance(ended.value.cause, CancelledError), ended.value.cause


async def sprint_result(handle: WorkflowHandle[Any, SprintReport]) -> SprintReport:
    """The sprint's result. On the shared time-skipping server a result's long poll has, rarely and late in a
    full run, never returned (pytest's timeout then stopped the run after 600 s): it is asked again once, and if
    the sprint is still not done, the test fails with what the server says of it instead of hanging."""
    for _ in range(2):
        try:
            return await asyncio.wait_for(handle.result(), RESULT_WAIT_SECONDS)
        except TimeoutError:
            continue
    described = await handle.describe()
    history = await handle.fetch_history()
    last = [EventType.Name(e.event_type) for e in history.events[-8:]]
    raise AssertionError(
        f"sprint {handle.id} gave no result in {2 * RESULT_WAIT_SECONDS:.0f}s: status {described.status}, "
        f"{len(history.events)} events, the last: {last}; pending activities: {described.raw_description.pending_activities}"
    )


def status_values(root: Path) -> dict[str, str]:
    """Every `key: value` line under development_status, read naively (independent of the parser)."""
    values = {}
    text = (root / DEFAULT_STATUS_FILE).read_text(encoding="utf-8")
    body = text.split("development_status:", 1)[1]
    for line in body.splitlines():
        line = line.split("#", 1)[0].strip()
        if ":" in line:
            key, value = line.split(":", 1)
            values[key.strip()] = value.strip()
    return values


def ledger(root: Path) -> list[dict[str, Any]]:
    path = root / ".sprint-session" / "simulated-agent-ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """A workflow's current details, as the Web UI shows them."""
    return (await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)).current_details


async def shown_done(handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """The Master's details: (stories done, stories in the sprint)."""
    details = await current_details(handle)
    found = re.search(r"(\d+)/(\d+) stories done", details)
    assert found, details
    return int(found[1]), int(found[2])


def done_of(report: SprintReport) -> tuple[int, int]:
    """(stories done, stories) of a report: what the Master's details show once the sprint has ended."""
    return sum(state == "done" for state in report.stories.values()), len(report.stories)


async def workflow_task_failures(client: Client, workflow_id: str) -> list[str]:
    """The WorkflowTaskFailed events in a workflow's history, each as its cause and message (a failing
    assertion then says why): a bad input must never cause one. Not those the server wrote because an event
    (a signal) came while a task that closes the workflow ran (UnhandledCommand): that is how Temporal hands
    the workflow the event before it closes, not a failure of its code, and the next task takes it in."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        f"{WorkflowTaskFailedCause.Name(failed.cause)}: {failed.failure.message}"
        for failed in (
            e.workflow_task_failed_event_attributes
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        )
        if failed.cause != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
    ]


async def status_is(handle: WorkflowHandle[Any, Any], status: WorkflowExecutionStatus) -> bool:
    """A poll_until probe: the workflow's (latest run's) status is `status`."""
    return (await handle.describe()).status is status


async def has_event(handle: WorkflowHandle[Any, Any], event_type: EventType.ValueType) -> bool:
    """A poll_until probe: the workflow's history has an event of `event_type`."""
    return any(e.event_type == event_type for e in (await handle.fetch_history()).events)


async def signals_sent(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The names of the signals the workflow sent to others, in order."""
    return [
        e.signal_external_workflow_execution_initiated_event_attributes.signal_name
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
    ]


async def cancelled_while_no_sprint_worker_runs(
    client: Client, queue_prefix: str, sprint: WorkflowHandle[Any, Any], slave: WorkflowHandle[Any, Any]
) -> None:
    """Cancel the batch and its sprint while no worker serves the sprint queue of `queue_prefix` (what reached
    the batch meanwhile comes in the same workflow task as the cancel), then start one: both end cancelled."""
    await slave.cancel()
    await sprint.cancel()
    (sprint_worker,) = build_workers(client, [SPRINT_TASK_QUEUE], queue_prefix=queue_prefix)
    async with sprint_worker:
        with pytest.raises(WorkflowFailureError):
            await sprint_result(sprint)
        await poll_until(lambda: status_is(slave, WorkflowExecutionStatus.CANCELED), "the batch ends cancelled")


async def in_one_task(handle: WorkflowHandle[Any, Any], first: EventType.ValueType, second: EventType.ValueType) -> bool:
    """The workflow's only events of these two types came in one workflow task (none ended between them)."""
    events = list((await handle.fetch_history()).events)
    (a,) = [e.event_id for e in events if e.event_type == first]
    (b,) = [e.event_id for e in events if e.event_type == second]
    return not [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and min(a, b) < e.event_id < max(a, b)]


async def poll_until(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Await `probe` until it returns something truthy, and return that; fail with `what` after `timeout` real
    seconds. The limit is generous on purpose: a busy CI machine is slow, and a test that falls through a
    loop that ran out would fail later for a reason that is hard to read."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"never reached within {timeout:.0f}s: {what}")
        await asyncio.sleep(interval)


async def wait_status(
    handle: WorkflowHandle, check: Callable[[SprintStatusView], bool], what: str, timeout: float = 60.0
) -> SprintStatusView:
    """Poll the Master's status query (real time, no time skipping) until `check` holds."""

    async def probe() -> SprintStatusView | None:
        try:
            status = await handle.query(SprintMasterWorkflow.status)
        except Exception:  # not started yet
            return None
        try:
            return status if check(status) else None
        except KeyError:  # the plan is not there yet
            return None

    return await poll_until(probe, what, timeout, interval=0.1)


async def agent_assignments(client, slave_id: str) -> list[dict]:
    """The Slave's dispatches, as their agent activities were scheduled (their inputs, from its history)."""
    assignments = []
    async for event in client.get_workflow_handle(slave_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "run_agent":
                assignments.append(json.loads(attrs.input.payloads[0].data))
    return assignments


async def fix_assignments(client, slave_id: str) -> list[dict]:
    """The Slave's fix dispatches."""
    return [a for a in await agent_assignments(client, slave_id) if a["mode"] == "fix"]


async def how_it_ended(handle: WorkflowHandle[Any, Any], seconds: float = 15) -> str:
    """`completed`, the failure's cause as text, or `still running after N s` (then terminated): for a workflow
    given a bad input, which must fail at once, never retry its workflow task."""
    try:
        await asyncio.wait_for(handle.result(), seconds)
        return "completed"
    except WorkflowFailureError as err:
        return str(err.cause)
    except TimeoutError:
        await handle.terminate("test over")
        return f"still running after {seconds:.0f} s"

