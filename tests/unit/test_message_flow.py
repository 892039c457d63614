"""The history -> message flow mapping, over the recorded example sprint (tests/histories/)."""

from __future__ import annotations

import collections
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import ActivityType, Payloads, WorkflowExecution, WorkflowType
from temporalio.api.enums.v1 import EventType, SignalExternalWorkflowExecutionFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.update.v1 import Input, Meta, Outcome, Request
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter

from bso.dependencies import PATCH_DEPENDENCY_UPDATE_CHECKED
from bso.dispatch import SLAVE_PATCH_ROLLUP, SLAVE_PATCH_ROLLUP_2
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


def test_a_dispatch_without_an_answer_is_counted_as_such():
    """A review that timed out counted as neither answered nor failed: the dispatches did not add up."""

    def message(event_id: int, kind: str, dispatch: str, **payload) -> FlowMessage:
        return FlowMessage(
            time=datetime(2026, 1, 5, 0, 0, event_id), workflow_id="s/batch-1", event_id=event_id, type=kind,
            sender="x", recipient="y", agent="review-runner", dispatch_id=dispatch, payload=payload,
        )

    flow = [
        message(1, "TASK_ASSIGNMENT", "d1"),
        message(2, "AGENT_COMPLETE", "d1", status="success", tokens_used=5),
        message(3, "TASK_ASSIGNMENT", "d2"),  # never answered: its activity timed out
    ]
    (stats,) = agent_performance(flow)
    assert (stats.dispatches, stats.answered, stats.failures, stats.unanswered) == (2, 1, 0, 1)
    # An answer naming another agent type counts for the agent its dispatch went to.
    wrong = message(4, "AGENT_COMPLETE", "d2", status="success", tokens_used=7).model_copy(update={"agent": "dev-runner"})
    (stats,) = agent_performance([*flow, wrong])
    assert (stats.agent, stats.answered, stats.unanswered, stats.tokens) == ("review-runner", 2, 0, 12)


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


# --- hand-made histories: what a recipient rejected, and the plan as planned ----------------------------

_T0 = datetime(2026, 1, 5, 9, 0, 0)


def _payloads(*values):
    return Payloads(payloads=DataConverter.default.payload_converter.to_payloads(list(values)))


class _History:
    """A workflow history built event by event (ids and times in order)."""

    def __init__(self, workflow_id: str, workflow_type: str, inp=None) -> None:
        self.workflow_id = workflow_id
        self.events: list[HistoryEvent] = []
        self.add(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, "workflow_execution_started_event_attributes",
                 workflow_type=WorkflowType(name=workflow_type), input=_payloads(inp or {}))

    def add(self, event_type, attrs_field: str | None = None, **attrs) -> int:
        event = HistoryEvent(event_id=len(self.events) + 1, event_type=event_type)
        event.event_time.FromDatetime(_T0 + timedelta(milliseconds=10 * len(self.events)))
        if attrs_field:
            getattr(event, attrs_field).CopyFrom(type(getattr(event, attrs_field))(**attrs))
        self.events.append(event)
        return event.event_id

    def task(self) -> None:
        """A whole workflow task: what came before it is what its activation saw."""
        for et in (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                   EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED):
            self.add(et)

    def signal(self, name: str, value) -> int:
        return self.add(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "workflow_execution_signaled_event_attributes",
                        signal_name=name, input=_payloads(value))

    def dispatch(
        self, dispatch_id: str, story: str, agent: str = "story-reviewer", mode: str = "review", **extra
    ) -> int:
        return self.add(
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, "activity_task_scheduled_event_attributes",
            activity_id=dispatch_id, activity_type=ActivityType(name="run_agent"),
            input=_payloads({"dispatch_id": dispatch_id, "story_key": story, "agent_type": agent, "mode": mode, **extra}),
        )

    def activity_completed(self, scheduled: int, result) -> int:
        return self.add(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, "activity_task_completed_event_attributes",
                        scheduled_event_id=scheduled, result=_payloads(result))

    def history(self) -> WorkflowHistory:
        return WorkflowHistory(self.workflow_id, self.events)


def _answer(dispatch_id: str, story: str = "1-1", **extra) -> dict:
    return {"dispatch_id": dispatch_id, "story_key": story, "agent_type": "story-reviewer", "mode": "review",
            "status": "success", "verdict": "passed", "tokens_used": 10, **extra}


