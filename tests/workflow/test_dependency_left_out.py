"""A story whose `Depends on:` names a story an earlier sprint left needs-intervention ran and was written done:
the dependency was left out of the sprint by itself (its state), and a dependency outside the sprint did not
count. One left out that will not be done (needs-intervention, skipped) skips its dependants, as a planned one
does; one left out that may still be done (another epic's backlog) still does not hold them. A human's rearm of such a
dependant waives the dependency (it is not the sprint's to rearm: the rearm was refused, naming it)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import bso_worker
from tests.workflow.helpers import (
    ledger, make_project, run_sprint, sprint_input, sprint_result, start_sprint, status_values, wait_status,
)
from workflows.sprint_master import SprintMasterWorkflow

K1, K2, K3 = "1-1-user-model", "1-2-login", "1-3-logout"


async def test_a_dependant_of_a_story_left_out_needs_intervention_is_skipped(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "needs-intervention", K2: "ready-for-dev", K3: "ready-for-dev", "2-1-other": "backlog"},
        {
            K2: "# Story 1.2: Login\n\nStatus: ready-for-dev\n\nDepends on: 1-1\n",
            K3: "# Story 1.3: Logout\n\nStatus: ready-for-dev\n\nDepends on: 2-1\n",
        },
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, epic="1", session_id="dep-left-out"))
    assert not [e for e in ledger(tmp_path) if e["dispatch_id"].split("/")[-2] == "1-2"]
    assert report.stories == {K2: "skipped", K3: "done"}, report.stories
    assert status_values(tmp_path)[K2] == "skipped" and status_values(tmp_path)[K1] == "needs-intervention"
    (skipped,) = [r for b in report.batches for r in b.results.story_results if r.story_key == K2]
    assert skipped.error == "dependency 1-1-user-model ended needs-intervention: story skipped", skipped


async def test_a_dependant_skipped_for_a_left_out_dependency_runs_once_rearmed(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "needs-intervention", K2: "ready-for-dev", K3: "ready-for-dev"},
        {K2: "# Story 1.2: Login\n\nStatus: ready-for-dev\n\nDepends on: 1-1\n"},
    )
    overrides = {"batch_size": 1, "first_story_checkpoint": "pause"}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, epic="1", session_id="dep-waived", config_overrides=overrides)
        )
        await wait_status(handle, lambda st: st.stories[K2].state == "skipped" and not st.running_batches, "1-2 skipped")
        view = await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K2, "decision": "rearm"})
        assert view.state == "ready-for-dev"
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K2: "done", K3: "done"}, report.stories
