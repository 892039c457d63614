"""The debugger's pure rules: when to debug, the transition after a DEBUG_RESULT, error signatures and the journal."""

from __future__ import annotations

from bso.config import resolve_config
from bso.debugging import (
    DebugRequest,
    DebugResult,
    after_debug,
    error_signature,
    known_result,
    render_entry,
    simulated_analysis,
    wants_debug,
)
from bso.dispatch import CODE_REVIEW, DEV, FIX, Outcome, next_dispatch
from bso.messages import AgentComplete
from bso.models import StoryProgress
from bso.states import AgentStatus


def failed(step, error="boom at line 12") -> AgentComplete:
    return AgentComplete(
        dispatch_id="d", story_key="1-1", agent_type=step.agent_type, mode=step.mode,
        status=AgentStatus.FAILURE, error=error, tokens_used=10,
    )


def request(error="boom at line 12", attempt=1) -> DebugRequest:
    return DebugRequest(debug_id="DBG-b1-1-1-001", story_key="1-1-x", error_summary=error, report_to="s", attempt=attempt)


def test_wants_debug_only_for_dev_runner_failures_with_attempts_left():
    p = StoryProgress(key="1-1-x", state="ready-for-dev")
    config = resolve_config({})
    assert wants_debug(DEV, failed(DEV), p, config) and wants_debug(FIX, failed(FIX), p, config)
    assert not wants_debug(CODE_REVIEW, failed(CODE_REVIEW), p, config)
    assert not wants_debug(DEV, failed(DEV), p.model_copy(update={"debug_attempts": 1}), config)
    assert not wants_debug(DEV, failed(DEV), p, resolve_config({"max_debug_attempts": 0}))


def test_fixable_result_dispatches_a_fix_with_the_analysis():
    p = StoryProgress(key="1-1-x", state="ready-for-dev")
    t = after_debug(p, DEV, failed(DEV), simulated_analysis(request(), "fixable"))
    assert t.outcome is Outcome.FIX_REQUESTED and t.progress.state == "needs-fix"
    assert next_dispatch(t.progress) == FIX
    assert t.progress.debug_attempts == 1 and t.progress.tokens_used == 10
    assert "root cause" in t.progress.fix_findings[0].summary


def test_unfixable_unavailable_or_missing_result_needs_intervention():
    p = StoryProgress(key="1-1-x", state="ready-for-dev")
    for result, why in (
        (simulated_analysis(request(), "unfixable"), "found no fix"),
        (DebugResult(debug_id="D", story_key="1-1-x", status="unavailable", error="down"), "debugger unavailable: down"),
        (None, "no answer"),
    ):
        t = after_debug(p, DEV, failed(DEV), result, "no answer")
        assert t.progress.state == "needs-intervention" and why in t.progress.error


def test_error_signature_ignores_numbers():
    assert error_signature("Boom at line 12 (0xdeadbeef)") == error_signature("boom at line 99  (0x1234)")


def test_known_result_comes_from_a_journal_entry_with_the_same_signature():
    entry = render_entry("E1", request(), simulated_analysis(request(), "fixable"), "now")
    found = known_result("# Debug journal\n\n" + entry, request("Boom at line 40", attempt=2))
    assert found is not None and found.known_pattern and found.fixable and found.journal_entry_id == "E1"
    assert known_result(entry, request("something else entirely")) is None
