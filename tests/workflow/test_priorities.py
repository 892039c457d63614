"""Message priority -> Temporal task priority of the agent activities a story's messages start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bso.config import resolve_config
from bso.constants import slave_workflow_id
from bso.dispatch import PRIORITY_KEYS, priority_key, story_priority
from bso.messages import MessagePriority
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input

K1 = "1-1-login-form"
K2 = "1-2-logout"
K3 = "1-3-profile-page"


def test_mapping_is_ordered_and_within_the_default_range() -> None:
    order = [MessagePriority.CRITICAL, MessagePriority.HIGH, MessagePriority.NORMAL, MessagePriority.LOW]
    keys = [PRIORITY_KEYS[p] for p in order]
    assert keys == sorted(keys) and len(set(keys)) == 4 and all(1 <= k <= 5 for k in keys)
    assert priority_key("normal") == 3  # the server's default for an unset key
    assert priority_key(None) is None
    with pytest.raises(ValueError):
        priority_key("urgent")


def test_story_priority_sources() -> None:
    cfg = resolve_config({"story_priorities": {"1-1": "critical", K2: "low"}})
    assert story_priority(K1, cfg) is MessagePriority.CRITICAL  # short key
    assert story_priority(K2, cfg) is MessagePriority.LOW  # full key
    assert story_priority(K3, cfg) is None
    assert story_priority(K3, cfg, scripted="high") is MessagePriority.HIGH  # the simulation script wins
    with pytest.raises(Exception):
        resolve_config({"story_priorities": {"1-1": "urgent"}})


async def _scheduled_priorities(client, session_id: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    handle = client.get_workflow_handle(slave_workflow_id(session_id, 1))
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "run_agent":
                story = json.loads(attrs.input.payloads[0].data)["story_key"]
                out.setdefault(story, set()).add(attrs.priority.priority_key)
    return out


async def _run(env, tmp_path: Path) -> dict[str, set[int]]:
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"})
    inp = sprint_input(
        tmp_path,
        simulation={"stories": {"1-1": {"priority": "critical"}}},
        config_overrides={"story_priorities": {"1-2": "low"}},
    )
    async with bso_worker(env.client) as queue:
        report = await run_sprint(env.client, queue, inp)
    assert set(report.stories.values()) == {"done"}
    return await _scheduled_priorities(env.client, report.session_id)


async def test_priorities_reach_the_scheduled_activities(ts_env, tmp_path: Path):
    seen = await _run(ts_env, tmp_path)
    assert seen == {K1: {1}, K2: {4}, K3: {0}}  # 0: no priority set, the default applies


@pytest.mark.e2e
async def test_priorities_on_the_dev_server(local_env, tmp_path: Path):
    seen = await _run(local_env, tmp_path)
    assert seen == {K1: {1}, K2: {4}, K3: {0}}


async def test_a_debug_request_runs_at_its_storys_priority(ts_env, tmp_path: Path):
    """The debugger's analysis activity takes the priority of the story whose failure it analyses."""
    from bso.roster import resident_workflow_id

    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    failing = {"fail": {"dev": "error"}, "debug": ["fixable"]}
    inp = sprint_input(
        tmp_path, session_id="prio-debug",
        simulation={"stories": {"1-1": {**failing, "priority": "critical"}, "1-2": failing}},
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert set(report.stories.values()) == {"done"}
    seen: dict[str, int] = {}
    debugger = ts_env.client.get_workflow_handle(resident_workflow_id("prio-debug", "debugger"))
    async for event in debugger.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "analyze_failure":
                story = json.loads(attrs.input.payloads[0].data)["request"]["story_key"]
                seen[story] = attrs.priority.priority_key
    assert seen == {K1: 1, K2: 0}  # critical; no priority: the default applies
