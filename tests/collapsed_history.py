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
failure. It leaves alone a task that completed after most of its timeout: sdk-core's heartbeat while a local
activity runs on. Joined there, a Slave that started its U4 write (a local activity) in the task before the
heartbeat, and whose story-updates hold timer fired after it, fails to replay (`Missing associated machine for
LocalActivity(3)`: joined, the agent's answer and the cancel that came later come in one activation, and the
cancelled Slave starts no write): an open problem (tests/workflow/test_replay.py, a strict xfail). The server can
write that shape: the same history has a cancel between a heartbeat's next WorkflowTaskScheduled and its start."""

from __future__ import annotations

import copy
from datetime import datetime
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


# sdk-core completes a task with no command, to keep it alive, at 80% of its timeout while a local activity runs.
_HEARTBEAT_SHARE = 0.75


def _seconds(duration: str | None) -> float | None:
    return float(duration.removesuffix("s")) if duration else None


def _heartbeat(events: list[dict[str, Any]], i: int, task_timeout: float | None) -> bool:
    """Whether the task completed at events[i] was a local activity's heartbeat (it ran most of its timeout)."""
    if task_timeout is None or i == 0 or events[i - 1]["eventType"] != _STARTED:
        return False
    ran = datetime.fromisoformat(events[i]["eventTime"]) - datetime.fromisoformat(events[i - 1]["eventTime"])
    return ran.total_seconds() >= _HEARTBEAT_SHARE * task_timeout


def collapsed(history: WorkflowHistory, join_heartbeats: bool = False) -> tuple[WorkflowHistory, int]:
    """(the history with every such pair in the shape that is joined on replay, how many pairs were moved);
    `join_heartbeats`: local activities' heartbeat tasks too."""
    data = copy.deepcopy(history.to_json_dict())
    events: list[dict[str, Any]] = data["events"]
    started = events[0].get("workflowExecutionStartedEventAttributes", {}) if events else {}
    task_timeout = None if join_heartbeats else _seconds(started.get("workflowTaskTimeout"))
    moved = 0
    i = 0
    while i < len(events):
        if events[i]["eventType"] != _COMPLETED or _heartbeat(events, i, task_timeout):
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