def test_answers_the_slave_rejected_are_marked_with_its_reason():
    """The Slave's rule (check_agent_complete) applied to its history: unknown, mismatched, malformed and
    repeated answers are marked rejected with the reason the Slave recorded; the accepted one is not."""
    h = _History("s/batch-1", "SprintSlaveWorkflow")
    h.task()
    h.dispatch("d-1", "1-1-login-form")
    h.signal("agent_complete", _answer("d-9"))  # no such dispatch
    h.signal("agent_complete", _answer("d-1", story="2-1"))  # another story's key
    h.signal("agent_complete", {"dispatch_id": "d-1", "status": "great"})  # malformed
    h.signal("agent_complete", "not even an object")
    h.signal("agent_complete", _answer("d-1"))  # the answer
    h.signal("agent_complete", _answer("d-1"))  # delivered twice
    h.task()
    answers = [m for m in message_flow([h.history()]) if m.type == "AGENT_COMPLETE"]
    reasons = [m.rejected for m in answers]
    assert reasons[0] == "unknown dispatch id 'd-9'; open: d-1"
    assert reasons[1] == "story_key '2-1' does not match dispatch (1-1-login-form)"
    assert reasons[2].startswith("validation_failed: ") and "status: invalid value: great" in reasons[2]
    assert reasons[3] == "validation_failed: (message): must be an object"
    assert reasons[4:] == [None, "already answered"]
    assert answers[0].sender == "story-reviewer" and answers[0].recipient == "slave-batch-1"
    assert answers[0].detail.startswith("REJECTED (unknown dispatch id 'd-9'; open: d-1): success, verdict passed")
    assert answers[4].detail == "success, verdict passed, 10 tokens"
    # A rejected answer was never acted on: not an answer in the agents' performance.
    assert [(s.agent, s.answered) for s in agent_performance(answers)] == [("story-reviewer", 1)]


def test_the_slave_reads_signals_before_an_answer_returned_in_the_same_task():
    """Within one workflow task the Slave runs the signals first: a signalled answer wins over the
    activity's returned one (never read), and a returned answer that is rejected leaves the dispatch open."""
    h = _History("s/batch-2", "SprintSlaveWorkflow")
    h.task()
    d1 = h.dispatch("d-1", "1-1-login-form")
    h.activity_completed(d1, {"dispatch_id": "d-1", "delivered": True, "answer": _answer("d-1", summary="result")})
    h.signal("agent_complete", _answer("d-1", summary="signal"))
    h.task()
    d2 = h.dispatch("d-2", "1-1-login-form")
    h.activity_completed(d2, {"dispatch_id": "d-2", "delivered": True, "answer": _answer("d-2", status="bogus")})
    h.task()
    h.signal("agent_complete", _answer("d-2"))  # still open: the Slave waits out the agent's time for it
    h.task()
    answers = [(m.payload.get("summary"), m.dispatch_id, m.rejected) for m in message_flow([h.history()])
               if m.type == "AGENT_COMPLETE"]
    assert answers[0] == ("result", "d-1", "not read: the dispatch was answered")
    assert answers[1] == ("signal", "d-1", None)
    assert answers[2][1] == "d-2" and answers[2][2].startswith("validation_failed: status")
    assert answers[3] == (None, "d-2", None)


def test_an_answer_after_the_agents_deadline_is_rejected():
    """An external agent's dispatch closes when its deadline timer fires: a later answer is unknown."""

    def after_the_deadline() -> _History:
        """d-1 dispatched to an external agent, and its deadline timer fired."""
        h = _History("s/batch-1", "SprintSlaveWorkflow")
        h.task()
        d1 = h.dispatch("d-1", "1-1-login-form")
        h.activity_completed(d1, {"dispatch_id": "d-1", "delivered": True})
        h.task()
        h.add(EventType.EVENT_TYPE_TIMER_STARTED, "timer_started_event_attributes", timer_id="7")
        h.add(EventType.EVENT_TYPE_TIMER_FIRED, "timer_fired_event_attributes", timer_id="7")
        return h

    def answers(h: _History) -> list[str | None]:
        return [m.rejected for m in message_flow([h.history()]) if m.type == "AGENT_COMPLETE"]

    h = after_the_deadline()
    h.signal("agent_complete", _answer("d-1"))  # in the same task as the timer: signals come first
    h.task()
    h.signal("agent_complete", _answer("d-1"))
    h.task()
    assert answers(h) == [None, "already answered"]
    late = after_the_deadline()
    late.task()
    late.signal("agent_complete", _answer("d-1"))
    late.task()
    assert answers(late) == ["unknown dispatch id 'd-1'; none open"]


