"""`bso messages ID` lists BATCH_PLAN_READY once per sprint, not once per Master run.

A sprint whose Master continued as new (`--set continue_as_new_after_events=100 --set batch_size=1`)
was planned once, but `bso messages ID --type BATCH_PLAN_READY` showed the same plan again after every
CONTINUED_AS_NEW (4 runs: 4 plans), as if the sprint had re-planned each time; `--export` wrote
sprint-master/BATCH_PLAN_READY_001..004.json. A continued run's start is not a new sprint (no second
SPRINT_START is shown for it), and its move to phase `running` is not a new plan either.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio.api.common.v1 import Payloads, WorkflowType
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter

from bso.message_flow import message_flow

_PLAN = {
    "msg_type": "BATCH_PLAN_READY",
    "session_id": "s",
    "total_stories": 2,
    "batches": [{"batch_id": 1, "stories": ["1-1-a"]}, {"batch_id": 2, "stories": ["1-2-b"]}],
    "dependency_graph": {},
}


def _payloads(*values) -> Payloads:
    return Payloads(payloads=DataConverter.default.payload_converter.to_payloads(list(values)))


def _run(start: datetime, inp: dict) -> WorkflowHistory:
    """One Master run: its start, and its upsert of BsoPhase=running (as every run of the Master does)."""
    events = []
    started = HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
    started.event_time.FromDatetime(start)
    started.workflow_execution_started_event_attributes.CopyFrom(
        type(started.workflow_execution_started_event_attributes)(
            workflow_type=WorkflowType(name="SprintMasterWorkflow"), input=_payloads(inp)
        )
    )
    events.append(started)
    upsert = HistoryEvent(event_id=2, event_type=EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
    upsert.event_time.FromDatetime(start + timedelta(milliseconds=30))
    upsert.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields["BsoPhase"].CopyFrom(
        _payloads("running").payloads[0]
    )
    events.append(upsert)
    return WorkflowHistory("s", events)


def test_a_sprint_planned_once_shows_one_plan_whatever_its_runs():
    t0 = datetime(2026, 1, 5, 9, 0, 0)
    first = _run(t0, {"project_root": "/p"})
    carried = {"project_root": "/p", "carried_state": {"plan": _PLAN}}
    later = [_run(t0 + timedelta(seconds=10 * n), carried) for n in (1, 2, 3)]
    flow = message_flow([first, *later])
    assert [m.type for m in flow].count("SPRINT_START") == 1
    plans = [m for m in flow if m.type == "BATCH_PLAN_READY"]
    assert len(plans) == 1, [(m.time, m.detail) for m in plans]
    assert plans[0].time == t0 + timedelta(milliseconds=30)  # the first run's: when the sprint was planned


def test_the_one_plan_shown_is_read_from_the_best_run():
    """Shown when the first run planned, with the plan the later runs carry (the first run of a sprint planned
    without a scrum-master knows only the batches it started)."""
    t0 = datetime(2026, 1, 5, 9, 0, 0)
    carried = {"project_root": "/p", "carried_state": {"plan": _PLAN}}
    (plan,) = [m for m in message_flow([_run(t0, {"project_root": "/p"}), _run(t0 + timedelta(seconds=10), carried)])
               if m.type == "BATCH_PLAN_READY"]
    assert plan.time == t0 + timedelta(milliseconds=30)
    assert plan.payload["source"] == "carried" and plan.detail == "2 batches: 1: 1-1-a; 2: 1-2-b"
