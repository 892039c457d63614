"""Payloads whose encoding BSO's data converter does not read: no `encoding` metadata, an encoding it does not
know, or `json/protobuf` (what `temporal workflow start --input-meta encoding=...`, or another SDK's client
with its own converter, sends).

1. As a workflow's start input: the SDK's "Failed decoding arguments" fails the workflow task on every retry (the
   sprint hangs, WorkflowTaskFailed events in its history), where undecodable JSON is refused in one line
   (workflows/inputs.py, bso/data_converter.py UnreadablePayload). Expected: the workflow fails, saying what.
2. As a signal's input: dropped by the SDK with a line in the worker's log only, never recorded among the
   workflow's rejected messages (as unreadable JSON is, workflows/inbound_guard.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from tests.conftest import bso_worker
from tests.workflow.helpers import (
    how_it_ended, make_project, sprint_input, start_sprint, status_values, wait_status, workflow_task_failures,
)

K1 = "1-1-login-form"
UNDECODABLE = {
    "no-encoding": Payload(metadata={}, data=b"{}"),
    "unknown-encoding": Payload(metadata={"encoding": b"text/yaml"}, data=b"project_root: /x\n"),
    "protobuf": Payload(metadata={"encoding": b"json/protobuf", "messageType": b"bso.Nope"}, data=b"{}"),
}


@pytest.mark.parametrize("name", sorted(UNDECODABLE))
async def test_an_undecodable_start_input_fails_the_sprint_not_its_task(ts_env, tmp_path: Path, name: str):
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(
            "SprintMasterWorkflow", RawValue(UNDECODABLE[name]), id=f"undecodable-{name}", task_queue=queue
        )
        failed = await how_it_ended(handle)
        failures = await workflow_task_failures(ts_env.client, handle.id)
    assert failures == [], f"{name}: {failures[:1]} (the sprint: {failed})"
    assert "invalid input" in failed, failed
    assert status_values(tmp_path) == before


async def test_a_signal_with_an_undecodable_input_is_recorded_as_rejected(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="undecodable-signal"), paused="hold")
        await wait_status(handle, lambda s: s.phase == "paused", "paused")
        await handle.signal("story_update", RawValue(UNDECODABLE["no-encoding"]))
        await handle.signal("pause", "marker: the signal after it")  # recorded as a pause reason
        status = await wait_status(handle, lambda s: s.pause_reason == "marker: the signal after it", "marker seen")
        await handle.terminate("test over")
    assert status.rejected_total == 1, f"the undecodable STORY_UPDATE left no trace: {status.rejected_messages}"
