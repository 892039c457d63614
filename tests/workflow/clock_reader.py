"""A workflow that reads the machine's clock: the sandbox must refuse it."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow


@workflow.defn
class ClockReaderWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # nondeterministic: workflow.now() is the one to use
