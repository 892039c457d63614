"""bso.answer_size: an answer put in history fits its budget and decides as the whole answer would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bso.answer_size import (
    EMPTY_BLOCKING_ISSUE,
    MAX_ANSWER_HISTORY_BYTES,
    MAX_PATH_CHARS,
    MAX_PO_MESSAGE_BYTES,
    _size,
    fit_for_history,
    without_oversized_po_message,
)
from bso.config import SprintConfig
from bso.dispatch import _fix_feedback, findings_needing_fix, review_shortfalls
from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS, AgentComplete, FeedbackItem, Finding
from bso.states import AgentStatus, Severity, Strictness

WHERE = "/p/.sprint-session/dispatches/d-1.json"


def _review(**fields) -> AgentComplete:
    return AgentComplete(
        dispatch_id="d-1", story_key="1-1-a", agent_type="review-runner", mode="review", status="success", **fields
    )


def test_a_small_clean_answer_is_returned_as_it_is():
    answer = _review(findings=[Finding(severity="HIGH", summary="x", file="a.py")], blocking_issues=["no tests"])
    assert fit_for_history(answer, WHERE) is answer
    bare = _review()
    assert fit_for_history(bare, WHERE) is bare


def test_a_po_message_over_its_bound_is_refused_naming_its_size_and_the_whole_answer():
    """A plan or report is checked whole by its gate: never cut, refused as an invalid message is (no po_message,
    error_type validation_failed), which the gate reports as "no valid PLAN_SUBMISSION (...)"."""
    plan = {"approach": "x" * (MAX_PO_MESSAGE_BYTES - 20)}
    within = _review(po_message=plan)
    assert _size(plan) <= MAX_PO_MESSAGE_BYTES and without_oversized_po_message(within, WHERE) is within
    over = _review(po_message={"approach": "x" * MAX_PO_MESSAGE_BYTES}, summary="plan submitted")
    refused = without_oversized_po_message(over, WHERE)
    assert refused.po_message is None and refused.error_type == "validation_failed"
    assert refused.error == (
        f"validation_failed: po_message: {MAX_PO_MESSAGE_BYTES + 15:,} bytes, over the {MAX_PO_MESSAGE_BYTES:,} "
        f"a workflow's history takes; the whole answer: {WHERE}"
    )
    assert (refused.status, refused.summary) == (over.status, over.summary)
    # A failed answer keeps its own error: a verification failure still asks for its fix round.
    failed = over.model_copy(
        update={"status": AgentStatus.FAILURE, "error": "3 tests fail", "error_type": "verification_failed"}
    )
    dropped = without_oversized_po_message(failed, WHERE)
    assert dropped.po_message is None and (dropped.error, dropped.error_type) == ("3 tests fail", "verification_failed")


def test_an_empty_blocking_issue_is_named_and_long_ones_cut_so_the_fix_feedback_can_carry_them():
    """The fix's feedback item (1 to 2,000 characters) of an empty or a 3,000-character blocking issue raised in the
    Slave. One of spaces was a valid item that asked for a fix: so does an empty one now."""
    answer = _review(blocking_issues=["", "   ", "x" * 3_000, "real issue"])
    fitted = fit_for_history(answer, WHERE)
    assert fitted.blocking_issues == [EMPTY_BLOCKING_ISSUE, "   ", "x" * MAX_SUMMARY_CHARS, "real issue"]
    issues = [f.issue for f in _fix_feedback(fitted, SprintConfig())]
    assert issues == fitted.blocking_issues
    assert fit_for_history(_review(blocking_issues=[""]), WHERE).blocking == [EMPTY_BLOCKING_ISSUE]


def test_the_items_always_kept_and_the_notes_fit_the_budget_with_everything_at_its_largest():
    """Blocking issues filling the room left the first blocking feedback item and the most severe finding (always
    kept) over the budget; a path of non-ASCII characters made the notes longer in bytes than in characters."""
    issues = ["b" * MAX_SUMMARY_CHARS] * MAX_FINDINGS
    feedback = [FeedbackItem(severity="blocking", category="c" * 100, issue="i" * 2_000, suggestion="s" * 2_000,
                             file="f" * 1_000)] * MAX_FINDINGS
    findings = [Finding(severity="HIGH", summary="x" * 2_000, file="f" * 1_000)] * MAX_FINDINGS
    answer = _review(findings=findings, blocking_issues=issues, feedback=feedback, summary="é" * MAX_SUMMARY_CHARS)
    for where in (WHERE, "/é" * 500):
        fitted = fit_for_history(answer, where)
        assert _size(fitted) <= MAX_ANSWER_HISTORY_BYTES
        assert fitted.findings[0].severity == Severity.HIGH and fitted.blocking_issues and fitted.blocking


def test_a_megabyte_review_keeps_the_most_severe_findings_and_names_where_the_rest_are():
    findings = [
        Finding(severity="LOW" if n % 2 else "HIGH", summary=f"finding {n} " + "s" * 1_900, file="f" * 7_000)
        for n in range(MAX_FINDINGS)
    ]
    feedback = [FeedbackItem(severity="suggestion", category="style", issue="i" * 2_000) for _ in range(MAX_FINDINGS)]
    answer = _review(findings=findings, blocking_issues=["b" * 2_000] * MAX_FINDINGS, feedback=feedback)
    assert _size(answer) > 2_500_000

    fitted = fit_for_history(answer, WHERE)

    assert _size(fitted) <= MAX_ANSWER_HISTORY_BYTES
    assert all(len(f.file or "") <= MAX_PATH_CHARS for f in fitted.findings)
    *kept, note = fitted.findings
    assert kept and all(f.severity == Severity.HIGH for f in kept)  # the HIGH ones first
    assert [int(f.summary.split()[1]) for f in kept] == list(range(0, 2 * len(kept), 2))  # in the answer's order
    assert note.severity == Severity.HIGH  # HIGH ones were left out too
    assert note.summary.startswith(f"{MAX_FINDINGS - len(kept)} more findings of this answer ({MAX_FINDINGS} in all)")
    assert note.summary.endswith(WHERE)
    assert fitted.blocking_issues[-1].endswith(WHERE)
    assert fitted.feedback[-1].issue.endswith(WHERE) and fitted.feedback[-1].severity == "suggestion"


severities = st.sampled_from(list(Severity))
texts = st.text(min_size=0, max_size=40) | st.builds(lambda n, c: c * n, st.integers(0, 6_000), st.sampled_from("ab "))
finding_lists = st.lists(
    st.builds(
        Finding,
        severity=severities,
        summary=st.builds(lambda n: "s" * n, st.integers(0, MAX_SUMMARY_CHARS)),
        file=st.none() | texts,
    ),
    max_size=MAX_FINDINGS,
)
feedback_lists = st.lists(
    st.builds(
        FeedbackItem,
        severity=st.sampled_from(["blocking", "suggestion"]),
        category=st.just("c"),
        issue=st.builds(lambda n: "i" * n, st.integers(1, MAX_SUMMARY_CHARS)),
        file=st.none() | texts,
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(findings=finding_lists, issues=st.lists(texts, max_size=MAX_FINDINGS), feedback=feedback_lists,
       score=st.none() | st.integers(0, 100), where=st.sampled_from([WHERE, "/é" * 500, "x" * 5_000]))
def test_any_answer_fits_and_decides_as_the_whole_answer(findings, issues, feedback, score, where):
    answer = _review(findings=findings, blocking_issues=issues, feedback=feedback, score=score)
    fitted = fit_for_history(answer, where)
    assert _size(fitted) <= MAX_ANSWER_HISTORY_BYTES
    assert (fitted.status, fitted.verdict, fitted.score, fitted.summary) == (
        answer.status, answer.verdict, answer.score, answer.summary
    )
    # Whether anything blocks, and which strictness asks for a fix.
    config = SprintConfig()
    assert bool(fitted.blocking) == bool(answer.blocking)
    assert bool(review_shortfalls(fitted, config)) == bool(review_shortfalls(answer, config))
    for strictness in Strictness:
        assert bool(findings_needing_fix(fitted.findings, strictness)) == bool(
            findings_needing_fix(answer.findings, strictness)
        )
    if answer.findings:
        assert max(f.severity.rank for f in fitted.findings) == max(f.severity.rank for f in answer.findings)
    _fix_feedback(fitted, config)  # never raises
