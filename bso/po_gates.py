"""Agent-PO's two gates on the dev-runner's work (agent-po-message-protocol.md), as pure rules.

- GO gate on a PLAN_SUBMISSION: every acceptance criterion mapped, files to modify inside the story's
  file scope (its `Files:` line; no scope declared = any file), tests planned -> GO_DIRECTIVE (authorized
  files, timeout) or FEEDBACK with the issues; after `max_revisions` revisions: BLOCKED.
- NEXT gate on a COMPLETION_REPORT: every AC with evidence and PASS, no failed test, changed files inside
  the authorized files -> NEXT_DIRECTIVE, or FIX_DIRECTIVE with the issues; after `max_retries`: BLOCKED.

The workflow calls these (deterministic); an activity records the decisions under `.sprint-session/gates/`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.models import GateCounts, SlaveResult
from bso.messages import (
    AcMapping,
    AcVerification,
    Authorization,
    BlockedDetails,
    BlockedNotificationPayload,
    CompletionReportPayload,
    cut_text,
    FeedbackPayload,
    FileChanged,
    FileToModify,
    FixDirectivePayload,
    GateIssue,
    GoDirectivePayload,
    GoValidation,
    IssueList,
    NextDirectivePayload,
    NextSummary,
    NextValidation,
    Plan,
    PlanSubmissionPayload,
    ReportSummary,
    RetryInfo,
    TestApproach,
    TestResults,
)

PO_AGENT_ID = "po"
PlanKind = Literal["good", "missing_ac", "out_of_scope", "no_tests"]
ReportKind = Literal["good", "missing_ac", "out_of_scope", "failing_tests"]


class StoryScope(BaseModel):
    """What the gates check against, read from the story file."""

    model_config = ConfigDict(frozen=True)
    ac_ids: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)  # empty: no scope declared, any file allowed


# Backends whose agents are told the PO phase (plan / implement / fix) and answer with a PO message: the
# command backend renders `assignment.po` into the prompt (+ BSO_PO_PHASE), validates the agent's
# PLAN_SUBMISSION / COMPLETION_REPORT and gives the NEXT gate the real git diff (bso/po_agent.py).
# The simulated backend answers PO phases too, but only when asked (`po_gates_enabled: true`).
PO_CAPABLE_BACKENDS: frozenset[str] = frozenset({"command"})


def gate_totals(results: list[SlaveResult]) -> GateCounts:
    """The Master's sum of its Slaves' gate counters (each batch keeps GO >= NEXT, so the sum does)."""
    return GateCounts(
        go_issued=sum(r.gates_go_issued for r in results),
        next_issued=sum(r.gates_next_issued for r in results),
        feedback_issued=sum(r.gates_feedback_issued for r in results),
        fix_issued=sum(r.gates_fix_issued for r in results),
        blocked=sum(r.gates_blocked for r in results),
    )


def gates_active(enabled: bool | None, backend: str) -> bool:
    """`po_gates_enabled`: explicit true/false, or None = on for the backends in PO_CAPABLE_BACKENDS."""
    return backend in PO_CAPABLE_BACKENDS if enabled is None else enabled


# --- the story file ------------------------------------------------------------------------------

_AC_HEADING = re.compile(r"^#{1,6}\s*acceptance\s+criteria\b.*$", re.IGNORECASE | re.MULTILINE)
_NEXT_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)
_AC_ITEM = re.compile(r"^\s*(?:[-*]\s*)?(?:\*\*)?(?:AC[-\s]?(\d+)|(\d+))[.):]", re.IGNORECASE | re.MULTILINE)


def acceptance_criteria_ids(story_text: str) -> list[str]:
    """AC ids (`AC-1`, `AC-2`, ...) of the numbered items of the story's Acceptance Criteria section."""
    heading = _AC_HEADING.search(story_text)
    if heading is None:
        return []
    rest = story_text[heading.end():]
    end = _NEXT_HEADING.search(rest)
    section = rest[: end.start()] if end else rest
    ids: list[str] = []
    for m in _AC_ITEM.finditer(section):
        ac = f"AC-{int(m.group(1) or m.group(2))}"
        if ac not in ids:
            ids.append(ac)
    return ids


def normalize_ac(ac_id: str) -> str:
    """`AC-1`, `ac1`, `AC 1`, `1` -> `AC-1`; anything else unchanged."""
    m = re.fullmatch(r"\s*(?:AC[-\s]?)?(\d+)\s*", ac_id, re.IGNORECASE)
    return f"AC-{int(m.group(1))}" if m else ac_id.strip()


def _strip_dot(path: str) -> str:
    path = path.strip()
    return path[2:] if path.startswith("./") else path


