"""The BSO messages that cross a Temporal boundary, as pydantic models.

Each model is a seed message (bso-message-protocol-v2.md, bso-sprint-slave-spec.md): the dispatch
assignment an agent activity receives, the AGENT_COMPLETE an agent answers with (a signal on the Slave),
the Scrum Master's BATCH_PLAN_READY and the Slave's SLAVE_BATCH_COMPLETE.

Below them: every message type of all five seeds (BSO V2 + Slave spec, Agent-PO, message-schemas, Gear 2)
in one envelope, as one discriminated union over `type` (`parse_message`, `MESSAGE_ADAPTER`), with each
seed's native shape accepted (`normalize_message`) and validation errors rendered the seeds' way
(`validation_failed`, `invalid_message`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from bso.states import AgentMode, AgentStatus, AgentType, Severity, Verdict

MAX_SUMMARY_CHARS = 2_000
MAX_FINDINGS = 200


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Finding(_Message):
    severity: Severity
    summary: str = Field(max_length=MAX_SUMMARY_CHARS)
    file: str | None = None
    line: int | None = Field(default=None, ge=0)

    @field_validator("severity", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Gear 2's review criteria and the most each may score (they add up to 100).
CRITERIA_MAX: dict[str, int] = {
    "code_quality": 30,
    "test_coverage": 25,
    "security": 20,
    "documentation": 15,
    "acceptance_criteria": 10,
}


class CriteriaScores(_Strict):
    code_quality: int = Field(0, ge=0, le=30)
    test_coverage: int = Field(0, ge=0, le=25)
    security: int = Field(0, ge=0, le=20)
    documentation: int = Field(0, ge=0, le=15)
    acceptance_criteria: int = Field(0, ge=0, le=10)

    @property
    def total(self) -> int:
        return self.code_quality + self.test_coverage + self.security + self.documentation + self.acceptance_criteria


class FeedbackItem(_Message):
    """One review remark (Gear 2's PR_FEEDBACK `feedback` item)."""

    severity: Literal["blocking", "suggestion"]
    category: str = Field(min_length=1, max_length=100)
    file: str | None = None
    line: int | None = Field(None, ge=0)
    issue: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS)
    suggestion: str = Field("", max_length=MAX_SUMMARY_CHARS)


# The longest dispatch id or story key an answer may carry: the sprint id is held to what fits
# (bso.constants.MAX_SPRINT_ID_CHARS).
MAX_ID_CHARS = 200


def story_key_too_long(key: str) -> str | None:
    """Why a sprint leaves this story out, or None: its agents' answers could not name it."""
    if len(key) <= MAX_ID_CHARS:
        return None
    return (
        f"{key[:60]}...: a story key of {len(key)} characters (at most {MAX_ID_CHARS}: an agent's answer names its "
        "story) is left out of the sprint; rename it in sprint-status.yaml and its story file"
    )
# No agent run reads and writes a billion tokens (a long Claude Code session is tens of millions, its cache reads
# included): an answer claiming more is refused (bso.dispatch.implausible_tokens).
MAX_TOKENS_PER_ANSWER = 1_000_000_000