def test_an_agent_error_is_the_failure_of_the_dispatch_it_names():
    h = _History("s/batch-1", "SprintSlaveWorkflow")
    h.task()
    h.dispatch("d-1", "1-1-login-form", agent="dev-runner", mode="dev")
    error = {"message_id": "msg_err001", "message_type": "agent_error", "from_agent": "dev", "to_agent": "moderator",
             "timestamp": "2024-10-15T10:35:00", "payload": {"error_type": "crash", "error_message": "boom"}}
    h.signal("agent_complete", {**error, "payload": {**error["payload"], "task_id": "d-7"}})
    h.signal("agent_complete", {**error, "payload": {**error["payload"], "task_id": "d-1"}})
    h.task()
    failures = [m for m in message_flow([h.history()]) if m.type == "AGENT_FAILURE"]
    assert [(m.dispatch_id, m.rejected) for m in failures] == [("d-7", "task_id names no open dispatch"), ("d-1", None)]
    assert failures[1].sender == "dev-runner" and failures[1].detail == "agent_error crash: boom"


def test_signals_the_master_and_residents_rejected_are_marked():
    master = _History("m", "SprintMasterWorkflow", {"project_root": "/p"})
    master.task()
    master.signal("story_update", {"batch_id": 1, "story_key": "1-1-login-form"})  # no view
    master.signal("story_updates", {"updates": "all of them"})
    master.signal("resume", {"token_limit": -5})
    master.signal("resume", None)
    master.signal("plan_result", {"request_id": "plan-1"})  # no planner
    master.task()
    resident = _History("m/resident-debugger", "ResidentWorkflow")
    resident.signal("debug_request", {"debug_id": "DBG-1", "story_key": "1-1"})  # no report_to
    flow = message_flow([master.history(), resident.history()])
    rejected = [(m.type, m.rejected) for m in sorted(flow, key=lambda m: (m.workflow_id, m.event_id))
                if m.type != "SPRINT_START"]
    assert rejected == [
        ("STORY_UPDATE", "validation_failed: view: required field missing"),
        ("STORY_UPDATE", "expected an object with a list of updates"),
        ("RESUME", "validation_failed: token_limit: Input should be greater than 0"),
        ("RESUME", None),
        ("PLAN_RESULT", "validation_failed: planner: required field missing"),
        ("DEBUG_REQUEST", "validation_failed: report_to: required field missing"),
    ]
    assert all(m.detail.startswith("REJECTED (") and len(m.detail) <= 200 for m in flow if m.rejected)


def test_the_plan_is_shown_as_planned_while_the_sprint_runs(histories, flow):
    """BATCH_PLAN_READY shows the planner's plan: the same with only the first batch started as at the end."""
    master = next(h for h in histories if h.workflow_id == "example-sprint")
    first_child = next(i for i, e in enumerate(master.events)
                       if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
                       and e.start_child_workflow_execution_initiated_event_attributes.workflow_type.name
                       == "SprintSlaveWorkflow")
    running = message_flow([WorkflowHistory(master.workflow_id, master.events[: first_child + 1])])
    (during,) = [m for m in running if m.type == "BATCH_PLAN_READY"]
    (after,) = [m for m in flow if m.type == "BATCH_PLAN_READY"]
    assert during.detail == after.detail and during.detail.startswith("2 batches: 1: 1-2-pantry-item-model")
    assert during.payload["batches"] == after.payload["batches"]
    assert (during.payload["source"], after.payload["source"]) == ("answer", "report")


def test_plan_result_is_one_readable_line(flow):
    (plan,) = [m for m in flow if m.type == "PLAN_RESULT"]
    assert plan.detail == "plan-1 by scrum-master: 2 batches: [1-2, 1-3, 2-1] [2-2, 2-2a]"
    assert plan.rejected is None and plan.payload["plan"]["batches"]


