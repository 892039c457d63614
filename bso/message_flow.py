"""A sprint's message flow, read from the workflow histories of its Master and Slaves (the Gear 2
view_message_flow idea): who sent what to whom, when, with the key detail.

Pure: it maps `temporalio.client.WorkflowHistory` objects (fetched by the CLI or loaded from JSON) to
`FlowMessage`s; no client, no I/O. Used by `bso messages`, the execution summary's Agent Performance
section and its tests (over the recorded histories in tests/histories/).
"""

from __future__ import annotations

import hashlib

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType, SignalExternalWorkflowExecutionFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bso.browser import BrowserRequest
from bso.constants import (
    SIGNAL_AGENT_COMPLETE,
    SIGNAL_BROWSER_REQUEST,
    SIGNAL_BROWSER_RESULT,
    SIGNAL_DEBUG_REQUEST,
    SIGNAL_DEBUG_RESULT,
    SIGNAL_DECISION,
    SIGNAL_DEPENDENCY_UPDATE,
    SIGNAL_PAUSE,
    SIGNAL_PLAN_REQUEST,
    SIGNAL_PLAN_RESULT,
    SIGNAL_RESEARCH_REQUEST,
    SIGNAL_RESEARCH_RESULT,
    SIGNAL_RESUME,
    SIGNAL_ROSTER_BROADCAST,
    SIGNAL_SHUTDOWN,
    SIGNAL_STOP,
    SIGNAL_STOP_NOW,
    SIGNAL_STORY_UPDATE,
    SIGNAL_STORY_UPDATES,
    UPDATE_BROWSE,
    UPDATE_COURSE_CORRECT,
    UPDATE_DECIDE,
    UPDATE_RESEARCH,
)
from bso.debugging import DebugRequest, DebugResult
from bso.decisions import WAITING_DECISIONS, DecisionError, DecisionRequest, check_waiting_decision
from bso.dependencies import PATCH_DEPENDENCY_UPDATE_CHECKED, checked_dependency_update
from bso.dispatch import (
    PATCH_ANSWER_MATCHES_DISPATCH,
    PATCH_TOKENS_BOUNDED,
    SLAVE_PATCH_ROLLUPS,
    answer_mismatch,
    check_agent_complete,
    check_agent_error,
    implausible_tokens,
    is_agent_error,
)
from bso.messages import (
    MASTER_SIGNALS,
    PATCH_PLAN_ANSWER_AWAITED,
    PATCH_STORY_UPDATE_FROM_ITS_BATCH,
    RejectedMessage,
    rejected_inputs,
    TerminateDirectivePayload,
    cut_text as _cut,  # a cut detail's whole text is in the message's payload
    describe_validation_error,
    plan_answer_not_awaited,
    plan_answer_timeout_summary,
    rejected_invalid,
    story_update_not_from_its_batch,
    unknown_signal_to_sprint,
)
from bso.models import ResumeRequest, StoryMeta, StoryUpdate, describe_in_flight, short_key
from bso.research import ResearchRequest
from bso.roster import RosterBroadcast
from bso.scrum_master import FALLBACK, PlanAnswer, PlanRequest, answer

MASTER = "sprint-master"
OPERATOR = "operator"
STATUS_FILE = "sprint-status.yaml"

# The message types `bso messages --type` accepts.
MESSAGE_TYPES = (
    "SPRINT_START",
    "BATCH_PLAN_READY",
    "BATCH_DISPATCH",
    "TASK_ASSIGNMENT",
    "AGENT_COMPLETE",
    "AGENT_FAILURE",
    "STATUS_WRITE",
    "STORY_UPDATE",
    "SLAVE_BATCH_COMPLETE",
    "PAUSE",
    "RESUME",
    "SHUTDOWN_REQUEST",
    "CANCEL_REQUEST",
    "CONTINUED_AS_NEW",
    "SPRINT_REPORT",
    "SPRINT_FAILED",
    # residents (workflows/residents.py) and the messages they exchange
    "RESIDENT_READY",
    "RESIDENT_STOPPED",
    "ROSTER_BROADCAST",
    "STOP",
    "STOP_NOW",
    "DEBUG_REQUEST",
    "DEBUG_RESULT",
    "RESEARCH_REQUEST",
    "RESEARCH_RESULT",
    "BROWSER_REQUEST",
    "BROWSER_RESULT",
    "DECISION",
    "DEPENDENCY_UPDATE",
    "PLAN_REQUEST",
    "PLAN_RESULT",
    # the `course_correct` update (CC_TRIGGER) and its answer: COURSE_CORRECTION, or CC_REJECTED
    "CC_TRIGGER",
    "COURSE_CORRECTION",
    "CC_REJECTED",
    # Agent-PO: a cancelled agent dispatch (its time is up, or the sprint was cancelled)
    "TERMINATE_DIRECTIVE",
)

# Signals a resident receives from the Master (the rest come from agents or Slaves, named in the payload).
_FROM_MASTER_TO_RESIDENT = {SIGNAL_ROSTER_BROADCAST, SIGNAL_STOP, SIGNAL_STOP_NOW, SIGNAL_PLAN_REQUEST}
# Signals the Master receives from its residents.
_FROM_RESIDENT = {"resident_ready", "resident_stopped", "plan_result"}
# Who sends a resident's answer whose payload does not name its role.
_RESIDENT_OF_SIGNAL = {
    SIGNAL_PLAN_RESULT: "scrum-master",
    SIGNAL_DEBUG_RESULT: "debugger",
    SIGNAL_RESEARCH_RESULT: "knowledge-researcher",
    SIGNAL_BROWSER_RESULT: "e2e-live",
}

# A resident's answers it signals to a request's `report_to` (its own history shows them: the recipient may be
# any workflow, with no handler for them); its debug and plan answers are read from the Slave's and Master's.
_RESULT_SIGNALS = {SIGNAL_RESEARCH_RESULT: "RESEARCH_RESULT", SIGNAL_BROWSER_RESULT: "BROWSER_RESULT"}
# The updates an agent asks a resident with (one call: the request accepted, its answer the completion).
_RESIDENT_UPDATES = {UPDATE_RESEARCH: "RESEARCH", UPDATE_BROWSE: "BROWSER"}

_OPERATOR_SIGNALS = {SIGNAL_PAUSE: "PAUSE", SIGNAL_RESUME: "RESUME", SIGNAL_SHUTDOWN: "SHUTDOWN_REQUEST"}

# Signal handlers without parameters: the SDK hands them no input at all, whatever was sent, and they act.
_TAKE_NO_INPUT = {SIGNAL_SHUTDOWN, SIGNAL_STOP, SIGNAL_STOP_NOW}
# The Slave's signals the flow shows (its pause and resume come from the Master, which the flow shows instead).
_SLAVE_ANSWERS = {SIGNAL_AGENT_COMPLETE, SIGNAL_DEBUG_RESULT, SIGNAL_DEPENDENCY_UPDATE, SIGNAL_DECISION}


def _surplus_inputs(attrs: Any) -> str | None:
    """Why workflows/inbound_guard.py refused this signal (every BSO signal handler takes one input at most),
    in its words; None when it was sent one input or none."""
    given = len(attrs.input.payloads)
    if given <= 1 or attrs.signal_name in _TAKE_NO_INPUT:
        return None
    return rejected_inputs("signal", attrs.signal_name, given, "too many positional arguments")


