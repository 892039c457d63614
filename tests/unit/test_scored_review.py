"""Scored reviews (Gear 2) in the pure rules: criteria scores, approval_score, blocking issues, feedback."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bso.config import resolve_config
from bso.dispatch import CODE_REVIEW, FIX, Outcome, apply_agent_result, review_shortfalls
from bso.messages import AgentComplete, FeedbackItem
from bso.models import StoryProgress
from bso.report import story_results
from bso.simulation import StoryScript, scripted_answer

KEY = "2-1-expiry-date-tracking"
CRITERIA = {"code_quality": 25, "test_coverage": 10, "security": 15, "documentation": 12, "acceptance_criteria": 10}


def scored(**kw) -> AgentComplete:
    return AgentComplete.model_validate(
        {"dispatch_id": "d-1", "story_key": KEY, "agent_type": "review-runner", "mode": "review",
         "status": "success", **kw}
    )


def run_review(answer: AgentComplete, p: StoryProgress | None = None, **overrides):
    p = p or StoryProgress(key=KEY, state="review")
    return apply_agent_result(p, CODE_REVIEW, answer, resolve_config(overrides), [])


def test_score_defaults_to_the_sum_of_criteria() -> None:
    assert scored(criteria_scores=CRITERIA).score == 72
    assert scored(criteria_scores=CRITERIA, score=90).score == 90  # an explicit score wins
    assert scored().score is None


@pytest.mark.parametrize(
    ("criterion", "too_much"),
    [("code_quality", 31), ("test_coverage", 26), ("security", 21), ("documentation", 16), ("acceptance_criteria", 11)],
)
def test_criteria_are_capped(criterion: str, too_much: int) -> None:
    with pytest.raises(ValidationError) as info:
        scored(criteria_scores={criterion: too_much})
    assert info.value.errors()[0]["loc"] == ("criteria_scores", criterion)


def test_score_must_be_0_to_100() -> None:
    for bad in (-1, 101):
        with pytest.raises(ValidationError):
            scored(score=bad)


def test_score_below_approval_needs_a_fix_with_the_feedback() -> None:
    feedback = [{"severity": "suggestion", "category": "documentation", "file": "src/cli.py", "line": 10,
                 "issue": "Function lacks docstring", "suggestion": "Add docstring"}]
    t = run_review(scored(criteria_scores=CRITERIA, feedback=feedback))
    assert t.outcome is Outcome.FIX_REQUESTED
    assert "score 72 < approval_score 80" in t.note
    assert t.progress.fix_pending and t.progress.review_scores == [72]
    score_item = FeedbackItem(
        severity="blocking", category="score",
        issue="review score 72 < approval_score 80 (points lost: code_quality 25/30, test_coverage 10/25, "
              "security 15/20, documentation 12/15)",
    )
    assert t.progress.fix_feedback == [FeedbackItem.model_validate(feedback[0]), score_item]


def test_a_low_score_alone_still_tells_the_fix_why() -> None:
    """No findings, no feedback: the fix used to be sent with nothing to go on."""
    t = run_review(scored(score=64, summary="thin tests"))
    assert t.outcome is Outcome.FIX_REQUESTED and t.progress.fix_findings == []
    (item,) = t.progress.fix_feedback
    assert (item.severity, item.issue, item.suggestion) == (
        "blocking", "review score 64 < approval_score 80", "thin tests"
    )


def test_a_failed_verdict_alone_still_tells_the_fix_why() -> None:
    t = run_review(scored(verdict="failure", summary="the login form does not submit"))
    assert t.outcome is Outcome.FIX_REQUESTED
    assert [i.issue for i in t.progress.fix_feedback] == ["the review failed the work: the login form does not submit"]


def test_score_reaching_approval_passes() -> None:
    t = run_review(scored(score=88))
    assert t.outcome is Outcome.ADVANCED and t.progress.state == "done" and t.progress.review_scores == [88]
    assert run_review(scored(score=80)).progress.state == "done"  # "reaches" includes equality


def test_approval_score_is_a_knob() -> None:
    assert resolve_config().approval_score == 80
    assert run_review(scored(score=72), approval_score=70).progress.state == "done"
    with pytest.raises(Exception):
        resolve_config({"approval_score": 101})


def test_a_blocking_issue_fails_even_a_high_score() -> None:
    t = run_review(scored(score=95, blocking_issues=["Missing unit tests for error handling"]))
    assert t.outcome is Outcome.FIX_REQUESTED
    assert "blocking: Missing unit tests for error handling" in t.note
    item = t.progress.fix_feedback[0]
    assert item.severity == "blocking" and item.issue == "Missing unit tests for error handling"


def test_a_blocking_feedback_item_fails_the_review() -> None:
    item = {"severity": "blocking", "category": "security", "file": "src/cli.py", "line": 67,
            "issue": "No validation of user input", "suggestion": "Validate task_id"}
    t = run_review(scored(score=90, feedback=[item]))
    assert t.outcome is Outcome.FIX_REQUESTED and "src/cli.py:67" in t.note
    assert t.progress.fix_feedback == [FeedbackItem.model_validate(item)]  # not repeated


def test_findings_still_follow_the_round_strictness() -> None:
    # A good score does not excuse a MEDIUM finding under normal strictness.
    t = run_review(scored(score=95, findings=[{"severity": "MEDIUM", "summary": "x"}]))
    assert t.outcome is Outcome.FIX_REQUESTED
    # ... and a LOW finding passes under normal strictness when the score is good.
    assert run_review(scored(score=95, findings=[{"severity": "LOW", "summary": "x"}])).progress.state == "done"


def test_unscored_reviews_behave_as_before() -> None:
    assert review_shortfalls(scored(), resolve_config()) == []
    assert run_review(scored()).progress.state == "done"


def test_scores_accumulate_per_round_and_fix_clears_feedback() -> None:
    first = run_review(scored(score=72, blocking_issues=["no tests"])).progress
    fixed = apply_agent_result(
        first, FIX, AgentComplete(dispatch_id="d-2", story_key=KEY, agent_type="dev-runner", mode="fix",
                                  status="success"), resolve_config(), []
    ).progress
    assert fixed.fix_feedback == [] and fixed.state == "review"
    second = run_review(scored(score=88), p=fixed).progress
    assert second.state == "done" and second.review_scores == [72, 88]
    assert story_results([second])[0].review_scores == [72, 88]


def test_simulation_scores_and_blocking() -> None:
    script = StoryScript(review_scores=[72, 88], blocking=["Missing tests", None])
    first = scripted_answer(script, "review", 1)
    assert first.score == 72 and first.blocking_issues == ["Missing tests"]
    assert [f.severity for f in first.feedback] == ["blocking", "suggestion"]
    second = scripted_answer(script, "review", 2)
    assert second.score == 88 and second.blocking_issues == []
    third = scripted_answer(script, "review", 3)
    assert third.score is None and third.feedback == []
    with pytest.raises(ValidationError):
        StoryScript(review_scores=[120])


def test_execution_summary_shows_scores_and_improvements() -> None:
    from bso.improvements import ImprovementRecord
    from bso.models import SlaveResult, SlaveResults, SprintReport, StoryResult
    from bso.summary import render_summary

    result = StoryResult(story_key=KEY, final_state="done", agents_dispatched=3, review_scores=[72, 88])
    batch = SlaveResult(
        status="batch-complete", batch_id=1, session_id="s",
        results=SlaveResults(stories_total=1, stories_completed=1, stories_failed=0, stories_skipped=0,
                             story_results=[result], total_agents_created=3, total_agents_destroyed=3,
                             review_fix_rounds={KEY: 1}),
    )
    imp = ImprovementRecord(improvement_id="imp_001", story_key="2-2-imp-001", description="Add caching",
                            priority_score=8.5)
    text = render_summary(SprintReport(session_id="s", status="sprint-complete", batches=[batch],
                                       stories={KEY: "done"}, improvements=[imp]))
    assert f"| {KEY} | 1 | done | 1 | 3 | 72 -> 88 |" in text
    assert "| imp_001 | 2-2-imp-001 | 8.5 | Add caching |" in text


def test_fix_prompt_carries_the_review_feedback() -> None:
    from bso.messages import TaskAssignment
    from bso.prompting import PromptContext, render_prompt

    a = TaskAssignment(
        dispatch_id="s/b/1-1/3", agent_type="dev-runner", mode="fix", story_key="1-1-x", story_path="s/1-1-x.md",
        session_id="s", batch_id=1, report_to="s/b", project_root="/p",
        fix_feedback=[
            FeedbackItem(severity="suggestion", category="documentation", issue="Function lacks docstring"),
            FeedbackItem(severity="blocking", category="security", file="src/cli.py", line=67,
                         issue="No validation of user input", suggestion="Validate task_id"),
        ],
    )
    ctx = PromptContext(assignment=a, story_file="/p/s/1-1-x.md", workdir="/wt", result_file="/r.json")
    out = render_prompt("$common", "$fix_section", ctx)
    blocking = "- [blocking/security] No validation of user input (src/cli.py:67); suggestion: Validate task_id"
    assert blocking in out and "- [suggestion/documentation] Function lacks docstring" in out
    assert out.index(blocking) < out.index("Function lacks docstring")  # blocking first
