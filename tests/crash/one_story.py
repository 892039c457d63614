"""A one-story sprint of simulated agents on a dev server of its own and one worker, for the trials of deadlines
passed while a laptop slept or a worker was down (test_laptop_sleep.py, test_worker_down_deadline.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from bench.infra import DevServer, WorkerProcess
from bso.constants import SPRINT_TASK_QUEUE
from bso.models import SprintInput
from tests.workflow.helpers import poll_until
from workflows.sprint_master import SprintMasterWorkflow


@asynccontextmanager
async def server_and_worker(tmp_path: Path, prefix: str) -> AsyncIterator[tuple[Client, DevServer, WorkerProcess]]:
    """A dev server on a free port and a worker of queues `prefix`bso-*, both stopped (resumed first) after."""
    server = DevServer(tmp_path / "temporal.db", tmp_path / "server.log")
    server.start()
    worker = WorkerProcess(server.address, tmp_path / "worker.log", ["--queue-prefix", prefix])
    try:
        client = await server.wait_ready()
        worker.start()
        yield client, server, worker
    finally:
        worker.resume()
        server.resume()
        worker.kill9()
        server.kill9()


async def start_sprint(
    client: Client, root: Path, session_id: str, prefix: str, overrides: dict[str, Any], story: str, dev_ms: int
) -> WorkflowHandle[Any, Any]:
    """The sprint of `story`, its dev agent working `dev_ms` (the others 200 ms)."""
    inp = SprintInput(
        project_root=str(root), session_id=session_id, agent_backend="simulated", config_overrides=overrides,
        simulation={"default": {"tokens": 100, "duration_ms": 200}, "stories": {story: {"duration_ms": dev_ms}}},
    )
    return await client.start_workflow(
        SprintMasterWorkflow.run, inp, id=session_id, task_queue=prefix + SPRINT_TASK_QUEUE
    )


async def dev_agent_working(handle: WorkflowHandle[Any, Any], story: str, seconds: float) -> None:
    """Returns once the story's dev agent has worked `seconds`."""

    async def dev_in_flight() -> bool:
        try:
            view = await handle.query(SprintMasterWorkflow.status)
        except Exception:  # noqa: BLE001 - not taken up yet
            return False
        entry = view.stories.get(story)
        return bool(entry and entry.state == "ready-for-dev" and view.running_batches)

    await poll_until(dev_in_flight, "the dev agent in flight")
    await asyncio.sleep(seconds)
