"""Agent-PO gate rules (bso/po_gates.py): GO on a plan, NEXT on a completion report."""

from __future__ import annotations

from bso.po_gates import (
    StoryScope,
    acceptance_criteria_ids,
    anti_patterns,
    gates_active,
    go_gate,
    in_scope,
    next_gate,
    plan_sha256,
    simulated_plan,
    simulated_report,
)
from bso.config import resolve_config
from bso.simulation import SimulationScript

STORY = """# Story 1.1: Login form

Status: ready-for-dev
Files: src/login.py, src/templates/

## Acceptance Criteria

1. The form shows
2. Errors are reported
AC-3: Tests cover it

## Tasks / Subtasks

1. not an AC
"""
SCOPE = StoryScope(ac_ids=["AC-1", "AC-2", "AC-3"], files=["src/login.py", "src/templates/"])
AT = "2026-01-05T00:00:00+00:00"


def _go(kind: str, revision: int = 1, max_revisions: int = 2):
    plan = simulated_plan(kind, SCOPE, "dev-runner", "1-1", revision)
    return go_gate(plan, SCOPE, revision=revision, max_revisions=max_revisions, timeout_minutes=30, task_id="1-1")


def _next(kind: str, retries_used: int = 0, max_retries: int = 2):
    report = simulated_report(kind, SCOPE, ["src/login.py"], "dev-runner", "1-1", AT)
    return next_gate(report, SCOPE, ["src/login.py"], retries_used=retries_used, max_retries=max_retries, task_id="1-1")


def test_story_acs_and_scope() -> None:
    assert acceptance_criteria_ids(STORY) == ["AC-1", "AC-2", "AC-3"]
    assert acceptance_criteria_ids("# Story 1.1: x\n\nno criteria\n") == []
    assert in_scope("src/login.py", SCOPE.files) and in_scope("src/templates/a.html", SCOPE.files)
    assert not in_scope("src/other.py", SCOPE.files)
    assert in_scope("anything.py", [])  # no scope declared: any file
    # `File scope:` globs, as the command backend's scope guard reads them
    assert in_scope("src/a/b.py", ["src/**"]) and in_scope("tests/test_x.py", ["tests/test_*.py"])
    assert not in_scope("docs/notes.md", ["src/**", "tests/**"]) and not in_scope("srcx/a.py", ["src/**"])
    assert in_scope("./.github/ci.yml", [".github/"]) and not in_scope("github/ci.yml", [".github/"])


def test_knob_default_depends_on_backend() -> None:
    assert resolve_config().po_gates_enabled is None
    # The command backend tells its agent the PO phase and checks the real diff: on by default for it.
    assert gates_active(None, "command") and not gates_active(None, "simulated")
    assert gates_active(True, "simulated") and not gates_active(False, "command")
    assert resolve_config().po_max_revisions == 2 and resolve_config().po_max_retries == 2


def test_go_gate() -> None:
    good = _go("good")
    assert good.outcome == "GO" and good.go is not None
    assert good.go.authorization.authorized_files == ["src/login.py", "src/templates/"]
    assert good.go.authorization.timeout_minutes == 30
    missing = _go("missing_ac")
    assert missing.outcome == "FEEDBACK" and [i.ac_id for i in missing.issues] == ["AC-3"]
    assert missing.feedback is not None and missing.feedback.current_revision == 1
    assert [i.type for i in _go("out_of_scope").issues] == ["file_out_of_scope"]
    assert [i.type for i in _go("no_tests").issues] == ["no_tests_planned"]
    assert _go("missing_ac", revision=3).outcome == "BLOCKED"
    assert _go("missing_ac", revision=2).outcome == "FEEDBACK"
    assert _go("good", revision=3).outcome == "GO"


def test_plan_hash_is_stable_and_content_bound() -> None:
    a = simulated_plan("good", SCOPE, "x", "1-1", 1)
    b = simulated_plan("good", SCOPE, "y", "1-1", 2)
    assert plan_sha256(a) == plan_sha256(b) and len(plan_sha256(a)) == 64
    assert plan_sha256(a) != plan_sha256(simulated_plan("no_tests", SCOPE, "x", "1-1", 1))


def test_next_gate() -> None:
    assert _next("good").outcome == "NEXT"
    assert [i.type for i in _next("missing_ac").issues] == ["ac_no_evidence"]
    assert [i.type for i in _next("out_of_scope").issues] == ["unauthorized_file"]
    fix = _next("failing_tests")
    assert fix.outcome == "FIX" and fix.fix is not None and fix.fix.retry.count == 1
    assert [i.type for i in fix.issues] == ["tests_failed"]
    # The directive says what to fix in its message too (it was empty in the gate's file).
    assert fix.fix.message == f"fix 1 issue (retry 1): {fix.issues[0].message}", fix.fix.message
    assert _next("failing_tests", retries_used=1).fix.retry.count == 2  # type: ignore[union-attr]
    assert _next("failing_tests", retries_used=2).outcome == "BLOCKED"
    assert _next("failing_tests", max_retries=0).outcome == "BLOCKED"


def test_anti_patterns_list_every_earlier_attempt() -> None:
    first, second = _next("failing_tests").issues, _next("out_of_scope").issues
    assert anti_patterns([first, second]) == [
        "attempt 1: 1 test(s) failed",
        "attempt 2: somewhere/else/unrelated.py was changed without authorization",
    ]


def test_script_po_kinds_are_validated() -> None:
    script = SimulationScript.model_validate({"stories": {"1-1": {"po": {"plan": ["missing_ac", "good"]}}}})
    assert script.for_story("1-1-login").po.plan == ["missing_ac", "good"]
    try:
        SimulationScript.model_validate({"stories": {"1-1": {"po": {"plan": ["bogus"]}}}})
    except ValueError:
        pass
    else:
        raise AssertionError("an unknown plan kind must be refused")


def test_gate_totals_sum_the_batches() -> None:
    from bso.models import GateCounts, SlaveResult, SlaveResults
    from bso.po_gates import gate_totals

    def batch(i: int, go: int, nxt: int, fb: int, fix: int, blocked: int) -> SlaveResult:
        results = SlaveResults(stories_total=0, stories_completed=0, stories_failed=0, stories_skipped=0,
                               story_results=[], total_agents_created=0, total_agents_destroyed=0,
                               review_fix_rounds={})
        return SlaveResult(status="batch-complete", batch_id=i, session_id="s", results=results, gates_go_issued=go,
                           gates_next_issued=nxt, gates_feedback_issued=fb, gates_fix_issued=fix, gates_blocked=blocked)

    assert gate_totals([]) == GateCounts()
    assert gate_totals([batch(1, 2, 1, 0, 3, 1), batch(2, 1, 1, 2, 0, 0)]) == GateCounts(
        go_issued=3, next_issued=2, feedback_issued=2, fix_issued=3, blocked=1
    )
