"""Unit tests of the pure dispatch rules in bso/dispatch.py.

The dispatch table (BSO-REFERENCE.md, bso-sprint-slave-spec.md), the success/failure columns of each step,
story-review fallbacks, code-review strictness and P22 degradation, the max_review_rounds cap, E2E triggers,
token accounting and the P26 budget levels. No Temporal here: these are plain functions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bso.config import ReviewDegradation, SprintConfig, resolve_config
from bso.dispatch import (
    changed_by_hand,
    taken_from_file,
    slept_through,
    CODE_REVIEW,
    CREATE,
    DEV,
    DISPATCH_TABLE,
    E2E,
    FIX,
    REVISE,
    STORY_REVIEW,
    BudgetLevel,
    DispatchStep,
    Outcome,
    apply_agent_result,
    apply_no_answer,
    budget_level,
    e2e_applies,
    effective_strictness,
    findings_needing_fix,
    implausible_tokens,
    is_terminal,
    mode_round,
    next_dispatch,
    normalize_state,
    record_dispatch,
    written_by_this_run,
)
from bso.messages import MAX_TOKENS_PER_ANSWER, AgentComplete, Finding
from bso.models import StoryProgress
from bso.simulation import SimulationScript
from bso.states import (
    AgentMode,
    AgentStatus,
    AgentType,
    Severity,
    StoryState,
    Strictness,
    Verdict,
)

KEY = "3-2-chunk-manager"
ALL_STEPS = [CREATE, REVISE, STORY_REVIEW, DEV, FIX, CODE_REVIEW, E2E]


# --- helpers ---------------------------------------------------------------------------------------


def progress(state: str, **kw) -> StoryProgress:
    return StoryProgress(key=KEY, state=state, **kw)


def finding(severity: Severity | str, summary: str = "something") -> Finding:
    return Finding(severity=severity, summary=summary)


def result(
    step: DispatchStep,
    status: AgentStatus = AgentStatus.SUCCESS,
    *,
    verdict: Verdict | None = None,
    findings: list[Finding] | None = None,
    tokens: int = 0,
    error: str | None = None,
    summary: str = "",
) -> AgentComplete:
    return AgentComplete(
        dispatch_id="d-1",
        story_key=KEY,
        agent_type=step.agent_type,
        mode=step.mode,
        status=status,
        verdict=verdict,
        findings=findings or [],
        tokens_used=tokens,
        summary=summary,
        error=error,
    )


def config(**overrides) -> SprintConfig:
    return resolve_config(overrides)


def review(
    severities: list[Severity],
    *,
    round_no: int = 1,
    fix_rounds: int = 0,
    cfg: SprintConfig | None = None,
    tags: list[str] | None = None,
):
    """Apply code review round `round_no` reporting one finding per severity."""
    p = progress("review", review_rounds=round_no - 1, fix_rounds=fix_rounds)
    return apply_agent_result(
        p,
        CODE_REVIEW,
        result(CODE_REVIEW, findings=[finding(s, f"{s} issue") for s in severities]),
        cfg or config(),
        tags or [],
    )


def no_degradation(**overrides) -> SprintConfig:
    return config(**{"review_degradation.enabled": False, **overrides})


# --- the dispatch table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "agent", "mode"),
    [
        ("backlog", AgentType.STORY_CREATOR, AgentMode.CREATE),
        ("story-doc-improved", AgentType.STORY_CREATOR, AgentMode.REVISE),
        ("story-doc-review", AgentType.STORY_REVIEWER, AgentMode.REVIEW),
        ("ready-for-dev", AgentType.DEV_RUNNER, AgentMode.DEV),
        ("review", AgentType.REVIEW_RUNNER, AgentMode.REVIEW),
        ("e2e-verify", AgentType.E2E_INSPECTOR, AgentMode.E2E),
        ("needs-fix", AgentType.DEV_RUNNER, AgentMode.FIX),
    ],
)
def test_dispatch_table_rows(state, agent, mode):
    step = next_dispatch(progress(state))
    assert step is not None
    assert (step.agent_type, step.mode) == (agent, mode)


def test_review_with_fix_pending_dispatches_dev_runner_in_fix_mode():
    step = next_dispatch(progress("review", fix_pending=True))
    assert step == FIX
    assert (step.agent_type, step.mode) == (AgentType.DEV_RUNNER, AgentMode.FIX)


def test_fix_pending_only_matters_in_review():
    # A stale fix_pending flag never turns another state's row into a fix.
    assert next_dispatch(progress("ready-for-dev", fix_pending=True)) == DEV
    assert next_dispatch(progress("e2e-verify", fix_pending=True)) == E2E


@pytest.mark.parametrize("legacy", ["in-progress", "drafted", "contexted"])
def test_legacy_bmad_values_dispatch_dev(legacy):
    assert normalize_state(legacy) is StoryState.READY_FOR_DEV
    assert next_dispatch(progress(legacy)) == DEV


@pytest.mark.parametrize(
    "raw",
    ["", "bogus", "in_progress", "Review", "BACKLOG", " review", "review ", "fix", "optional", "epic-1"],
)
def test_unknown_values_have_no_row(raw):
    assert normalize_state(raw) is None
    assert next_dispatch(progress(raw)) is None


@pytest.mark.parametrize("state", ["done", "needs-intervention", "skipped"])
def test_terminal_states_have_no_row(state):
    p = progress(state)
    assert next_dispatch(p) is None
    assert next_dispatch(p.model_copy(update={"fix_pending": True})) is None
    assert is_terminal(p)


@pytest.mark.parametrize(
    "state", ["backlog", "story-doc-improved", "story-doc-review", "ready-for-dev", "review", "e2e-verify", "needs-fix"]
)
def test_working_states_are_not_terminal(state):
    assert not is_terminal(progress(state))


def test_table_covers_every_non_terminal_state():
    terminal = {StoryState.DONE, StoryState.NEEDS_INTERVENTION, StoryState.SKIPPED}
    assert set(DISPATCH_TABLE) == set(StoryState) - terminal


@pytest.mark.parametrize(
    ("step", "key"),
    [
        (CREATE, "create"),
        (REVISE, "revise"),
        (STORY_REVIEW, "story_review"),
        (DEV, "dev"),
        (FIX, "fix"),
        (CODE_REVIEW, "review"),
        (E2E, "e2e"),
    ],
)
def test_script_keys(step, key):
    assert step.script_key == key


# --- failure column: every step -> needs-intervention ----------------------------------------------


@pytest.mark.parametrize("step", ALL_STEPS, ids=lambda s: s.script_key)
def test_failure_of_any_step_is_needs_intervention(step):
    p = progress("review", fix_pending=step == FIX, tokens_used=10)
    p = record_dispatch(p, step, "d-1")
    t = apply_agent_result(
        p, step, result(step, AgentStatus.FAILURE, error="boom", tokens=5, verdict=Verdict.PASSED), config(), []
    )
    assert t.outcome is Outcome.INTERVENTION
    assert t.progress.state == "needs-intervention"
    assert "boom" in t.progress.error
    assert step.agent_type.value in t.progress.error
    assert t.progress.fix_pending is False
    assert t.progress.tokens_used == 15
    assert t.progress.pending_dispatch_id is None
    assert is_terminal(t.progress)


def test_failure_without_error_text_still_gives_a_reason():
    t = apply_agent_result(progress("ready-for-dev"), DEV, result(DEV, AgentStatus.FAILURE), config(), [])
    assert t.progress.state == "needs-intervention"
    assert t.progress.error


def test_failure_uses_summary_when_no_error():
    t = apply_agent_result(
        progress("ready-for-dev"), DEV, result(DEV, AgentStatus.FAILURE, summary="tests red"), config(), []
    )
    assert "tests red" in t.progress.error


@pytest.mark.parametrize("step", ALL_STEPS, ids=lambda s: s.script_key)
def test_no_answer_is_needs_intervention(step):
    p = record_dispatch(progress("review", tokens_used=7), step, "d-9")
    t = apply_no_answer(p, step, "no AGENT_COMPLETE within 900s")
    assert t.outcome is Outcome.INTERVENTION
    assert t.progress.state == "needs-intervention"
    assert "900s" in t.progress.error
    assert f"{step.agent_type.value}/{step.mode.value}" in t.progress.error
    assert t.progress.tokens_used == 7
    assert t.progress.pending_dispatch_id is None


# --- success column: story docs --------------------------------------------------------------------


@pytest.mark.parametrize(("state", "step"), [("backlog", CREATE), ("story-doc-improved", REVISE)])
def test_story_creator_success_goes_to_story_doc_review(state, step):
    t = apply_agent_result(progress(state), step, result(step), config(), [])
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "story-doc-review"


@pytest.mark.parametrize(("state", "step"), [("backlog", CREATE), ("story-doc-improved", REVISE)])
def test_story_review_disabled_skips_story_doc_review(state, step):
    t = apply_agent_result(progress(state), step, result(step), config(story_review_enabled=False), [])
    assert t.progress.state == "ready-for-dev"
    assert next_dispatch(t.progress) == DEV


@pytest.mark.parametrize("verdict", [Verdict.PASSED, Verdict.SUCCESS, None])
def test_story_review_passed_goes_to_ready_for_dev(verdict):
    t = apply_agent_result(progress("story-doc-review"), STORY_REVIEW, result(STORY_REVIEW, verdict=verdict), config(), [])
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "ready-for-dev"
    assert t.progress.story_review_rounds == 1


def test_story_review_needs_improve_goes_to_story_doc_improved():
    t = apply_agent_result(
        progress("story-doc-review"), STORY_REVIEW, result(STORY_REVIEW, verdict=Verdict.NEEDS_IMPROVE), config(), []
    )
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "story-doc-improved"
    assert t.progress.story_review_rounds == 1
    assert next_dispatch(t.progress) == REVISE


def _story_review_loop(cfg: SprintConfig) -> tuple[StoryProgress, list[str], Outcome]:
    """Drive a story from story-doc-review with a reviewer that always says needs-improve."""
    p = progress("story-doc-review")
    states = []
    outcome = Outcome.ADVANCED
    for _ in range(50):
        step = next_dispatch(p)
        if step is None:
            break
        verdict = Verdict.NEEDS_IMPROVE if step == STORY_REVIEW else None
        t = apply_agent_result(p, step, result(step, verdict=verdict), cfg, [])
        p, outcome = t.progress, t.outcome
        states.append(p.state)
        if step == STORY_REVIEW and p.state != "story-doc-improved":
            break
    return p, states, outcome


@pytest.mark.parametrize("max_rounds", [1, 2, 3, 5])
def test_story_review_loops_until_max_story_review_rounds_then_asks_user(max_rounds):
    p, states, outcome = _story_review_loop(config(max_story_review_rounds=max_rounds))
    # max_rounds reviews: each but the last sends the doc back for improvement.
    assert states.count("story-doc-improved") == max_rounds - 1
    # each revise goes back to review; the last review leaves the story in review, waiting
    assert states.count("story-doc-review") == max_rounds
    assert p.story_review_rounds == max_rounds
    # ask_user: the story stays in story-doc-review and waits for a human decision.
    assert p.state == "story-doc-review"
    assert outcome is Outcome.AWAITING_DECISION
    assert "force_pass, skip_story or retry" in p.awaiting_decision


def test_story_review_default_allows_three_rounds():
    p, states, _ = _story_review_loop(config())
    assert p.story_review_rounds == 3
    assert states.count("story-doc-improved") == 2
    assert p.state == "story-doc-review" and p.awaiting_decision


def test_story_review_fallback_force_pass():
    p, _, outcome = _story_review_loop(config(story_review_fallback="force_pass"))
    assert p.state == "ready-for-dev"
    assert p.story_review_rounds == 3
    assert outcome is Outcome.ADVANCED
    assert next_dispatch(p) == DEV


def test_story_review_fallback_skip_story():
    p, _, outcome = _story_review_loop(config(story_review_fallback="skip_story"))
    assert p.state == "skipped"
    assert p.story_review_rounds == 3
    assert outcome is Outcome.SKIPPED
    assert is_terminal(p)
    assert p.error


@pytest.mark.parametrize(("rounds", "said"), [(1, "did not pass in 1 round"), (3, "did not pass in 3 rounds")])
def test_the_story_review_fallback_counts_its_rounds_in_words(rounds, said):
    skipped, _, _ = _story_review_loop(config(story_review_fallback="skip_story", max_story_review_rounds=rounds))
    asked, _, _ = _story_review_loop(config(max_story_review_rounds=rounds))
    assert skipped.error == f"story doc {said}"
    assert asked.awaiting_decision.startswith(f"story doc {said};")


def test_story_review_passing_on_last_round_is_not_a_fallback():
    p = progress("story-doc-review", story_review_rounds=2)
    t = apply_agent_result(p, STORY_REVIEW, result(STORY_REVIEW, verdict=Verdict.PASSED), config(), [])
    assert t.progress.state == "ready-for-dev"
    assert t.progress.error is None


# --- success column: dev and fix -------------------------------------------------------------------


def test_dev_success_goes_to_review():
    t = apply_agent_result(progress("ready-for-dev"), DEV, result(DEV), config(), [])
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "review"
    assert next_dispatch(t.progress) == CODE_REVIEW


def test_fix_success_goes_back_to_review_and_clears_findings():
    p = progress("review", fix_pending=True, fix_rounds=1, fix_findings=[finding("HIGH")])
    t = apply_agent_result(p, FIX, result(FIX), config(), [])
    assert t.progress.state == "review"
    assert t.progress.fix_pending is False
    assert t.progress.fix_findings == []
    assert t.progress.fix_rounds == 1
    assert next_dispatch(t.progress) == CODE_REVIEW


def test_needs_fix_story_is_fixed_then_reviewed():
    p = progress("needs-fix")
    assert next_dispatch(p) == FIX
    t = apply_agent_result(p, FIX, result(FIX), config(), [])
    assert t.progress.state == "review"
    assert next_dispatch(t.progress) == CODE_REVIEW


# --- success column: code review -------------------------------------------------------------------


def test_clean_review_goes_to_done():
    t = review([])
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "done"
    assert t.progress.review_rounds == 1
    assert t.progress.fix_rounds == 0


def test_needs_fix_requests_a_fix_and_carries_the_findings():
    t = review([Severity.HIGH, Severity.LOW, Severity.MEDIUM])
    assert t.outcome is Outcome.FIX_REQUESTED
    assert t.progress.state == "review"
    assert t.progress.fix_pending is True
    assert t.progress.fix_rounds == 1
    assert t.progress.review_rounds == 1
    # Only the findings that need a fix under the round's strictness (normal: >= MEDIUM) are carried.
    assert [f.severity for f in t.progress.fix_findings] == [Severity.HIGH, Severity.MEDIUM]
    assert [f.summary for f in t.progress.fix_findings] == ["HIGH issue", "MEDIUM issue"]
    assert next_dispatch(t.progress) == FIX


STRICTNESS_CASES = [
    # base, highest finding, needs a fix at round 1?
    ("strict", Severity.LOW, True),
    ("strict", Severity.MEDIUM, True),
    ("strict", Severity.HIGH, True),
    ("strict", Severity.CRITICAL, True),
    ("normal", Severity.LOW, False),
    ("normal", Severity.MEDIUM, True),
    ("normal", Severity.HIGH, True),
    ("normal", Severity.CRITICAL, True),
    ("lenient", Severity.LOW, False),
    ("lenient", Severity.MEDIUM, False),
    ("lenient", Severity.HIGH, True),
    ("lenient", Severity.CRITICAL, True),
]


@pytest.mark.parametrize(("strictness", "severity", "needs_fix"), STRICTNESS_CASES)
def test_strictness_thresholds_in_review(strictness, severity, needs_fix):
    t = review([severity], cfg=config(review_strictness=strictness))
    if needs_fix:
        assert t.outcome is Outcome.FIX_REQUESTED
        assert t.progress.fix_pending and t.progress.fix_rounds == 1
        assert [f.severity for f in t.progress.fix_findings] == [severity]
    else:
        assert t.outcome is Outcome.ADVANCED
        assert t.progress.state == "done"
        assert t.progress.fix_rounds == 0


def test_default_strictness_is_normal():
    assert review([Severity.LOW]).progress.state == "done"
    assert review([Severity.MEDIUM]).outcome is Outcome.FIX_REQUESTED


# Degradation (P22): (base, round, severity, needs a fix?)
DEGRADATION_CASES = [
    # normal: >= MEDIUM for rounds 1-2, lenient (>= HIGH) from 3, high-only from 5
    ("normal", 2, Severity.MEDIUM, True),
    ("normal", 3, Severity.MEDIUM, False),
    ("normal", 3, Severity.HIGH, True),
    ("normal", 4, Severity.MEDIUM, False),
    ("normal", 5, Severity.MEDIUM, False),
    ("normal", 5, Severity.HIGH, True),
    ("normal", 7, Severity.CRITICAL, True),
    # strict: >= LOW for rounds 1-2, normal (>= MEDIUM) for 3-4, high-only from 5
    ("strict", 2, Severity.LOW, True),
    ("strict", 3, Severity.LOW, False),
    ("strict", 3, Severity.MEDIUM, True),
    ("strict", 4, Severity.MEDIUM, True),
    ("strict", 5, Severity.MEDIUM, False),
    ("strict", 5, Severity.HIGH, True),
    ("strict", 7, Severity.HIGH, True),
    # lenient: HIGH only throughout
    ("lenient", 3, Severity.MEDIUM, False),
    ("lenient", 3, Severity.HIGH, True),
    ("lenient", 6, Severity.HIGH, True),
]


@pytest.mark.parametrize(("strictness", "round_no", "severity", "needs_fix"), DEGRADATION_CASES)
def test_degradation_steps(strictness, round_no, severity, needs_fix):
    t = review([severity], round_no=round_no, fix_rounds=round_no - 1, cfg=config(review_strictness=strictness))
    assert t.progress.review_rounds == round_no
    if needs_fix:
        assert t.outcome is Outcome.FIX_REQUESTED
        assert t.progress.fix_rounds == round_no
    else:
        assert t.outcome is Outcome.ADVANCED
        assert t.progress.state == "done"


@pytest.mark.parametrize("strictness", ["strict", "normal", "lenient"])
@pytest.mark.parametrize("severity", [Severity.HIGH, Severity.CRITICAL])
def test_round_8_with_findings_is_forced_to_needs_intervention(strictness, severity):
    t = review([severity], round_no=8, fix_rounds=7, cfg=config(review_strictness=strictness))
    assert t.outcome is Outcome.INTERVENTION
    assert t.progress.state == "needs-intervention"
    assert t.progress.fix_rounds == 7  # no fix was dispatched
    assert t.progress.fix_pending is False
    assert t.progress.review_rounds == 8
    assert "P22" in t.progress.error or "forced" in t.progress.error


@pytest.mark.parametrize("strictness", ["strict", "normal", "lenient"])
def test_clean_review_at_round_8_still_passes(strictness):
    t = review([], round_no=8, fix_rounds=7, cfg=config(review_strictness=strictness))
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "done"


def test_clean_review_at_round_8_goes_to_e2e_when_it_applies():
    t = review([], round_no=8, fix_rounds=7, cfg=config(e2e_enabled=True), tags=["ui"])
    assert t.progress.state == "e2e-verify"


def test_degradation_disabled_keeps_base_strictness_and_never_forces():
    cfg = no_degradation(review_strictness="strict")
    for round_no in (3, 5, 8, 9):
        t = review([Severity.LOW], round_no=round_no, fix_rounds=round_no - 1, cfg=cfg)
        assert t.outcome is Outcome.FIX_REQUESTED, round_no
        assert t.progress.fix_rounds == round_no


def test_degradation_schedule_is_configurable():
    cfg = config(
        **{
            "review_degradation.downgrade_from_round": 2,
            "review_degradation.high_only_from_round": 3,
            "review_degradation.force_intervention_at_round": 4,
            "review_strictness": "strict",
        }
    )
    assert review([Severity.LOW], round_no=1, cfg=cfg).outcome is Outcome.FIX_REQUESTED
    assert review([Severity.LOW], round_no=2, fix_rounds=1, cfg=cfg).progress.state == "done"
    assert review([Severity.MEDIUM], round_no=2, fix_rounds=1, cfg=cfg).outcome is Outcome.FIX_REQUESTED
    assert review([Severity.MEDIUM], round_no=3, fix_rounds=2, cfg=cfg).progress.state == "done"
    assert review([Severity.HIGH], round_no=4, fix_rounds=3, cfg=cfg).progress.state == "needs-intervention"


# --- the max_review_rounds cap ---------------------------------------------------------------------


def test_max_review_rounds_zero_sends_first_needs_fix_to_intervention():
    t = review([Severity.HIGH], cfg=config(max_review_rounds=0))
    assert t.outcome is Outcome.INTERVENTION
    assert t.progress.state == "needs-intervention"
    assert t.progress.fix_rounds == 0
    assert "max_review_rounds" in t.progress.error


def test_max_review_rounds_zero_still_lets_a_clean_review_pass():
    assert review([], cfg=config(max_review_rounds=0)).progress.state == "done"


@pytest.mark.parametrize("cap", [1, 2, 4, 10])
def test_needs_fix_beyond_the_cap_is_intervention(cap):
    cfg = no_degradation(max_review_rounds=cap)
    # The cap-th fix is still allowed ...
    allowed = review([Severity.HIGH], round_no=cap, fix_rounds=cap - 1, cfg=cfg)
    assert allowed.outcome is Outcome.FIX_REQUESTED
    assert allowed.progress.fix_rounds == cap
    # ... the next one would exceed it.
    capped = review([Severity.HIGH], round_no=cap + 1, fix_rounds=cap, cfg=cfg)
    assert capped.outcome is Outcome.INTERVENTION
    assert capped.progress.state == "needs-intervention"
    assert capped.progress.fix_rounds == cap
    assert f"max_review_rounds ({cap})" in capped.progress.error
    # A clean review at the cap passes.
    assert review([], round_no=cap + 1, fix_rounds=cap, cfg=cfg).progress.state == "done"


def test_cap_applies_before_degradation_forces():
    cfg = config(max_review_rounds=2)
    assert review([Severity.HIGH], round_no=3, fix_rounds=2, cfg=cfg).progress.state == "needs-intervention"


# --- E2E -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", ["frontend", "ui", "web", "page", "UI", "Frontend", "WEB", "Page"])
def test_e2e_applies_with_a_trigger_tag_case_insensitively(tag):
    cfg = config(e2e_enabled=True)
    assert e2e_applies(["backend", tag], cfg)
    t = review([], cfg=cfg, tags=["backend", tag])
    assert t.progress.state == "e2e-verify"
    assert next_dispatch(t.progress) == E2E


@pytest.mark.parametrize("tags", [[], ["backend"], ["api", "cli"], ["uix"], ["webpage"]])
def test_e2e_does_not_apply_without_a_trigger_tag(tags):
    cfg = config(e2e_enabled=True)
    assert not e2e_applies(tags, cfg)
    assert review([], cfg=cfg, tags=tags).progress.state == "done"


def test_e2e_does_not_apply_when_disabled():
    cfg = config(e2e_enabled=False)
    assert not e2e_applies(["frontend", "ui"], cfg)
    assert review([], cfg=cfg, tags=["frontend"]).progress.state == "done"


def test_e2e_is_disabled_by_default():
    assert not e2e_applies(["frontend"], config())


def test_e2e_custom_trigger_tags_compare_case_insensitively():
    cfg = config(e2e_enabled=True, e2e_trigger_tags=["Mobile"])
    assert e2e_applies(["MOBILE"], cfg)
    assert not e2e_applies(["frontend"], cfg)


def test_e2e_success_goes_to_done():
    t = apply_agent_result(
        progress("e2e-verify"), E2E, result(E2E, verdict=Verdict.SUCCESS), config(e2e_enabled=True), ["ui"]
    )
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "done"
    assert t.progress.e2e_rounds == 1


def test_e2e_failure_goes_back_to_review():
    p = progress("e2e-verify", review_rounds=2, fix_rounds=1, e2e_rounds=1)
    t = apply_agent_result(p, E2E, result(E2E, verdict=Verdict.FAILURE), config(e2e_enabled=True), ["ui"])
    assert t.outcome is Outcome.ADVANCED
    assert t.progress.state == "review"
    assert t.progress.e2e_rounds == 2
    # Counters of the review-fix loop carry on; the next step is a code review, not a fix.
    assert t.progress.review_rounds == 2
    assert t.progress.fix_rounds == 1
    assert next_dispatch(t.progress) == CODE_REVIEW


def test_the_review_after_a_failed_e2e_is_given_what_failed_and_its_pass_clears_it():
    """Nothing of the failure reached the review: it passed the unchanged code again, and the e2e failed again for
    max_review_rounds rounds (22 agent runs by default)."""
    cfg = config(e2e_enabled=True)
    said = [finding("HIGH", "the expiry date is not shown")]
    t = apply_agent_result(progress("e2e-verify"), E2E, result(E2E, verdict=Verdict.FAILURE, findings=said), cfg, ["ui"])
    assert (t.progress.state, t.progress.fix_findings) == ("review", said)
    bare = apply_agent_result(
        progress("e2e-verify"), E2E, result(E2E, verdict=Verdict.FAILURE, summary="page 500s"), cfg, ["ui"]
    )
    assert [(f.severity, f.summary) for f in bare.progress.fix_findings] == [
        (Severity.HIGH, "e2e verification failed: page 500s")
    ]
    passed = apply_agent_result(t.progress, CODE_REVIEW, result(CODE_REVIEW), cfg, ["ui"])
    assert (passed.progress.state, passed.progress.fix_findings) == ("e2e-verify", [])
    fixing = apply_agent_result(t.progress, CODE_REVIEW, result(CODE_REVIEW, findings=said), cfg, ["ui"])
    assert (next_dispatch(fixing.progress), fixing.progress.fix_findings) == (FIX, said)


# --- accounting: tokens, pending dispatch, agents dispatched, mode_round ---------------------------


def test_tokens_accumulate_over_a_story():
    cfg = config()
    p = progress("backlog")
    script = [
        (CREATE, result(CREATE, tokens=100)),
        (STORY_REVIEW, result(STORY_REVIEW, verdict=Verdict.PASSED, tokens=20)),
        (DEV, result(DEV, tokens=3000)),
        (CODE_REVIEW, result(CODE_REVIEW, findings=[finding("HIGH")], tokens=400)),
        (FIX, result(FIX, tokens=500)),
        (CODE_REVIEW, result(CODE_REVIEW, tokens=60)),
    ]
    for n, (step, res) in enumerate(script):
        assert next_dispatch(p) == step
        p = record_dispatch(p, step, f"d-{n}")
        p = apply_agent_result(p, step, res, cfg, []).progress
    assert p.state == "done"
    assert p.tokens_used == 100 + 20 + 3000 + 400 + 500 + 60
    assert p.agents_dispatched == 6
    assert p.review_rounds == 2
    assert p.fix_rounds == 1
    assert p.story_review_rounds == 1


def test_tokens_of_a_failed_agent_count():
    t = apply_agent_result(
        progress("ready-for-dev", tokens_used=1000), DEV, result(DEV, AgentStatus.FAILURE, tokens=250), config(), []
    )
    assert t.progress.tokens_used == 1250


def test_tokens_of_a_forced_intervention_count():
    t = apply_agent_result(
        progress("review", review_rounds=7, fix_rounds=7, tokens_used=10),
        CODE_REVIEW,
        result(CODE_REVIEW, findings=[finding("CRITICAL")], tokens=90),
        config(),
        [],
    )
    assert t.progress.state == "needs-intervention"
    assert t.progress.tokens_used == 100


def test_record_dispatch_sets_pending_and_counts_the_agent():
    p = progress("ready-for-dev", agents_dispatched=2)
    d = record_dispatch(p, DEV, "sess/batch-1/3-2/dev/1")
    assert d.agents_dispatched == 3
    assert d.started is True
    assert d.pending_dispatch_id == "sess/batch-1/3-2/dev/1"
    assert d.pending_agent is AgentType.DEV_RUNNER
    assert d.pending_mode is AgentMode.DEV
    assert d.state == "ready-for-dev"  # dispatching does not change the state
    assert p.agents_dispatched == 2  # the original is untouched


@pytest.mark.parametrize("step", ALL_STEPS, ids=lambda s: s.script_key)
def test_pending_dispatch_cleared_after_a_result(step):
    state = {CREATE: "backlog", REVISE: "story-doc-improved", STORY_REVIEW: "story-doc-review", DEV: "ready-for-dev",
             FIX: "review", CODE_REVIEW: "review", E2E: "e2e-verify"}[step]
    p = record_dispatch(progress(state, fix_pending=step == FIX), step, "d-1")
    assert p.pending_dispatch_id == "d-1"
    t = apply_agent_result(p, step, result(step, findings=[finding("HIGH")]), config(), [])
    assert t.progress.pending_dispatch_id is None
    assert t.progress.pending_agent is None
    assert t.progress.pending_mode is None
    assert t.progress.agents_dispatched == 1


def test_mode_round_values():
    p = progress("review", story_review_rounds=2, review_rounds=4, fix_rounds=3, e2e_rounds=1)
    assert mode_round(p, STORY_REVIEW) == 3
    assert mode_round(p, CODE_REVIEW) == 5
    assert mode_round(p, E2E) == 2
    assert mode_round(p, FIX) == 3
    assert mode_round(p, REVISE) == 2
    assert mode_round(p, CREATE) == 1
    assert mode_round(p, DEV) == 1


def test_mode_round_on_a_fresh_story():
    p = progress("backlog")
    for step in ALL_STEPS:
        assert mode_round(p, step) == 1, step.script_key


def test_mode_round_follows_the_review_fix_loop():
    """The n-th review, the n-th fix: the simulated agents' script indexes line up."""
    cfg = config()
    p = progress("review")
    seen = []
    for sev in ["HIGH", "HIGH", None]:
        step = next_dispatch(p)
        seen.append((step.script_key, mode_round(p, step)))
        p = apply_agent_result(p, step, result(step, findings=[finding(sev)] if sev else []), cfg, []).progress
        if step == CODE_REVIEW and p.fix_pending:
            step = next_dispatch(p)
            seen.append((step.script_key, mode_round(p, step)))
            p = apply_agent_result(p, step, result(step), cfg, []).progress
    assert seen == [("review", 1), ("fix", 1), ("review", 2), ("fix", 2), ("review", 3)]
    assert p.state == "done"