class AgentComplete(_Message):
    """AGENT_COMPLETE: an agent's answer to one dispatch, sent to the Slave as the `agent_complete` signal."""

    msg_type: Literal["AGENT_COMPLETE"] = "AGENT_COMPLETE"
    dispatch_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    story_key: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    agent_type: AgentType
    mode: AgentMode
    status: AgentStatus
    verdict: Verdict | None = None
    findings: list[Finding] = Field(default_factory=list, max_length=MAX_FINDINGS)
    tokens_used: int = Field(0, ge=0)
    summary: str = Field("", max_length=MAX_SUMMARY_CHARS)
    error: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)
    # Scored reviews (Gear 2), all optional: a review-runner may score the work and name blocking issues.
    criteria_scores: CriteriaScores | None = None
    score: int | None = Field(None, ge=0, le=100)  # defaults to the sum of criteria_scores when given
    blocking_issues: list[str] = Field(default_factory=list, max_length=MAX_FINDINGS)
    feedback: list[FeedbackItem] = Field(default_factory=list, max_length=MAX_FINDINGS)
    # Gear 2's AGENT_ERROR, for a failure: what kind of error, and whether a retry or a human could fix it.
    error_type: str | None = Field(None, max_length=200)
    recoverable: bool = True
    # Agent-PO gates: the dev-runner's PLAN_SUBMISSION (plan phase) or COMPLETION_REPORT (implementation),
    # the seed's flat payload; validated by the Slave against PlanSubmissionPayload / CompletionReportPayload.
    po_message: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _score_from_criteria(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("score") is None and isinstance(data.get("criteria_scores"), dict):
            criteria = data["criteria_scores"]
            if all(isinstance(criteria.get(k, 0), int) and not isinstance(criteria.get(k, 0), bool)
                   for k in CRITERIA_MAX):
                data = {**data, "score": sum(criteria.get(k, 0) for k in CRITERIA_MAX)}
        return data

    @property
    def blocking(self) -> list[str]:
        """Every blocking issue: `blocking_issues` and the `feedback` items of severity blocking."""
        items = [f"{f.file}:{f.line}: {f.issue}" if f.file else f.issue for f in self.feedback if f.severity == "blocking"]
        return [*self.blocking_issues, *(i for i in items if i not in self.blocking_issues)]


class RejectedMessage(_Message):
    """A message that failed validation or did not match anything pending: recorded, never acted on."""

    msg_type: str
    reason: str
    dispatch_id: str | None = None
    # message-schemas' validation_failed, seed-shaped ({type, error_type, original_message_id, errors}),
    # when the message failed validation.
    error: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        """The sender's text in it is cut: a workflow keeps 50 rejections in its status and carries the Master's
        into its next run, and a few signals of megabytes (an id, an invalid value) would take those over
        Temporal's payload limit (the hand-over's workflow task then fails for good)."""
        if not isinstance(data, dict):
            return data
        bounded = dict(data)
        for name, limit in (("msg_type", 100), ("reason", 1000), ("dispatch_id", MAX_ID_CHARS)):
            if isinstance(bounded.get(name), str):
                bounded[name] = cut_text(bounded[name], limit)
        error = bounded.get("error")
        if isinstance(error, dict):
            if isinstance(error.get("errors"), list):
                error = {**error, "errors": error["errors"][:MAX_REJECTED_ERRORS]}
            bounded["error"] = map_strings(error, lambda text: cut_text(text, 300))
        return bounded


MAX_REJECTED_ERRORS = 20  # of a rejection's validation_failed errors, the first ones are kept
MAX_REJECTED_KEPT = 50  # a workflow keeps the last ones in its status (the count goes on)


def rejected_invalid(msg_type: str, raw: Any, err: ValidationError) -> RejectedMessage:
    """A message that failed validation, recorded with the seed's validation_failed naming each field."""
    answer = validation_failed(raw, err)
    return RejectedMessage(msg_type=msg_type, reason=f"validation_failed: {answer.describe()}", error=answer.to_seed())


# The Master's signals (workflows/sprint_master.py and its mixins; a test keeps this in step with them).
MASTER_SIGNALS = frozenset(
    {"story_update", "story_updates", "pause", "resume", "shutdown_request", "resident_ready", "resident_stopped",
     "plan_result"}
)
# Answers that go to the batch (Slave) that asked: its workflow id is the start of the dispatch id.
_BATCH_ANSWERS = {"agent_complete": "AGENT_COMPLETE", "debug_result": "DEBUG_RESULT"}


def unknown_signal_to_sprint(name: str, payload: Any) -> RejectedMessage:
    """A signal the Master has no handler for, recorded as rejected instead of lost; an agent's answer sent to the
    sprint rather than to its batch says which batch (the TASK_ASSIGNMENT's report_to) would take it."""
    fields = payload if isinstance(payload, dict) else {}
    dispatch_id = fields.get("dispatch_id") if isinstance(fields.get("dispatch_id"), str) else None
    if name in _BATCH_ANSWERS:
        batch = dispatch_id.rsplit("/", 2)[0] if dispatch_id and dispatch_id.count("/") >= 3 else None
        where = f"send it to {batch}" if batch else "send it to the batch's workflow"
        reason = (f"{_BATCH_ANSWERS[name]} sent to the sprint, which takes no agent answers: {where} "
                  "(the TASK_ASSIGNMENT's report_to)")
        return RejectedMessage(msg_type=_BATCH_ANSWERS[name], reason=reason, dispatch_id=dispatch_id)
    if name == "decision":  # an operator's: the sprint takes it as an update
        return RejectedMessage(msg_type="DECISION", reason="a decision goes to the sprint's `decide` update "
                               "(`bso sprint decide`), not a signal")
    known = ", ".join(sorted(MASTER_SIGNALS))
    return RejectedMessage(msg_type=name.upper(), reason=f"the sprint has no signal {name!r} (it takes: {known})",
                           dispatch_id=dispatch_id)


def rejected_inputs(kind: str, name: str, given: int, problem: str) -> str:
    """Why a signal or update was refused before its handler ran: the inputs it was sent do not fit it (two
    `--input`s to `temporal workflow signal`, say). `problem` is Python's own word on the call."""
    inputs = "no input" if given == 0 else "1 input" if given == 1 else f"{given} inputs"
    return f"{kind} {name!r} sent with {inputs}, which it cannot take ({problem}): ignored"


# The Master takes a story update only from the running batch that holds the story (bso.message_flow reads the
# rule off histories with this marker: one naming no running batch, sent by hand, set the story's view before).
PATCH_STORY_UPDATE_FROM_ITS_BATCH = "master-story-update-from-its-batch"
# A plan_result for no plan request in flight (late, or forged) is ignored: kept, such answers piled up for good,
# and one sent before its request was taken for the answer. (Recorded where it first ignores one: bso.message_flow
# reads the rule off histories with this marker.)
PATCH_PLAN_ANSWER_AWAITED = "master-plan-answer-awaited"


def plan_answer_not_awaited(request_id: str) -> str:
    return f"no plan request {request_id!r} awaits an answer"


def plan_answer_timeout_summary(request_id: str) -> str:
    """The summary of the timer that ends the Master's wait for a plan answer (bso.message_flow reads it)."""
    return f"plan answer {request_id}: timeout"


def story_update_not_from_its_batch(story_key: str, batch_id: int) -> str:
    """Why the Master ignores a STORY_UPDATE: only the running batch that holds the story tells how it goes."""
    return f"{story_key} is not a story of a running batch {batch_id}: only its batch tells the sprint how it goes"


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, strings...) with `fn` applied to every string in it, keys too."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(map_strings(v, fn) for v in value)
    return value


def keep_rejected(kept: list[RejectedMessage], message: RejectedMessage) -> list[RejectedMessage]:
    return [*kept, message][-MAX_REJECTED_KEPT:]


