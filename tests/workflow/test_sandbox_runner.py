"""BSO's workflow runner (workers/sandbox.py): the SDK's sandbox, its code strings compiled once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import RestrictedWorkflowAccessError, SandboxedWorkflowRunner

from bso.data_converter import data_converter
from tests.conftest import bso_worker
from tests.workflow.clock_reader import ClockReaderWorkflow
from tests.workflow.helpers import make_project, run_sprint, sprint_input
from workers.main import WORKFLOW_INTERCEPTORS, WORKFLOWS
from workers.sandbox import CompiledOnceSandboxedWorkflowRunner, compiled, workflow_runner

HISTORIES = Path(__file__).resolve().parents[1] / "histories"


def test_this_sdk_gets_the_compiled_once_runner():
    """Fails when an SDK upgrade drops the private hook: BSO then runs the sandbox as shipped (slower)."""
    runner = workflow_runner()
    assert isinstance(runner, CompiledOnceSandboxedWorkflowRunner)
    assert isinstance(runner, SandboxedWorkflowRunner)


async def test_a_replay_compiles_each_code_string_once():
    histories = sorted(HISTORIES.glob("before-2026-11-2[67]*/*.json"))[:6]
    assert histories
    replayer = Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS,
        workflow_runner=workflow_runner(),
    )
    compiled.cache_clear()
    for path in histories:
        history = WorkflowHistory.from_json(path.stem.replace("--", "/"), path.read_text())
        assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    info = compiled.cache_info()
    assert 1 <= info.misses <= 8, info  # the sandbox's few code strings
    assert info.hits > 20 * info.misses, info


async def test_a_sprint_runs_on_the_runner(ts_env, tmp_path):
    make_project(tmp_path, {"1-1-a": "review"})
    compiled.cache_clear()
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path))
    assert report.stories == {"1-1-a": "done"}
    assert compiled.cache_info().hits > 0  # build_workers gave the sprint's worker this runner


async def test_the_sandbox_still_refuses_what_a_workflow_must_not_do(ts_env):
    queue = f"clock-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_env.client, task_queue=queue, workflows=[ClockReaderWorkflow], workflow_runner=workflow_runner(),
        workflow_failure_exception_types=[RestrictedWorkflowAccessError],
    ):
        with pytest.raises(WorkflowFailureError) as failed:
            await ts_env.client.execute_workflow(ClockReaderWorkflow.run, id=queue, task_queue=queue)
    assert "datetime.datetime.now" in str(failed.value.cause)
