"""A story line added to sprint-status.yaml while the sprint runs (BMAD's create-story adds them) could not be brought
in by a course correction: `CC_REJECTED: add_stories: unknown story key '1-3-new-thing'`, the Master checking against
the file as it was at the sprint's start. It reads the file for such a key; one still unknown is refused, named."""

from __future__ import annotations

from pathlib import Path

from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE
from tests.conftest import bso_worker
from tests.workflow.helpers import cancel_sprint, make_project, sprint_input, start_sprint
from tests.workflow.test_external_agents import _pending
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"
K2 = "1-2-logout"
NEW = "1-3-new-thing"


async def test_a_story_line_added_to_the_file_mid_sprint_can_be_added_by_course_correction(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "backlog"})
    client = ts_env.client
    status_file = tmp_path / DEFAULT_STATUS_FILE
    async with bso_worker(client) as queue:
        handle = await start_sprint(
            client, queue,
            sprint_input(tmp_path, agent_backend="external", session_id="cc-new-line", story_keys=["1-1"]),
        )
        await _pending(client, slave_workflow_id("cc-new-line", 1), ts_env)  # the sprint runs, K1's agent in flight

        # The scrum master adds a new story to the status file (a new line under its epic).
        text = status_file.read_text()
        line = f"  {K2}: backlog  # story {K2}\n"
        assert line in text
        status_file.write_text(text.replace(line, line + f"  {NEW}: ready-for-dev\n"))

        try:
            cc = await handle.execute_update(
                SprintMasterWorkflow.course_correct,
                {"reason": "new_requirements", "add_stories": [NEW], "text": "new story from the SM"},
            )
            outcome = f"added {cc.added}"
        except Exception as err:  # WorkflowUpdateFailedError carrying CC_REJECTED
            outcome = f"refused: {getattr(err, 'cause', None) or err}"
        try:
            await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "new_requirements", "add_stories": ["1-9"]})
            typo = "added"
        except Exception as err:  # noqa: BLE001 - WorkflowUpdateFailedError carrying CC_REJECTED
            typo = getattr(getattr(err, "cause", None), "message", str(err))  # as `bso sprint cc` shows it
        await cancel_sprint(handle)
    assert outcome == f"added {[NEW]}", outcome
    assert typo == "CC_REJECTED: add_stories: unknown story key '1-9'", typo