def test_the_fallback_plan_is_the_masters_answer_to_its_own_request():
    """The scrum-master did not answer: the plan is the Master's fallback for the request it sent."""
    stories = [{"key": k, "state": "backlog", "epic": "epic-1", "short_key": k[:3], "story_path": f"{k}.md"}
               for k in ("1-1-a", "1-2-b", "1-3-c")]
    master = _History("m", "SprintMasterWorkflow", {"project_root": "/p"})
    master.task()
    master.add(
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        "signal_external_workflow_execution_initiated_event_attributes",
        signal_name="plan_request",
        input=_payloads({"request_id": "plan-1", "session_id": "m", "report_to": "m", "stories": stories,
                         "batch_size": 2}),
    )
    master.task()
    master.add(EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
               "upsert_workflow_search_attributes_event_attributes")
    master.events[-1].upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields[
        "BsoPhase"].CopyFrom(_payloads("running").payloads[0])
    (plan,) = [m for m in message_flow([master.history()]) if m.type == "BATCH_PLAN_READY"]
    assert plan.payload["source"] == "fallback"
    assert plan.detail == "2 batches: 1: 1-1-a, 1-2-b; 2: 1-3-c"


def test_a_long_text_cut_for_the_table_ends_in_an_ellipsis():
    """A detail cut to fit says so (it read `... error in 2-2-expiry-reminder-ema` as if whole); the payload keeps
    all of it."""
    resident = _History("m/resident-debugger", "ResidentWorkflow")
    summary = "worker crashed with a very long error in 2-2-expiry-reminder-emails " * 4
    resident.signal("debug_request", {"debug_id": "DBG-1", "story_key": "2-2", "report_to": "m/batch-1",
                                      "error_summary": summary})
    (request,) = message_flow([resident.history()])
    assert len(request.detail) == 120 and request.detail.endswith("..."), request.detail
    assert request.payload["error_summary"] == summary


@pytest.mark.parametrize("marker", ["slave-answer-matches-dispatch", SLAVE_PATCH_ROLLUP, SLAVE_PATCH_ROLLUP_2, None])
def test_an_answer_naming_another_agent_is_rejected_where_the_slave_applied_that_rule(marker):
    """A reviewer's answer to a dev dispatch: refused by a Slave with the slave-answer-matches-dispatch patch
    (its history has the marker), accepted by one from before it; `bso messages` says what that Slave did."""
    h = _History("s/batch-1", "SprintSlaveWorkflow")
    h.task()
    h.dispatch("d-1", "1-1-login-form", agent="dev-runner", mode="dev")
    h.signal("agent_complete", _answer("d-1", story="1-1-login-form"))  # a story-reviewer's answer
    h.task()
    patched = marker is not None  # the patch's own marker, or the rollup's (workflows/patches.py)
    if patched:
        h.add(EventType.EVENT_TYPE_MARKER_RECORDED, "marker_recorded_event_attributes", marker_name="core_patch",
              details={"patch-data": _payloads({"id": marker, "deprecated": False})})
    (answer,) = [m for m in message_flow([h.history()]) if m.type == "AGENT_COMPLETE"]
    expected = "agent_type/mode story-reviewer/review does not match dispatch (dev-runner/dev)" if patched else None
    assert answer.rejected == expected, answer


@pytest.mark.parametrize("marker", ["slave-answer-tokens-bounded", SLAVE_PATCH_ROLLUP, SLAVE_PATCH_ROLLUP_2, None])
def test_an_answer_claiming_implausible_tokens_is_rejected_where_the_slave_applied_that_rule(marker):
    """An answer claiming 10^30 tokens: refused by a Slave with the slave-answer-tokens-bounded patch (the next,
    believable answer is the one taken), accepted by one from before it, as `bso messages` shows."""
    h = _History("s/batch-1", "SprintSlaveWorkflow")
    h.task()
    h.dispatch("d-1", "1-1-login-form", agent="story-reviewer", mode="review")
    h.signal("agent_complete", _answer("d-1", tokens_used=10**30))
    h.signal("agent_complete", _answer("d-1"))
    h.task()
    patched = marker is not None  # the patch's own marker, or the rollup's (workflows/patches.py)
    if patched:
        h.add(EventType.EVENT_TYPE_MARKER_RECORDED, "marker_recorded_event_attributes", marker_name="core_patch",
              details={"patch-data": _payloads({"id": marker, "deprecated": False})})
    garbled, believable = [m.rejected for m in message_flow([h.history()]) if m.type == "AGENT_COMPLETE"]
    if patched:
        assert garbled == f"tokens_used {10**30} is more than any agent run uses (at most 1,000,000,000)"
        assert believable is None
    else:
        assert (garbled, believable) == (None, "already answered")


# --- what the Master tells a Slave besides its batch, and the residents' research and browser answers -------


