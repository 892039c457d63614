"""The history -> message flow mapping, over the recorded example sprint (tests/histories/)."""

from __future__ import annotations

import collections
from datetime import datetime
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from bso.message_flow import (
    MESSAGE_TYPES,
    FlowMessage,
    agent_performance,
    export_paths,
    filter_messages,
    message_flow,
)

HISTORIES = Path(__file__).resolve().parent.parent / "histories"


@pytest.fixture(scope="module")
def histories() -> list[WorkflowHistory]:
    return [
        WorkflowHistory.from_json(p.stem.replace("--", "/"), p.read_text())
        for p in sorted(HISTORIES.glob("example-sprint*.json"))
    ]


@pytest.fixture(scope="module")
def flow(histories):
    return message_flow(histories)


def test_every_message_type_is_known_and_time_ordered(flow):
    assert flow, "the example sprint has messages"
    assert {m.type for m in flow} <= set(MESSAGE_TYPES)
    assert [m.time for m in flow] == sorted(m.time for m in flow)


def test_the_sprint_starts_plans_and_reports(flow):
    types = [m.type for m in flow]
    assert types[0] == "SPRINT_START"
    assert types[-1] == "SPRINT_REPORT"
    plan = next(m for m in flow if m.type == "BATCH_PLAN_READY")
    assert [b["stories"] for b in plan.payload["batches"]] == [
        ["1-2-pantry-item-model-and-storage", "1-3-add-and-list-items-api", "2-1-expiry-date-tracking"],
        ["2-2-expiry-reminder-emails", "2-2a-reminder-digest-settings"],
    ]
    report = flow[-1]
    assert report.sender == "sprint-master" and report.recipient == "operator"
    assert report.payload["status"] == "sprint-partial"
    completes = [m for m in flow if m.type == "SLAVE_BATCH_COMPLETE"]
    assert [(m.sender, m.batch_id) for m in completes] == [("slave-batch-1", 1), ("slave-batch-2", 2)]
    assert completes[1].payload["stories_failed"] == ["2-2-expiry-reminder-emails"]


def test_each_assignment_is_answered_by_its_agent(flow):
    assignments = {m.dispatch_id: m for m in flow if m.type == "TASK_ASSIGNMENT"}
    answers = {m.dispatch_id: m for m in flow if m.type == "AGENT_COMPLETE"}
    assert assignments and set(assignments) == set(answers)
    for dispatch_id, assignment in assignments.items():
        answer = answers[dispatch_id]
        assert assignment.recipient == answer.sender == assignment.agent
        assert assignment.sender == answer.recipient == f"slave-batch-{assignment.batch_id}"
        assert assignment.story == answer.story
        assert answer.time >= assignment.time


def test_status_writes_follow_the_story_through_its_states(flow):
    writes = [m for m in flow if m.type == "STATUS_WRITE" and m.story == "1-3-add-and-list-items-api"]
    steps = [(m.payload["expected"], m.payload["new"]) for m in writes]
    assert steps[0] == ("backlog", "story-doc-review")
    assert steps[-1][1] == "done"
    assert all(m.payload["outcome"] == "written" for m in writes)
    assert all(a[1] == b[0] for a, b in zip(steps, steps[1:]))


def test_filters(flow):
    story = filter_messages(flow, story="2-2")
    assert story and {m.story for m in story} == {"2-2-expiry-reminder-emails"}  # 2-2a is another story
    dev = filter_messages(flow, agent="dev-runner", types=["task_assignment"])
    assert dev and all(m.type == "TASK_ASSIGNMENT" and m.agent == "dev-runner" for m in dev)
    failed = filter_messages(flow, story="2-2-expiry-reminder-emails", types=["AGENT_COMPLETE"])
    assert any(m.payload.get("status") == "failure" for m in failed)


def test_export_paths_follow_the_agent_po_layout(flow):
    paths = [p for p, _ in export_paths(flow)]
    assert len(paths) == len(set(paths)) == len(flow)
    assert "operator/SPRINT_START_001.json" in paths
    assert "dev-runner/TASK_ASSIGNMENT_001.json" in paths
    count = collections.Counter(m.type for m in flow if m.agent == "dev-runner")
    assert f"dev-runner/AGENT_COMPLETE_{count['AGENT_COMPLETE']:03d}.json" in paths


def test_agent_performance(flow):
    stats = {s.agent: s for s in agent_performance(flow)}
    assert set(stats) == {"story-creator", "story-reviewer", "dev-runner", "review-runner"}
    assert sum(s.dispatches for s in stats.values()) == sum(m.type == "TASK_ASSIGNMENT" for m in flow)
    assert stats["dev-runner"].failures == 1  # 2-2's scripted dev error
    assert sum(s.tokens for s in stats.values()) == flow[-1].payload["tokens_used"]


def test_a_refused_signal_s_fields_are_shown_as_they_came():
    """What a sender signalled reaches history even when the workflow refused it: the flow shows it as text."""
    message = FlowMessage(
        time=datetime(2026, 1, 5), workflow_id="s", event_id=7, type="STORY_UPDATE", sender="slave-batch-1",
        recipient="sprint-master", story=42, agent={"a": 1}, batch_id="one", dispatch_id=True, payload=[1, 2],
    )
    assert (message.story, message.agent, message.dispatch_id) == ("42", '{"a": 1}', "true")
    assert message.batch_id is None and message.payload == {"value": [1, 2]}


def test_the_debug_exchange_and_resident_answers_name_their_parties(flow):
    """The Slave asks the debugger and gets its answer; senders are roles, never workflow ids."""
    (request,) = [m for m in flow if m.type == "DEBUG_REQUEST"]
    (result,) = [m for m in flow if m.type == "DEBUG_RESULT"]
    assert (request.sender, request.recipient) == ("slave-batch-2", "debugger")
    assert (result.sender, result.recipient) == ("debugger", "slave-batch-2")
    assert request.story == result.story == "2-2-expiry-reminder-emails"
    assert result.payload["debug_id"] == request.payload["debug_id"] and result.detail.startswith(result.payload["debug_id"])
    assert result.time > request.time
    (plan,) = [m for m in flow if m.type == "PLAN_RESULT"]
    assert (plan.sender, plan.recipient) == ("scrum-master", "sprint-master")
    for m in flow:
        assert "/" not in m.sender, m
        assert "\n" not in m.detail and len(m.detail) <= 200, m
