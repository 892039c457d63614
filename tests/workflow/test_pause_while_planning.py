"""A pause that arrives while the residents start and the scrum-master plans holds, and the phase says so
(it used to be overwritten by `running`, leaving a sprint paused in fact but shown running: an operator
waiting for `paused` never saw it, and never resumed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, start_sprint
from workflows.sprint_master import SprintMasterWorkflow

K1, K2 = "1-1-login-form", "1-2-logout"


async def test_a_pause_sent_during_planning_shows_paused_and_resumes(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="pause-plan-1"))
        await handle.signal(SprintMasterWorkflow.pause, "early pause")  # before the first batch can start
        for _ in range(200):
            status = await handle.query(SprintMasterWorkflow.status)
            if status.batches_total:  # planned
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.pause_reason == "early pause"
        assert status.phase == "paused" and status.batches_done == 0
        await handle.signal(SprintMasterWorkflow.resume)
        report = await handle.result()
    assert report.stories == {K1: "done", K2: "done"}