@pytest.mark.parametrize("checked", [False, True], ids=["before-the-check", "checked"])
def test_the_masters_dependency_updates_and_decisions_reach_the_slave(checked: bool):
    """`--type DEPENDENCY_UPDATE` / `--type DECISION` found nothing: the Slave's history shows both, from the
    Master; a payload the Slave's handler refuses is marked with its reason, and never breaks the flow. A
    Slave that checks the stories an update names (its marker, recorded when it refused one) refused one naming
    stories none of its own depends on; one from before took it."""
    story = {"key": "2-1-signup", "epic": "2", "short_key": "2-1", "state": "review", "story_path": "2-1.md",
             "depends_on": ["1-1-login", "1-2-logout"]}
    h = _History("s/batch-2", "SprintSlaveWorkflow", {"batch_id": 2, "stories": [story]})
    h.task()
    h.signal("dependency_update", {"1-1-login": "done", "1-2-logout": "unfinished:needs-intervention"})
    h.signal("dependency_update", {f"9-{n}-a-rather-long-story-key": "done" for n in range(20)})
    if checked:
        h.add(EventType.EVENT_TYPE_MARKER_RECORDED, "marker_recorded_event_attributes", marker_name="core_patch",
              details={"patch-data": _payloads({"id": PATCH_DEPENDENCY_UPDATE_CHECKED, "deprecated": False})})
    h.signal("dependency_update", {"1-1-login": 5})
    h.signal("dependency_update", ["1-1-login", "done"])
    h.signal("decision", {"story_key": "2-1-signup", "decision": "force_pass", "note": "good enough"})
    h.signal("decision", {"story_key": "2-1-signup", "decision": "rearm", "state": "review"})
    h.signal("decision", {"story_key": "2-1-signup", "decision": "maybe"})
    h.signal("decision", "force_pass")
    h.task()
    flow = message_flow([h.history()])
    assert {m.type for m in flow} <= set(MESSAGE_TYPES)
    assert all((m.sender, m.recipient, m.batch_id) == ("sprint-master", "slave-batch-2", 2) for m in flow)
    deps = filter_messages(flow, types=["dependency_update"])
    assert [m.detail for m in deps[:1]] == ["1-1-login: done, 1-2-logout: unfinished:needs-intervention"]
    assert len(deps[1].detail) == (200 if checked else 160) and deps[1].detail.endswith("...") and len(deps[1].payload) == 20
    unknown = (
        "ignored for stories no story of this batch depends on: 9-0-a-rather-long-story-key, 9-1-a-rather-long-story-key, "
        "9-10-a-rather-long-story-key, 9-11-a-rather-long-story-key, 9-12-a-rather-long-story-key and 15 more "
        "(it depends on: 1-1-login, 1-2-logout)"
    )
    assert [m.rejected for m in deps] == [None, unknown if checked else None, *["expected an object of story key: state"] * 2]
    assert deps[2].payload == {"1-1-login": 5} and deps[3].payload == {"value": ["1-1-login", "done"]}
    decisions = filter_messages(flow, story="2-1", types=["DECISION"])
    assert [(m.story, m.detail) for m in decisions[:1]] == [("2-1-signup", "force_pass")]
    assert decisions[0].rejected is None and decisions[0].payload["note"] == "good enough"
    assert decisions[1].rejected.startswith("decision 'rearm' does not answer a waiting story")  # the Slave's rule
    assert decisions[1].detail.endswith("): rearm -> review")
    assert decisions[2].rejected.startswith("decision: Input should be 'force_pass'")
    (malformed,) = [m for m in flow if m.type == "DECISION" and m.story is None]
    assert malformed.rejected.startswith("(root): ") and malformed.payload == {"value": "force_pass"}
    assert all(m.detail.startswith("REJECTED (") and len(m.detail) <= 200 for m in flow if m.rejected)


def _update(h: _History, name: str, value) -> int:
    """An update the resident's validator accepted."""
    return h.add(
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "workflow_execution_update_accepted_event_attributes",
        protocol_instance_id=f"u-{len(h.events)}",
        accepted_request=Request(meta=Meta(update_id=f"u-{len(h.events)}"), input=Input(name=name, args=_payloads(value))),
    )


def _update_done(h: _History, accepted: int, result=None, failure: str | None = None) -> int:
    outcome = Outcome(failure=Failure(message=failure)) if failure else Outcome(success=_payloads(result))
    return h.add(
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED, "workflow_execution_update_completed_event_attributes",
        accepted_event_id=accepted, outcome=outcome,
    )