# The model each resident validates a signal with (workflows/residents.py), and the name it records a
# rejection under.
_RESIDENT_MODELS: dict[str, tuple[str, type[BaseModel]]] = {
    SIGNAL_DEBUG_REQUEST: ("DEBUG_REQUEST", DebugRequest),
    SIGNAL_PLAN_REQUEST: ("PLAN_REQUEST", PlanRequest),
    SIGNAL_RESEARCH_REQUEST: ("RESEARCH_REQUEST", ResearchRequest),
    SIGNAL_BROWSER_REQUEST: ("BROWSER_REQUEST", BrowserRequest),
    SIGNAL_ROSTER_BROADCAST: ("AGENT_ROSTER_BROADCAST", RosterBroadcast),
}


def _as_text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value, default=str)


def _as_batch_id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_payload(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"value": value}


# A history holds whatever a sender signalled, including what the workflow refused (a story key of 42): its
# fields are shown as they came, as text, so one malformed signal never breaks `bso messages` or the summary.
Text = Annotated[str | None, BeforeValidator(_as_text)]


class FlowMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    time: datetime
    workflow_id: str
    event_id: int
    type: str
    sender: Annotated[str, BeforeValidator(_as_text)]
    recipient: Annotated[str, BeforeValidator(_as_text)]
    story: Text = None
    agent: Text = None
    batch_id: Annotated[int | None, BeforeValidator(_as_batch_id)] = None
    dispatch_id: Text = None
    detail: str = ""
    payload: Annotated[dict[str, Any], BeforeValidator(_as_payload)] = Field(default_factory=dict)
    # Why the recipient rejected this message (recorded, never acted on), by the recipient's own rule; None:
    # it was accepted (or the flow cannot tell).
    rejected: str | None = None

    @property
    def owner(self) -> str:
        """The folder of the Agent-PO persistence layout: the agent concerned, else the sender."""
        return self.agent or self.sender


def _patches(events: Sequence[HistoryEvent]) -> set[str]:
    """The patch ids (workflow.patched) a history has markers of."""
    found = set()
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = event.marker_recorded_event_attributes
            if attrs.marker_name == "core_patch" and "patch-data" in attrs.details:
                found.add(str(_dict(decode(attrs.details["patch-data"])).get("id")))
    return found


def decode(payloads: Payloads | None) -> Any:
    """The first JSON payload's value (BSO uses the pydantic JSON converter); None when absent."""
    if payloads is None or not payloads.payloads:
        return None
    payload = payloads.payloads[0]
    encoding = payload.metadata.get("encoding", b"")
    if encoding == b"binary/null":
        return None
    if encoding != b"json/plain":
        return {"_encoding": encoding.decode(errors="replace")}
    try:
        return json.loads(payload.data)
    except ValueError:
        return None


def slave_name(batch_id: int | None) -> str:
    return f"slave-batch-{batch_id}" if batch_id is not None else "slave"


def _batch_from_workflow_id(workflow_id: str) -> int | None:
    tail = workflow_id.rsplit("/batch-", 1)
    if len(tail) == 2 and tail[1].isdigit():
        return int(tail[1])
    return None


def _party(name: str) -> str:
    """A sender named by its workflow id (a request's `requested_by` / `report_to`) as the flow names it."""
    batch_id = _batch_from_workflow_id(name)
    return slave_name(batch_id) if batch_id is not None else name


def _brief(value: Any, limit: int = 160) -> str:
    """A payload as one short line of the table (the whole of it stays in the record's payload)."""
    return _cut(json.dumps(value, default=str) if value not in (None, {}) else "", limit)


