"""Connecting to Temporal the same way everywhere (worker, demo, CLI, tests)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path, PurePath
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from bso.data_converter import data_converter
from temporalio.envconfig import ClientConfig
from temporalio.service import RPCError, RPCStatusCode

from bso.constants import MASTER_TYPE, SA_PHASE, SEARCH_ATTRIBUTES
from bso.states import ENDED_PHASES, SprintPhase

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"


def address_from_env() -> str:
    return os.environ.get("TEMPORAL_ADDRESS") or DEFAULT_ADDRESS


def namespace_from_env() -> str:
    return os.environ.get("TEMPORAL_NAMESPACE") or DEFAULT_NAMESPACE


def connect_failure_reason(err: BaseException) -> str:
    """A failed connection in a few words: the SDK's text ends in the transport's nested debug form
    (`tonic::transport::Error(Transport, ConnectError(...))`), which tells a user nothing more."""
    if "Connection refused" in str(err):
        return "connection refused"
    return str(err).split("(", 1)[0].strip() or type(err).__name__


def connect_config(
    address: str | None = None, namespace: str | None = None, profile: str | None = None
) -> dict[str, Any]:
    """Client.connect keyword arguments from the standard Temporal environment configuration
    (`temporalio.envconfig`: the TOML profile file, then TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
    TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_PROFILE...), explicit arguments winning."""
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    if address:
        config["target_host"] = address
    if namespace:
        config["namespace"] = namespace
    config.setdefault("target_host", DEFAULT_ADDRESS)
    config.setdefault("namespace", DEFAULT_NAMESPACE)
    return config


async def connect(
    address: str | None = None, namespace: str | None = None, *, runtime: Any = None, profile: str | None = None
) -> Client:
    config = connect_config(address, namespace, profile)
    target = config.pop("target_host")
    if runtime is not None:
        config["runtime"] = runtime
    return await Client.connect(target, data_converter=data_converter, **config)


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register BSO's search attributes on the server if missing; returns the names added."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        known = set(existing.custom_attributes) | set(existing.system_attributes)
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server cannot list
            raise
        known = set()
    missing = {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in SEARCH_ATTRIBUTES
        if key.name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)


async def is_running(client: Client, workflow_id: str, first_run_id: str | None = None) -> bool:
    """Whether the workflow's latest run is running (asked of the server: current, unlike a visibility search);
    False for an id the server does not know. With `first_run_id` (the run that made a claim), only while that
    run's chain of continue-as-new runs goes on: the id used again since by another sprint is not it."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=timedelta(seconds=10))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    if described.status != WorkflowExecutionStatus.RUNNING:
        return False
    chain = described.raw_description.workflow_execution_info.first_run_id
    return not (first_run_id and chain and chain != first_run_id)  # (a server that does not say: by the id)


RUNNING_SPRINTS_CHECKED = 1000  # a first history page each: cheap, and more sprints than a team runs at once
# A sprint in these phases may not have claimed its project yet (its first step does).
_NOT_CLAIMED_YET = frozenset({SprintPhase.STARTING.value, SprintPhase.PLANNING.value})


async def sprint_started_on(
    client: Client, root: PurePath, *, besides: str | None = None, claimed: bool = False
) -> str | None:
    """A running sprint (other than `besides`) whose input names the project `root`, from each running
    Master's input (its first history event): a sprint whose worker has not run yet counts too, unless `claimed`
    (only those past their first step, which claims the project). The search reads the visibility store, which
    lags by a second or two."""
    project = Path(root).resolve()
    query = f'WorkflowType = "{MASTER_TYPE}" AND ExecutionStatus = "Running"'
    async for wf in client.list_workflows(query, limit=RUNNING_SPRINTS_CHECKED):
        phase = wf.typed_search_attributes.get(SA_PHASE)
        if wf.id == besides or (claimed and phase in (None, *_NOT_CLAIMED_YET, *ENDED_PHASES)):
            continue
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        async for event in handle.fetch_history_events(page_size=1):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            try:
                started_on = json.loads(payloads[0].data).get("project_root") if payloads else None
                same = isinstance(started_on, str) and Path(started_on).expanduser().resolve() == project
            except (ValueError, AttributeError, OSError):  # not a JSON object or not a path: not a sprint BSO runs
                same = False
            # The visibility store lags a sprint's end: asked of the server itself before it counts (a sprint started
            # right after the last one ended was refused for it).
            if same and await is_running(client, wf.id):
                return wf.id
            break
    return None


async def fetch_sprint_histories(client: Client, sprint_id: str) -> list[WorkflowHistory]:
    """Every run of a sprint's Master (following continue-as-new back, oldest first) and then every
    child it started (Slaves, residents), each with the runs it continued as new into: the input of
    `bso.message_flow.message_flow`."""
    histories: list[WorkflowHistory] = []
    run_id: str | None = None
    seen: set[str] = set()
    while True:
        history = await client.get_workflow_handle(sprint_id, run_id=run_id).fetch_history()
        histories.append(history)
        start = history.events[0].workflow_execution_started_event_attributes if history.events else None
        previous = start.continued_execution_run_id if start else ""
        if not previous or previous in seen:
            break
        seen.add(previous)
        run_id = previous
    histories.reverse()
    for workflow_id, first_run in _children(histories):
        histories.extend(await _child_runs(client, workflow_id, first_run))
    return histories


def _children(masters: list[WorkflowHistory]) -> list[tuple[str, str | None]]:
    """Each child the Master runs started, once, with the run id it started (None: never started)."""
    started: list[tuple[str, str | None]] = []
    initiated: list[str] = []
    for history in masters:
        for event in history.events:
            if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
                child = event.start_child_workflow_execution_initiated_event_attributes.workflow_id
                if child not in initiated:
                    initiated.append(child)
            elif event.HasField("child_workflow_execution_started_event_attributes"):
                execution = event.child_workflow_execution_started_event_attributes.workflow_execution
                if (execution.workflow_id, execution.run_id) not in started:
                    started.append((execution.workflow_id, execution.run_id))
    seen = {workflow_id for workflow_id, _ in started}
    return started + [(child, None) for child in initiated if child not in seen]


async def _child_runs(client: Client, workflow_id: str, run_id: str | None) -> list[WorkflowHistory]:
    """A child's run and the runs it continued as new into (a resident hands over when its history is long)."""
    runs: list[WorkflowHistory] = []
    while True:
        try:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return runs
        runs.append(history)
        last = history.events[-1] if history.events else None
        if run_id is None or last is None or not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            return runs
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
