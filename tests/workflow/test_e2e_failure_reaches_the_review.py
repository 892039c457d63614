"""An e2e-inspector `failure` sent the story back to `review` with nothing of the failure: the review-runner's
assignment carried no findings, so a persistent e2e failure ran review + e2e on unchanged code max_review_rounds
+ 1 times (22 agent runs by default: `e2e still failing after 11 rounds`). The review after it is given what
failed (its fix_findings, shown in its prompt)."""

from __future__ import annotations

from pathlib import Path

from bso.constants import slave_workflow_id
from tests.conftest import bso_worker
from tests.workflow.helpers import agent_assignments, make_project, run_sprint, sprint_input

K = "2-1-expiry-page"


async def test_an_e2e_failure_reaches_the_review_after_it(ts_env, tmp_path: Path):
    make_project(tmp_path, {K: "ready-for-dev"}, {K: "# Story 2.1: Expiry page\n\nStatus: ready-for-dev\n\nTags: ui\n"})
    simulation = {"stories": {"2-1": {"e2e": ["failure", "success"]}}}
    inp = sprint_input(tmp_path, session_id="e2e-fix", config_overrides={"e2e_enabled": True}, simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    slave = slave_workflow_id("e2e-fix", 1)
    given = await agent_assignments(ts_env.client, slave)
    steps = [(a["agent_type"], a["mode"]) for a in given]
    assert steps == [("dev-runner", "dev"), ("review-runner", "review"), ("e2e-inspector", "e2e"),
                     ("review-runner", "review"), ("e2e-inspector", "e2e")], steps
    assert [f["summary"] for f in given[3]["fix_findings"]] == ["e2e verification failed: simulated e2e-inspector/e2e"]
    assert given[1]["fix_findings"] == [] and report.stories == {K: "done"}