def in_scope(path: str, scope: list[str]) -> bool:
    """A path is in scope when no scope is declared, or it is a scope file, under a scope directory, or
    matches a scope glob (`src/**`, `tests/test_*.py`)."""
    if not scope:
        return True
    clean = _strip_dot(path)
    for entry in scope:
        e = _strip_dot(entry)
        if clean == e or (e.endswith("/") and clean.startswith(e)) or clean.startswith(e.rstrip("/") + "/"):
            return True
        if e.endswith("/**") and clean.startswith(e[:-2]):
            return True
        if any(c in e for c in "*?[") and fnmatch.fnmatchcase(clean, e):
            return True
    return False


def plan_sha256(plan: PlanSubmissionPayload) -> str:
    return hashlib.sha256(
        json.dumps(plan.plan.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


# --- GO gate -------------------------------------------------------------------------------------


class GoDecision(BaseModel):
    model_config = ConfigDict(frozen=True)
    outcome: Literal["GO", "FEEDBACK", "BLOCKED"]
    issues: list[GateIssue] = Field(default_factory=list)
    go: GoDirectivePayload | None = None
    feedback: FeedbackPayload | None = None
    blocked: BlockedNotificationPayload | None = None


def plan_issues(plan: PlanSubmissionPayload, scope: StoryScope) -> list[GateIssue]:
    issues: list[GateIssue] = []
    mapped = {normalize_ac(m.ac_id) for m in plan.plan.ac_mapping}
    for ac in scope.ac_ids:
        if ac not in mapped:
            issues.append(GateIssue(type="ac_not_mapped", message=f"{ac} is not mapped to any change", ac_id=ac))
    for f in plan.plan.files_to_modify:
        if not in_scope(f.path, scope.files):
            issues.append(
                GateIssue(type="file_out_of_scope", message=f"{f.path} is outside the story's file scope", file=f.path)
            )
    tests = plan.plan.test_approach
    if not tests.unit_tests and not tests.integration_tests:
        issues.append(GateIssue(type="no_tests_planned", message="the plan plans no test"))
    return issues


def go_gate(
    plan: PlanSubmissionPayload,
    scope: StoryScope,
    *,
    revision: int,
    max_revisions: int,
    timeout_minutes: int,
    task_id: str,
) -> GoDecision:
    """`revision`: 1 for the first plan; FEEDBACK allows up to `max_revisions` revised plans after it."""
    issues = plan_issues(plan, scope)
    if not issues:
        files = sorted({f.path for f in plan.plan.files_to_modify})
        go = GoDirectivePayload(
            agent_id=PO_AGENT_ID,
            task_id=task_id,
            validation=GoValidation(
                plan_validated=True,
                ac_coverage=f"{len(scope.ac_ids)}/{len(scope.ac_ids)}",
                file_scope="within scope" if scope.files else "no scope declared",
                test_delta=f"+{len(plan.plan.test_approach.unit_tests) + len(plan.plan.test_approach.integration_tests)}",
            ),
            authorization=Authorization(authorized_files=files, timeout_minutes=max(1, timeout_minutes)),
            message="Plan approved. Implement it within the authorized files.",
        )
        return GoDecision(outcome="GO", go=go)
    if revision > max_revisions:
        return GoDecision(
            outcome="BLOCKED",
            issues=issues,
            blocked=BlockedNotificationPayload(
                agent_id=PO_AGENT_ID,
                task_id=task_id,
                reason=f"plan rejected after {max_revisions} revision(s)",
                details=BlockedDetails(issue="; ".join(i.message for i in issues)),
                suggested_action="a human reviews the story's acceptance criteria and file scope",
            ),
        )
    return GoDecision(
        outcome="FEEDBACK",
        issues=issues,
        feedback=FeedbackPayload(
            agent_id=PO_AGENT_ID,
            task_id=task_id,
            validation=IssueList(issues=issues),
            guidance="Revise the plan: map every acceptance criterion, stay in scope, plan tests.",
            max_revisions=max(1, max_revisions),
            current_revision=revision,
        ),
    )


# --- NEXT gate -----------------------------------------------------------------------------------


class NextDecision(BaseModel):
    model_config = ConfigDict(frozen=True)
    outcome: Literal["NEXT", "FIX", "BLOCKED"]
    issues: list[GateIssue] = Field(default_factory=list)
    next: NextDirectivePayload | None = None
    fix: FixDirectivePayload | None = None
    blocked: BlockedNotificationPayload | None = None


def report_issues(
    report: CompletionReportPayload, scope: StoryScope, authorized_files: list[str]
) -> list[GateIssue]:
    issues: list[GateIssue] = []
    verified = {normalize_ac(v.ac_id): v for v in report.ac_verification}
    for ac in scope.ac_ids:
        v = verified.get(ac)
        if v is None or not v.evidence.strip():
            issues.append(GateIssue(type="ac_no_evidence", message=f"{ac} has no evidence", ac_id=ac))
        elif v.status != "PASS":
            issues.append(GateIssue(type="ac_failed", message=f"{ac} does not pass", ac_id=ac))
    if report.test_results.failed:
        issues.append(GateIssue(type="tests_failed", message=f"{report.test_results.failed} test(s) failed"))
    for f in report.files_changed:  # authorized: the plan's files (a directory or glob there covers its files)
        if not authorized_files or not in_scope(f.path, authorized_files):
            issues.append(
                GateIssue(type="unauthorized_file", message=f"{f.path} was changed without authorization", file=f.path)
            )
    return issues


def next_gate(
    report: CompletionReportPayload,
    scope: StoryScope,
    authorized_files: list[str],
    *,
    retries_used: int,
    max_retries: int,
    task_id: str,
) -> NextDecision:
    """`retries_used`: FIX_DIRECTIVEs already issued for this implementation."""
    issues = report_issues(report, scope, authorized_files)
    if not issues:
        return NextDecision(
            outcome="NEXT",
            next=NextDirectivePayload(
                agent_id=PO_AGENT_ID,
                task_id=task_id,
                validation=NextValidation(
                    report_validated=True,
                    ac_verified=f"{len(scope.ac_ids)}/{len(scope.ac_ids)}",
                    tests_passed=True,
                    scope_verified=True,
                ),
                summary=NextSummary(
                    criteria_met=len(scope.ac_ids),
                    tests_passed=report.test_results.passed,
                    files_changed=len(report.files_changed),
                ),
                message="Completion verified.",
            ),
        )
    if retries_used >= max_retries:
        return NextDecision(
            outcome="BLOCKED",
            issues=issues,
            blocked=BlockedNotificationPayload(
                agent_id=PO_AGENT_ID,
                task_id=task_id,
                reason=f"completion rejected after {max_retries} fix retr{'y' if max_retries == 1 else 'ies'}",
                details=BlockedDetails(issue="; ".join(i.message for i in issues)),
                suggested_action="a human looks at the implementation",
            ),
        )
    count = retries_used + 1
    return NextDecision(
        outcome="FIX",
        issues=issues,
        fix=FixDirectivePayload(
            agent_id=PO_AGENT_ID,
            task_id=task_id,
            validation=IssueList(issues=issues),
            retry=RetryInfo(count=count, max=max(1, max_retries), allowed=True),
            guidance="Fix the issues" + (" starting from fresh context" if count >= 2 else ""),
            message=cut_text(f"fix {len(issues)} issue{'' if len(issues) == 1 else 's'} (retry {count}): "
                              + "; ".join(i.message for i in issues), 500),
        ),
    )


def anti_patterns(earlier: list[list[GateIssue]]) -> list[str]:
    """What the earlier attempts got wrong, for a retry that starts with fresh context."""
    out: list[str] = []
    for attempt, issues in enumerate(earlier, 1):
        for issue in issues:
            line = f"attempt {attempt}: {issue.message}"
            if line not in out:
                out.append(line)
    return out


# --- the simulated dev-runner's plans and reports -----------------------------------------------


def simulated_plan(kind: str, scope: StoryScope, agent_id: str, task_id: str, revision: int) -> PlanSubmissionPayload:
    acs = list(scope.ac_ids) or ["AC-1"]
    if kind == "missing_ac" and len(acs) > 0 and scope.ac_ids:
        acs = acs[:-1]
    files = list(scope.files) or ["src/feature.py"]
    if kind == "out_of_scope":
        files = [*files, "somewhere/else/unrelated.py"]
    tests = TestApproach() if kind == "no_tests" else TestApproach(unit_tests=["tests/test_feature.py"])
    return PlanSubmissionPayload(
        agent_id=agent_id,
        task_id=task_id,
        revision=revision,
        plan=Plan(
            approach=f"simulated plan ({kind})",
            ac_mapping=[AcMapping(ac_id=ac, implementation=f"implements {ac}", file=files[0]) for ac in acs],
            files_to_modify=[FileToModify(path=f, changes="simulated") for f in files],
            test_approach=tests,
        ),
    )


def simulated_report(
    kind: str, scope: StoryScope, authorized_files: list[str], agent_id: str, task_id: str, at: str
) -> CompletionReportPayload:
    acs = list(scope.ac_ids)
    if kind == "missing_ac" and acs:
        acs = acs[:-1]
    files = list(authorized_files)
    if kind == "out_of_scope":
        files = [*files, "somewhere/else/unrelated.py"]
    failed = 1 if kind == "failing_tests" else 0
    return CompletionReportPayload.model_validate(
        {
            "agent_id": agent_id,
            "task_id": task_id,
            "summary": ReportSummary.model_validate(
                {"started_at": at, "completed_at": at, "duration_minutes": 0}
            ).model_dump(mode="json"),
            "ac_verification": [
                AcVerification(ac_id=ac, status="PASS", evidence=f"simulated test for {ac}", tested=True).model_dump()
                for ac in acs
            ],
            "test_results": TestResults(passed=max(1, len(acs)), failed=failed).model_dump(),
            "files_changed": [FileChanged(path=f, action="modified").model_dump() for f in files],
        }
    )
