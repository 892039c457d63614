"""End to end on the real local dev server: the worker process (`python -m workers.main`), the
sprint started with the `temporal` CLI, the example project's sprint run to its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_PROJECT, REPO, _binary
from tests.workflow.helpers import status_values, workflow_task_failures
from workflows.sprint_master import SprintMasterWorkflow

pytestmark = pytest.mark.e2e


@pytest.fixture
def worker_process(local_env, tmp_path_factory):
    address = local_env.client.service_client.config.target_host
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": local_env.client.namespace}
    # Logs to a file: an unread pipe fills up and blocks the worker.
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.main"],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def test_example_sprint_started_with_the_temporal_cli(local_env, worker_process, project: Path):
    client = local_env.client
    session = f"e2e-{uuid.uuid4().hex[:6]}"
    sprint = {
        "project_root": str(project),
        "simulation": json.loads((EXAMPLE_PROJECT / "simulation.json").read_text()),
    }
    original = (project / "_bmad-output/implementation-artifacts/sprint-status.yaml").read_text()
    subprocess.run(
        [
            _binary("temporal"), "workflow", "start",
            "--address", worker_process,
            "--type", "SprintMasterWorkflow",
            "--task-queue", "bso-sprint",
            "--workflow-id", session,
            "--input", json.dumps(sprint),
        ],
        check=True,
        capture_output=True,
    )
    handle = client.get_workflow_handle_for(SprintMasterWorkflow.run, session)
    report = await handle.result()

    assert report.session_id == session
    assert report.stories == {
        "1-2-pantry-item-model-and-storage": "done",
        "1-3-add-and-list-items-api": "done",
        "2-1-expiry-date-tracking": "done",
        "2-2-expiry-reminder-emails": "needs-intervention",
        "2-2a-reminder-digest-settings": "done",
    }
    assert report.status == "sprint-partial"
    assert [b.stories for b in report.batch_plan.batches] == [
        ["1-2-pantry-item-model-and-storage", "1-3-add-and-list-items-api", "2-1-expiry-date-tracking"],
        ["2-2-expiry-reminder-emails", "2-2a-reminder-digest-settings"],
    ]
    values = status_values(project)
    assert values["1-1-project-scaffold-and-health-check"] == "done"
    assert values["2-2-expiry-reminder-emails"] == "needs-intervention"
    assert values["epic-1"] == "done" and values["epic-2"] == "in-progress"

    # Only story values, epic values and last_updated changed: every other line (comments too) survives.
    new = (project / "_bmad-output/implementation-artifacts/sprint-status.yaml").read_text()
    changed = [(a, b) for a, b in zip(original.splitlines(), new.splitlines()) if a != b]
    assert len(original.splitlines()) == len(new.splitlines())
    assert all(a.split(":")[0] == b.split(":")[0] for a, b in changed)
    assert "# merged 2025-11-07" in new and "# STATUS DEFINITIONS:" in new

    status = await handle.query(SprintMasterWorkflow.status)
    assert status.phase == "completed"
    assert await workflow_task_failures(client, session) == []
