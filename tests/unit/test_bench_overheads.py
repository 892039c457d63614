"""The benchmark's overhead arithmetic (bench/run.py slave_overheads) on hand-made Slave histories: which
two moments each figure runs between, so a change that measures from the wrong event fails here."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType, Payload, Payloads
from temporalio.api.enums.v1 import EventType as E
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    ActivityTaskStartedEventAttributes,
    History,
    HistoryEvent,
    MarkerRecordedEventAttributes,
    WorkflowExecutionSignaledEventAttributes,
)

from bench.run import slave_overheads

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def _at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def _ts(ms: float) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(_at(ms))
    return ts


def _json(value: object) -> Payloads:
    return Payloads(payloads=[Payload(data=json.dumps(value).encode())])


class _Builder:
    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def add(self, at_ms: float, event_type: int, **attributes) -> int:
        event_id = len(self.events) + 1
        self.events.append(HistoryEvent(event_id=event_id, event_time=_ts(at_ms), event_type=event_type, **attributes))
        return event_id

    def local_activity(self, recorded_ms: float, activity_type: str, result: dict) -> None:
        """A local activity's marker, recorded when its workflow task ends; its result carries its own time."""
        details = {"data": _json({"activity_type": activity_type}), "result": _json(result)}
        attributes = MarkerRecordedEventAttributes(marker_name="core_local_activity", details=details)
        self.add(recorded_ms, E.EVENT_TYPE_MARKER_RECORDED, marker_recorded_event_attributes=attributes)

    def load(self, recorded_ms: float, read_ms: float | None) -> None:
        read_at = _at(read_ms).isoformat() if read_ms is not None else None
        self.local_activity(recorded_ms, "load_sprint_status", {"read_at": read_at})

    def write(self, recorded_ms: float, done_ms: float | None, outcome: str = "written") -> None:
        done_at = _at(done_ms).isoformat() if done_ms is not None else None
        self.local_activity(recorded_ms, "write_story_status", {"outcome": outcome, "done_at": done_at})

    def agent(self, scheduled_ms: float, started_ms: float, answered_ms: float, in_result: bool = True) -> None:
        scheduled = self.add(
            scheduled_ms, E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                activity_type=ActivityType(name="run_agent")),
        )
        self.add(
            started_ms, E.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(scheduled_event_id=scheduled),
        )
        self.add(
            answered_ms, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
                scheduled_event_id=scheduled, result=_json({"answer": {"status": "SUCCESS"} if in_result else None})),
        )

    def signal_answer(self, at_ms: float) -> None:
        self.add(at_ms, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
                 workflow_execution_signaled_event_attributes=WorkflowExecutionSignaledEventAttributes(
                     signal_name="agent_complete"))

    def overheads(self) -> dict:
        return slave_overheads(History(events=self.events))


def test_each_figure_runs_between_the_right_moments():
    h = _Builder()
    h.load(recorded_ms=14, read_ms=10)  # read at 10 ms, recorded (with the first dispatch) at 14 ms
    h.agent(scheduled_ms=14, started_ms=15, answered_ms=100)
    # The answer's workflow task: the U4 write done at 125 ms, its marker recorded at 150, the next agent at 152.
    h.write(recorded_ms=150, done_ms=125)
    h.agent(scheduled_ms=150, started_ms=152, answered_ms=300)
    h.write(recorded_ms=340, done_ms=310)

    got = h.overheads()

    assert got["ready"] == [5.0, 27.0]  # read 10 -> started 15; written 125 -> next started 152
    assert got["written"] == [25.0, 10.0]  # answer 100 -> written 125; answer 300 -> written 310
    assert got["recorded"] == [50.0, 40.0]  # answer -> the write's marker in history
    assert got["cycle"] == [52.0]  # answer 100 -> next agent started 152 (= 25 + 27)
    assert got["counts"]["agent_activities"] == 2 and got["counts"]["write_activities"] == 2
    assert got["counts"]["times_from_history"] == 0


def test_a_result_without_its_own_time_is_timed_in_history_and_counted():
    h = _Builder()
    h.agent(scheduled_ms=0, started_ms=1, answered_ms=100)
    h.write(recorded_ms=130, done_ms=None)
    got = h.overheads()
    assert got["written"] == got["recorded"] == [30.0]
    assert got["counts"]["times_from_history"] == 1


def test_only_writes_that_wrote_count_and_only_against_their_own_answer():
    h = _Builder()
    h.agent(scheduled_ms=0, started_ms=1, answered_ms=100)
    h.write(recorded_ms=130, done_ms=120, outcome="cas-mismatch")  # nothing written
    h.agent(scheduled_ms=200, started_ms=201, answered_ms=300)  # an answer that changed no state: no write
    h.agent(scheduled_ms=400, started_ms=401, answered_ms=500, in_result=False)  # no answer (the agent timed out)
    h.write(recorded_ms=600, done_ms=580)  # needs-intervention: a write with no answer of its own
    h.agent(scheduled_ms=700, started_ms=701, answered_ms=800, in_result=False)
    h.signal_answer(860)  # this agent answers by signal
    h.write(recorded_ms=900, done_ms=880)
    got = h.overheads()
    assert got["written"] == [20.0]  # the signal at 860 -> written 880; nothing from 100, 300 or 500
    assert got["recorded"] == [40.0]
    assert got["counts"]["write_activities"] == 3 and got["counts"]["signals"] == 1