# --- effective_strictness and findings_needing_fix -------------------------------------------------

S = Strictness
EFFECTIVE = {
    #            rounds 1      2         3          4          5            6            7            8
    S.STRICT: [S.STRICT, S.STRICT, S.NORMAL, S.NORMAL, S.HIGH_ONLY, S.HIGH_ONLY, S.HIGH_ONLY, None],
    S.NORMAL: [S.NORMAL, S.NORMAL, S.LENIENT, S.LENIENT, S.HIGH_ONLY, S.HIGH_ONLY, S.HIGH_ONLY, None],
    S.LENIENT: [S.LENIENT, S.LENIENT, S.HIGH_ONLY, S.HIGH_ONLY, S.HIGH_ONLY, S.HIGH_ONLY, S.HIGH_ONLY, None],
}


@pytest.mark.parametrize("base", list(EFFECTIVE))
@pytest.mark.parametrize("round_no", range(1, 9))
def test_effective_strictness_table(base, round_no):
    assert effective_strictness(base, round_no, ReviewDegradation()) == EFFECTIVE[base][round_no - 1]


@pytest.mark.parametrize("base", list(EFFECTIVE))
@pytest.mark.parametrize("round_no", [8, 9, 15, 100])
def test_effective_strictness_stops_from_round_8(base, round_no):
    assert effective_strictness(base, round_no, ReviewDegradation()) is None


