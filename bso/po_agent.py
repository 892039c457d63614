"""Agent-PO gates for agents that run as commands (the `command` backend), as pure rules.

- The TASK_ASSIGNMENT's PO phase (`assignment.po`: plan, or implement / fix = completion) rendered into
  the agent's prompt (templates `bso/prompts/po-plan.md` and `po-complete.md`, overridable per project).
- The agent's answer in `$BSO_RESULT_FILE`: a PLAN_SUBMISSION (plan phase) or COMPLETION_REPORT
  (completion phases) in Agent-PO's flat shape (`message_type`, `timestamp`, the payload's fields), or a
  BLOCKED_NOTIFICATION. Validated with the message models: an invalid one is answered with message-schemas'
  validation_failed (and Agent-PO's ERROR / INVALID_MESSAGE), never acted on.
- The NEXT gate's changed files come from the real git diff of the story's worktree, not from the claim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from string import Template
from typing import Any, Literal

from pydantic import ValidationError

from bso.messages import (
    AgentComplete,
    BlockedNotificationPayload,
    CompletionReportPayload,
    FieldError,
    FileChanged,
    PlanSubmissionPayload,
    TaskAssignment,
    ValidationFailed,
    invalid_message,
    parse_message,
    validation_failed,
)
from bso.states import AgentStatus

PoPhase = Literal["plan", "implement", "fix"]
PLAN_TEMPLATE = "po-plan"
COMPLETION_TEMPLATE = "po-complete"


def po_phase(a: TaskAssignment) -> PoPhase | None:
    phase = a.po.get("phase") if a.po else None
    return phase if phase in ("plan", "implement", "fix") else None  # type: ignore[return-value]


def expected_type(phase: PoPhase) -> str:
    return "PLAN_SUBMISSION" if phase == "plan" else "COMPLETION_REPORT"


# The messages a dev agent writes as its answer in the PO phases; BSO reads them from its result file.
AGENT_ANSWER_TYPES = ("PLAN_SUBMISSION", "COMPLETION_REPORT", "BLOCKED_NOTIFICATION")


def with_read_time(raw: dict[str, Any], at: datetime) -> dict[str, Any]:
    """An agent's answer without a timestamp takes the time BSO read it (the agent need not write one)."""
    if raw.get("message_type") in AGENT_ANSWER_TYPES and "timestamp" not in raw:
        return {**raw, "timestamp": at.isoformat()}
    return raw


def template_name(phase: PoPhase) -> str:
    return PLAN_TEMPLATE if phase == "plan" else COMPLETION_TEMPLATE


def gated_id(dispatch_id: str) -> str:
    """The dispatch the gated attempts belong to: `<slave>/<story>/<n>/impl-2` -> `<slave>/<story>/<n>`."""
    for marker in ("/impl-", "/plan-"):
        if marker in dispatch_id:
            return dispatch_id.rsplit(marker, 1)[0]
    return dispatch_id


# --- the prompt ----------------------------------------------------------------------------------


