"""A workflow that sleeps: on a time-skipping server it ends at once, unless something holds the clock."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn
class SleepWorkflow:
    @workflow.run
    async def run(self, seconds: float) -> None:
        await workflow.sleep(timedelta(seconds=seconds))


@workflow.defn
class SleepingChildWorkflow:
    """Starts a SleepWorkflow child (`<its id>-child`) and waits for it."""

    @workflow.run
    async def run(self, seconds: float) -> None:
        await workflow.execute_child_workflow(SleepWorkflow.run, seconds, id=f"{workflow.info().workflow_id}-child")
