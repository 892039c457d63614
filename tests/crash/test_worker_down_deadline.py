"""A worker down (killed -9) or frozen (SIGSTOP) past an agent's deadline while the dev server runs on: the server
fires the deadline on time, but no worker takes the workflow task carrying it until one runs again. The story
ended needs-intervention ("no AGENT_COMPLETE within ...") for time no worker ran the agent, or the batch out of
its working time; the agent now starts again with its whole time, and the working stretch is not counted, as
after a closed laptop (tests/crash/test_laptop_sleep.py). The timeouts are scaled
down (a 7 s deadline, a worker gone 14 s), `asleep_after_seconds` with them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.infra import WorkerProcess, make_project, status_values
from bso.states import SprintStatus
from tests.conftest import record_histories
from tests.crash import one_story
from tests.workflow.helpers import ledger, poll_until, workflow_task_failures

pytestmark = pytest.mark.e2e

STORY = "1-1-worker-down-story"
DOWN_SECONDS = 14


@pytest.mark.parametrize("down, deadline", [("killed", "agent"), ("frozen", "agent"), ("killed", "working-time")])
async def test_a_worker_down_past_a_deadline_costs_the_sprint_nothing(tmp_path: Path, down: str, deadline: str) -> None:
    overrides: dict = {
        "asleep_after_seconds": 3,
        "agent_retry": {"heartbeat_timeout_seconds": 3, "initial_interval_seconds": 0.5},
    }
    if deadline == "agent":
        overrides["agent_timeout_seconds"] = {"dev_execution": 7}
    else:  # the batch's working time fires while the worker is down; the work after it (~7 s) fits a new stretch
        overrides["slave_timeout_seconds"] = 12
    root = tmp_path / "project"
    make_project(root, {STORY: "ready-for-dev"})
    async with one_story.server_and_worker(tmp_path, "down-") as (client, _server, worker):
        handle = await one_story.start_sprint(client, root, "down", "down-", overrides, STORY, 5000)
        await one_story.dev_agent_working(handle, STORY, 1.5)  # (of its 5 s)
        first = [e for e in ledger(root) if e["event"] == "started"]
        assert first and not [e for e in ledger(root) if e["event"] == "finished"], ledger(root)
        if down == "killed":
            worker.kill9()
        else:
            worker.suspend()
        await asyncio.sleep(DOWN_SECONDS)  # the deadline (7 s, 12 s) fires meanwhile, the server running on
        if down == "killed":
            worker.start()
        else:
            worker.resume()
        report = await asyncio.wait_for(handle.result(), 180)
        assert report.status is SprintStatus.COMPLETE, report
        assert status_values(root)[STORY] == "done"
        dev = first[0]["dispatch_id"]
        ran = [e["event"] for e in ledger(root) if e["dispatch_id"] == dev]
        assert ran.count("finished") == 1, ledger(root)  # the dev agent ran to its end, once, after the worker's return
        assert await workflow_task_failures(client, "down/batch-1") == []
        slave = client.get_workflow_handle("down/batch-1")
        events = (await slave.fetch_history()).events
        agents = [e.activity_task_scheduled_event_attributes.activity_id for e in events if e.HasField("activity_task_scheduled_event_attributes")]
        if deadline == "agent":
            assert agents.count(dev) == 2, agents  # started again with its whole time once the worker ran again
        else:  # the stretch the worker was down through not counted (the batch was not out of time)
            markers = [str(e.marker_recorded_event_attributes.details) for e in events if e.HasField("marker_recorded_event_attributes")]
            assert any("slave-working-time-wakes-after-sleep" in m for m in markers), markers
        record_histories([await slave.fetch_history()])


async def test_an_agent_still_working_at_its_deadline_ends_out_of_time(tmp_path: Path) -> None:
    """Its worker running all along, it takes the deadline up at once: not late, the story ends needs-intervention
    (the dev agent works 20 s, its deadline is 10 s)."""
    overrides = {"asleep_after_seconds": 5, "agent_timeout_seconds": {"dev_execution": 10}}
    root = tmp_path / "project"
    make_project(root, {STORY: "ready-for-dev"})
    async with one_story.server_and_worker(tmp_path, "down-") as (client, _server, _worker):
        handle = await one_story.start_sprint(client, root, "working", "down-", overrides, STORY, 20000)
        report = await asyncio.wait_for(handle.result(), 180)
        assert report.status is SprintStatus.FAILED, report
        assert status_values(root)[STORY] == "needs-intervention"
        events = (await client.get_workflow_handle("working/batch-1").fetch_history()).events
        agents = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events if e.HasField("activity_task_scheduled_event_attributes")]
        assert agents.count("deadline_lateness") == 1 and agents.count("run_agent") == 1, agents  # asked, not late


async def test_a_worker_stopped_on_purpose_just_before_an_agents_deadline_costs_the_sprint_nothing(tmp_path: Path) -> None:
    """A stop on purpose (SIGTERM, Ctrl-C) hands the agent's attempt back at once as failed (WorkerShutdown); its
    retry's backoff (2 s) does not fit before the deadline, so the server gives up at once with that failure, no
    timeout: the story ended needs-intervention ("agent activity failed: Worker is shutting down ..."). Killed -9
    at that moment it ends done (above). Scaled down: a 7 s deadline, the 6.5 s dev agent stopped 5.5 s into it,
    the worker gone 14 s. (From an adversarial durability tester.)"""
    overrides = {
        "asleep_after_seconds": 3,
        "agent_timeout_seconds": {"dev_execution": 7},
        "agent_retry": {"heartbeat_timeout_seconds": 3, "initial_interval_seconds": 2},
    }
    root = tmp_path / "project"
    make_project(root, {STORY: "ready-for-dev"})
    async with one_story.server_and_worker(tmp_path, "stop-") as (client, _server, worker):
        handle = await one_story.start_sprint(client, root, "stop", "stop-", overrides, STORY, 6500)

        async def dev_started() -> bool:
            return any(e["event"] == "started" for e in ledger(root))

        await poll_until(dev_started, "the dev agent started", interval=0.02)
        started = time.monotonic()
        await asyncio.sleep(5.5)  # 1.5 s before the agent's deadline: less than the retry's 2 s backoff
        assert not [e for e in ledger(root) if e["event"] == "finished"], ledger(root)
        await _stopped_on_purpose(worker)
        assert time.monotonic() - started < 7, "stopped too late: the deadline had passed"
        # The server gave up at the stop (no retry fits before the deadline): the time gone does not matter.
        await asyncio.sleep(3)
        worker.start()
        report = await asyncio.wait_for(handle.result(), 180)
        record_histories([await client.get_workflow_handle("stop/batch-1").fetch_history()])
        errors = [r.error for b in report.batches for r in b.results.story_results]
        assert (status_values(root)[STORY], report.status) == ("done", SprintStatus.COMPLETE), errors
        _the_dev_agent_finished_once(root)
        assert await workflow_task_failures(client, "stop/batch-1") == []


async def test_a_worker_restarted_on_purpose_as_often_as_an_agent_has_attempts_costs_the_sprint_nothing(
    tmp_path: Path,
) -> None:
    """Each stop on purpose fails the agent's attempt (WorkerShutdown), counted against `agent_retry.maximum_attempts`
    (5 by default, 3 here): the last restart during one dev agent's run ended the story needs-intervention, though
    nothing faulted.
    (From an adversarial durability tester.)"""
    overrides = {
        "agent_timeout_seconds": {"dev_execution": 300},
        "agent_retry": {"initial_interval_seconds": 0.5, "maximum_attempts": 3},  # (5 by default: the same, longer)
    }
    root = tmp_path / "project"
    make_project(root, {STORY: "ready-for-dev"})
    async with one_story.server_and_worker(tmp_path, "restart-") as (client, _server, worker):
        handle = await one_story.start_sprint(client, root, "restart", "restart-", overrides, STORY, 6000)
        for n in range(1, 4):  # as many stops as the agent has attempts

            async def started(n: int = n) -> bool:
                return len([e for e in ledger(root) if e["event"] == "started"]) >= n

            await poll_until(started, f"the dev agent's attempt {n} started", timeout=60)
            await asyncio.sleep(1.5)
            await _stopped_on_purpose(worker)
            worker.start()
        report = await asyncio.wait_for(handle.result(), 180)
        record_histories([await client.get_workflow_handle("restart/batch-1").fetch_history()])
        errors = [r.error for b in report.batches for r in b.results.story_results]
        assert (status_values(root)[STORY], report.status) == ("done", SprintStatus.COMPLETE), errors
        _the_dev_agent_finished_once(root)


async def _stopped_on_purpose(worker: WorkerProcess) -> None:
    """SIGTERM, as Ctrl-C or `make stop`: the worker hands its activities back and exits."""
    worker.stop()
    assert worker.proc is not None
    await asyncio.to_thread(worker.proc.wait, 30)


def _the_dev_agent_finished_once(root: Path) -> None:
    dev = ledger(root)[0]["dispatch_id"]
    assert [e["event"] for e in ledger(root) if e["dispatch_id"] == dev].count("finished") == 1, ledger(root)
