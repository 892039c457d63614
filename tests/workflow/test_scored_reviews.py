"""Scored reviews (Gear 2) through the real Slave: the score per round, blocking issues, feedback in the fix."""

from __future__ import annotations

from pathlib import Path

from bso.constants import slave_workflow_id
from tests.conftest import bso_worker
from tests.workflow.helpers import fix_assignments, make_project, run_sprint, sprint_input

K1 = "1-1-login-form"
K2 = "1-2-logout"


def _story(report, key):
    return next(r for b in report.batches for r in b.results.story_results if r.story_key == key)


async def test_scored_review_fix_loop_and_scores_in_the_report(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    simulation = {
        "stories": {
            "1-1": {"review_scores": [72, 88], "blocking": ["Missing unit tests for error handling"]},
            "1-2": {"review_scores": [60, 65]},
        }
    }
    inp = sprint_input(tmp_path, simulation=simulation, config_overrides={"max_review_rounds": 1})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories == {K1: "done", K2: "needs-intervention"}
    assert _story(report, K1).review_scores == [72, 88]
    assert _story(report, K2).review_scores == [60, 65]
    assert "max_review_rounds (1)" in (_story(report, K2).error or "")

    # The fix assignment carried the review's feedback: read the Slave's scheduled activities.
    fixes = await fix_assignments(ts_env.client, slave_workflow_id(report.session_id, 1))
    k1_fix = next(a for a in fixes if a["story_key"] == K1)
    issues = [(f["severity"], f["issue"]) for f in k1_fix["fix_feedback"]]
    assert ("blocking", "Missing unit tests for error handling") in issues