def cut_text(text: str, limit: int) -> str:
    """`text` in at most `limit` characters, a cut one ending in "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation_error(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()
    )


class TaskAssignment(_Message):
    """AGENT_DISPATCH_REQUEST + TASK_ASSIGNMENT (P51 unified dispatch): all an agent needs to start."""

    msg_type: Literal["TASK_ASSIGNMENT"] = "TASK_ASSIGNMENT"
    dispatch_id: str
    agent_type: AgentType
    mode: AgentMode
    story_key: str
    story_path: str  # relative to project_root
    session_id: str
    batch_id: int
    report_to: str  # workflow id of the Slave that waits for AGENT_COMPLETE
    project_root: str
    resident_contacts: dict[str, str] = Field(default_factory=dict)
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    # The sprint's status file (as the sprint was given it; None: the default): agents must not change it.
    status_file: str | None = None
    # Which call of this mode this is for the story (1-based): the simulated agents' script index.
    mode_round: int = 1
    fix_findings: list[Finding] = Field(default_factory=list)
    # The last review's feedback items and blocking issues (scored reviews): what the fix must address.
    fix_feedback: list[FeedbackItem] = Field(default_factory=list)
    # message-schemas' priority; the Slave starts the agent activity with the matching Temporal priority.
    priority: Literal["critical", "high", "normal", "low"] | None = None
    story_title: str = ""
    backend: str = "simulated"
    # The part of the simulation script that concerns this story (small by construction).
    simulation: dict[str, Any] = Field(default_factory=dict)
    # Agent-PO gates (empty when off): phase (plan | implement | fix), attempt, the story's AC ids and file
    # scope, and the PO's last directive (FEEDBACK, GO_DIRECTIVE, FIX_DIRECTIVE + anti-patterns).
    po: dict[str, Any] = Field(default_factory=dict)
    # True: an agent that answers in-process (simulated, command) returns its AGENT_COMPLETE as the
    # activity's result instead of signalling it (a signal, its workflow task and a deadline timer less
    # per dispatch). Agents that answer by themselves (external) still signal.
    answer_in_result: bool = False


class DispatchReceipt(_Message):
    """What the agent activity returns: whether it delivered AGENT_COMPLETE itself, and the answer
    itself when the assignment asked for it in the result (the Slave validates it like the signal)."""

    dispatch_id: str
    delivered: bool
    replayed_from_ledger: bool = False
    answer: dict[str, Any] | None = None


class BatchSpec(_Message):
    batch_id: int
    stories: list[str]


class BatchPlanReady(_Message):
    msg_type: Literal["BATCH_PLAN_READY"] = "BATCH_PLAN_READY"
    session_id: str
    total_stories: int
    batches: list[BatchSpec]
    dependency_graph: dict[str, dict[str, list[str]]] = Field(default_factory=dict)


class SlaveBatchComplete(_Message):
    msg_type: Literal["SLAVE_BATCH_COMPLETE"] = "SLAVE_BATCH_COMPLETE"
    batch_id: int
    session_id: str
    stories_completed: list[str]
    stories_failed: list[str]
    batch_report: str


# =================================================================================================
# Every message of the five seeds, in one envelope, as one discriminated union over `type`.
#
# Families (the value of `type`):
#   BSO V2 + Slave spec ........ AGENT_CREATE_REQUEST ... RESEARCH_RESULT (payload = the seed's flat JSON)
#   Agent-PO ................... PLAN_SUBMISSION ... ERROR (payload = the seed's flat JSON minus timestamp)
#   message-schemas ............ query, response, notification, collaboration, broadcast, ack, error
#   Gear 2 ..................... task_assigned ... agent_error (payload = the seed's `payload`)
# `parse_message(raw)` accepts the envelope and each seed's native shape (see `normalize_message`).
# =================================================================================================

MESSAGE_ID_PATTERN = r"^msg-[a-f0-9]{8}$"
_ID_RE = re.compile(MESSAGE_ID_PATTERN[1:-1])


class MessagePriority(StrEnum):
    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class Topic(StrEnum):
    REQUIREMENTS = "requirements"
    ARCHITECTURE = "architecture"
    CODE_CHANGE = "code_change"
    TESTING = "testing"
    SECURITY = "security"
    REVIEW = "review"
    PERFORMANCE = "performance"
    RELEASE = "release"
    WORKFLOW = "workflow"


# message-schemas.md: the agents that may send its messages.
SchemaAgent = Literal[
    "orchestrator", "pm-agent", "architect-agent", "go-coder-agent", "test-agent", "security-agent",
    "reviewer-agent", "optimizer-agent", "devops-agent",
]
Recipient = Union[str, list[str]]


class _Payload(BaseModel):
    """A message body: unknown keys are ignored (the seeds say agents ignore what they do not know)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Envelope(BaseModel):
    """The one envelope every message travels in (message-schemas.md's base schema, for all seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str = Field(pattern=MESSAGE_ID_PATTERN)
    type: str
    sender: str | None = Field(default=None, alias="from", min_length=1, max_length=200)
    to: Recipient | None = None
    timestamp: datetime | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    in_reply_to: str | None = None
    priority: MessagePriority = MessagePriority.NORMAL
    requires_response: bool = False
    topic: Topic | None = None
    native_id: str | None = None  # the seed's own id when it did not fit the pattern (Gear 2's msg_abc123)

    @field_validator("to")
    @classmethod
    def _recipients(cls, value: Recipient | None) -> Recipient | None:
        if isinstance(value, list) and not value:
            raise ValueError("at least one recipient")
        if isinstance(value, str) and not value:
            raise ValueError("empty recipient")
        return value


# --- BSO V2 + Slave spec -------------------------------------------------------------------------


class AgentCreateRequestPayload(_Payload):
    agent_type: AgentType
    role_hint: str = Field(min_length=1, max_length=500)
    requested_by: str = Field(min_length=1)


class AgentCreatedPayload(_Payload):
    agent_name: str = Field(min_length=1)
    agent_type: AgentType


class AgentDestroyRequestPayload(_Payload):
    agent_name: str = Field(min_length=1)


class AgentDestroyedPayload(_Payload):
    agent_name: str = Field(min_length=1)


class Roster(_Payload):
    residents: list[str] = Field(default_factory=list)
    slaves: list[str] = Field(default_factory=list)
    temps: list[str] = Field(default_factory=list)


class AgentRosterBroadcastPayload(_Payload):
    session_id: str = Field(min_length=1)
    roster: Roster


class TaskAssignmentPayload(_Payload):
    """TASK_ASSIGNMENT as the seed sends it (BSO's own TaskAssignment adds dispatch id, batch, backend)."""

    story_key: str = Field(min_length=1)
    story_path: str = Field(min_length=1)
    mode: AgentMode
    session_id: str = Field(min_length=1)
    report_to: str = Field(min_length=1)
    resident_contacts: dict[str, str] = Field(default_factory=dict)
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    dispatch_id: str | None = None
    agent_type: AgentType | None = None


class AgentDispatchRequestPayload(_Payload):
    """P51: everything the Master needs to create an agent that starts at once."""

    agent_type: AgentType
    story_key: str = Field(min_length=1)
    mode: AgentMode
    session_id: str = Field(min_length=1)
    report_to: str = Field(min_length=1)
    resident_contacts: dict[str, str] = Field(default_factory=dict)
    config_overrides: dict[str, Any] = Field(default_factory=dict)


class CourseCorrectionPayload(_Payload):
    """SM -> Master: the re-plan of the pending stories (batch ids continue after the current batch)."""

    session_id: str = Field(min_length=1)
    batches: list[BatchSpec]
    stories_added: list[str] = Field(default_factory=list)
    stories_dropped: list[str] = Field(default_factory=list)
    reason: str = ""


class CcReason(StrEnum):
    USER_REQUEST = "user_request"
    REPEATED_FAILURES = "repeated_failures"
    NEW_REQUIREMENTS = "new_requirements"


class CcTriggerPayload(_Payload):
    session_id: str | None = None
    reason: CcReason
    add_stories: list[str] = Field(default_factory=list)
    drop_stories: list[str] = Field(default_factory=list)
    details: str = Field("", max_length=MAX_SUMMARY_CHARS)


class Confidence(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class DebugRequestPayload(_Payload):
    debug_id: str = Field(min_length=1)
    story_key: str = Field(min_length=1)
    agent_type: AgentType
    error_summary: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS)
    stack_trace: str = ""
    test_output: str = ""
    severity_hint: Severity | None = None

    @field_validator("severity_hint", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class DebugResultPayload(_Payload):
    debug_id: str = Field(min_length=1)
    story_key: str = Field(min_length=1)
    root_cause: str = Field(min_length=1)
    fix_suggestion: str = ""
    severity: Severity
    confidence: Confidence
    journal_entry_id: str | None = None

    @field_validator("severity", "confidence", mode="before")
    @classmethod
    def _case(cls, value: Any, info: Any) -> Any:
        if not isinstance(value, str):
            return value
        return value.upper() if info.field_name == "severity" else value.lower()


class BrowserOperation(StrEnum):
    NAVIGATE = "navigate"
    CLICK = "click"
    FILL = "fill"
    SCREENSHOT = "screenshot"
    WAIT_FOR = "wait_for"
    READ_TEXT = "read_text"


class BrowserRequestPayload(_Payload):
    request_id: str = Field(min_length=1)
    operation: BrowserOperation
    url: str | None = None
    selector: str | None = None
    input_value: str | None = None
    screenshot_path: str | None = None

    @model_validator(mode="after")
    def _operands(self) -> BrowserRequestPayload:
        if self.operation is BrowserOperation.NAVIGATE and not self.url:
            raise ValueError("navigate needs a url")
        if self.operation in (BrowserOperation.CLICK, BrowserOperation.FILL) and not self.selector:
            raise ValueError(f"{self.operation.value} needs a selector")
        if self.operation is BrowserOperation.FILL and self.input_value is None:
            raise ValueError("fill needs an input_value")
        return self


class BrowserResultPayload(_Payload):
    request_id: str = Field(min_length=1)
    status: Literal["success", "failure"]
    result_data: dict[str, Any] = Field(default_factory=dict)
    screenshot_path: str | None = None
    error: str | None = None


class ResearchRequestPayload(_Payload):
    request_id: str = Field(min_length=1)
    story_key: str | None = None
    topic: str = Field(min_length=1, max_length=500)
    question: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS)
    report_to: str | None = None


class ResearchResultPayload(_Payload):
    request_id: str = Field(min_length=1)
    status: Literal["success", "partial", "failure"] = "success"
    summary: str = Field("", max_length=MAX_SUMMARY_CHARS * 5)
    report_path: str | None = None
    sources: list[str] = Field(default_factory=list)
    cached: bool = False


# --- Agent-PO ------------------------------------------------------------------------------------


class _PoPayload(_Payload):
    agent_id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class AcMapping(_Payload):
    ac_id: str = Field(min_length=1)
    implementation: str = Field(min_length=1)
    file: str | None = None
    line_estimate: str | None = None


class FileToModify(_Payload):
    path: str = Field(min_length=1)
    changes: str = ""


class TestApproach(_Payload):
    unit_tests: list[str] = Field(default_factory=list)
    integration_tests: list[str] = Field(default_factory=list)


class Plan(_Payload):
    approach: str = Field(min_length=1)
    ac_mapping: list[AcMapping]
    files_to_modify: list[FileToModify]
    test_approach: TestApproach


class PlanSubmissionPayload(_PoPayload):
    plan: Plan
    questions: list[str] = Field(default_factory=list)
    revision: int = Field(1, ge=1)


class ProgressUpdatePayload(_PoPayload):
    status: str = Field(min_length=1)
    progress_percent: int = Field(ge=0, le=100)
    current_activity: str = ""
    files_modified: list[str] = Field(default_factory=list)
    issues: list[Any] = Field(default_factory=list)
    eta_minutes: int | None = Field(None, ge=0)


class ReportSummary(_Payload):
    started_at: datetime
    completed_at: datetime
    duration_minutes: float = Field(ge=0)


class AcVerification(_Payload):
    ac_id: str = Field(min_length=1)
    status: Literal["PASS", "FAIL"]
    evidence: str = ""
    tested: bool = False


class TestFileResult(_Payload):
    file: str
    passed: int = Field(ge=0)
    failed: int = Field(ge=0)


class TestResults(_Payload):
    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    skipped: int = Field(0, ge=0)
    details: list[TestFileResult] = Field(default_factory=list)


class FileChanged(_Payload):
    path: str = Field(min_length=1)
    action: Literal["added", "modified", "deleted", "renamed"]
    lines_added: int = Field(0, ge=0)
    lines_removed: int = Field(0, ge=0)


class CompletionReportPayload(_PoPayload):
    summary: ReportSummary
    ac_verification: list[AcVerification]
    test_results: TestResults
    files_changed: list[FileChanged]
    issues: list[Any] = Field(default_factory=list)
    recommendations: list[str] = Field(default_factory=list)


class BlockedDetails(_Payload):
    issue: str = ""
    attempts: list[str] = Field(default_factory=list)
    blocking_since: datetime | None = None


class BlockedNotificationPayload(_PoPayload):
    """Sent both ways: an agent reports a blocker, or the PO marks the task blocked after max retries."""

    reason: str = Field(min_length=1)
    details: BlockedDetails = BlockedDetails()
    suggested_action: str = ""


class GoValidation(_Payload):
    plan_validated: Literal[True]
    ac_coverage: str
    file_scope: str
    test_delta: str


class Authorization(_Payload):
    authorized_files: list[str]
    timeout_minutes: int = Field(gt=0)


class GoDirectivePayload(_PoPayload):
    status: Literal["GO"] = "GO"
    validation: GoValidation
    authorization: Authorization
    message: str = ""


class GateIssue(_Payload):
    """An issue a gate found (FEEDBACK / FIX_DIRECTIVE): a type, a message, and whatever it refers to."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(min_length=1)
    message: str = Field(min_length=1)
    ac_id: str | None = None


class IssueList(_Payload):
    issues: list[GateIssue] = Field(min_length=1)


class FeedbackPayload(_PoPayload):
    status: Literal["NEEDS_REVISION"] = "NEEDS_REVISION"
    validation: IssueList
    guidance: str = ""
    revision_required: bool = True
    max_revisions: int = Field(2, ge=1)
    current_revision: int = Field(ge=1)


class NextValidation(_Payload):
    report_validated: Literal[True]
    ac_verified: str
    tests_passed: bool
    scope_verified: bool


class NextSummary(_Payload):
    criteria_met: int = Field(ge=0)
    tests_passed: int = Field(ge=0)
    files_changed: int = Field(ge=0)


class Cleanup(_Payload):
    worktree: str
    branch: str


class NextDirectivePayload(_PoPayload):
    status: Literal["NEXT"] = "NEXT"
    validation: NextValidation
    summary: NextSummary
    message: str = ""
    cleanup: Cleanup | None = None


class RetryInfo(_Payload):
    count: int = Field(ge=1)
    max: int = Field(ge=1)
    allowed: bool


class FixDirectivePayload(_PoPayload):
    status: Literal["FIX"] = "FIX"
    validation: IssueList
    retry: RetryInfo
    guidance: str = ""
    message: str = ""


class TerminateDirectivePayload(_PoPayload):
    reason: str = Field(min_length=1)
    cleanup: Cleanup | None = None
    message: str = ""


class PoErrorBody(_Payload):
    code: Literal["INVALID_MESSAGE"] | str
    message: str = Field(min_length=1)
    original_message_type: str | None = None


class PoErrorPayload(_Payload):
    error: PoErrorBody
    action: str = ""


# --- message-schemas ----------------------------------------------------------------------------


class QueryContext(_Payload):
    file: str | None = None
    line: int | None = None
    function: str | None = None
    related_files: list[str] = Field(default_factory=list)


class QueryPayload(_Payload):
    question: str = Field(min_length=1, max_length=500)
    context: QueryContext | None = None
    expected_format: Literal["text", "code", "json", "yaml"] = "text"


class ResponsePayload(_Payload):
    answer: str | None = None
    code: str | None = None
    reference: str | None = None
    confidence: float | None = Field(None, ge=0, le=1)
    alternatives: list[str] = Field(default_factory=list)


NotificationEvent = Literal[
    "file_created", "file_modified", "build_started", "build_completed", "build_failed", "test_started",
    "test_completed", "test_failed", "vulnerability_found", "review_started", "review_issue", "phase_change",
    "checkpoint_created", "error_occurred",
]


class NotificationPayload(_Payload):
    event: NotificationEvent
    severity: Literal["info", "warning", "error", "critical"] | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    affected_files: list[str] = Field(default_factory=list)
    action_required: bool = False


class CollaborationTarget(_Payload):
    file: str | None = None
    function: str | None = None
    line_start: int | None = None
    line_end: int | None = None


class CollaborationPayload(_Payload):
    request: Literal[
        "fix_code", "add_test", "update_test", "fix_vulnerability", "add_documentation", "refactor",
        "optimize", "review_change",
    ]
    description: str = Field(min_length=1, max_length=1000)
    target: CollaborationTarget | None = None
    acceptance_criteria: list[str] = Field(default_factory=list)
    deadline_step: int | None = None
    blocking: bool = False


class BroadcastPayload(_Payload):
    event: Literal[
        "session_start", "session_end", "phase_change", "checkpoint_created", "rollback_initiated",
        "emergency_stop", "configuration_change",
    ]
    context: dict[str, Any] = Field(default_factory=dict)
    instructions: str | None = None


class AckPayload(_Payload):
    received: Literal[True] = True
    will_act: bool | None = None
    notes: str | None = None


# --- Gear 2 -------------------------------------------------------------------------------------


class TaskAssignedPayload(_Payload):
    task_id: str = Field(min_length=1)
    description: str = Field(min_length=1)
    acceptance_criteria: list[str] = Field(default_factory=list)
    dependencies: list[str] = Field(default_factory=list)
    estimated_hours: float | None = Field(None, ge=0)


class TaskCompletedPayload(_Payload):
    task_id: str = Field(min_length=1)
    pr_number: int | None = Field(None, ge=1)
    final_score: int | None = Field(None, ge=0, le=100)
    total_iterations: int | None = Field(None, ge=1)
    approved: bool = True
    completion_time: datetime | None = None
    files_generated: list[str] = Field(default_factory=list)
    status: str | None = None


class PrSubmittedPayload(_Payload):
    task_id: str = Field(min_length=1)
    pr_url: str = Field(min_length=1)
    pr_number: int = Field(ge=1)
    branch_name: str | None = None
    files_changed: list[str] = Field(default_factory=list)
    files_added: int = Field(0, ge=0)
    files_modified: int = Field(0, ge=0)
    lines_added: int = Field(0, ge=0)
    lines_deleted: int = Field(0, ge=0)
    iteration: int = Field(1, ge=1)


class PrFeedbackPayload(_Payload):
    task_id: str = Field(min_length=1)
    pr_number: int = Field(ge=1)
    iteration: int = Field(1, ge=1)
    score: int = Field(ge=0, le=100)
    approved: bool = False
    blocking_issues: list[str] = Field(default_factory=list)
    suggestions: list[str] = Field(default_factory=list)
    feedback: list[FeedbackItem] = Field(default_factory=list)
    criteria_scores: CriteriaScores | None = None


class PrApprovedPayload(_Payload):
    task_id: str = Field(min_length=1)
    pr_number: int = Field(ge=1)
    score: int | None = Field(None, ge=0, le=100)
    iteration: int = Field(1, ge=1)


class ImprovementRequestedPayload(_Payload):
    improvement_id: str = Field(min_length=1)
    description: str = Field(min_length=1)
    category: str = ""
    priority: Literal["critical", "high", "medium", "low"] = "medium"
    impact: Literal["high", "medium", "low"] | None = None
    effort_hours: float | None = Field(None, ge=0)
    priority_score: float = Field(ge=0, le=10)
    rationale: str = ""
    affected_files: list[str] = Field(default_factory=list)
    acceptance_criteria: list[str] = Field(default_factory=list)


class ImprovementCompletedPayload(_Payload):
    improvement_id: str = Field(min_length=1)
    pr_number: int | None = Field(None, ge=1)
    final_score: int | None = Field(None, ge=0, le=100)
    approved: bool = True


class AgentReadyPayload(_Payload):
    agent_id: str | None = None
    role: str | None = None
    capabilities: list[str] = Field(default_factory=list)


class AgentErrorPayload(_Payload):
    error_type: str = Field(min_length=1)
    error_message: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS * 5)
    task_id: str | None = None
    task_description: str = ""
    stack_trace: str = ""
    recoverable: bool = False
    context: dict[str, Any] = Field(default_factory=dict)


# --- the typed messages -------------------------------------------------------------------------


def _msg(name: str, type_value: str, payload_model: type[BaseModel], doc: str, **overrides: Any) -> type[Envelope]:
    """One message class: the envelope with `type` fixed and `payload` typed."""
    annotations: dict[str, Any] = {"type": Literal[type_value], "payload": payload_model}  # type: ignore[valid-type]
    namespace: dict[str, Any] = {"__annotations__": annotations, "__doc__": doc, "__module__": __name__}
    namespace["type"] = type_value
    for field_name, (annotation, default) in overrides.items():
        annotations[field_name] = annotation
        namespace[field_name] = default
    return type(name, (Envelope,), namespace)


_REQUIRED_FROM = (str, Field(alias="from", min_length=1, max_length=200))
_REQUIRED_TO = (Recipient, Field())
_REQUIRED_TS = (datetime, Field())

# BSO (flat seed JSON under `payload`)
BSO_MESSAGES: dict[str, tuple[type[BaseModel], str]] = {
    "AGENT_CREATE_REQUEST": (AgentCreateRequestPayload, "Slave -> Master: request a temp agent"),
    "AGENT_CREATED": (AgentCreatedPayload, "Master -> Slave: temp agent created"),
    "AGENT_DESTROY_REQUEST": (AgentDestroyRequestPayload, "Slave -> Master: request temp agent destruction"),
    "AGENT_DESTROYED": (AgentDestroyedPayload, "Master -> Slave: temp agent destroyed"),
    "AGENT_ROSTER_BROADCAST": (AgentRosterBroadcastPayload, "Master -> residents: the full roster"),
    "TASK_ASSIGNMENT": (TaskAssignmentPayload, "Slave -> temp agent: the business context"),
    "AGENT_DISPATCH_REQUEST": (AgentDispatchRequestPayload, "Slave -> Master: unified dispatch (P51)"),
    "AGENT_COMPLETE": (AgentComplete, "Temp agent -> Slave: the result of one dispatch"),
    "SLAVE_BATCH_COMPLETE": (SlaveBatchComplete, "Slave -> Master: batch report"),
    "BATCH_PLAN_READY": (BatchPlanReady, "SM -> Master: batch plan"),
    "COURSE_CORRECTION": (CourseCorrectionPayload, "SM -> Master: course-correction re-plan"),
    "CC_TRIGGER": (CcTriggerPayload, "Master -> SM: user-triggered course correction"),
    "DEBUG_REQUEST": (DebugRequestPayload, "Any -> debugger: debug analysis request"),
    "DEBUG_RESULT": (DebugResultPayload, "Debugger -> requester: debug analysis result"),
    "BROWSER_REQUEST": (BrowserRequestPayload, "Any -> E2E live: browser operation"),
    "BROWSER_RESULT": (BrowserResultPayload, "E2E live -> requester: browser operation result"),
    "RESEARCH_REQUEST": (ResearchRequestPayload, "Any -> knowledge researcher: research request"),
    "RESEARCH_RESULT": (ResearchResultPayload, "Knowledge researcher -> requester: research result"),
}
PO_MESSAGES: dict[str, tuple[type[BaseModel], str]] = {
    "PLAN_SUBMISSION": (PlanSubmissionPayload, "Agent -> PO: implementation plan (before GO)"),
    "PROGRESS_UPDATE": (ProgressUpdatePayload, "Agent -> PO: current status"),
    "COMPLETION_REPORT": (CompletionReportPayload, "Agent -> PO: task completion"),
    "BLOCKED_NOTIFICATION": (BlockedNotificationPayload, "Agent -> PO: blocker; PO -> agent: task blocked"),
    "GO_DIRECTIVE": (GoDirectivePayload, "PO -> agent: implementation authorized"),
    "FEEDBACK": (FeedbackPayload, "PO -> agent: plan needs revision"),
    "NEXT_DIRECTIVE": (NextDirectivePayload, "PO -> agent: completion approved"),
    "FIX_DIRECTIVE": (FixDirectivePayload, "PO -> agent: fixes needed"),
    "TERMINATE_DIRECTIVE": (TerminateDirectivePayload, "PO -> agent: end"),
}
SCHEMA_MESSAGES: dict[str, tuple[type[BaseModel], str]] = {
    "query": (QueryPayload, "Request for information from another agent"),
    "response": (ResponsePayload, "Reply to a query"),
    "notification": (NotificationPayload, "One-way notification"),
    "collaboration": (CollaborationPayload, "Request for another agent to perform a task"),
    "broadcast": (BroadcastPayload, "Message sent to all agents"),
    "ack": (AckPayload, "Receipt of a notification or broadcast"),
}
GEAR2_MESSAGES: dict[str, tuple[type[BaseModel], str]] = {
    "task_assigned": (TaskAssignedPayload, "Moderator -> TechLead: a task"),
    "task_completed": (TaskCompletedPayload, "Moderator -> TechLead: task approved and completed"),
    "pr_submitted": (PrSubmittedPayload, "TechLead -> Moderator: a PR (or a new iteration)"),
    "pr_feedback": (PrFeedbackPayload, "Moderator -> TechLead: scored review, changes needed"),
    "pr_approved": (PrApprovedPayload, "Moderator -> TechLead: PR approved"),
    "improvement_requested": (ImprovementRequestedPayload, "Moderator -> TechLead: an improvement task"),
    "improvement_completed": (ImprovementCompletedPayload, "Moderator -> TechLead: improvement merged"),
    "agent_ready": (AgentReadyPayload, "Agent -> bus: initialised"),
    "agent_error": (AgentErrorPayload, "Agent -> other: an exception was caught"),
}


def _class_name(type_value: str) -> str:
    return "".join(part.capitalize() for part in type_value.lower().split("_")) + "Message"


MESSAGE_CLASSES: dict[str, type[Envelope]] = {}
for _t, (_p, _d) in BSO_MESSAGES.items():
    MESSAGE_CLASSES[_t] = _msg(_class_name(_t), _t, _p, _d)
for _t, (_p, _d) in PO_MESSAGES.items():
    # Agent-PO: "Valid timestamp format" is part of every message's validation.
    MESSAGE_CLASSES[_t] = _msg(_class_name(_t), _t, _p, _d, timestamp=_REQUIRED_TS)
MESSAGE_CLASSES["ERROR"] = _msg("PoErrorMessage", "ERROR", PoErrorPayload, "PO -> agent: invalid message")
for _t, (_p, _d) in SCHEMA_MESSAGES.items():
    _over: dict[str, Any] = {"sender": (SchemaAgent, Field(alias="from")), "to": _REQUIRED_TO, "timestamp": _REQUIRED_TS}
    if _t in ("query", "collaboration"):
        _over["requires_response"] = (bool, True)
    if _t in ("notification", "broadcast"):
        _over["requires_response"] = (Literal[False], False)
    if _t == "broadcast":
        _over["to"] = (Literal["*"], Field())
    if _t in ("response", "ack"):
        _over["in_reply_to"] = (str, Field(min_length=1))
    if _t == "query":
        _over["timeout_ms"] = (int, Field(5000, ge=1000, le=30000))
    if _t == "response":
        _over["status"] = (Literal["success", "partial", "unable", "error"], "success")
    if _t == "ack":
        _over["payload"] = (AckPayload, AckPayload())
    MESSAGE_CLASSES[_t] = _msg(_class_name(_t), _t, _p, _d, **_over)
for _t, (_p, _d) in GEAR2_MESSAGES.items():
    MESSAGE_CLASSES[_t] = _msg(
        _class_name(_t), _t, _p, _d, sender=_REQUIRED_FROM, to=(str, Field(min_length=1)), timestamp=_REQUIRED_TS
    )


# --- message-schemas' error messages (type "error", one per error_type) --------------------------


class _ErrorMessage(Envelope):
    type: Literal["error"] = "error"
    id: str | None = Field(default=None, pattern=MESSAGE_ID_PATTERN)  # type: ignore[assignment]
    original_message_id: str | None = None

    def to_seed(self) -> dict[str, Any]:
        """The error as message-schemas.md prints it: no unset envelope fields."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key, default in (("priority", "normal"), ("requires_response", False)):
            if data.get(key) == default:
                del data[key]
        return data


class DeliveryFailed(_ErrorMessage):
    """A message could not be delivered; retried up to max_retries."""

    error_type: Literal["delivery_failed"] = "delivery_failed"
    reason: str = Field(min_length=1)
    retry_count: int = Field(ge=0)
    max_retries: int = Field(ge=0)
    next_retry_at: datetime | None = None


class ResponseTimeout(_ErrorMessage):
    """A query's timeout_ms passed without a response."""

    error_type: Literal["response_timeout"] = "response_timeout"
    waited_ms: int = Field(ge=0)
    recipient: str = Field(min_length=1)


class FieldError(_Strict):
    field: str
    error: str


class ValidationFailed(_ErrorMessage):
    """A message failed validation: each bad field and what is wrong with it."""

    error_type: Literal["validation_failed"] = "validation_failed"
    errors: list[FieldError] = Field(min_length=1)

    def describe(self) -> str:
        return "; ".join(f"{e.field}: {e.error}" for e in self.errors)


ErrorMessage = Annotated[Union[DeliveryFailed, ResponseTimeout, ValidationFailed], Field(discriminator="error_type")]
EnvelopeUnion = Annotated[
    Union[tuple([*MESSAGE_CLASSES.values(), ErrorMessage])],  # type: ignore[misc]
    Field(discriminator="type"),
]
MESSAGE_ADAPTER: TypeAdapter[Envelope] = TypeAdapter(EnvelopeUnion)
MESSAGE_TYPES: tuple[str, ...] = (*MESSAGE_CLASSES, "error")
ERROR_TYPES: tuple[str, ...] = ("delivery_failed", "response_timeout", "validation_failed")

_ENVELOPE_KEYS = frozenset(
    {"id", "type", "from", "to", "timestamp", "session_id", "correlation_id", "in_reply_to", "priority",
     "requires_response", "topic", "payload", "native_id"}
)


def derived_message_id(raw: Any) -> str:
    """A deterministic `msg-xxxxxxxx` for a message that has none (hash of its content)."""
    try:
        text = json.dumps(raw, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(raw)
    return "msg-" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8]


def _fit_id(native: Any, out: dict[str, Any]) -> None:
    if isinstance(native, str) and native and not _ID_RE.fullmatch(native):
        out["native_id"] = native
        out["id"] = derived_message_id(native)
    else:
        out["id"] = native


def normalize_message(raw: Any) -> Any:
    """Each seed's native shape -> the envelope. Anything else is returned as is (validation says why).

    - BSO (`msg_type` key, flat): type = msg_type, payload = the other keys (the whole message for
      models that carry `msg_type` themselves), id derived from the content. An agent's answer as sent in the
      `agent_complete` signal (`dispatch_id` and `status`, no type key) is an AGENT_COMPLETE.
    - Agent-PO (`message_type` in upper case, flat): type = message_type, timestamp to the envelope,
      payload = the other keys, id derived from the content.
    - Gear 2 (`message_type` in lower case with `message_id`, `from_agent`, `to_agent`, `payload`).
    - The envelope itself (`type` key) passes through; an id that does not fit `msg-xxxxxxxx` is not
      rewritten there (the envelope is the strict form).
    """
    if not isinstance(raw, dict) or "type" in raw:
        return raw
    if not ({"msg_type", "message_type"} & raw.keys()) and {"dispatch_id", "status"} <= raw.keys():
        raw = {"msg_type": "AGENT_COMPLETE", **raw}  # an `agent_complete` signal's payload, as the Slave takes it
    if "msg_type" in raw and isinstance(raw["msg_type"], str):
        msg_type = raw["msg_type"]
        body = {k: v for k, v in raw.items() if k != "msg_type"}
        if msg_type in ("AGENT_COMPLETE", "SLAVE_BATCH_COMPLETE", "BATCH_PLAN_READY", "TASK_ASSIGNMENT"):
            body = dict(raw) if msg_type != "TASK_ASSIGNMENT" else body
        out: dict[str, Any] = {"id": derived_message_id(raw), "type": msg_type, "payload": body}
        if isinstance(raw.get("session_id"), str):
            out["session_id"] = raw["session_id"]
        return out
    message_type = raw.get("message_type")
    if not isinstance(message_type, str):
        return raw
    if message_type in MESSAGE_CLASSES and message_type.isupper():
        body = {k: v for k, v in raw.items() if k not in ("message_type", "timestamp")}
        out = {"id": derived_message_id(raw), "type": message_type, "payload": body}
        if "timestamp" in raw:
            out["timestamp"] = raw["timestamp"]
        return out
    out = {"type": message_type}
    _fit_id(raw.get("message_id"), out)
    renames = {"from_agent": "from", "to_agent": "to"}
    for key, value in raw.items():
        if key in ("message_type", "message_id"):
            continue
        out[renames.get(key, key)] = value
    return out


def parse_message(raw: Any) -> Envelope:
    """Validate one message (envelope or a seed's native shape); raises pydantic's ValidationError."""
    return MESSAGE_ADAPTER.validate_python(normalize_message(raw))


# --- rendering validation errors the seeds' way --------------------------------------------------

_TAGS = frozenset(MESSAGE_TYPES) | frozenset(ERROR_TYPES)


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = list(loc)
    while parts and isinstance(parts[0], str) and parts[0] in _TAGS:
        parts = parts[1:]  # the discriminated union's tags: not fields of the message
    rendered = ""
    for part in parts:
        if isinstance(part, int):
            rendered += f"[{part}]"
        else:
            rendered += ("." if rendered else "") + str(part)
    return rendered or "(message)"


def _error_text(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field missing"
    if kind in ("literal_error", "enum", "union_tag_invalid"):
        value = error.get("input")
        if kind == "union_tag_invalid":
            value = (error.get("ctx") or {}).get("tag", value)
        return f"invalid value: {value}"
    if kind == "union_tag_not_found":
        return "required field missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return "must be an object"
    return str(error["msg"])


def field_errors(err: ValidationError, flat: bool = False) -> list[FieldError]:
    """Each error as (field, error); `flat` for a native flat message (fields named without `payload.`)."""
    out: list[FieldError] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        if e["type"] in ("union_tag_not_found", "union_tag_invalid"):
            loc = (*loc, str((e.get("ctx") or {}).get("discriminator", "type")).strip("'"))
        field = _field_path(loc)
        if flat and field.startswith("payload."):
            field = field[len("payload."):]  # the sender's own (flat) shape has no `payload`
        out.append(FieldError(field=field, error=_error_text(e)))
    return out


def _is_flat_native(raw: Any) -> bool:
    """BSO (`msg_type`) and Agent-PO (upper-case `message_type`) messages carry their fields at top level."""
    if not isinstance(raw, dict) or "type" in raw:
        return False
    if isinstance(raw.get("msg_type"), str):
        return True
    message_type = raw.get("message_type")
    return isinstance(message_type, str) and message_type.isupper()


def original_id(raw: Any) -> str | None:
    """The id an error about `raw` names as its original_message_id (an answer's own, or its dispatch id)."""
    if not isinstance(raw, dict):
        return None
    for key in ("id", "message_id", "dispatch_id"):
        if isinstance(raw.get(key), str):
            return raw[key]
    return None


def validation_failed(raw: Any, err: ValidationError) -> ValidationFailed:
    """message-schemas.md's validation error for a message that failed validation."""
    return ValidationFailed(original_message_id=original_id(raw), errors=field_errors(err, _is_flat_native(raw)))


def _original_type(raw: Any) -> str | None:
    if isinstance(raw, dict):
        for key in ("message_type", "msg_type", "type"):
            if isinstance(raw.get(key), str):
                return raw[key]
    return None


def invalid_message(raw: Any, err: ValidationError) -> dict[str, Any]:
    """Agent-PO's ERROR / INVALID_MESSAGE answer, in the seed's own (flat) shape."""
    errors = field_errors(err, _is_flat_native(raw))
    first = errors[0]
    text = (
        f"Missing required field: {first.field}"
        if first.error == "required field missing"
        else f"Invalid field {first.field}: {first.error}"
    )
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return {
        "message_type": "ERROR",
        "error": {"code": "INVALID_MESSAGE", "message": text, "original_message_type": _original_type(raw)},
        "action": "Please resubmit with all required fields",
    }