@pytest.mark.parametrize("base", list(Strictness))
@pytest.mark.parametrize("round_no", [1, 3, 5, 8, 50])
def test_effective_strictness_without_degradation(base, round_no):
    assert effective_strictness(base, round_no, ReviewDegradation(enabled=False)) is base


@pytest.mark.parametrize(
    ("strictness", "threshold"),
    [(S.STRICT, Severity.LOW), (S.NORMAL, Severity.MEDIUM), (S.LENIENT, Severity.HIGH), (S.HIGH_ONLY, Severity.HIGH)],
)
def test_strictness_threshold(strictness, threshold):
    assert strictness.threshold is threshold


@pytest.mark.parametrize(
    ("strictness", "kept"),
    [
        (S.STRICT, ["LOW", "MEDIUM", "HIGH", "CRITICAL"]),
        (S.NORMAL, ["MEDIUM", "HIGH", "CRITICAL"]),
        (S.LENIENT, ["HIGH", "CRITICAL"]),
        (S.HIGH_ONLY, ["HIGH", "CRITICAL"]),
    ],
)
def test_findings_needing_fix(strictness, kept):
    findings = [finding(s, f"f-{s}") for s in ["CRITICAL", "LOW", "HIGH", "MEDIUM"]]
    got = findings_needing_fix(findings, strictness)
    order = ["CRITICAL", "LOW", "HIGH", "MEDIUM"]
    assert [f.severity.value for f in got] == [s for s in order if s in kept]  # order preserved


