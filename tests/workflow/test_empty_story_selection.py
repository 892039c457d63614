"""A sprint started with `"story_keys": []` runs no story: it fails at its start (it ran every open story).

`temporal workflow start --type SprintMasterWorkflow ... --input '{"project_root": "/tmp/shelfwise",
"story_keys": []}'` (a script whose user picked no story, a selection filtered down to nothing) is taken as
no selection at all: the sprint takes on every story of the status file that is not settled and its agents
move them all (seen: `sprint-complete, batches ended 2/2` on the demo project). The README says `story_keys`
restricts the sprint and that a selection with nothing left to run fails it at its start; an empty list
selects nothing, so it should fail the same way (or be refused as an empty selection), never run everything.
`"story_keys": null` (or leaving it out) is the way to say "no selection".
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowFailureError

from bso.message_flow import message_flow
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, status_values

K1 = "1-1-login-form"
K2 = "1-2-logout"


async def test_an_empty_story_selection_runs_no_story(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "backlog"})
    before = status_values(tmp_path)
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, story_keys=[]))
        try:
            ran = (await sprint_result(handle)).stories
        except WorkflowFailureError as err:  # refused at its start, as a selection with nothing to run is
            assert "story_keys is an empty list" in str(err.cause), err.cause
            ran = {}
        (start,) = [m for m in message_flow([await handle.fetch_history()]) if m.type == "SPRINT_START"]
    assert "story_keys [], no story" in start.detail, start.detail  # not "all open stories"
    assert ran == {}, f"an empty selection ran {ran}"
    assert status_values(tmp_path) == before  # epics included: nothing written
