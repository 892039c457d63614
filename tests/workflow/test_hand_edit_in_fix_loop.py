"""A story set to `skipped` by hand while its fix agent ran went on being reviewed and fixed, round after round: a
review-fix loop keeps `review` in the file, and no write (the compare-and-swap that sees a hand edit) happened. The
README's promise: the answer of the agent working on it (or of the next one) is set aside, no more."""

from __future__ import annotations

from pathlib import Path

from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, start_sprint
from tests.workflow.test_external_agents import _complete, _pending

K1 = "1-1-login-form"


async def test_a_story_skipped_by_hand_during_its_fix_stops_its_review_fix_loop(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    client = ts_env.client
    status_file = tmp_path / DEFAULT_STATUS_FILE
    async with bso_worker(client) as queue:
        handle = await start_sprint(
            client, queue, sprint_input(tmp_path, agent_backend="external", session_id="hand-fix")
        )
        slave_id = slave_workflow_id("hand-fix", 1)
        slave = client.get_workflow_handle(slave_id)
        high = {"findings": [{"severity": "HIGH", "summary": "broken"}]}

        review_1, agent, mode = await _pending(client, slave_id, ts_env)
        assert (agent, mode) == ("review-runner", "review")
        await slave.signal("agent_complete", _complete(review_1, agent, mode, **high))
        fix_1, agent, mode = await _pending(client, slave_id, ts_env, after=review_1)
        assert (agent, mode) == ("dev-runner", "fix")

        # The user gives the story up while its fix agent works.
        text = status_file.read_text()
        status_file.write_text(text.replace(f"{K1}: review", f"{K1}: skipped"))

        await slave.signal("agent_complete", _complete(fix_1, agent, mode))
        # "the answer of the agent working on it (or of the next one) is set aside": at most one more agent
        after = agent2 = mode2 = None
        try:
            nxt, agent, mode = await _pending(client, slave_id, ts_env, after=fix_1, tries=50)
        except AssertionError:
            nxt = None  # no further dispatch: the fix's answer was set aside
        if nxt is not None:
            await slave.signal("agent_complete", _complete(nxt, agent, mode, **high))
            try:
                after, agent2, mode2 = await _pending(client, slave_id, ts_env, after=nxt, tries=50)
            except AssertionError:
                after = None  # no further dispatch: the next agent's answer was set aside
        await handle.cancel()
        assert after is None, (
            f"the story was set to skipped by hand during fix {fix_1}, yet the loop went on: {nxt} "
            f"({agent}/{mode}) and then {after} ({agent2}/{mode2}) were dispatched"
        )
