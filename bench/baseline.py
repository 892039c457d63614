"""The raw Temporal baselines.

- BaselineWorkflow: a minimal workflow running N no-op activities, sequentially or in P parallel lanes
  (as BSO's Slaves run their stories one after another, P Slaves at a time): the issue's baseline.
- SkeletonWorkflow: the shape the Slave spec prescribes, in raw Temporal and nothing else: one workflow
  per lane, each story an agent activity followed by its status write (a local activity), stories one
  after another. P of them at once show what that shape costs before any of BSO's own work.

    python -m bench.baseline --worker      # the baseline's worker process (started by bench.run)
"""

from __future__ import annotations

import argparse
import asyncio
import os
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

TASK_QUEUE = "bench-baseline"


@activity.defn
async def noop(i: int) -> int:
    return i


@activity.defn
async def noop_write(i: int) -> int:
    return i


@workflow.defn
class BaselineWorkflow:
    @workflow.run
    async def run(self, n: int, lanes: int) -> int:
        async def lane(start: int) -> None:
            for i in range(start, n, lanes):
                await workflow.execute_activity(noop, i, start_to_close_timeout=timedelta(seconds=30))

        await asyncio.gather(*(lane(k) for k in range(lanes)))
        return n


@workflow.defn
class SkeletonWorkflow:
    @workflow.run
    async def run(self, start: int, n: int, lanes: int) -> int:
        for i in range(start, n, lanes):
            await workflow.execute_activity(noop, i, start_to_close_timeout=timedelta(seconds=30))
            await workflow.execute_local_activity(noop_write, i, start_to_close_timeout=timedelta(seconds=30))
        return n


async def serve() -> None:
    from workers.sandbox import workflow_runner  # here: the sandbox re-imports this module for every workflow run

    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    # BSO's workflow runner here too: the ratio compares orchestration, not two builds of the sandbox.
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[BaselineWorkflow, SkeletonWorkflow],
        activities=[noop, noop_write],
        workflow_runner=workflow_runner(),
    )
    await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.parse_args()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
