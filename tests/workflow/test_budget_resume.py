"""A plain `bso sprint resume` (or a temporal CLI resume with a limit still under the tokens used) after the
sprint paused on its token budget: the Master cleared the pause while no batch could start, and its loop spun (a
deadlock failing its workflow task on every retry: no status, no progress). It stays paused and says why; a
resume with a higher limit goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bso.states import SprintPhase, SprintStatus
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, wait_status, workflow_task_failures
from workflows.sprint_master import SprintMasterWorkflow

KEYS = ["1-1-a", "1-2-b", "1-3-c"]


async def test_a_resume_that_leaves_the_budget_used_up_keeps_the_sprint_paused(own_ts_env, tmp_path: Path):
    client = own_ts_env.client
    make_project(tmp_path, {k: "ready-for-dev" for k in KEYS})
    overrides = {"batch_size": 1, "token_budget": {"limit": 1500}}
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, session_id="budget-resume", config_overrides=overrides))
        stopped = await wait_status(
            handle, lambda st: (st.pause_reason or "").startswith("token budget exhausted"), "the budget stop"
        )
        assert stopped.pause_reason.endswith("resume with a higher token_limit to go on"), stopped.pause_reason
        await handle.signal(SprintMasterWorkflow.resume)  # no limit
        await handle.signal(SprintMasterWorkflow.resume, {"token_limit": stopped.tokens_used - 1})  # still under
        status = await wait_status(handle, lambda st: "still exhausted" in (st.pause_reason or ""), "the note")
        await asyncio.sleep(1)
        assert await workflow_task_failures(client, handle.id) == []
        assert status.phase is SprintPhase.PAUSED and not status.running_batches
        assert status.pause_reason == (
            f"token budget still exhausted ({stopped.tokens_used:,}/{stopped.tokens_used - 1:,} tokens): resume with "
            f"a token_limit above {stopped.tokens_used:,} to go on"
        )
        await handle.signal(SprintMasterWorkflow.resume, {"token_limit": 100_000})
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE and set(report.stories.values()) == {"done"}, report
    assert await workflow_task_failures(client, handle.id) == []
