"""The BSO worker process: `python -m workers.main`.

Serves both task queues by default: `bso-sprint` (the workflows, and the cheap status-file
activities they call) and `bso-agents` (the agent activities, one slot per agent this host can run).
Reads TEMPORAL_ADDRESS (default localhost:7233) and TEMPORAL_NAMESPACE (default default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from activities.agents import run_agent
from activities.debugger import analyze_failure
from activities.browser import browse
from activities.researcher import research
from activities.status_file import load_sprint_status, write_story_status
from bso.constants import AGENTS_TASK_QUEUE, SPRINT_TASK_QUEUE, agents_task_queue_for
from bso.temporal_client import address_from_env, connect, ensure_search_attributes, namespace_from_env
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

WORKFLOWS = [SprintMasterWorkflow, SprintSlaveWorkflow, ResidentWorkflow]
SPRINT_ACTIVITIES = [load_sprint_status, write_story_status]
AGENT_ACTIVITIES = [run_agent, analyze_failure, research, browse]

log = logging.getLogger("bso.worker")


def build_workers(
    client: Client,
    queues: Sequence[str] = (SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE),
    *,
    queue_prefix: str = "",
    max_concurrent_agents: int = 8,
) -> list[Worker]:
    """The workers for the given queues; tests give each run its own `queue_prefix`."""
    sprint_task_queue = queue_prefix + SPRINT_TASK_QUEUE
    agents_task_queue = agents_task_queue_for(sprint_task_queue)
    workers = []
    if SPRINT_TASK_QUEUE in queues:
        workers.append(
            Worker(
                client,
                task_queue=sprint_task_queue,
                workflows=WORKFLOWS,
                activities=SPRINT_ACTIVITIES,
            )
        )
    if AGENTS_TASK_QUEUE in queues:
        workers.append(
            Worker(
                client,
                task_queue=agents_task_queue,
                activities=AGENT_ACTIVITIES,
                max_concurrent_activities=max_concurrent_agents,
            )
        )
    return workers


async def run(queues: Sequence[str], max_concurrent_agents: int) -> None:
    client = await connect()
    added = await ensure_search_attributes(client)
    if added:
        log.info("registered search attributes: %s", ", ".join(added))
    workers = build_workers(client, queues, max_concurrent_agents=max_concurrent_agents)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker polling %s on %s (namespace %s)", ", ".join(queues), address_from_env(), namespace_from_env()
    )
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        await stop.wait()
    log.info("worker stopped")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.main", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--queue",
        choices=[SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE],
        action="append",
        help="serve only this task queue (repeatable; default: both)",
    )
    parser.add_argument("--max-concurrent-agents", type=int, default=8)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args.queue or [SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE], args.max_concurrent_agents))


if __name__ == "__main__":
    main()
