"""A pause that arrives while the Master is still starting or planning holds, and the phase says so (it
used to be overwritten by `running` at the end of planning: the sprint held with no sign of why, and an
operator waiting for `paused` waited forever)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bso.states import SprintPhase, SprintStatus
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"


async def test_a_pause_sent_at_the_start_holds_and_shows(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        # Signal-with-start: the pause is there before the Master has even read the status file.
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="early-pause-1"), paused="before the first batch"
        )
        for _ in range(200):
            status = await handle.query(SprintMasterWorkflow.status)
            if status.phase is SprintPhase.PAUSED:
                break
            await asyncio.sleep(0.05)
        assert status.phase is SprintPhase.PAUSED and status.pause_reason == "before the first batch"
        assert status.batches_done == 0 and status.current_batch is None
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done"}
