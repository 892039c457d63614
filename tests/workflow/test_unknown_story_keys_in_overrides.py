"""A `story_priorities` key naming no story of the status file (a typo: `1-9`): `bso sprint start` refuses it, but
a sprint started with `temporal workflow start --input` took it without a word, the priority the user meant
silently not applied. The Master refuses it too, naming the key. (A simulation script may name stories to come:
the improvement cycle's, or lines added to the file later and brought in by a course correction.)"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowFailureError

from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint, status_values

K1 = "1-1-login-form"


async def test_a_priority_for_no_story_is_refused(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    inp = sprint_input(tmp_path, config_overrides={"story_priorities": {"1-9": "critical"}})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        try:
            report = await sprint_result(handle)
            outcome = f"ran: {report.stories}"
        except WorkflowFailureError as err:
            outcome = str(err.cause)
    assert "story_priorities: unknown story key '1-9' (not a story of sprint-status.yaml)" in outcome, outcome
    assert status_values(tmp_path) == before