def test_findings_needing_fix_empty():
    assert findings_needing_fix([], S.STRICT) == []


def test_finding_severity_is_case_insensitive():
    assert finding("high").severity is Severity.HIGH


@given(
    severities=st.lists(st.sampled_from(list(Severity)), max_size=10),
    strictness=st.sampled_from(list(Strictness)),
)
def test_findings_needing_fix_is_exactly_those_at_or_above_threshold(severities, strictness):
    findings = [finding(s) for s in severities]
    got = findings_needing_fix(findings, strictness)
    assert got == [f for f in findings if f.severity.rank >= strictness.threshold.rank]


@given(base=st.sampled_from([S.STRICT, S.NORMAL, S.LENIENT]), r=st.integers(1, 30))
def test_degradation_never_gets_stricter(base, r):
    deg = ReviewDegradation()
    now, later = effective_strictness(base, r, deg), effective_strictness(base, r + 1, deg)
    if now is None:
        assert later is None
    elif later is not None:
        assert later.threshold.rank >= now.threshold.rank


# --- token budget (P26) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "level"),
    [
        (0, BudgetLevel.OK),
        (699, BudgetLevel.OK),
        (700, BudgetLevel.WARNING),
        (999, BudgetLevel.WARNING),
        (1000, BudgetLevel.EXHAUSTED),
        (10_000, BudgetLevel.EXHAUSTED),
    ],
)
def test_budget_level(used, level):
    assert budget_level(used, config(**{"token_budget.limit": 1000})) is level


