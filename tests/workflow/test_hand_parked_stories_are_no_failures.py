"""README, "The status file": a story not started yet that the user sets to `needs-intervention` by hand is
taken as left ("set to needs-intervention in sprint-status.yaml by hand"). The Master counts such parked stories
as agent failures: three of them make it raise its own `repeated_failures` course correction and PAUSE the
sprint ("repeated failures: 3 stories in a row ended needs-intervention; course_correct, then resume"), though no
agent failed at all; an unattended sprint then waits for a human. (workflows/course_corrector.py,
`_count_failure`, counts every needs-intervention state whatever its cause.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE
from tests.conftest import bso_worker
from tests.workflow.helpers import cancel_sprint, make_project, sprint_input, start_sprint, wait_status
from tests.workflow.test_external_agents import _complete, _pending
from workflows.sprint_master import SprintMasterWorkflow

KEYS = ["1-1-a", "1-2-b", "1-3-c", "1-4-d", "1-5-e"]


async def test_stories_parked_by_hand_do_not_pause_the_sprint_as_repeated_failures(ts_env, tmp_path: Path):
    make_project(tmp_path, {k: "ready-for-dev" for k in KEYS})
    client = ts_env.client
    status_file = tmp_path / DEFAULT_STATUS_FILE
    async with bso_worker(client) as queue:
        handle = await start_sprint(
            client, queue,
            sprint_input(tmp_path, agent_backend="external", session_id="ux-parked", config_overrides={"batch_size": 5}),
        )
        slave_id = slave_workflow_id("ux-parked", 1)
        slave = client.get_workflow_handle(slave_id)
        dev, agent, mode = await _pending(client, slave_id, ts_env)
        assert (agent, mode) == ("dev-runner", "dev")

        # The user parks three stories not started yet (README: taken as left).
        text = status_file.read_text()
        for key in KEYS[1:4]:
            text = text.replace(f"{key}: ready-for-dev", f"{key}: needs-intervention")
        status_file.write_text(text)

        await slave.signal("agent_complete", {**_complete(dev, agent, mode), "story_key": "1-1"})
        review, agent, mode = await _pending(client, slave_id, ts_env, after=dev)
        await slave.signal("agent_complete", {**_complete(review, agent, mode), "story_key": "1-1"})

        await wait_status(
            handle,
            lambda s: all(s.stories[k].state == "needs-intervention" for k in KEYS[1:4]),
            "the Master has heard of the three parked stories",
        )
        await asyncio.sleep(3)  # (real time) the Master's story updates are held about a second
        status = await handle.query(SprintMasterWorkflow.status)
        await cancel_sprint(handle)
    parked = {k: status.stories[k].error for k in KEYS[1:4]}
    assert all("by hand" in (e or "") for e in parked.values()), parked
    assert status.pause_reason is None, (
        f"no agent failed (the three stories were parked by hand), yet the sprint paused itself: {status.pause_reason!r}"
    )
