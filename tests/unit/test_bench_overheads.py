"""The benchmark's overhead arithmetic (bench/run.py slave_overheads) on a hand-made Slave history: which
timestamps each figure runs between, so a change that measures from the wrong event fails here."""

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
)

from bench.run import slave_overheads

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def _ts(ms: float) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(T0 + timedelta(milliseconds=ms))
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

    def local_activity(self, recorded_ms: float, activity_type: str, completed_ms: float) -> None:
        done = _ts(completed_ms)
        data = {"activity_type": activity_type, "complete_time": {"seconds": done.seconds, "nanos": done.nanos}}
        self.marker(recorded_ms, data)

    def marker(self, recorded_ms: float, data: dict) -> None:
        attributes = MarkerRecordedEventAttributes(marker_name="core_local_activity", details={"data": _json(data)})
        self.add(recorded_ms, E.EVENT_TYPE_MARKER_RECORDED, marker_recorded_event_attributes=attributes)

    def agent(self, scheduled_ms: float, started_ms: float, answered_ms: float) -> None:
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
                scheduled_event_id=scheduled, result=_json({"answer": {"status": "SUCCESS"}})),
        )


def test_each_figure_runs_between_the_right_moments():
    h = _Builder()
    # First workflow task: the status load completes at 10 ms, recorded (with the dispatch) at 14 ms.
    h.local_activity(recorded_ms=14, activity_type="load_sprint_status", completed_ms=10)
    h.agent(scheduled_ms=14, started_ms=15, answered_ms=100)
    # The answer's workflow task: U4 done at 120 ms, its marker recorded at 150 ms, the next agent started at 152.
    h.local_activity(recorded_ms=150, activity_type="write_story_status", completed_ms=120)
    h.agent(scheduled_ms=150, started_ms=152, answered_ms=300)
    h.local_activity(recorded_ms=340, activity_type="write_story_status", completed_ms=310)

    got = slave_overheads(History(events=h.events))

    assert got["ready"] == [5.0, 32.0]  # load done 10 -> started 15; U4 done 120 -> next started 152
    assert got["written"] == [20.0, 10.0]  # answer 100 -> U4 done 120; answer 300 -> U4 done 310
    assert got["recorded"] == [50.0, 40.0]  # answer -> the write's marker in history
    assert got["cycle"] == [52.0]  # answer 100 -> next agent started 152
    assert got["counts"]["agent_activities"] == 2 and got["counts"]["write_activities"] == 2


def test_a_marker_without_a_completion_time_counts_from_the_marker():
    h = _Builder()
    h.agent(scheduled_ms=0, started_ms=1, answered_ms=100)
    h.marker(130, {"activity_type": "write_story_status"})
    got = slave_overheads(History(events=h.events))
    assert got["written"] == got["recorded"] == [30.0]