def test_budget_warning_threshold_is_configurable():
    cfg = config(**{"token_budget.limit": 1000, "token_budget.warning_threshold": 0.5})
    assert budget_level(499, cfg) is BudgetLevel.OK
    assert budget_level(500, cfg) is BudgetLevel.WARNING


def test_a_limit_past_what_a_float_holds_is_a_budget_never_reached():
    """`--set token_budget.limit=1000...0` (309 zeros) passed every check, then the warning line's float overflowed
    in every Slave workflow task: the batch's task failed on every retry and the sprint hung."""
    cfg = config(**{"token_budget.limit": 10**309})
    assert budget_level(10**12, cfg) is BudgetLevel.OK
    assert budget_level(10**309, cfg) is BudgetLevel.EXHAUSTED


@pytest.mark.parametrize("used", [0, 999, 1000, 10**12])
def test_budget_disabled_is_always_ok(used):
    assert budget_level(used, config(**{"token_budget.enabled": False, "token_budget.limit": 1000})) is BudgetLevel.OK


def test_budget_default_limit_not_reached_by_a_small_sprint():
    assert budget_level(12_345, config()) is BudgetLevel.OK


@pytest.mark.parametrize("tokens", [0, MAX_TOKENS_PER_ANSWER, MAX_TOKENS_PER_ANSWER + 1, 10**30])
def test_an_answer_claiming_more_tokens_than_any_run_uses_is_refused(tokens):
    """A forged or garbled count would end the sprint on its budget: refused, naming the count and the bound."""
    refused = implausible_tokens(result(DEV, tokens=tokens))
    if tokens <= MAX_TOKENS_PER_ANSWER:
        assert refused is None
    else:
        assert refused is not None and refused.reason == (
            f"tokens_used {tokens} is more than any agent run uses (at most 1,000,000,000)"
        )