def _answer_signal(h: _History, signal: str, to: str, value) -> int:
    return h.add(
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        "signal_external_workflow_execution_initiated_event_attributes",
        signal_name=signal, workflow_execution=WorkflowExecution(workflow_id=to), input=_payloads(value),
    )


def test_residents_research_and_browser_answers_are_shown():
    """RESEARCH_RESULT and BROWSER_RESULT never appeared: a signalled request's answer (signalled to its report_to,
    in the resident's history) and an update's (its completion) go from the resident to whoever asked."""
    researcher = _History("m/resident-knowledge-researcher", "ResidentWorkflow")
    researcher.signal("research_request", {"request_id": "rs-1", "story_key": "1-1-login", "query": "how  do\nsessions expire?",
                                           "report_to": "m/batch-1"})
    researcher.task()
    answer = {"request_id": "rs-1", "story_key": "1-1-login", "query": "how do sessions expire?", "status": "answered",
              "answer": "after 30 minutes " * 20}
    lost = _answer_signal(researcher, "research_result", "m/batch-1", answer)
    researcher.add(EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED,
                   "signal_external_workflow_execution_failed_event_attributes", initiated_event_id=lost,
                   cause=SignalExternalWorkflowExecutionFailedCause.SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED_CAUSE_EXTERNAL_WORKFLOW_EXECUTION_NOT_FOUND)
    _answer_signal(researcher, "research_result", "m/batch-1", answer)  # delivered on the second try
    _answer_signal(researcher, "debug_result", "m/batch-1", {"debug_id": "DBG-1"})  # shown from the Slave's history
    asked = _update(researcher, "research", {"request_id": "rs-2", "story_key": "1-2-logout", "query": "csrf?",
                                             "agent_type": "dev-runner"})
    _update_done(researcher, asked, {**answer, "request_id": "rs-2", "story_key": "1-2-logout", "status": "cached",
                                     "answer": "use the token"})
    browser = _History("m/resident-e2e-live", "ResidentWorkflow")
    asked = _update(browser, "browse", {"request_id": "br-1", "operation": "navigate", "url": "/login"})
    _update_done(browser, asked, {"request_id": "br-1", "status": "success", "result_data": {"title": "Login"}})
    asked = _update(browser, "browse", {"request_id": "br-2", "operation": "click", "selector": "#go"})
    _update_done(browser, asked, failure="the e2e-live resident is stopping")
    _answer_signal(browser, "browser_result", "m/batch-3", {"request_id": "br-3", "status": "browser_error",
                                                            "error": "no url, and no e2e_live_base_url configured"})
    flow = message_flow([researcher.history(), browser.history()])
    assert {m.type for m in flow} <= set(MESSAGE_TYPES)
    research = [(m.type, m.sender, m.recipient, m.story) for m in flow if m.workflow_id.endswith("researcher")]
    assert research == [
        ("RESEARCH_REQUEST", "slave-batch-1", "knowledge-researcher", "1-1-login"),
        ("RESEARCH_RESULT", "knowledge-researcher", "slave-batch-1", "1-1-login"),
        ("RESEARCH_RESULT", "knowledge-researcher", "slave-batch-1", "1-1-login"),
        ("RESEARCH_REQUEST", "dev-runner", "knowledge-researcher", "1-2-logout"),
        ("RESEARCH_RESULT", "knowledge-researcher", "dev-runner", "1-2-logout"),
    ]
    results = filter_messages(flow, types=["RESEARCH_RESULT"])
    assert results[1].detail.startswith("rs-1: answered: after 30 minutes after") and results[1].detail.endswith("...")
    assert results[0].detail.endswith("... (not delivered: external workflow execution not found)")
    assert results[1].payload == answer and results[2].detail == "rs-2: cached: use the token"
    assert filter_messages(flow, types=["RESEARCH_REQUEST"])[0].detail == "rs-1: how do sessions expire?"
    browsed = [(m.type, m.sender, m.recipient, m.detail) for m in flow if m.workflow_id.endswith("e2e-live")]
    assert browsed == [
        ("BROWSER_REQUEST", "agent", "e2e-live", "br-1: navigate /login"),
        ("BROWSER_RESULT", "e2e-live", "agent", 'br-1: success: {"title": "Login"}'),
        ("BROWSER_REQUEST", "agent", "e2e-live", "br-2: click"),
        ("BROWSER_RESULT", "e2e-live", "agent", "failed: the e2e-live resident is stopping"),
        ("BROWSER_RESULT", "e2e-live", "slave-batch-3", "br-3: browser_error: no url, and no e2e_live_base_url configured"),
    ]
    for m in flow:
        assert "/" not in m.sender and "/" not in m.recipient, m
        assert "\n" not in m.detail and len(m.detail) <= 200, m