def _time(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime().replace(tzinfo=None)


def _is_resident(workflow_id: str) -> bool:
    return "/resident-" in workflow_id


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _invalid(msg_type: str, model: type[BaseModel], value: Any) -> str | None:
    """Why the recipient's model rejects `value` (the reason it records: validation_failed naming each
    field), or None when it is valid."""
    try:
        model.model_validate(value)
    except ValidationError as err:
        return rejected_invalid(msg_type, value, err).reason
    return None


def _batches_text(batches: Any, limit: int = 160) -> str:
    """A plan's batches on one line: `3 batches: [1-1, 1-2] [2-1] [3-1]` (short story keys)."""
    specs = [_dict(b) for b in batches] if isinstance(batches, list) else []
    text = f"{len(specs)} batch{'' if len(specs) == 1 else 'es'}: " + " ".join(
        "[" + ", ".join(short_key(str(k)) for k in (b.get("stories") or [])) + "]" for b in specs
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plan_result_detail(value: dict[str, Any]) -> str:
    """PLAN_RESULT on one line: which request, by whom, and the plan, re-plan or error it carries."""
    head = f"{value.get('request_id', '?')} by {value.get('planner', '?')}"
    if value.get("error"):
        return _cut(f"{head}: error: {' '.join(str(value['error']).split())}", 200)
    if isinstance(value.get("plan"), dict):
        return f"{head}: {_batches_text(value['plan'].get('batches'))}"
    if isinstance(value.get("course_correction"), dict):
        cc = value["course_correction"]
        return f"{head}: course correction ({cc.get('reason', '?')}): {_batches_text(cc.get('batches'))}"
    return f"{head}: no plan"


def _cc_trigger_detail(value: dict[str, Any]) -> str:
    """CC_TRIGGER on one line: the reason, the stories added and dropped (short keys), the note given with it."""
    changes = [
        f"{verb} {', '.join(short_key(str(k)) for k in value[field])}"
        for verb, field in (("add", "add_stories"), ("drop", "drop_stories"))
        if isinstance(value.get(field), list) and value[field]
    ]
    head = str(value.get("reason", "?")) + (f" ({'; '.join(changes)})" if changes else "")
    note = " ".join(str(value.get("text") or "").split())
    return _cut(f"{head}: {note}" if note else head, 200)


def _master_messages(workflow_id: str, events: Sequence[HistoryEvent]) -> list[FlowMessage]:
    out: list[FlowMessage] = []
    children: dict[str, dict[str, Any]] = {}  # child workflow id -> its SlaveInput
    running: dict[Any, list[str]] = {}  # the running batches' stories, by batch id (the Master's _batch_stories)
    from_its_batch = PATCH_STORY_UPDATE_FROM_ITS_BATCH in _patches(events)  # the Master applied the rule
    planned = False
    # The plan as planned, from the first of: the report's, the carried state's (a continued run), the
    # scrum-master's accepted answer to the Master's plan request, the Master's fallback plan for that request.
    plans: dict[str, Any] = {}
    plan_request: dict[str, Any] | None = None  # the first plan request the Master sent (not a re-plan)
    # The Master's _plan_awaited: the plan request in flight, whose answer only it takes (once it has the rule).
    answers_awaited_only = PATCH_PLAN_ANSWER_AWAITED in _patches(events)
    awaited: str | None = None
    plan_timers: dict[str, str] = {}  # timer id -> the plan request whose answer's timeout it is
    corrections: set[str] = set()  # the update ids of course_correct updates accepted and not answered yet

    def add(event: HistoryEvent, **fields: Any) -> None:
        out.append(FlowMessage(time=_time(event), workflow_id=workflow_id, event_id=event.event_id, **fields))

    def add_story_updates(event: HistoryEvent, updates: Any) -> None:
        """A Slave's story_update payloads (from a story_updates signal or its result), one message each."""
        for item in updates if isinstance(updates, list) else []:
            update = _dict(item)
            view = _dict(update.get("view"))
            batch = update.get("batch_id")
            in_flight = describe_in_flight(view.get("agent_in_flight"), view.get("mode_in_flight"), view.get("debug_in_flight"))
            fields = {
                "type": "STORY_UPDATE",
                "sender": slave_name(batch),
                "recipient": MASTER,
                "batch_id": batch,
                "story": update.get("story_key"),
                "dispatch_id": view.get("dispatch_id"),
                "detail": f"{view.get('state', '?')}"
                + (f", {in_flight} in flight" if in_flight else "")
                + (", merging" if view.get("merging") is True else "")
                + (f", review round {view['review_round']}" if view.get("review_round") else ""),
                "payload": update if isinstance(item, dict) else {"value": item},
            }
            reason = _invalid("STORY_UPDATE", StoryUpdate, item)  # the Master's rules (_apply_story_update)
            if reason is None and from_its_batch:
                valid = StoryUpdate.model_validate(item)
                if valid.story_key not in running.get(valid.batch_id, ()):
                    reason = story_update_not_from_its_batch(valid.story_key, valid.batch_id)
            add(event, **(_rejected(fields, reason) if reason else fields))

    for event in events:
        et = event.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            inp = _dict(decode(event.workflow_execution_started_event_attributes.input))
            if inp.get("carried_state"):
                carried = _dict(_dict(inp["carried_state"]).get("plan"))
                if carried:
                    plans.setdefault("carried", carried)
                continue  # a continued run: its start is not a new sprint
            scope = []
            if inp.get("epic") is not None:
                scope.append(f"epic {inp['epic']}")
            if inp.get("story_keys") == []:
                scope.append("story_keys [], no story")  # refused at the start (it ran all open stories before)
            elif inp.get("story_keys"):
                keys = inp["story_keys"]  # as it came: a refused input may hold anything here
                scope.append("stories " + (", ".join(map(str, keys)) if isinstance(keys, list) else str(keys)))
            detail = (
                f"{inp['project_root']} ({', '.join(scope) or 'all open stories'}; "
                f"backend {inp.get('agent_backend', 'simulated')})"
                if isinstance(inp.get("project_root"), str) and inp["project_root"]
                else "started without a usable input (no project_root): the sprint failed at its start"
            )
            add(
                event,
                type="SPRINT_START",
                sender=OPERATOR,
                recipient=MASTER,
                detail=detail,
                payload={k: v for k, v in inp.items() if k not in ("simulation", "carried_state")},
            )
        elif et == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES and not planned:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            phase = decode(Payloads(payloads=[fields["BsoPhase"]])) if "BsoPhase" in fields else None
            if phase == "running":
                planned = True
                add(event, type="BATCH_PLAN_READY", sender=MASTER, recipient=MASTER, detail="batch plan ready")
        elif et == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            attrs = event.start_child_workflow_execution_initiated_event_attributes
            if attrs.workflow_type.name == "ResidentWorkflow":
                continue  # a resident, not a batch: its own history shows what it received
            inp = _dict(decode(attrs.input))
            children[attrs.workflow_id] = inp
            batch = inp.get("batch_id", _batch_from_workflow_id(attrs.workflow_id))
            keys = [s.get("key", "") for s in inp.get("stories", []) if isinstance(s, dict)]
            running[batch] = keys
            add(
                event,
                type="BATCH_DISPATCH",
                sender=MASTER,
                recipient=slave_name(batch),
                batch_id=batch,
                detail=f"batch {batch}: {', '.join(keys)}",
                payload={"batch_id": batch, "stories": keys, "workflow_id": attrs.workflow_id},
            )
        elif et == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            attrs = event.child_workflow_execution_completed_event_attributes
            if _is_resident(attrs.workflow_execution.workflow_id):
                continue
            result = _dict(decode(attrs.result))
            add_story_updates(event, result.get("final_updates"))  # the last ones come with the result
            batch = result.get("batch_id", _batch_from_workflow_id(attrs.workflow_execution.workflow_id))
            running.pop(batch, None)
            results = _dict(result.get("results"))
            add(
                event,
                type="SLAVE_BATCH_COMPLETE",
                sender=slave_name(batch),
                recipient=MASTER,
                batch_id=batch,
                detail=f"{result.get('status', '?')}: {results.get('stories_completed', 0)} done, "
                f"{results.get('stories_failed', 0)} failed, {result.get('tokens_used', 0)} tokens",
                payload={
                    "status": result.get("status"),
                    "stories_completed": [
                        r["story_key"] for r in results.get("story_results", []) if r.get("final_state") == "done"
                    ],
                    "stories_failed": [
                        r["story_key"]
                        for r in results.get("story_results", [])
                        if r.get("final_state") == "needs-intervention"
                    ],
                    "tokens_used": result.get("tokens_used", 0),
                },
            )
        elif et in (
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED,
        ):
            which = EventType.Name(et).removeprefix("EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_").lower()
            attrs = {
                "failed": event.child_workflow_execution_failed_event_attributes,
                "timed_out": event.child_workflow_execution_timed_out_event_attributes,
                "terminated": event.child_workflow_execution_terminated_event_attributes,
                "canceled": event.child_workflow_execution_canceled_event_attributes,
            }[which]
            if _is_resident(attrs.workflow_execution.workflow_id):
                continue
            batch = _batch_from_workflow_id(attrs.workflow_execution.workflow_id)
            running.pop(batch, None)
            add(
                event,
                type="SLAVE_BATCH_COMPLETE",
                sender=slave_name(batch),
                recipient=MASTER,
                batch_id=batch,
                detail=f"Slave {which.replace('_', ' ')}",
                payload={"status": f"slave-{which}"},
            )
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            value = decode(attrs.input)
            surplus = _surplus_inputs(attrs) if attrs.signal_name in MASTER_SIGNALS else None
            if surplus is not None:
                fields = {"type": _OPERATOR_SIGNALS.get(attrs.signal_name, attrs.signal_name.upper()), "sender": OPERATOR,
                          "recipient": MASTER, "detail": _brief(value), "payload": _as_payload(value) if value is not None else {}}
                add(event, **_rejected(fields, surplus))
            elif attrs.signal_name in (SIGNAL_STORY_UPDATE, SIGNAL_STORY_UPDATES):
                # story_updates: several story_update payloads in one signal, each its own message.
                many = _dict(value).get("updates") if attrs.signal_name == SIGNAL_STORY_UPDATES else [value]
                if isinstance(many, list):
                    add_story_updates(event, many)
                else:  # the Master's rule (story_updates): the whole signal is rejected
                    fields = {"type": "STORY_UPDATE", "sender": "slave", "recipient": MASTER,
                              "detail": _brief(value), "payload": _dict(value)}
                    add(event, **_rejected(fields, "expected an object with a list of updates"))
            else:
                kind = _OPERATOR_SIGNALS.get(attrs.signal_name, attrs.signal_name.upper())
                sender = OPERATOR
                if attrs.signal_name in _FROM_RESIDENT:  # resident_ready / resident_stopped carry the role itself
                    role = value if isinstance(value, str) else _dict(value).get("role")
                    sender = str(role or _RESIDENT_OF_SIGNAL.get(attrs.signal_name, "resident"))
                fields = {"type": kind, "sender": sender, "recipient": MASTER, "detail": _brief(value),
                          "payload": _as_payload(value) if value is not None else {}}
                reason = None
                if attrs.signal_name not in MASTER_SIGNALS:  # as the Master's unknown_signal handler records it
                    unknown = unknown_signal_to_sprint(attrs.signal_name, value)
                    fields["type"], reason = unknown.msg_type, unknown.reason
                    fields["sender"] = str(_dict(value).get("agent_type") or OPERATOR)  # an agent's misdirected answer
                elif attrs.signal_name == SIGNAL_RESUME:
                    reason = _invalid("RESUME", ResumeRequest, value or {})  # as the Master's resume handler
                elif attrs.signal_name == SIGNAL_PLAN_RESULT:
                    # The Master ignores (and logs) an answer its planner mixin cannot validate.
                    reason = _invalid("PLAN_RESULT", PlanAnswer, value)
                    fields["detail"] = _plan_result_detail(_dict(value))
                    if reason is None and answers_awaited_only:
                        if value.get("request_id") != awaited:
                            reason = plan_answer_not_awaited(str(value.get("request_id")))
                        else:
                            awaited = None  # taken: the request is answered
                    if reason is None and isinstance(value.get("plan"), dict) and (
                        plan_request is None or value.get("request_id") == plan_request.get("request_id")
                    ):
                        plans.setdefault("answer", value["plan"])
                add(event, **(_rejected(fields, reason) if reason else fields))
        elif et == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            attrs = event.signal_external_workflow_execution_initiated_event_attributes
            if attrs.signal_name == SIGNAL_PLAN_REQUEST:
                request = _dict(decode(attrs.input))
                awaited = str(request.get("request_id")) if request.get("request_id") else None
                if plan_request is None and request and not request.get("course_correction"):
                    plan_request = request
        elif et == EventType.EVENT_TYPE_TIMER_STARTED and awaited is not None and event.user_metadata.HasField("summary"):
            if decode(Payloads(payloads=[event.user_metadata.summary])) == plan_answer_timeout_summary(awaited):
                plan_timers[event.timer_started_event_attributes.timer_id] = awaited
        elif et == EventType.EVENT_TYPE_TIMER_FIRED:
            if plan_timers.pop(event.timer_fired_event_attributes.timer_id, None) == awaited:
                awaited = None  # timed out: the Master no longer awaits its answer
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == UPDATE_COURSE_CORRECT:  # its validator let it in (a refused one is in no history)
                value = _dict(decode(request.input.args))
                corrections.add(request.meta.update_id)
                add(event, type="CC_TRIGGER", sender=OPERATOR, recipient=MASTER, detail=_cc_trigger_detail(value),
                    payload=value)
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            attrs = event.workflow_execution_update_completed_event_attributes
            if attrs.meta.update_id in corrections:  # (the test server leaves accepted_event_id unset)
                corrections.discard(attrs.meta.update_id)
                if attrs.outcome.HasField("failure"):
                    message = " ".join(attrs.outcome.failure.message.split())
                    add(event, type="CC_REJECTED", sender=MASTER, recipient=OPERATOR, detail=_cut(message, 200),
                        payload={"error": message})
                else:
                    value = _dict(decode(attrs.outcome.success))
                    add(event, type="COURSE_CORRECTION", sender=MASTER, recipient=OPERATOR,
                        detail=_cut(str(value.get("impact") or _batches_text(value.get("batches"))), 200), payload=value)
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            reason = event.workflow_execution_cancel_requested_event_attributes.cause
            add(event, type="CANCEL_REQUEST", sender=OPERATOR, recipient=MASTER, detail=reason)
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            add(event, type="CONTINUED_AS_NEW", sender=MASTER, recipient=MASTER, detail="history handed to a new run")
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            report = _dict(decode(event.workflow_execution_completed_event_attributes.result))
            if _dict(report.get("batch_plan")):
                plans.setdefault("report", report["batch_plan"])
            stories = _dict(report.get("stories"))
            done = sum(v == "done" for v in stories.values())
            add(
                event,
                type="SPRINT_REPORT",
                sender=MASTER,
                recipient=OPERATOR,
                detail=f"{report.get('status', '?')}: {done}/{len(stories)} stories done, "
                f"{report.get('tokens_used', 0)} tokens",
                payload={"status": report.get("status"), "stories": stories, "tokens_used": report.get("tokens_used")},
            )
        elif et in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        ):
            detail = EventType.Name(et).removeprefix("EVENT_TYPE_WORKFLOW_EXECUTION_").lower()
            if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                detail += ": " + event.workflow_execution_failed_event_attributes.failure.message
            add(event, type="SPRINT_FAILED", sender=MASTER, recipient=OPERATOR, detail=detail)

    # The plan as planned (BATCH_PLAN_READY), the same while the sprint runs and once it ended.
    plan, source = _planned(plans, plan_request)
    if plan is None and children:
        # Planned by the Master itself with no scrum-master (its plan is in no history until the report):
        # the batches it started so far.
        plan = {"batches": [{"batch_id": i.get("batch_id"), "stories": [_dict(s).get("key") for s in i.get("stories", [])]}
                            for i in children.values()]}
        source = "batches started so far"
    if plan is not None:
        batches = [
            {"batch_id": b.get("batch_id"), "stories": [str(k) for k in (b.get("stories") or [])]}
            for b in map(_dict, plan.get("batches") or [])
        ]
        detail = f"{len(batches)} batch{'' if len(batches) == 1 else 'es'}: " + "; ".join(
            f"{b['batch_id']}: {', '.join(b['stories'])}" for b in batches
        )
        out = [
            m.model_copy(
                update={
                    "detail": _cut(detail if source != "batches started so far" else f"{source}: {detail}", 200),
                    "payload": {"batches": batches, "source": source},
                }
            )
            if m.type == "BATCH_PLAN_READY"
            else m
            for m in out
        ]
    return out


def _planned(plans: dict[str, Any], plan_request: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """The sprint's plan (BatchPlanReady as JSON) and where it was read, from a Master run's history."""
    for source in ("report", "carried", "answer"):
        if source in plans:
            return _dict(plans[source]), source
    if plan_request is not None:
        # The scrum-master did not answer with a plan: the Master planned this request by itself, by the
        # same pure rules (bso/scrum_master.py answer(request, FALLBACK)).
        try:
            fallback = answer(PlanRequest.model_validate(plan_request), FALLBACK).plan
        except ValidationError:
            fallback = None
        if fallback is not None:
            return fallback.model_dump(mode="json"), "fallback"
    return None, ""


def _slave_messages(workflow_id: str, events: Sequence[HistoryEvent]) -> list[FlowMessage]:
    out: list[FlowMessage] = []
    batch = _batch_from_workflow_id(workflow_id)
    me = slave_name(batch)
    scheduled: dict[int, tuple[str, dict[str, Any]]] = {}  # event id -> (activity type, input)
    writes: dict[int, int] = {}  # scheduled event id -> index in out
    cancelling = False  # the Slave itself was asked to cancel (the sprint was cancelled)
    # The Slave's dispatches as it saw them, to judge each answer by its own rule (check_agent_complete):
    # opened when the agent activity is scheduled, closed by an accepted answer, the activity's failure or
    # time-out, or its deadline timer (external agents). Within a workflow task the Slave runs the signals
    # first, then the rest (an answer returned as the activity's result, a close): those wait for the task's end.
    opened: dict[str, str] = {}  # dispatch id -> story key
    answered: set[str] = set()
    assignments: dict[str, dict[str, Any]] = {}  # dispatch id -> its assignment
    deferred: list[tuple[HistoryEvent, str, Any]] = []  # answers returned as results, this task
    closing: list[str] = []  # dispatches closed by this task
    no_answer_yet: list[str] = []  # activities done without an answer this task: a deadline timer follows
    arming: list[str] = []  # ... whose timer the next commands start
    timers: dict[str, str] = {}  # timer id -> the dispatch whose deadline it is
    # A Slave that refused an answer naming another agent than its dispatch's recorded this patch marker then.
    patches = _patches(events)
    rolled_up = any(rollup in patches for rollup in SLAVE_PATCH_ROLLUPS)  # a Slave with a rollup applied both
    matched_by_dispatch = rolled_up or PATCH_ANSWER_MATCHES_DISPATCH in patches
    tokens_bounded = rolled_up or PATCH_TOKENS_BOUNDED in patches  # ... and one claiming implausible tokens
    # DEBUG_REQUESTs it signalled (a delivered one is shown from the debugger's history, one that was not here).
    debug_sent: dict[int, dict[str, Any]] = {}
    # Its stories, to judge a DEPENDENCY_UPDATE as a Slave that checks them does (one that refused one has the marker).
    checked_for = _slave_stories(events) if PATCH_DEPENDENCY_UPDATE_CHECKED in patches else None

    def add(event: HistoryEvent, **fields: Any) -> None:
        out.append(
            FlowMessage(time=_time(event), workflow_id=workflow_id, event_id=event.event_id, batch_id=batch, **fields)
        )

    def answer(event: HistoryEvent, raw: Any) -> None:
        """An AGENT_COMPLETE or agent_error (as it came) as the Slave judged it."""
        value = _dict(raw)
        if is_agent_error(raw):
            error = check_agent_error(raw, opened)
            if isinstance(error, RejectedMessage):
                add(event, **_rejected(_agent_error(value, me, assignments), error.reason))
                return
            opened.pop(str(error.task_id), None)
            answered.add(str(error.task_id))
            add(event, **_agent_error(value, me, assignments))
            return
        checked = check_agent_complete(raw, opened, answered)
        fields = _agent_complete(value, me)
        assignment = assignments.get(checked.dispatch_id or "", {})
        if not isinstance(checked, RejectedMessage) and matched_by_dispatch and assignment:
            checked = answer_mismatch(checked, assignment.get("agent_type"), assignment.get("mode")) or checked
        if not isinstance(checked, RejectedMessage) and tokens_bounded:
            checked = implausible_tokens(checked) or checked
        if isinstance(checked, RejectedMessage):
            add(event, **_rejected(fields, checked.reason))
            return
        del opened[checked.dispatch_id]
        answered.add(checked.dispatch_id)
        add(event, **fields)

    for event in events:
        et = event.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            name = attrs.activity_type.name
            inp = _dict(decode(attrs.input))
            scheduled[event.event_id] = (name, inp)
            if name == "run_agent" and isinstance(inp.get("dispatch_id"), str):
                # The Slave closed the story's earlier dispatch before it started this one.
                opened = {d: k for d, k in opened.items() if k != inp.get("story_key")}
                opened[inp["dispatch_id"]] = str(inp.get("story_key"))
                assignments[inp["dispatch_id"]] = inp
            if name == "run_agent":
                findings = inp.get("fix_findings") or []
                po_phase = _dict(inp.get("po")).get("phase")  # Agent-PO gates: plan, implement or fix
                add(
                    event,
                    type="TASK_ASSIGNMENT",
                    sender=me,
                    recipient=inp.get("agent_type", "agent"),
                    story=inp.get("story_key"),
                    agent=inp.get("agent_type"),
                    dispatch_id=inp.get("dispatch_id", attrs.activity_id),
                    detail=f"{inp.get('mode', '?')} round {inp.get('mode_round', 1)}"
                    + (f", PO phase {po_phase}" if po_phase else "")
                    + (f", {len(findings)} findings to fix" if findings else ""),
                    payload={k: v for k, v in inp.items() if k not in ("simulation", "config_overrides")},
                )
            elif name == "write_story_status":
                writes[event.event_id] = len(out)
                add(
                    event,
                    type="STATUS_WRITE",
                    sender=me,
                    recipient=STATUS_FILE,
                    story=inp.get("story_key"),
                    detail=f"U4 {inp.get('expected', '?')} -> {inp.get('new', '?')}",
                    payload={k: inp.get(k) for k in ("story_key", "expected", "new")},
                )
        elif et == EventType.EVENT_TYPE_MARKER_RECORDED:
            write = _local_status_write(event)
            if write is not None:
                result = write
                add(
                    event,
                    type="STATUS_WRITE",
                    sender=me,
                    recipient=STATUS_FILE,
                    story=result.get("story_key"),
                    detail=f"U4 {result.get('expected') or '?'} -> {result.get('new') or '?'} ({result.get('outcome', '?')})",
                    payload={
                        "story_key": result.get("story_key"),
                        "expected": result.get("expected"),
                        "new": result.get("new"),
                        "outcome": result.get("outcome"),
                    },
                )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            name, inp = scheduled.get(attrs.scheduled_event_id, ("?", {}))
            returned = _dict(decode(attrs.result)).get("answer") if name == "run_agent" else None
            if returned is not None:  # AGENT_COMPLETE returned as the agent activity's result
                deferred.append((event, str(inp.get("dispatch_id")), returned))
            elif name == "run_agent":
                no_answer_yet.append(str(inp.get("dispatch_id")))
            if attrs.scheduled_event_id in writes:
                result = _dict(decode(attrs.result))
                i = writes[attrs.scheduled_event_id]
                out[i] = out[i].model_copy(
                    update={
                        "detail": f"{out[i].detail} ({result.get('outcome', '?')})",
                        "payload": {**out[i].payload, "outcome": result.get("outcome")},
                    }
                )
        elif et in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
        ):
            if et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                attrs = event.activity_task_failed_event_attributes
            else:
                attrs = event.activity_task_timed_out_event_attributes
            name, inp = scheduled.get(attrs.scheduled_event_id, ("?", {}))
            if name == "run_agent":
                closing.append(str(inp.get("dispatch_id")))
            if name == "run_agent" and et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                # The agent's time (the activity's timeout) is up: its worker cancels it, as a TERMINATE would.
                add(event, **terminate_directive(me, inp, sprint_cancelled=False))
            if name == "run_agent":
                add(
                    event,
                    type="AGENT_FAILURE",
                    sender=inp.get("agent_type", "agent"),
                    recipient=me,
                    story=inp.get("story_key"),
                    agent=inp.get("agent_type"),
                    dispatch_id=inp.get("dispatch_id"),
                    detail=attrs.failure.message or EventType.Name(et).lower(),
                )
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            cancelling = True
        elif et == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            attrs = event.signal_external_workflow_execution_initiated_event_attributes
            if attrs.signal_name == SIGNAL_DEBUG_REQUEST:
                debug_sent[event.event_id] = _dict(decode(attrs.input))
        elif et == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED:
            attrs = event.signal_external_workflow_execution_failed_event_attributes
            if (request := debug_sent.pop(attrs.initiated_event_id, None)) is not None:
                summary = " ".join(str(request.get("error_summary") or "").split())
                add(
                    event,
                    type="DEBUG_REQUEST",
                    sender=me,
                    recipient=_RESIDENT_OF_SIGNAL[SIGNAL_DEBUG_RESULT],
                    story=request.get("story_key"),
                    detail=_cut(f"{request.get('debug_id', '?')}: not delivered: {_not_delivered(attrs)}"
                                + (f": {summary}" if summary else ""), 200),
                    payload=request,
                )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            attrs = event.activity_task_cancel_requested_event_attributes
            name, inp = scheduled.get(attrs.scheduled_event_id, ("?", {}))
            if name == "run_agent":
                add(event, **terminate_directive(me, inp, cancelling))
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            value = _dict(decode(attrs.input))
            surplus = _surplus_inputs(attrs)
            if surplus is not None and attrs.signal_name in _SLAVE_ANSWERS:
                fields = {"type": attrs.signal_name.upper(), "sender": str(value.get("agent_type") or OPERATOR),
                          "recipient": me, "story": value.get("story_key"), "detail": _brief(decode(attrs.input)),
                          "payload": value}
                add(event, **_rejected(fields, surplus))
            elif attrs.signal_name == SIGNAL_AGENT_COMPLETE:
                answer(event, decode(attrs.input))
            elif attrs.signal_name == SIGNAL_SHUTDOWN:
                add(event, type="SHUTDOWN_REQUEST", sender=MASTER, recipient=me, detail="finish the story in hand")
            elif attrs.signal_name == SIGNAL_DEBUG_RESULT:
                verdict = " ".join(str(value.get("fix_suggestion") or value.get("root_cause") or value.get("error") or "").split())
                fields = {
                    "type": "DEBUG_RESULT",
                    "sender": _RESIDENT_OF_SIGNAL[SIGNAL_DEBUG_RESULT],
                    "recipient": me,
                    "story": value.get("story_key"),
                    "detail": f"{value.get('debug_id', '?')}: {value.get('status', '?')}, confidence "
                    f"{value.get('confidence', '?')}" + (f": {_cut(verdict, 100)}" if verdict else ""),
                    "payload": value,
                }
                reason = _invalid("DEBUG_RESULT", DebugResult, decode(attrs.input))  # the Slave's debug_result
                add(event, **(_rejected(fields, reason) if reason else fields))
            elif attrs.signal_name == SIGNAL_DEPENDENCY_UPDATE:
                add(event, **_dependency_update(decode(attrs.input), me, checked_for))
            elif attrs.signal_name == SIGNAL_DECISION:
                add(event, **_decision(decode(attrs.input), me))
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            # A decision sent to the batch itself (`temporal workflow update execute --workflow-id S/batch-N`): its
            # validator let it in (a refused one is in no history).
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == UPDATE_DECIDE:
                add(event, **{**_decision(decode(request.input.args), me), "sender": OPERATOR})
        elif et == EventType.EVENT_TYPE_TIMER_STARTED and arming and not event.user_metadata.HasField("summary"):
            # The deadline of a dispatch answered by the agent itself (the story-updates hold timer has a summary).
            timers[event.timer_started_event_attributes.timer_id] = arming.pop(0)
        elif et == EventType.EVENT_TYPE_TIMER_FIRED:
            dispatch_id = timers.pop(event.timer_fired_event_attributes.timer_id, None)
            if dispatch_id is not None:
                closing.append(dispatch_id)
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            # The end of a workflow task: what its code did after the signals.
            for answered_event, dispatch_id, value in deferred:
                if dispatch_id in answered:  # a signal answered it first: the Slave never read the result
                    add(answered_event, **_rejected(_agent_complete(_dict(value), me), "not read: the dispatch was answered"))
                    continue
                answer(answered_event, value)
                if dispatch_id in opened:  # rejected: the Slave waits out the agent's time for a signal
                    no_answer_yet.append(dispatch_id)
            for dispatch_id in closing:
                opened.pop(dispatch_id, None)
            arming = [d for d in no_answer_yet if d in opened]
            deferred, closing, no_answer_yet = [], [], []
    for answered_event, _, value in deferred:  # a history that ends inside a workflow task
        answer(answered_event, value)
    return sorted(out, key=lambda m: m.event_id)


def _slave_stories(events: Sequence[HistoryEvent]) -> list[StoryMeta]:
    """The stories of a Slave's batch, from its input (none from an input that does not read)."""
    if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        return []
    stories = _dict(decode(events[0].workflow_execution_started_event_attributes.input)).get("stories")
    try:
        return TypeAdapter(list[StoryMeta]).validate_python(stories)
    except ValidationError:
        return []


def _dependency_update(states: Any, slave: str, stories: list[StoryMeta] | None) -> dict[str, Any]:
    """The Master's DEPENDENCY_UPDATE to a Slave (`{story key: state}`), as the Slave's dependency_update judged it
    (`stories`: the batch's, for a Slave that checked the stories an update names; None for one that did not)."""
    fields = {
        "type": "DEPENDENCY_UPDATE",
        "sender": MASTER,
        "recipient": slave,
        "detail": _brief(states),
        "payload": _as_payload(states) if states is not None else {},
    }
    if not isinstance(states, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in states.items()):
        return _rejected(fields, "expected an object of story key: state")  # the Slave's own reason
    if stories is not None and (ignored := checked_dependency_update(states, stories)[1]) is not None:
        return _rejected(fields, ignored)
    return {**fields, "detail": _cut(", ".join(f"{k}: {v}" for k, v in states.items()), 160)}


def _decision(request: Any, slave: str) -> dict[str, Any]:
    """A human decision the Master forwarded to a Slave (the `decision` signal), as the Slave's handler judged
    what it can tell from the message alone: its shape, and whether the decision answers a waiting story at all
    (whether that story is waiting for one is the Slave's state, in no history event)."""
    value = _dict(request)
    state = value.get("state")
    fields = {
        "type": "DECISION",
        "sender": MASTER,
        "recipient": slave,
        "story": value.get("story_key"),
        "detail": _cut(f"{value.get('decision', '?')}" + (f" -> {state}" if state else ""), 120),
        "payload": _as_payload(request) if request is not None else {},
    }
    try:
        parsed = DecisionRequest.model_validate(request)
        if parsed.decision not in WAITING_DECISIONS:
            check_waiting_decision(parsed, None)  # raises for the decision before it looks at the story
    except ValidationError as err:
        return _rejected(fields, describe_validation_error(err))  # as the Slave's decision handler records it
    except DecisionError as err:
        return _rejected(fields, str(err))
    return fields


def _rejected(fields: dict[str, Any], reason: str) -> dict[str, Any]:
    """A message's fields marked as rejected by its recipient (the table's detail says so first)."""
    return {**fields, "rejected": reason, "detail": _cut(f"REJECTED ({_cut(reason, 100)}): {fields.get('detail', '')}", 200)}


def terminate_directive(slave: str, assignment: dict[str, Any], sprint_cancelled: bool) -> dict[str, Any]:
    """A cancelled agent dispatch as Agent-PO's TERMINATE_DIRECTIVE (payload validated with the model)."""
    agent = str(assignment.get("agent_type") or "agent")
    reason = "the sprint was cancelled" if sprint_cancelled else "the agent's time is up: no AGENT_COMPLETE in time"
    payload = TerminateDirectivePayload(
        agent_id=agent,
        task_id=str(assignment.get("story_key") or assignment.get("dispatch_id") or "task"),
        reason=reason,
        message=f"dispatch {assignment.get('dispatch_id', '?')} cancelled; its process is stopped",
    )
    return {
        "type": "TERMINATE_DIRECTIVE",
        "sender": slave,
        "recipient": agent,
        "story": assignment.get("story_key"),
        "agent": assignment.get("agent_type"),
        "dispatch_id": assignment.get("dispatch_id"),
        "detail": reason,
        "payload": payload.model_dump(mode="json"),
    }


def _agent_complete(value: dict[str, Any], recipient: str) -> dict[str, Any]:
    """The fields of an AGENT_COMPLETE message, signalled or returned as the agent activity's result."""
    parts = [str(value.get("status", "?"))]
    if value.get("verdict"):
        parts.append(f"verdict {value['verdict']}")
    if isinstance(value.get("score"), int):  # a scored review (Gear 2)
        parts.append(f"score {value['score']}")
    if isinstance(value.get("findings"), list) and value["findings"]:  # (a rejected answer's may be any value)
        parts.append(f"{len(value['findings'])} findings")
    parts.append(f"{value.get('tokens_used', 0)} tokens")
    return {
        "type": "AGENT_COMPLETE",
        "sender": str(value.get("agent_type", "agent")),
        "recipient": recipient,
        "story": value.get("story_key"),
        "agent": value.get("agent_type"),
        "dispatch_id": value.get("dispatch_id"),
        "detail": ", ".join(parts),
        "payload": value,
    }


def _agent_error(value: dict[str, Any], recipient: str, assignments: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Gear 2's agent_error sent on the agent_complete signal: the failure of the dispatch its task_id names."""
    error = _dict(value.get("payload"))
    assignment = assignments.get(str(error.get("task_id")), {})
    agent = assignment.get("agent_type") or value.get("from") or value.get("sender")
    message = " ".join(str(error.get("error_message") or "").split())
    return {
        "type": "AGENT_FAILURE",
        "sender": str(agent or "agent"),
        "recipient": recipient,
        "story": assignment.get("story_key"),
        "agent": assignment.get("agent_type"),
        "dispatch_id": error.get("task_id"),
        "detail": f"agent_error {error.get('error_type', '?')}" + (f": {_cut(message, 120)}" if message else ""),
        "payload": value,
    }


def _local_status_write(event: HistoryEvent) -> dict[str, Any] | None:
    """The result of a U4 write run as a local activity (its marker), or None for any other marker."""
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity" or "data" not in attrs.details:
        return None
    data = _dict(decode(attrs.details["data"]))
    if data.get("activity_type") != "write_story_status" or "result" not in attrs.details:
        return None
    return _dict(decode(attrs.details["result"])) or None


def _resident_messages(workflow_id: str, events: Sequence[HistoryEvent]) -> list[FlowMessage]:
    """What a resident received: the Master's broadcasts and stop, and the requests agents and Slaves sent (by
    signal, or by the `research` / `browse` update); and the research and browser answers it sent back."""
    role = workflow_id.rsplit("/resident-", 1)[-1]
    out: list[FlowMessage] = []
    sent: dict[int, int] = {}  # initiated event id -> index in out (an answer signalled to its report_to)
    asked: dict[int, tuple[str, str, Any]] = {}  # accepted update's event id -> (kind, requester, story)

    def add(event: HistoryEvent, **fields: Any) -> None:
        out.append(FlowMessage(time=_time(event), workflow_id=workflow_id, event_id=event.event_id, **fields))

    for event in events:
        et = event.event_type
        if et == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            attrs = event.signal_external_workflow_execution_initiated_event_attributes
            if attrs.signal_name in _RESULT_SIGNALS:
                value = _dict(decode(attrs.input))
                sent[event.event_id] = len(out)
                add(
                    event,
                    type=_RESULT_SIGNALS[attrs.signal_name],
                    sender=role,
                    recipient=_party(attrs.workflow_execution.workflow_id or "?"),
                    story=value.get("story_key"),
                    detail=_result_detail(value),
                    payload=value,
                )
            continue
        if et == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED:
            # Not delivered (the requester is gone): `deliver` tries again, each try its own message.
            attrs = event.signal_external_workflow_execution_failed_event_attributes
            if attrs.initiated_event_id in sent:
                i = sent[attrs.initiated_event_id]
                out[i] = out[i].model_copy(update={"detail": _cut(f"{out[i].detail} (not delivered: {_not_delivered(attrs)})", 200)})
            continue
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name not in _RESIDENT_UPDATES:
                continue
            kind = _RESIDENT_UPDATES[request.input.name]
            value = _dict(decode(request.input.args))  # its validator let it in: a valid request
            requester = _party(str(value.get("requested_by") or value.get("agent_type") or "agent"))
            asked[event.event_id] = (kind, requester, value.get("story_key"))
            add(
                event,
                type=f"{kind}_REQUEST",
                sender=requester,
                recipient=role,
                story=value.get("story_key"),
                detail=_request_detail(value),
                payload=value,
            )
            continue
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            attrs = event.workflow_execution_update_completed_event_attributes
            if attrs.accepted_event_id not in asked:
                continue
            kind, requester, story = asked.pop(attrs.accepted_event_id)
            if attrs.outcome.HasField("failure"):
                value = {}
                detail = _cut("failed: " + " ".join(attrs.outcome.failure.message.split()), 200)
            else:
                value = _dict(decode(attrs.outcome.success))
                detail = _result_detail(value)
            add(event, type=f"{kind}_RESULT", sender=role, recipient=requester, story=value.get("story_key", story),
                detail=detail, payload=value)
            continue
        if et != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attrs = event.workflow_execution_signaled_event_attributes
        value = _dict(decode(attrs.input))
        if attrs.signal_name in _FROM_MASTER_TO_RESIDENT:
            sender = MASTER
        else:
            sender = _party(str(value.get("requested_by") or value.get("report_to") or value.get("agent_type") or "agent"))
        detail = ""
        if attrs.signal_name == "roster_broadcast":
            roster = _dict(value.get("roster"))
            detail = ", ".join(f"{len(v)} {k}" for k, v in roster.items() if isinstance(v, list))
        elif value.get("error_summary"):
            detail = _cut(str(value["error_summary"]), 120)
        elif attrs.signal_name in (SIGNAL_RESEARCH_REQUEST, SIGNAL_BROWSER_REQUEST):
            detail = _request_detail(value)
        elif attrs.signal_name == SIGNAL_PLAN_REQUEST:
            stories = value.get("stories")
            count = f"{len(stories)} stor{'y' if len(stories) == 1 else 'ies'}" if isinstance(stories, list) else "? stories"
            detail = f"{value.get('request_id', '?')}: {count}, batch_size {value.get('batch_size', '?')}" + (
                " (course correction)" if value.get("course_correction") else ""
            )
        fields: dict[str, Any] = {"detail": detail}
        if (surplus := _surplus_inputs(attrs)) is not None:
            fields = _rejected(fields, surplus)
        elif attrs.signal_name in _RESIDENT_MODELS:  # the resident validates it with this model
            msg_type, model = _RESIDENT_MODELS[attrs.signal_name]
            reason = _invalid(msg_type, model, decode(attrs.input))
            fields = _rejected(fields, reason) if reason else fields
        add(
            event,
            type=attrs.signal_name.upper(),
            sender=sender,
            recipient=role,
            story=value.get("story_key"),
            payload=value,
            **fields,
        )
    return out


def _not_delivered(attrs: Any) -> str:
    """Why a signal to another workflow failed (SignalExternalWorkflowExecutionFailed), in words."""
    causes = {number: name for name, number in SignalExternalWorkflowExecutionFailedCause.items()}
    cause = causes.get(attrs.cause, str(attrs.cause))
    return cause.removeprefix("SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED_CAUSE_").lower().replace("_", " ")


def _request_detail(value: dict[str, Any]) -> str:
    """A research or browser request on one line: its id and question (query, or operation and url)."""
    what = value.get("query") if "query" in value else " ".join(str(value[k]) for k in ("operation", "url") if value.get(k))
    return _cut(f"{value.get('request_id', '?')}: " + " ".join(str(what or "").split()), 120)


def _result_detail(value: dict[str, Any]) -> str:
    """A research or browser answer on one line: its id, status and answer (or error)."""
    said = value.get("error") or value.get("answer") or (json.dumps(value["result_data"], default=str)
                                                          if value.get("result_data") else "")
    said = " ".join(str(said).split())
    return _cut(f"{value.get('request_id', '?')}: {value.get('status', '?')}" + (f": {_cut(said, 100)}" if said else ""), 160)


def message_flow(histories: Iterable[WorkflowHistory]) -> list[FlowMessage]:
    """All messages of a sprint's histories (Master runs and Slaves, in any order), by time."""
    messages: list[FlowMessage] = []
    for history in histories:
        events = list(history.events)
        if not events:
            continue
        start = events[0].workflow_execution_started_event_attributes
        if start.workflow_type.name == "SprintSlaveWorkflow":
            messages.extend(_slave_messages(history.workflow_id, events))
        elif start.workflow_type.name == "ResidentWorkflow":
            messages.extend(_resident_messages(history.workflow_id, events))
        else:
            messages.extend(_master_messages(history.workflow_id, events))
    flow = sorted(messages, key=lambda m: (m.time, m.workflow_id, m.event_id))
    # A sprint is planned once: each Master run after a continue-as-new moves to phase `running` too (the mark of
    # the plan in a run's history), and is no new plan. One is shown, when the first run planned, with the plan
    # read best among the runs' (the last run's report, a continued run's carried plan, then the first run's).
    plans: dict[str, list[FlowMessage]] = {}
    for m in flow:
        if m.type == "BATCH_PLAN_READY":
            plans.setdefault(m.workflow_id, []).append(m)
    shown: dict[str, FlowMessage] = {}
    for workflow_id, found in plans.items():
        best = min(found, key=lambda m: _PLAN_SOURCES.get(m.payload.get("source"), len(_PLAN_SOURCES)))
        shown[workflow_id] = found[0].model_copy(update={"detail": best.detail, "payload": best.payload})
    return [
        shown[m.workflow_id] if m.type == "BATCH_PLAN_READY" else m
        for m in flow
        if m.type != "BATCH_PLAN_READY" or m is plans[m.workflow_id][0]
    ]


# Where a BATCH_PLAN_READY's plan was read (its payload's `source`), the best first (none: not found).
_PLAN_SOURCES = {s: rank for rank, s in enumerate(("report", "carried", "answer", "fallback", "batches started so far"))}


def filter_messages(
    messages: Iterable[FlowMessage],
    *,
    story: str | None = None,
    agent: str | None = None,
    types: Sequence[str] = (),
) -> list[FlowMessage]:
    """Keep the messages of one story (full or short key), one agent type, some message types."""
    wanted = {t.upper() for t in types}
    kept = []
    for m in messages:
        if story and not (m.story and (m.story == story or m.story.startswith(story + "-"))):
            continue
        if agent and m.agent != agent and m.sender != agent and m.recipient != agent:
            continue
        if wanted and m.type not in wanted:
            continue
        kept.append(m)
    return kept


def export_paths(messages: Sequence[FlowMessage]) -> list[tuple[str, FlowMessage]]:
    """`<agent>/<TYPE>_<NNN>.json` for each message (the Agent-PO persistence layout), numbered in
    time order per agent and type."""
    counters: dict[tuple[str, str], int] = {}
    paths = []
    for m in messages:
        key = (m.owner, m.type)
        counters[key] = counters.get(key, 0) + 1
        paths.append((f"{file_safe(m.owner)}/{m.type}_{counters[key]:03d}.json", m))
    return paths


def file_safe(name: str) -> str:
    """A readable file or folder name for an id (a sprint, an agent): anything but letters, digits, `-_.` is `_`."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def file_safe_unique(name: str) -> str:
    """file_safe, and unique: an id it changed gets 8 hex digits of its sha1 (sprints `a/b` and `a_b` would
    share one file otherwise); an id it leaves alone stays as it is."""
    safe = file_safe(name)
    if safe.startswith("."):  # `.`, `..`, a hidden name: never a path step, never another id's twin
        safe = "_" + safe.lstrip(".")
    return safe if safe == name else f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


class AgentStats(BaseModel):
    agent: str
    dispatches: int = 0
    answered: int = 0
    failures: int = 0
    tokens: int = 0
    total_seconds: float = 0.0

    @property
    def average_seconds(self) -> float:
        return self.total_seconds / self.answered if self.answered else 0.0

    @property
    def unanswered(self) -> int:
        """Dispatches no answer came for: the agent timed out, or the sprint was cancelled while it ran."""
        return max(self.dispatches - self.answered, 0)


def agent_performance(messages: Sequence[FlowMessage]) -> list[AgentStats]:
    """Per agent type: dispatches, answers, failures, tokens and time from assignment to answer."""
    stats: dict[str, AgentStats] = {}
    assigned: dict[str, datetime] = {}
    agent_of: dict[str, str] = {}  # dispatch id -> the agent it went to
    for m in messages:
        if not m.agent or m.rejected:  # a rejected answer was never acted on
            continue
        # An answer counts for the agent its dispatch went to, whatever agent_type it names itself (an
        # external agent's wrong agent_type made a dev-runner dispatch look unanswered).
        agent = m.agent if m.type == "TASK_ASSIGNMENT" else agent_of.get(m.dispatch_id or "", m.agent)
        s = stats.setdefault(agent, AgentStats(agent=agent))
        if m.type == "TASK_ASSIGNMENT":
            s.dispatches += 1
            if m.dispatch_id:
                assigned[m.dispatch_id] = m.time
                agent_of[m.dispatch_id] = m.agent
        elif m.type == "AGENT_COMPLETE":
            s.answered += 1
            s.tokens += int(m.payload.get("tokens_used", 0) or 0)
            if m.payload.get("status") == "failure":
                s.failures += 1
            if m.dispatch_id in assigned:
                s.total_seconds += (m.time - assigned.pop(m.dispatch_id)).total_seconds()
        elif m.type == "AGENT_FAILURE":
            s.failures += 1
    return [stats[k] for k in sorted(stats)]
