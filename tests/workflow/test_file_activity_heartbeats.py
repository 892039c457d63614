"""The Master's file activities heartbeat: a worker killed in the middle of one is noticed within the heartbeat
timeout (activities.status_file.FILE_WORK_HEARTBEAT), not at the 60 s start-to-close timeout. A crash trial
once stood still 61.8 s after a worker kill that caught the sprint's first status load in flight."""

from __future__ import annotations

import time
from pathlib import Path

from temporalio.api.enums.v1 import EventType

import activities.status_file as status_file
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input

K1 = "1-1-login-form"


async def test_a_slow_status_load_heartbeats_through_its_heartbeat_timeout(local_env, tmp_path: Path, monkeypatch):
    """The sprint's first load takes 2.5 s against a 1 s heartbeat timeout: its heartbeats keep it alive (one
    attempt), and the Master scheduled it with that timeout. Without heartbeats each attempt timed out."""
    make_project(tmp_path, {K1: "review"})
    real_load = status_file._load_sync

    def slow_first_load(inp):
        if inp.claim_project:  # the Master's load at the sprint's start
            time.sleep(2.5)
        return real_load(inp)

    monkeypatch.setattr(status_file, "FILE_WORK_HEARTBEAT", 1)
    monkeypatch.setattr(status_file, "_load_sync", slow_first_load)
    session = f"slow-load-{time.monotonic_ns()}"
    async with bso_worker(local_env.client) as queue:
        report = await run_sprint(local_env.client, queue, sprint_input(tmp_path, session_id=session))
        history = await local_env.client.get_workflow_handle(session).fetch_history()
    assert report.stories == {K1: "done"}
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    (load_id,) = [i for i, a in scheduled.items() if a.activity_type.name == "load_sprint_status"]
    assert scheduled[load_id].heartbeat_timeout.ToTimedelta().total_seconds() == 1
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id == load_id
    ]
    assert attempts == [1]
