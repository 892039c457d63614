"""A workflow that sleeps: on a time-skipping server it ends at once, unless something holds the clock."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn
class SleepWorkflow:
    @workflow.run
    async def run(self, seconds: float) -> None:
        await workflow.sleep(timedelta(seconds=seconds))
