"""A history as the server could have written it with its workflow tasks joined on replay.

sdk-core replays a workflow task that completed with no command, followed at once by the next one's
WorkflowTaskScheduled, together with that next one (arch_docs/workflow_task_chunking.md in sdk-core): one
activation with the events of both, the first one's clock, and the signals applied before the other events.
The server writes that shape when the events that wake the next task come after it was scheduled (a task
retried after a failure, or the time-skipping server's order). Code whose commands depend on the order of those
events, or on the clock between the two tasks, replays it differently from how it ran: a nondeterminism error.

`collapsed` moves, for every task that completed with no command and was woken only by inbound events, the next
WorkflowTaskScheduled before those events: the same run, in the shape that is joined on replay. The moved task's
activation holds the same events as before, so the commands recorded after it are what the workflow did live.
It moves more than core joins (core 1.35 also wants no command since the task before: `saw_command` in its
history_update.rs); a pair core leaves apart replays as it did, so the extra ones cost time, never a false
failure. A task sdk-core completed with no command to keep it alive while a local activity ran on (a heartbeat,
at 80% of the task's timeout) is joined too: the server can write the next one's WorkflowTaskScheduled before the
events that come meanwhile. Joined there, a Slave from before PATCH_WRITE_SURVIVES_CANCEL whose U4 write ran that
long got its agent's answer and a later cancel in one activation, and started no write (tests/workflow/
test_replay.py)."""

from __future__ import annotations

import copy
from typing import Any

from temporalio.client import WorkflowHistory

_COMPLETED = "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"
_SCHEDULED = "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED"
_STARTED = "EVENT_TYPE_WORKFLOW_TASK_STARTED"
# What wakes a workflow task from outside, as opposed to the commands a task writes after its completion.
_INBOUND = {
    "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED",
    "EVENT_TYPE_ACTIVITY_TASK_STARTED",
    "EVENT_TYPE_ACTIVITY_TASK_COMPLETED",
    "EVENT_TYPE_ACTIVITY_TASK_FAILED",
    "EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT",
    "EVENT_TYPE_ACTIVITY_TASK_CANCELED",
    "EVENT_TYPE_TIMER_FIRED",
    "EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED",
    "EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED",
    "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED",
    "EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_CANCEL_REQUESTED",
    "EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_FAILED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED",
}


def _renumber(value: Any, new_ids: dict[str, str]) -> None:
    """Every `...EventId` field (and the event's own `eventId`) through `new_ids`, in place."""
    if isinstance(value, dict):
        for key, item in value.items():
            if (key == "eventId" or key.endswith("EventId")) and isinstance(item, str | int) and str(item) in new_ids:
                value[key] = new_ids[str(item)]
            else:
                _renumber(item, new_ids)
    elif isinstance(value, list):
        for item in value:
            _renumber(item, new_ids)


def collapsed(history: WorkflowHistory) -> tuple[WorkflowHistory, int]:
    """(the history with every such pair in the shape that is joined on replay, how many pairs were moved)."""
    data = copy.deepcopy(history.to_json_dict())
    events: list[dict[str, Any]] = data["events"]
    moved = 0
    i = 0
    while i < len(events):
        if events[i]["eventType"] != _COMPLETED:
            i += 1
            continue
        k = i + 1
        while k < len(events) and events[k]["eventType"] in _INBOUND:
            k += 1
        if k == i + 1 or k + 1 >= len(events) or events[k]["eventType"] != _SCHEDULED or events[k + 1]["eventType"] != _STARTED:
            i += 1
            continue
        # events[i+1:k] woke the task scheduled at k: put that WorkflowTaskScheduled first.
        block = [events[k], *events[i + 1 : k]]
        old_ids = [str(e["eventId"]) for e in events[i + 1 : k + 1]]
        new_ids = {str(e["eventId"]): old_ids[n] for n, e in enumerate(block)}
        events[i + 1 : k + 1] = block
        _renumber(events, new_ids)
        moved += 1
        i = k + 1
    return WorkflowHistory.from_json(history.workflow_id, data), moved
