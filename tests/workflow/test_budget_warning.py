"""`token_budget.warning_threshold` (0.7) is the "share of the limit that raises a warning": a sprint that used 80%
of its budget (threshold 0.5) raised none anywhere (bso.dispatch.budget_level computed WARNING, nothing acted on
it). The status's errors, the execution summary and the worker's log say it, once."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, start_sprint, sprint_result
from workflows.sprint_master import SprintMasterWorkflow


async def test_token_budget_warning_threshold_raises_a_warning(ts_env, tmp_path: Path):
    make_project(tmp_path, {"1-1-a": "ready-for-dev", "1-2-b": "ready-for-dev"})
    inp = sprint_input(
        tmp_path,
        session_id="budget-80pct",
        config_overrides={"token_budget.limit": 10_000, "token_budget.warning_threshold": 0.5},
        simulation={"default": {"tokens": 2000}},  # dev + review per story: 4000 each, 8000 = 80% in all
    )
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert report.tokens_used == 8000 and report.token_limit == 10_000
    summary = (tmp_path / ".sprint-session" / "execution-summary-budget-80pct.md").read_text()
    summary_without_config = summary.split("## Configuration Used")[0].lower()
    # Said once, as soon as the Master's count passed the line (5,000: 6,000 after the first story's review).
    [warning] = [e for e in status.errors if "token budget warning" in e]
    assert warning.endswith(" of 10,000 tokens used, past warning_threshold 0.5 (action at the limit: pause_and_report)")
    assert "token budget warning" in summary_without_config, summary