def test_a_po_phase_and_a_review_score_are_in_the_detail():
    """The Agent-PO plan and implementation of one dev dispatch read alike ("dev round 1"), and a scored
    review's answer did not show its score."""
    h = _History("s/batch-1", "SprintSlaveWorkflow")
    h.task()
    h.dispatch("d-1", "1-1-login-form", agent="dev-runner", mode="dev", po={"phase": "plan", "attempt": 1})
    h.dispatch("d-2", "1-2-logout")
    h.signal("agent_complete", _answer("d-2", story="1-2", score=72))
    h.task()
    messages = message_flow([h.history()])
    plan = next(m for m in messages if m.type == "TASK_ASSIGNMENT" and m.dispatch_id == "d-1")
    assert plan.detail == "dev round 1, PO phase plan", plan.detail
    answer = next(m for m in messages if m.type == "AGENT_COMPLETE")
    assert answer.detail == "success, verdict passed, score 72, 10 tokens", answer.detail


def test_a_plan_request_says_what_it_asks():
    """PLAN_REQUEST's detail was empty: the request id, how many stories, the batch size (and a re-plan)."""
    sm = _History("m/resident-scrum-master", "ResidentWorkflow")
    stories = [{"key": f"1-{i}-s", "epic": "epic-1", "short_key": f"1-{i}", "state": "backlog", "story_path": ""} for i in (1, 2, 3)]
    sm.signal("plan_request", {"request_id": "plan-1", "session_id": "m", "report_to": "m", "stories": stories, "batch_size": 2})
    sm.signal("plan_request", {"request_id": "plan-2", "session_id": "m", "report_to": "m", "stories": stories[:1],
                               "batch_size": 2, "course_correction": {"reason": "user_request"}})
    details = [m.detail for m in message_flow([sm.history()]) if m.type == "PLAN_REQUEST"]
    assert details[0] == "plan-1: 3 stories, batch_size 2", details
    assert details[1] == "plan-2: 1 story, batch_size 2 (course correction)", details


def test_a_debug_request_that_was_not_delivered_is_listed():
    """A Slave's DEBUG_REQUEST to a debugger that was gone appeared nowhere (they are read from the debugger's
    history): it is listed from the Slave's, saying it was not delivered; a delivered one is not listed twice."""
    slave = _History("m/batch-1", "SprintSlaveWorkflow")
    slave.task()
    request = {"debug_id": "DBG-1", "story_key": "1-1-login", "error_summary": "boom\n at line 3", "report_to": "m/batch-1"}
    lost = _answer_signal(slave, "debug_request", "m/resident-debugger", request)
    slave.add(EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED,
              "signal_external_workflow_execution_failed_event_attributes", initiated_event_id=lost,
              cause=SignalExternalWorkflowExecutionFailedCause.SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED_CAUSE_EXTERNAL_WORKFLOW_EXECUTION_NOT_FOUND)
    _answer_signal(slave, "debug_request", "m/resident-debugger", {**request, "debug_id": "DBG-2"})  # delivered
    flow = [m for m in message_flow([slave.history()]) if m.type == "DEBUG_REQUEST"]
    assert [(m.sender, m.recipient, m.story) for m in flow] == [("slave-batch-1", "debugger", "1-1-login")], flow
    assert flow[0].detail == "DBG-1: not delivered: external workflow execution not found: boom at line 3", flow[0].detail


def test_a_rejected_answer_whose_findings_are_no_list_is_not_counted_by_their_length() -> None:
    """`"findings": "none"` (rejected) was listed as `4 findings`: the length of the string."""
    from bso.message_flow import _agent_complete

    assert _agent_complete({"status": "success", "findings": "none"}, "slave")["detail"] == "success, 0 tokens"
    assert _agent_complete({"status": "success", "findings": [{}, {}]}, "slave")["detail"] == (
        "success, 2 findings, 0 tokens"
    )