def test_a_simulation_script_claiming_implausible_tokens_is_named_at_the_start():
    assert SimulationScript.model_validate({"default": {"tokens": MAX_TOKENS_PER_ANSWER}}).tokens_error() is None
    script = SimulationScript.model_validate(
        {"default": {"tokens": 10**30}, "stories": {"1-1": {"tokens": 5}, KEY: {"tokens": MAX_TOKENS_PER_ANSWER + 1}}}
    )
    assert script.tokens_error() == f"tokens of default, {KEY}: at most 1,000,000,000 (no agent run uses more)"


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"default": {"tokens": 5, "duration_ms": 0}, "stories": {"1-1": {"review_scores": [70], "flaky": {"dev": 1}}},
          "improvements": [{"improvement_id": "i", "description": "d", "priority_score": 8}]}, None),
        ({"default": {"tokens": True}}, "default.tokens: Input should be a valid integer"),
        ({"stories": {"1-1": {"duration_ms": "200"}}}, "stories.1-1.duration_ms: Input should be a valid integer"),
        ({"stories": {"1-1": {"review_scores": [72.0]}}}, "stories.1-1.review_scores.0: Input should be a valid integer"),
        ({"stories": {"1-1": {"flaky": {"dev": False}}}}, "stories.1-1.flaky.dev: Input should be a valid integer"),
    ],
)
def test_a_simulation_script_value_taken_only_converted_is_named_at_the_start(raw, error):
    """`"tokens": true` was read as 1 token, `"200"` as 200 ms: the model (validated again by every workflow of a
    running sprint) converts them; the start refuses them."""
    SimulationScript.model_validate(raw)  # (taken by the model)
    assert SimulationScript.converted_values_error(raw) == error


def test_a_simulation_script_too_large_to_copy_is_named_at_the_start():
    fits = SimulationScript.model_validate({"stories": {"1-1": {"blocking": ["x" * 1000] * 200}}})
    assert fits.size_error() is None
    script = SimulationScript.model_validate({"stories": {"1-1": {"blocking": ["x" * 1000] * 300}}})
    assert script.size_error() == (
        f"{len(script.model_dump_json()):,} bytes, over the 256,000 a script may take (each of the sprint's residents "
        "and batches gets a copy in its history): script fewer stories, or shorter texts"
    )


# --- properties of the review-fix loop -------------------------------------------------------------

SEVERITY_LISTS = st.lists(st.lists(st.sampled_from(list(Severity)), max_size=4), max_size=30)


