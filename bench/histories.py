"""History sizes of every workflow run on a server (events and bytes), grouped by workflow type (residents
by role too: `ResidentWorkflow (debugger)`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHistory

# The server refusing a continue-as-new (or completion) because a signal arrived while the task ran: the task
# runs again with the signal, which is how Temporal keeps it. Counted apart: it is not a workflow code failure.
UNHANDLED_COMMAND = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND


def task_failures(history: WorkflowHistory) -> list[str]:
    """A history's WorkflowTaskFailed events but for the signal races above: `event N: CAUSE: message`."""
    found = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attrs = e.workflow_task_failed_event_attributes
            if attrs.cause != UNHANDLED_COMMAND:
                found.append(
                    f"event {e.event_id}: {WorkflowTaskFailedCause.Name(attrs.cause)}: {attrs.failure.message[:300]}"
                )
    return found


def signal_races(history: WorkflowHistory) -> int:
    """A history's WorkflowTaskFailed events that are signal races (UNHANDLED_COMMAND), which task_failures leaves out."""
    return sum(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause == UNHANDLED_COMMAND
        for e in history.events
    )


def row_name(workflow_type: str, workflow_id: str) -> str:
    """The table row of a run: its workflow type, with the role for a resident (`<session>/resident-<role>`)."""
    if "/resident-" in workflow_id:
        return f"{workflow_type} ({workflow_id.rsplit('/resident-', 1)[1]})"
    return workflow_type


async def history_sizes(client: Client, query: str = "") -> dict[str, dict[str, Any]]:
    """Per workflow type: runs, the largest history (events, bytes, which run), the largest event, the events of
    all its runs, the WorkflowTaskFailed events (signal races that refused a hand-over apart)."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "runs": 0, "max_events": 0, "max_bytes": 0, "max_event_bytes": 0, "largest": None,
            "task_failures": 0, "task_failure_causes": [], "signal_races": 0, "total_events": 0,
        }
    )
    async for wf in client.list_workflows(query):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        sizes = [e.ByteSize() for e in history.events]
        row = out[row_name(wf.workflow_type, wf.id)]
        row["runs"] += 1
        row["total_events"] += len(sizes)
        failures = task_failures(history)
        row["task_failures"] += len(failures)
        row["task_failure_causes"] += [f"{wf.id} {failure}" for failure in failures]
        row["signal_races"] += signal_races(history)
        row["max_event_bytes"] = max(row["max_event_bytes"], max(sizes, default=0))
        if len(sizes) > row["max_events"]:
            row["max_events"] = len(sizes)
            row["largest"] = f"{wf.id} run {wf.run_id}"
        row["max_bytes"] = max(row["max_bytes"], sum(sizes))
    return dict(out)
