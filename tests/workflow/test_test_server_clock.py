"""Why tests/conftest.py terminates what a test leaves running on the shared time-skipping server. The server
skips time only while no workflow task is outstanding. A workflow left sleeping by a test whose worker has
gone gets a task when time is skipped to its timer (for a later test), no worker ever takes it, and from
then on every timer of every later test runs in real time. Terminated at the end of its test, it cannot."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.worker import Worker

from tests.conftest import terminate_left_running
from tests.workflow.sleeper import SleepingChildWorkflow, SleepWorkflow

HOUR = 3600.0


async def sleeps_an_hour_quickly(env, workflow_id: str, patience: float) -> bool:
    async with Worker(env.client, task_queue="clock", workflows=[SleepWorkflow]):
        try:
            await asyncio.wait_for(
                env.client.execute_workflow(SleepWorkflow.run, HOUR, id=workflow_id, task_queue="clock"), patience
            )
        except asyncio.TimeoutError:
            await env.client.get_workflow_handle(workflow_id).terminate()
            return False
    return True


@pytest.mark.parametrize("terminated", [True, False], ids=["terminated", "left-behind"])
async def test_a_workflow_left_sleeping_holds_the_clock_unless_terminated(own_ts_env, terminated: bool):
    client = own_ts_env.client
    # An earlier test: its workflow sleeps 5 minutes when the test ends and its worker stops.
    async with Worker(client, task_queue="earlier-test", workflows=[SleepWorkflow]):
        handle = await client.start_workflow(SleepWorkflow.run, 300.0, id="earlier", task_queue="earlier-test")
        await asyncio.sleep(0.5)  # its first task done: it sleeps
    if terminated:
        assert await terminate_left_running(client, ["earlier", "never-started"]) == ["earlier"]
    # Later tests: skipping an hour passes the 5 minutes; without the termination the timer fires there, and
    # the task it makes waits for a worker that is gone: the clock is held from then on.
    # Skipped time takes well under a second; a held clock never finishes. The wait that must succeed gets
    # room for a busy machine, the one that must time out stays short.
    patience = 60.0 if terminated else 5.0
    assert await sleeps_an_hour_quickly(own_ts_env, "later-1", patience) is terminated
    assert await sleeps_an_hour_quickly(own_ts_env, "later-2", patience) is terminated
    assert (await handle.describe()).status.name == ("TERMINATED" if terminated else "RUNNING")


async def test_a_terminated_workflows_children_are_terminated_too(own_ts_env):
    """The time-skipping server does not apply a parent's close policy: a Master terminated at its test's end left
    its batch running, whose next timer held the clock for every later test."""
    client = own_ts_env.client
    async with Worker(client, task_queue="earlier-test", workflows=[SleepingChildWorkflow, SleepWorkflow]):
        await client.start_workflow(SleepingChildWorkflow.run, 300.0, id="parent", task_queue="earlier-test")
        await asyncio.sleep(0.5)  # its child started, sleeping
    assert await terminate_left_running(client, ["parent"]) == ["parent", "parent-child"]
    assert await sleeps_an_hour_quickly(own_ts_env, "later", 60.0)