def _issues(directive: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not isinstance(directive, dict):
        return []
    issues = (directive.get("validation") or {}).get("issues") or []
    return [i for i in issues if isinstance(i, dict)]


def _issue_lines(issues: list[dict[str, Any]]) -> str:
    lines = []
    for i in issues:
        where = f" (file: {i['file']})" if i.get("file") else ""
        lines.append(f"- [{i.get('type', 'issue')}] {i.get('message', '')}{where}")
    return "\n".join(lines)


def plan_example(a: TaskAssignment, at: str) -> dict[str, Any]:
    acs = list(a.po.get("ac_ids") or []) or ["AC-1"]
    return {
        "message_type": "PLAN_SUBMISSION",
        "timestamp": at,
        "agent_id": a.agent_type.value,
        "task_id": a.story_key,
        "revision": int(a.po.get("attempt", 1)),
        "plan": {
            "approach": "how you will implement the story",
            "ac_mapping": [{"ac_id": ac, "implementation": "what implements it", "file": "src/x.py"} for ac in acs],
            "files_to_modify": [{"path": "src/x.py", "changes": "what changes"}],
            "test_approach": {"unit_tests": ["tests/test_x.py"], "integration_tests": []},
        },
        "questions": [],
    }


def report_example(a: TaskAssignment, at: str) -> dict[str, Any]:
    acs = list(a.po.get("ac_ids") or []) or ["AC-1"]
    return {
        "message_type": "COMPLETION_REPORT",
        "timestamp": at,
        "agent_id": a.agent_type.value,
        "task_id": a.story_key,
        "summary": {"started_at": at, "completed_at": at, "duration_minutes": 12},
        "ac_verification": [
            {"ac_id": ac, "status": "PASS", "evidence": "tests/test_x.py::test_y", "tested": True} for ac in acs
        ],
        "test_results": {"passed": 3, "failed": 0, "skipped": 0},
        "files_changed": [{"path": "src/x.py", "action": "modified", "lines_added": 10, "lines_removed": 2}],
        "issues": [],
        "recommendations": [],
    }


def render_po_section(template: str, a: TaskAssignment, result_file: str, at: str) -> str:
    """The PO phase part of the prompt (appended to the agent's own prompt)."""
    phase = po_phase(a)
    if phase is None:
        return ""
    po = a.po
    ac_ids = list(po.get("ac_ids") or [])
    scope = list(po.get("scope") or [])
    authorized = list(po.get("authorized_files") or [])
    feedback = po.get("feedback") if phase == "plan" else po.get("fix")
    previous = _issue_lines(_issues(feedback))
    anti = [str(x) for x in po.get("anti_patterns") or []]
    example = plan_example(a, at) if phase == "plan" else report_example(a, at)
    values = {
        "phase": phase,
        "attempt": str(po.get("attempt", 1)),
        "message_type": expected_type(phase),
        "story_key": a.story_key,
        "result_file": result_file,
        "ac_ids": "\n".join(f"- {ac}" for ac in ac_ids) or "- (the story names none: map what the story asks)",
        "file_scope": "\n".join(f"- `{f}`" for f in scope) or "- (no file scope declared)",
        "authorized_files": "\n".join(f"- `{f}`" for f in authorized) or "- (none)",
        "previous_issues": ("### Issues the PO found in your last attempt\n\n" + previous + "\n") if previous else "",
        "fresh_context": (
            "This retry starts from fresh context: do not repeat what went wrong before.\n" if po.get("fresh_context") else ""
        ),
        "anti_patterns": ("### Anti-patterns of the earlier attempts\n\n" + "\n".join(f"- {x}" for x in anti) + "\n")
        if anti
        else "",
        "example": json.dumps(example, indent=2),
    }
    return Template(template).safe_substitute(values)


# --- the agent's answer --------------------------------------------------------------------------

PO_ANSWER_TYPES = ("PLAN_SUBMISSION", "COMPLETION_REPORT", "BLOCKED_NOTIFICATION")


def is_po_answer(raw: Any) -> bool:
    """The result file holds an Agent-PO message (not an AGENT_COMPLETE)."""
    return isinstance(raw, dict) and raw.get("message_type") in PO_ANSWER_TYPES


@dataclass(frozen=True)
class PoAnswer:
    """What the result file said: a valid PO message, a blocker, or a validation failure."""

    kind: Literal["valid", "blocked", "invalid"]
    payload: dict[str, Any] | None = None
    blocked_reason: str = ""
    failure: ValidationFailed | None = None
    error_message: dict[str, Any] = field(default_factory=dict)  # Agent-PO's ERROR / INVALID_MESSAGE


def parse_po_answer(raw: dict[str, Any], phase: PoPhase, at: datetime) -> PoAnswer:
    """Validate the agent's PO message (a missing timestamp is the time BSO read it)."""
    wanted = expected_type(phase)
    got = raw.get("message_type")
    if got not in (wanted, "BLOCKED_NOTIFICATION"):
        failure = ValidationFailed(
            original_message_id=None,
            errors=[FieldError(field="message_type", error=f"invalid value: {got} (expected {wanted})")],
        )
        error = {
            "message_type": "ERROR",
            "error": {
                "code": "INVALID_MESSAGE",
                "message": f"Invalid field message_type: expected {wanted} in the {phase} phase",
                "original_message_type": str(got),
            },
            "action": f"Please resubmit a {wanted}",
        }
        return PoAnswer(kind="invalid", failure=failure, error_message=error)
    msg = with_read_time(raw, at)
    try:
        parsed = parse_message(msg)
    except ValidationError as err:
        return PoAnswer(kind="invalid", failure=validation_failed(msg, err), error_message=invalid_message(msg, err))
    payload = parsed.payload  # type: ignore[attr-defined]
    if isinstance(payload, BlockedNotificationPayload):
        detail = f": {payload.details.issue}" if payload.details.issue else ""
        return PoAnswer(kind="blocked", blocked_reason=f"{payload.reason}{detail}")
    assert isinstance(payload, PlanSubmissionPayload | CompletionReportPayload)
    return PoAnswer(kind="valid", payload=payload.model_dump(mode="json"))


def po_complete(a: TaskAssignment, answer: PoAnswer, summary: str) -> AgentComplete:
    """The AGENT_COMPLETE the Slave receives for a PO phase dispatch."""
    base = AgentComplete(
        dispatch_id=a.dispatch_id, story_key=a.story_key, agent_type=a.agent_type, mode=a.mode,
        status=AgentStatus.SUCCESS, summary=summary[:400],
    )
    if answer.kind == "valid":
        return base.model_copy(update={"po_message": answer.payload})
    if answer.kind == "blocked":
        return base.model_copy(
            update={"status": AgentStatus.FAILURE, "error": f"agent BLOCKED: {answer.blocked_reason}"[:1900],
                    "error_type": "blocked"}
        )
    assert answer.failure is not None
    return po_message_refused(base, answer.failure.describe())


def po_message_refused(answer: AgentComplete, why: str) -> AgentComplete:
    """A successful answer whose PO message is refused: without it, the Slave's gate finds no valid message and
    reports this error (never acted on). A failed answer keeps its own error (the gate reports the failure)."""
    if answer.status is not AgentStatus.SUCCESS:
        return answer.model_copy(update={"po_message": None})
    return answer.model_copy(
        update={"po_message": None, "error": f"validation_failed: {why}"[:1900], "error_type": "validation_failed"}
    )


# --- the real diff -------------------------------------------------------------------------------

_ACTIONS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "C": "added", "T": "modified"}