def _drive_from_review(cfg: SprintConfig, reviews: list[list[Severity]], e2e: list[bool], tags: list[str]):
    """Loop next_dispatch/apply_agent_result from `review`; FIX always succeeds.

    Returns the final progress and the number of dispatches, checking the invariants on the way.
    """
    p = progress("review")
    reviews_it, e2e_it = iter(reviews), iter(e2e)
    steps = 0
    while not is_terminal(p):
        step = next_dispatch(p)
        assert step in (CODE_REVIEW, FIX, E2E), p.state
        p = record_dispatch(p, step, f"d-{steps}")
        if step == CODE_REVIEW:
            res = result(step, findings=[finding(s) for s in next(reviews_it, [])], tokens=1)
        elif step == E2E:
            ok = next(e2e_it, True)
            res = result(step, verdict=Verdict.SUCCESS if ok else Verdict.FAILURE, tokens=1)
        else:
            res = result(step, tokens=1)
        p = apply_agent_result(p, step, res, cfg, tags).progress
        steps += 1
        assert p.fix_rounds <= cfg.max_review_rounds
        assert p.tokens_used == steps
        assert p.agents_dispatched == steps
        assert steps <= 1000, "review-fix loop does not terminate"
    return p, steps


@settings(max_examples=300)
@given(
    reviews=SEVERITY_LISTS,
    strictness=st.sampled_from(["strict", "normal", "lenient"]),
    degradation=st.booleans(),
    max_review_rounds=st.integers(0, 12),
)
def test_review_fix_loop_always_terminates(reviews, strictness, degradation, max_review_rounds):
    cfg = config(
        review_strictness=strictness,
        max_review_rounds=max_review_rounds,
        **{"review_degradation.enabled": degradation},
    )
    p, steps = _drive_from_review(cfg, reviews, [], [])
    assert p.state in {"done", "needs-intervention"}
    # Each fix costs a review and a fix dispatch; then one last review decides.
    max_fixes = min(max_review_rounds, 7) if degradation else max_review_rounds
    assert p.fix_rounds <= max_fixes
    assert steps == 2 * p.fix_rounds + 1
    assert p.review_rounds == p.fix_rounds + 1
    if degradation:
        assert p.review_rounds <= 8
    if p.state == "needs-intervention":
        assert p.error


@settings(max_examples=200)
@given(
    reviews=SEVERITY_LISTS,
    e2e=st.lists(st.booleans(), max_size=5),
    strictness=st.sampled_from(["strict", "normal", "lenient"]),
    degradation=st.booleans(),
    max_review_rounds=st.integers(0, 12),
)
def test_review_fix_e2e_loop_terminates_when_e2e_eventually_passes(
    reviews, e2e, strictness, degradation, max_review_rounds
):
    cfg = config(
        review_strictness=strictness,
        max_review_rounds=max_review_rounds,
        e2e_enabled=True,
        **{"review_degradation.enabled": degradation},
    )
    p, steps = _drive_from_review(cfg, reviews, e2e, ["Frontend"])
    assert p.state in {"done", "needs-intervention"}
    e2e_failures = e2e.count(False)
    assert p.e2e_rounds <= e2e_failures + 1
    assert steps <= 2 * max_review_rounds + 2 * e2e_failures + 3
    if p.state == "done":
        assert p.e2e_rounds >= 1  # a tagged story only reaches done through e2e-verify


SCHEDULED = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("recorded_run", "written_at", "mine"),
    [
        ("run-2", SCHEDULED - timedelta(days=1), True),  # this run's, whenever written
        ("run-1", SCHEDULED + timedelta(seconds=5), False),  # a sprint started again under its id
        (None, SCHEDULED + timedelta(seconds=5), True),  # an older worker's, written by this dispatch's attempt
        (None, SCHEDULED - timedelta(seconds=5), False),  # an older worker's, left by an earlier sprint
    ],
)
def test_a_dispatch_record_belongs_to_the_run_that_wrote_it(recorded_run, written_at, mine):
    assert written_by_this_run(recorded_run, "run-2", written_at=written_at, first_scheduled_at=SCHEDULED) is mine


def test_a_story_changed_by_hand_is_taken_if_settled_else_left_to_the_human():
    from bso.dispatch import changed_by_hand

    working = progress("review").model_copy(update={"pending_dispatch_id": "d-1", "pending_agent": "review-runner"})
    done = changed_by_hand(working, "review", "done", tokens=7).progress
    assert (done.state, done.error, done.pending_dispatch_id, done.tokens_used) == ("done", None, None, 7)
    skipped = changed_by_hand(working, "review", "skipped").progress
    assert skipped.state == "skipped" and "set to skipped in sprint-status.yaml by hand" in skipped.error
    other = changed_by_hand(working, "review", "ready-for-dev").progress
    assert other.state == "needs-intervention"
    assert "changed under the Slave (expected 'review', found 'ready-for-dev')" in other.error


def test_a_story_not_started_takes_the_files_value():
    from bso.dispatch import taken_from_file

    waiting = progress("backlog")
    assert taken_from_file(waiting, "review").state == "review"  # its starting point, with no error
    assert taken_from_file(waiting, "review").error is None
    skipped = taken_from_file(waiting, "skipped")
    assert skipped.state == "skipped" and "set to skipped in sprint-status.yaml by hand" in skipped.error
    assert taken_from_file(waiting, "done").state == "done"
    gone = taken_from_file(waiting, None)
    assert gone.state == "needs-intervention" and gone.error == "story no longer in sprint-status.yaml"
    held = taken_from_file(waiting, "needs-intervention")  # (it ended with no reason: the report said nothing)
    assert held.state == "needs-intervention" and held.error == "set to needs-intervention in sprint-status.yaml by hand"
    assert taken_from_file(held, "needs-intervention") == held


def test_a_deadline_fired_long_past_its_moment_was_slept_through():
    """The server fires an overdue timer when it runs again: more than asleep_after_seconds (30) past its moment,
    the machine or the server was not running then (a closed laptop), and the agent's time was not spent."""
    assert not slept_through(0.2, SprintConfig())  # on time: a real timeout
    assert not slept_through(30, SprintConfig())
    assert slept_through(31, SprintConfig())
    assert slept_through(9 * 3600, SprintConfig())  # a night
    assert not slept_through(9 * 3600, SprintConfig(asleep_after_seconds=10 * 3600))


def test_a_needs_intervention_a_human_set_is_said_to_be_set_by_hand():
    """Three stories parked by hand paused an unattended sprint as repeated failures: the Master tells them apart."""
    progress = StoryProgress(key="1-1-a", state="ready-for-dev")
    assert taken_from_file(progress, "needs-intervention").set_by_hand
    assert changed_by_hand(progress, "ready-for-dev", "needs-intervention").progress.set_by_hand
    assert changed_by_hand(progress, "ready-for-dev", "in-progress").progress.set_by_hand  # left to that person
    assert not taken_from_file(progress, None).set_by_hand  # gone from the file: not a human's state
    assert not changed_by_hand(progress, "ready-for-dev", "done").progress.set_by_hand



