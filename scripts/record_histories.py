"""Record the example sprint's workflow histories into tests/histories/ for the replay test.

Run after an intentional change to workflow code (`.venv/bin/python scripts/record_histories.py`),
and commit the new histories together with that change. The replay test then fails on any later
change that would break the determinism of running sprints.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bso.data_converter import data_converter  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bso.constants import slave_workflow_id  # noqa: E402
from bso.models import SprintInput  # noqa: E402
from bso.roster import resident_workflow_id  # noqa: E402
from bso.temporal_client import ensure_search_attributes  # noqa: E402
from tests.conftest import EXAMPLE_PROJECT, _binary, bso_worker  # noqa: E402
from workflows.sprint_master import SprintMasterWorkflow  # noqa: E402

HISTORIES = REPO / "tests" / "histories"


async def record() -> None:
    simulation = json.loads((EXAMPLE_PROJECT / "simulation.json").read_text())
    simulation["default"]["duration_ms"] = 0
    for script in simulation["stories"].values():
        script.pop("duration_ms", None)
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_binary("temporal-test-server"), data_converter=data_converter
    )
    async with env:
        await ensure_search_attributes(env.client)
        with tempfile.TemporaryDirectory() as scratch:
            project = Path(scratch) / "project"
            shutil.copytree(EXAMPLE_PROJECT, project)
            session = "example-sprint"
            async with bso_worker(env.client) as queue:
                report = await env.client.execute_workflow(
                    SprintMasterWorkflow.run,
                    SprintInput(project_root=str(project), session_id=session, simulation=simulation),
                    id=session,
                    task_queue=queue,
                )
            ids = [session] + [slave_workflow_id(session, b.batch_id) for b in report.batches]
            ids += [resident_workflow_id(session, role) for role in ("scrum-master", "knowledge-researcher", "debugger")]
            HISTORIES.mkdir(exist_ok=True)
            for workflow_id in ids:
                history = await env.client.get_workflow_handle(workflow_id).fetch_history()
                name = workflow_id.replace("/", "--") + ".json"
                (HISTORIES / name).write_text(history.to_json())
                print(f"recorded {name}: {len(history.events)} events")
            await record_resident_handovers(env, simulation, Path(scratch) / "handover")


async def record_resident_handovers(env: WorkflowEnvironment, simulation: dict, project: Path) -> None:
    """The same sprint with residents continuing as new every ~20 events: the first two runs of each
    resident (one started by the Master, one started from a carried ResidentState)."""
    shutil.copytree(EXAMPLE_PROJECT, project)
    session = "handover-sprint"
    async with bso_worker(env.client) as queue:
        await env.client.execute_workflow(
            SprintMasterWorkflow.run,
            SprintInput(
                project_root=str(project), session_id=session, simulation=simulation,
                config_overrides={"resident_continue_as_new_after_events": 20},
            ),
            id=session,
            task_queue=queue,
        )
    for role in ("scrum-master", "knowledge-researcher", "debugger"):
        workflow_id = resident_workflow_id(session, role)
        chain, run_id = [], None
        while True:  # the latest run back to the first
            history = await env.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
            chain.append(history)
            run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
            if not run_id:
                break
        for number, history in enumerate(reversed(chain[-2:]), start=1):
            name = f"{workflow_id.replace('/', '--')}--run-{number}.json"
            (HISTORIES / name).write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events (of {len(chain)} runs)")


if __name__ == "__main__":
    asyncio.run(record())
