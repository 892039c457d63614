"""How late the Temporal server fired a deadline, from the workflow's own history: the moment it was meant for
(an activity's schedule-to-close, a timer's length, from when the server recorded them) against the moment the
server recorded its firing. A machine or a server that was not running at that moment (a closed laptop) fires it
when it runs again: late by the time slept. Read from history by an activity, its answer recorded in the
workflow's history: the workflow's own clock (`workflow.now()`) is not the same on replay, where sdk-core may
join a task that had no command with the next and lend it its clock.

A worker down or frozen (SIGSTOP) at an agent's deadline, the server running on, is the same to the agent: the
server fires the deadline on time, but no worker takes up the workflow task carrying it until one runs again. An
agent activity's deadline is late by the time from its moment to the first workflow task after its firing that a
worker completed or failed: a live worker read the history then (a frozen worker's open poll takes tasks it never
answers; they time out and do not count). An agent still working at its deadline is not late so: a simulated
agent runs in the sprint's own worker, which takes the deadline up at once; a command agent, which may run in a
worker of the agents' queue alone, ends itself at its deadline and reports before the server's (its activity's
deadline leaves it the time), so the server's fires only when its worker did not run either. The batch's working
time is the same (`worker_down_counts`): with no worker, no agent of the batch ran. An external agent's deadline
(a timer) is late by the server's firing only: that agent answers whether a worker runs or not."""

from __future__ import annotations

import json

from pydantic import BaseModel
from temporalio import activity
from temporalio.api.history.v1 import HistoryEvent


class LatenessInput(BaseModel):
    workflow_id: str
    run_id: str
    activity_id: str | None = None  # the last activity of this id that timed out
    timer_summary: str | None = None  # or the last timer of this summary (its static summary) that fired
    # A timer late until a worker took it up too, as an agent's deadline is (the batch's working time).
    worker_down_counts: bool = False


@activity.defn
async def deadline_lateness(inp: LatenessInput) -> float:
    """Seconds past its moment the server fired the deadline (0 when history holds none: not late)."""
    handle = activity.client().get_workflow_handle(inp.workflow_id, run_id=inp.run_id)
    return lateness_in([event async for event in handle.fetch_history_events()], inp)


def lateness_in(events: list[HistoryEvent], inp: LatenessInput) -> float:
    meant: dict[int | str, float] = {}  # scheduled event id (activity) or timer id -> the moment it was meant for
    late = 0.0
    unhandled: float | None = None  # the moment meant of a deadline fired, no worker having handled it
    for event in events:
        at = event.event_time.ToDatetime().timestamp()
        if unhandled is not None and (
            event.HasField("workflow_task_completed_event_attributes")
            or event.HasField("workflow_task_failed_event_attributes")
        ):
            late, unhandled = at - unhandled, None
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_id == inp.activity_id:
                meant[event.event_id] = at + attrs.schedule_to_close_timeout.ToTimedelta().total_seconds()
        elif event.HasField("activity_task_timed_out_event_attributes"):
            scheduled = event.activity_task_timed_out_event_attributes.scheduled_event_id
            if scheduled in meant:
                late = at - meant[scheduled]
                unhandled = meant[scheduled]
        elif event.HasField("timer_started_event_attributes") and inp.timer_summary is not None:
            attrs = event.timer_started_event_attributes
            if _summary(event) == inp.timer_summary:
                meant[attrs.timer_id] = at + attrs.start_to_fire_timeout.ToTimedelta().total_seconds()
        elif event.HasField("timer_fired_event_attributes"):
            timer = event.timer_fired_event_attributes.timer_id
            if timer in meant:
                late = at - meant[timer]
                if inp.worker_down_counts:
                    unhandled = meant[timer]
    return max(late, 0.0)


def _summary(event: HistoryEvent) -> str | None:
    data = event.user_metadata.summary.data
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None