def test_how_late_the_server_fired_a_deadline_is_read_from_history():
    """The Slave asks history, not its clock (a replay may lend a task an earlier task's clock): an agent activity
    timed out 9 s past its schedule-to-close, a working-time timer fired 1 h past its length; the last one of the
    id or summary counts, and one that never fired is not late."""
    from google.protobuf.duration_pb2 import Duration
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.api.common.v1 import Payload
    from temporalio.api.history.v1 import HistoryEvent

    from activities.deadlines import LatenessInput, lateness_in

    def event(event_id: int, second: int, **attrs) -> HistoryEvent:
        return HistoryEvent(event_id=event_id, event_time=Timestamp(seconds=second), **attrs)

    scheduled = {"activity_id": "s/batch-1/1-1/1", "schedule_to_close_timeout": Duration(seconds=10)}
    summary = {"summary": Payload(metadata={"encoding": b"json/plain"}, data=b'"working time"')}
    events = [
        event(1, 100, activity_task_scheduled_event_attributes=scheduled),
        event(2, 110, activity_task_timed_out_event_attributes={"scheduled_event_id": 1}),  # on time
        event(3, 120, activity_task_scheduled_event_attributes=scheduled),
        event(4, 139, activity_task_timed_out_event_attributes={"scheduled_event_id": 3}),  # 9 s late
        event(5, 140, timer_started_event_attributes={"timer_id": "7", "start_to_fire_timeout": Duration(seconds=60)},
              user_metadata=summary),
        event(6, 3800, timer_fired_event_attributes={"timer_id": "7"}),
    ]
    run = {"workflow_id": "s/batch-1", "run_id": "r"}
    assert lateness_in(events, LatenessInput(activity_id="s/batch-1/1-1/1", **run)) == 9
    assert lateness_in(events[:2], LatenessInput(activity_id="s/batch-1/1-1/1", **run)) == 0
    assert lateness_in(events, LatenessInput(timer_summary="working time", **run)) == 3600
    assert lateness_in(events, LatenessInput(timer_summary="story updates hold", **run)) == 0


def test_a_deadline_fired_while_no_worker_ran_is_late_until_a_worker_handled_it():
    """A worker killed or frozen (SIGSTOP) at an agent's deadline, the server running on: the server fires it on
    time, and the workflow task carrying it waits (killed) or is taken by the frozen worker's open poll and times
    out (frozen) until a worker runs again. The deadline is late until a worker completed or failed a workflow task
    after it (the event sequences measured on a dev server, a 30 s deadline, the worker back at 45 s); one a live
    worker took up at once (an agent still working at its deadline) is not late, nor is a timer (an external
    agent's deadline) fired on time while no worker ran: that agent answers whether a worker runs or not."""
    from google.protobuf.duration_pb2 import Duration
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.api.common.v1 import Payload
    from temporalio.api.history.v1 import HistoryEvent

    from activities.deadlines import LatenessInput, lateness_in

    def event(event_id: int, second: float, **attrs) -> HistoryEvent:
        return HistoryEvent(event_id=event_id, event_time=Timestamp(seconds=int(second), nanos=int(second % 1 * 1e9)), **attrs)

    scheduled = {"activity_id": "s/batch-1/1-1/1", "schedule_to_close_timeout": Duration(seconds=30)}
    fired = [
        event(5, 100, activity_task_scheduled_event_attributes=scheduled),
        event(6, 130, activity_task_timed_out_event_attributes={"scheduled_event_id": 5}),  # on time
        event(7, 130, workflow_task_scheduled_event_attributes={}),
    ]
    killed = [  # the sticky task not started, then the task on the normal queue taken once a worker runs again
        event(8, 140, workflow_task_timed_out_event_attributes={"scheduled_event_id": 7}),
        event(9, 140, workflow_task_scheduled_event_attributes={}),
        event(10, 155.8, workflow_task_started_event_attributes={"scheduled_event_id": 9}),
        event(11, 155.9, workflow_task_completed_event_attributes={"scheduled_event_id": 9}),
    ]
    frozen = [  # taken by the frozen worker's poll at once, timed out unanswered, twice; answered once it goes on
        event(8, 130, workflow_task_started_event_attributes={"scheduled_event_id": 7}),
        event(9, 140, workflow_task_timed_out_event_attributes={"scheduled_event_id": 7}),
        event(10, 140, workflow_task_scheduled_event_attributes={}),
        event(11, 140, workflow_task_started_event_attributes={"scheduled_event_id": 10}),
        event(12, 150, workflow_task_timed_out_event_attributes={"scheduled_event_id": 10}),
        event(13, 150, workflow_task_scheduled_event_attributes={}),
        event(14, 155, workflow_task_started_event_attributes={"scheduled_event_id": 13}),
        event(15, 155.5, workflow_task_completed_event_attributes={"scheduled_event_id": 13}),
    ]
    running = [  # a live worker (its agent still working at the deadline) took and answered it at once
        event(8, 130.01, workflow_task_started_event_attributes={"scheduled_event_id": 7}),
        event(9, 130.05, workflow_task_completed_event_attributes={"scheduled_event_id": 7}),
    ]
    failing = [  # a live worker failed the task (a bug): it ran, so not late
        event(8, 130.01, workflow_task_started_event_attributes={"scheduled_event_id": 7}),
        event(9, 130.05, workflow_task_failed_event_attributes={"scheduled_event_id": 7}),
    ]
    agent = LatenessInput(activity_id="s/batch-1/1-1/1", workflow_id="s/batch-1", run_id="r")
    assert lateness_in(fired + killed, agent) == pytest.approx(25.9)
    assert lateness_in(fired + frozen, agent) == pytest.approx(25.5)
    assert lateness_in(fired + running, agent) == pytest.approx(0.05)
    assert lateness_in(fired + failing, agent) == pytest.approx(0.05)
    assert not slept_through(lateness_in(fired + killed, agent), SprintConfig())  # 25.9 s: not past 30 s
    assert slept_through(lateness_in(fired + killed, agent), SprintConfig(asleep_after_seconds=20))
    summary = {"summary": Payload(metadata={"encoding": b"json/plain"}, data=b'"external deadline"')}
    timer = [
        event(5, 100, timer_started_event_attributes={"timer_id": "3", "start_to_fire_timeout": Duration(seconds=30)},
              user_metadata=summary),
        event(6, 130, timer_fired_event_attributes={"timer_id": "3"}),
        event(7, 130, workflow_task_scheduled_event_attributes={}),
    ]
    assert lateness_in(timer + killed, LatenessInput(timer_summary="external deadline", workflow_id="s/batch-1", run_id="r")) == 0
    # The batch's working time: no worker, no agent of the batch ran; late until a worker took it up.
    working = LatenessInput(timer_summary="external deadline", worker_down_counts=True, workflow_id="s/batch-1", run_id="r")
    assert lateness_in(timer + killed, working) == pytest.approx(25.9)
    assert lateness_in(timer + running, working) == pytest.approx(0.05)
