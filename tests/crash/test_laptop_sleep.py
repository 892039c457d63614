"""A closed laptop for longer than an agent's deadline, or than the batch's working time, while the agent works:
the worker and the dev server it runs stand still (SIGSTOP) and go on (SIGCONT). The server fires its overdue
timers on waking: the story ended needs-intervention ("no AGENT_COMPLETE within ..."), or the batch out of time,
the sprint sprint-failed, for time nobody worked; an external agent's deadline, kept by the batch's own timer, the
same. The timeouts are scaled down (a 10-15 s deadline and a 25 s sleep
stand for a 30 min one and a night), `asleep_after_seconds` with them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client

from bench.infra import make_project, status_values
from bso.constants import SPRINT_TASK_QUEUE
from bso.models import SprintInput
from bso.states import SprintStatus
from tests.conftest import record_histories
from tests.crash import one_story
from tests.workflow.helpers import poll_until, workflow_task_failures
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow, external_deadline_summary

pytestmark = pytest.mark.e2e

STORY = "1-1-laptop-story"
SLEEP_SECONDS = 25


@pytest.mark.parametrize("deadline", ["agent", "working-time"])
async def test_a_laptop_closed_past_a_deadline_costs_the_sprint_nothing(tmp_path: Path, deadline: str) -> None:
    overrides: dict = {
        "asleep_after_seconds": 5,
        "agent_retry": {"heartbeat_timeout_seconds": 3, "initial_interval_seconds": 0.5},
    }
    if deadline == "agent":
        overrides["agent_timeout_seconds"] = {"dev_execution": 10}
    else:
        overrides["slave_timeout_seconds"] = 15  # the work after waking (~7 s) fits, on a slow machine too
    root = tmp_path / "project"
    make_project(root, {STORY: "ready-for-dev"})
    async with _laptop(tmp_path) as (client, close_the_lid):
        handle = await one_story.start_sprint(client, root, "laptop", "laptop-", overrides, STORY, 6000)
        await one_story.dev_agent_working(handle, STORY, 2)  # (of its 6 s)
        await close_the_lid()
        report = await asyncio.wait_for(handle.result(), 180)
        assert report.status is SprintStatus.COMPLETE, report
        assert status_values(root)[STORY] == "done"
        assert await workflow_task_failures(client, "laptop/batch-1") == []
        slave = client.get_workflow_handle("laptop/batch-1")
        events = [e for e in (await slave.fetch_history()).events if e.HasField("marker_recorded_event_attributes")]
        patch = "slave-agent-wakes-after-sleep" if deadline == "agent" else "slave-working-time-wakes-after-sleep"
        assert any(patch in str(e.marker_recorded_event_attributes.details) for e in events), "not slept through?"
        record_histories([await slave.fetch_history()])


async def test_a_laptop_closed_past_an_external_agents_deadline_leaves_the_agent_its_time(tmp_path: Path) -> None:
    """The external agent (a human, another machine) answers after the laptop wakes and the server has fired its
    deadline: slept through, it did not end the story."""
    overrides = {"asleep_after_seconds": 5, "agent_timeout_seconds": {"code_review": 10}}
    root = tmp_path / "project"
    make_project(root, {STORY: "review"})
    async with _laptop(tmp_path) as (client, close_the_lid):
        inp = SprintInput(
            project_root=str(root), session_id="laptop-ext", agent_backend="external", config_overrides=overrides
        )
        handle = await client.start_workflow(
            SprintMasterWorkflow.run, inp, id="laptop-ext", task_queue="laptop-" + SPRINT_TASK_QUEUE
        )
        slave = client.get_workflow_handle("laptop-ext/batch-1")

        async def review_out() -> str | None:
            try:
                view = (await slave.query(SprintSlaveWorkflow.status)).stories.get(STORY)
            except Exception:  # noqa: BLE001 - not started yet
                return None
            return view.dispatch_id if view and view.agent_in_flight == "review-runner" else None

        dispatch_id = await poll_until(review_out, "the review out to the external agent")
        await asyncio.sleep(2)
        await close_the_lid()

        async def deadline_fired() -> bool:
            summary = f'"{external_deadline_summary(dispatch_id)}"'.encode()
            events = (await slave.fetch_history()).events
            timers = {e.timer_started_event_attributes.timer_id for e in events if e.user_metadata.summary.data == summary}
            return any(e.timer_fired_event_attributes.timer_id in timers for e in events if e.HasField("timer_fired_event_attributes"))

        await poll_until(deadline_fired, "the server fires the overdue deadline", timeout=60, interval=0.5)
        answer = {
            "dispatch_id": dispatch_id, "story_key": STORY, "agent_type": "review-runner", "mode": "review",
            "status": "success", "tokens_used": 100,
        }
        await slave.signal("agent_complete", answer)  # the agent answers after the laptop woke
        report = await asyncio.wait_for(handle.result(), 120)
        assert report.status is SprintStatus.COMPLETE, report
        assert status_values(root)[STORY] == "done"
        assert await workflow_task_failures(client, "laptop-ext/batch-1") == []
        record_histories([await slave.fetch_history()])


@asynccontextmanager
async def _laptop(tmp_path: Path) -> AsyncIterator[tuple[Client, Callable[[], Awaitable[None]]]]:
    """A dev server and a worker on it, and the lid to close: both stand still (SIGSTOP) for SLEEP_SECONDS."""
    async with one_story.server_and_worker(tmp_path, "laptop-") as (client, server, worker):

        async def close_the_lid() -> None:
            worker.suspend()
            server.suspend()  # the laptop closes: every process stands still
            await asyncio.sleep(SLEEP_SECONDS)
            server.resume()
            worker.resume()

        yield client, close_the_lid