def parse_name_status(out: str) -> list[FileChanged]:
    """`git diff --name-status -z` -> FileChanged (a rename: the new path)."""
    parts = [p for p in out.split("\x00")]
    files: list[FileChanged] = []
    i = 0
    while i < len(parts):
        code = parts[i]
        if not code:
            i += 1
            continue
        letter = code[0]
        if letter in ("R", "C"):
            if i + 2 >= len(parts):
                break
            path = parts[i + 2]
            i += 3
        else:
            if i + 1 >= len(parts):
                break
            path = parts[i + 1]
            i += 2
        if path:
            files.append(FileChanged(path=path, action=_ACTIONS.get(letter, "modified")))  # type: ignore[arg-type]
    return files


def with_real_diff(report: dict[str, Any], real: list[FileChanged]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The COMPLETION_REPORT with `files_changed` = the real diff; plus what the claim left out and
    what it named that did not change (the agent's line counts are kept for the files it named)."""
    claimed = {f.get("path"): f for f in report.get("files_changed", []) if isinstance(f, dict)}
    real_paths = [f.path for f in real]
    unclaimed = [p for p in real_paths if p not in claimed]
    unchanged = [p for p in claimed if p not in real_paths]
    files = []
    for f in real:
        mine = claimed.get(f.path) or {}
        files.append(
            FileChanged(
                path=f.path, action=f.action,
                lines_added=int(mine.get("lines_added", 0) or 0), lines_removed=int(mine.get("lines_removed", 0) or 0),
            ).model_dump(mode="json")
        )
    return {**report, "files_changed": files}, unclaimed, unchanged
