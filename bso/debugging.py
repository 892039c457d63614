"""The debugger's protocol (DEBUG_REQUEST / DEBUG_RESULT) and rules, pure.

When a dev-runner (dev or fix) reports failure with an error, the Slave does not give the story up at
once: it sends a DEBUG_REQUEST to the debugger resident (a signal), which analyses the failure (an
activity; known error patterns are matched from the debug journal first) and answers with a DEBUG_RESULT
signal (`debug_result`). A fixable result sends the story to `needs-fix`: the dev-runner is dispatched in
fix mode with the root cause and the fix suggestion among its findings. At most `max_debug_attempts` per
story; after that, or when the debugger finds no fix or is unavailable, the story needs intervention.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bso.config import SprintConfig
from bso.dispatch import (
    DEV,
    FIX,
    SETUP_ERROR_TYPE,
    DispatchStep,
    Outcome,
    Transition,
    _settled,
    failed_verification,
    fix_after_failed_verification,
    intervention,
)
from bso.messages import AgentComplete, Finding
from bso.models import StoryProgress
from bso.story_keys import SHORT_KEY_RE, STORY_KEY_RE
from bso.states import AgentStatus, Severity, StoryState

JOURNAL = "debug-journal.md"  # in .sprint-session/ (P49)
MAX_TEXT = 4000


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class DebugRequest(_Message):
    msg_type: Literal["DEBUG_REQUEST"] = "DEBUG_REQUEST"
    debug_id: str = Field(min_length=1, max_length=200)
    # A story key (`N-M-slug`) or its short form: the journal (and the next analyses it feeds) records it.
    story_key: str = Field(min_length=1)
    agent_type: str = "dev-runner"
    error_summary: str = Field("", max_length=MAX_TEXT)
    stack_trace: str = Field("", max_length=MAX_TEXT)
    test_output: str = Field("", max_length=MAX_TEXT)
    severity_hint: Severity = Severity.HIGH
    report_to: str = Field(min_length=1)  # the requester's workflow id: DEBUG_RESULT goes there
    session_id: str = ""
    attempt: int = Field(1, ge=1)  # the story's debug attempt (the simulated debugger's script index)
    timeout_ms: int | None = Field(None, ge=1000, le=30000)  # message-schemas' query timeout (None: none)
    priority: Literal["critical", "high", "normal", "low"] | None = None  # message-schemas: the analysis activity's Temporal priority

    @field_validator("story_key")
    @classmethod
    def _a_story_key(cls, value: str) -> str:
        # The sprint's own grammar (Python's re, as the status file's parse): what the Slave sends always passes.
        if not (STORY_KEY_RE.match(value) or SHORT_KEY_RE.match(value)):
            raise ValueError(f"{value[:80]!r} is not a story key (N-M or N-M-slug)")
        return value


class DebugResult(_Message):
    msg_type: Literal["DEBUG_RESULT"] = "DEBUG_RESULT"
    debug_id: str
    story_key: str
    root_cause: str = ""
    fix_suggestion: str = ""
    severity: Severity = Severity.HIGH
    confidence: Literal["high", "medium", "low", "none"] = "medium"
    journal_entry_id: str | None = None
    known_pattern: bool = False  # matched from the journal, no new analysis
    status: Literal["analysed", "unavailable"] = "analysed"
    error: str | None = None

    @property
    def fixable(self) -> bool:
        return self.status == "analysed" and self.confidence != "none" and bool(self.fix_suggestion)


def debug_id_for(batch_id: int, story_short_key: str, attempt: int) -> str:
    return f"DBG-b{batch_id}-{story_short_key}-{attempt:03d}"


def wants_debug(
    step: DispatchStep,
    answer: AgentComplete,
    progress: StoryProgress,
    config: SprintConfig,
    *,
    setup_errors: bool = False,
    unrecoverable_errors: bool = False,
) -> bool:
    """A dev-runner failure with an error, and debug attempts left for the story. Not an error its agent marked
    `recoverable: false` (Gear 2: nothing a fix round mends), such as an agent that could not start at all (a
    missing CLI, a broken profile: the user's setup, not the code). A Slave from before replays as it ran:
    `setup_errors` (before PATCH_NO_DEBUG_FOR_SETUP) and `unrecoverable_errors` (before
    PATCH_NO_DEBUG_FOR_UNRECOVERABLE) let those through."""
    if is_setup_error(answer):
        let_through = setup_errors
    else:
        let_through = answer.recoverable or unrecoverable_errors
    return (
        step in (DEV, FIX)
        and answer.status is AgentStatus.FAILURE
        and bool(answer.error or answer.summary)
        and progress.debug_attempts < config.max_debug_attempts
        and let_through
    )


def is_setup_error(answer: AgentComplete) -> bool:
    return answer.error_type == SETUP_ERROR_TYPE


def debug_request_for(
    progress: StoryProgress, step: DispatchStep, answer: AgentComplete, debug_id: str, report_to: str, session_id: str
) -> DebugRequest:
    error = answer.error or answer.summary or "agent reported failure"
    return DebugRequest(
        debug_id=debug_id,
        story_key=progress.key,
        agent_type=step.agent_type.value,
        error_summary=error[:MAX_TEXT],
        test_output=(answer.summary or "")[:MAX_TEXT],
        report_to=report_to,
        session_id=session_id,
        attempt=progress.debug_attempts + 1,
    )


def awaiting_debug(progress: StoryProgress, debug_id: str) -> StoryProgress:
    """The story while the debugger analyses its failure: the dev-runner is done, nothing else in flight.

    For the status views only: the story's transition is still made from its progress before the request."""
    return progress.model_copy(
        update={"pending_agent": None, "pending_mode": None, "pending_debug_id": debug_id}
    )


def after_debug(
    progress: StoryProgress,
    step: DispatchStep,
    answer: AgentComplete,
    result: DebugResult | None,
    why_none: str = "",
    config: SprintConfig | None = None,
) -> Transition:
    """The story after its debug round: a fix dispatch with the analysis, or needs-intervention.

    A failed verification (bso.dispatch.failed_verification; needs `config`) goes to a fix whatever the
    debugger said: with the debugger's finding when it has one, always with the failing output."""
    failure = f"{step.agent_type.value}/{step.mode.value} failed: {answer.error or answer.summary}"
    progress = progress.model_copy(update={"debug_attempts": progress.debug_attempts + 1})
    if config is not None and failed_verification(step, answer):
        if result is not None and result.fixable:
            note = f"; debugger {result.debug_id}: {result.root_cause}"
            return fix_after_failed_verification(progress, step, answer, config, [_debug_finding(result)], note)
        why = why_none if result is None else (result.error or f"{result.debug_id} found no fix")
        return fix_after_failed_verification(progress, step, answer, config, note=f"; debugger: {why}")
    if result is None:
        return intervention(progress, f"{failure}; debugger gave no answer ({why_none})", answer.tokens_used)
    if result.status == "unavailable":
        return intervention(progress, f"{failure}; debugger unavailable: {result.error}", answer.tokens_used)
    if not result.fixable:
        return intervention(
            progress,
            f"{failure}; debugger {result.debug_id} found no fix ({result.root_cause or 'root cause unknown'})",
            answer.tokens_used,
        )
    finding = _debug_finding(result)
    return Transition(
        _settled(
            progress,
            answer.tokens_used,
            state=StoryState.NEEDS_FIX.value,
            fix_pending=False,
            fix_findings=[finding],
            fix_rounds=progress.fix_rounds + 1,
        ),
        Outcome.FIX_REQUESTED,
        f"{failure}; debugger {result.debug_id}: {result.root_cause} -> fix",
    )


def _debug_finding(result: DebugResult) -> Finding:
    return Finding(
        severity=result.severity,
        summary=(
            f"{result.debug_id} root cause: {result.root_cause}. Fix suggestion: {result.fix_suggestion}"
        )[:2000],
    )


# --- the journal (pure text; the activity does the file I/O) ---------------------------------------


def error_signature(error_summary: str) -> str:
    """The error with its volatile parts (numbers, hex ids, paths' line numbers, quotes) normalised, so the
    same failure matches across runs."""
    text = error_summary.strip().lower()
    text = re.sub(r"0x[0-9a-f]+", "<hex>", text)
    text = re.sub(r"\d+", "<n>", text)
    text = re.sub(r"\s+", " ", text)
    return text[:300]


_ENTRY_RE = re.compile(
    r"^## (?P<entry>\S+)\n(?P<body>.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL
)
_FIELD_RE = re.compile(r"^- (?P<key>[a-z_]+): (?P<value>.*)$", re.MULTILINE)


def _one_line(text: str) -> str:
    """A journal field's value on its one line: a line break in a request's text cannot start a forged entry."""
    return " ".join(text.split())


def journal_entry_id(request: DebugRequest) -> str:
    """The request's entry in the journal: its debug id and sprint, one word (the entry's heading)."""
    return "-".join(f"{request.debug_id}-{request.session_id or 'sprint'}".split())


def render_entry(entry_id: str, request: DebugRequest, result: DebugResult, when: str) -> str:
    fields = {
        "debug_id": result.debug_id,
        "when": when,
        "session": request.session_id,
        "story": request.story_key,
        "agent": request.agent_type,
        "signature": error_signature(request.error_summary),
        "error": _one_line(request.error_summary)[:500],
        "root_cause": result.root_cause,
        "fix_suggestion": result.fix_suggestion,
        "severity": result.severity.value,
        "confidence": result.confidence,
        "known_pattern": "yes" if result.known_pattern else "no",
    }
    lines = [f"## {entry_id}", *(f"- {key}: {_one_line(value)}" for key, value in fields.items()), ""]
    return "\n".join(lines) + "\n"


def journal_entries(journal_text: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Each section of the journal, oldest first: its heading's entry id and its fields. A heading counts only at
    a line's start (an error's text that quotes one stays on its `error` line)."""
    for match in _ENTRY_RE.finditer(journal_text):
        yield match.group("entry"), {m.group("key"): m.group("value").strip() for m in _FIELD_RE.finditer(match.group("body"))}


def result_of_entry(entry_id: str, fields: dict[str, str], request: DebugRequest, *, known_pattern: bool) -> DebugResult:
    """A journal section's analysis as the answer to `request`."""
    confidence = fields.get("confidence", "low")
    return DebugResult(
        debug_id=request.debug_id,
        story_key=request.story_key,
        root_cause=fields.get("root_cause", ""),
        fix_suggestion=fields.get("fix_suggestion", ""),
        severity=Severity(fields.get("severity", "HIGH")),
        confidence=confidence if confidence in ("high", "medium", "low", "none") else "low",  # type: ignore[arg-type]
        known_pattern=known_pattern,
        journal_entry_id=entry_id,
    )


def known_result(journal_text: str, request: DebugRequest) -> DebugResult | None:
    """The latest analysis in the journal of an error with the same signature, as this request's result."""
    signature = error_signature(request.error_summary)
    found = None
    for entry_id, fields in journal_entries(journal_text):
        if fields.get("signature") == signature and fields.get("known_pattern") == "no":
            found = entry_id, fields
    return None if found is None else result_of_entry(*found, request, known_pattern=True)


def simulated_analysis(request: DebugRequest, outcome: Literal["fixable", "unfixable"]) -> DebugResult:
    fixable = outcome == "fixable"
    cause = request.error_summary[:200]
    return DebugResult(
        debug_id=request.debug_id,
        story_key=request.story_key,
        root_cause=f"simulated root cause of: {cause}"
        if fixable
        else f"simulated analysis could not find the cause of: {cause}",
        fix_suggestion="apply the simulated fix (guard the failing call and cover it with a test)" if fixable else "",
        severity=request.severity_hint,
        confidence="high" if fixable else "none",
    )
