"""`bso sprint cc` sent again after the server went away, the Master having continued as new meanwhile: the
update went to the sprint's current run, which did not know it and refused it ("already in this sprint") though
the first run had applied it. It goes to the run current when it was first sent, which answers its id with the
outcome after its hand-over too, and on to the next run only once a run has ended without taking it."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

import bso.cli
from bso.cli import SprintRuns, _update
from bso.constants import slave_workflow_id
from bso.models import SprintReport
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, poll_until, sprint_input, sprint_result, start_sprint, status_values
from tests.workflow.test_external_agents import _complete, _pending

K1 = "1-1-login-form"
K2 = "1-2-logout"


async def test_a_course_correction_asked_again_after_the_hand_over_gets_the_first_runs_answer(local_env, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(bso.cli, "UPDATE_SERVER_RETRY_INTERVAL", 0.05)
    make_project(tmp_path, {K1: "review", K2: "review"})
    client = local_env.client
    overrides = {"continue_as_new_after_events": 100}  # the first batch's end hands over
    async with bso_worker(client) as queue:
        inp = sprint_input(tmp_path, agent_backend="external", session_id="cc-away", story_keys=["1-1"], config_overrides=overrides)
        handle = await start_sprint(client, queue, inp)
        first_slave = slave_workflow_id(handle.id, 1)
        dispatch_id, agent, mode = await _pending(client, first_slave, local_env)
        first_run = (await handle.describe()).run_id
        sent = []
        real_execute_update = WorkflowHandle.execute_update

        async def answer_lost_while_the_sprint_hands_over(self, *args, **kwargs):
            sent.append(self.run_id)
            answer = await real_execute_update(self, *args, **kwargs)
            if len(sent) == 1:  # the server goes away with the answer; meanwhile the Master continues as new
                await client.get_workflow_handle(first_slave).signal("agent_complete", _complete(dispatch_id, agent, mode))

                async def handed_over() -> bool:
                    return (await client.get_workflow_handle(handle.id).describe()).run_id != first_run

                await poll_until(handed_over, "the Master's hand-over")
                raise RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")
            return answer

        monkeypatch.setattr(WorkflowHandle, "execute_update", answer_lost_while_the_sprint_hands_over)
        answer = await _update(
            SprintRuns(client, handle.id, first_run), "course_correct", {"reason": "new_requirements", "add_stories": ["1-2"]}
        )
        monkeypatch.undo()
        assert answer["added"] == [K2], answer
        assert sent == [first_run, first_run]  # asked again of the run that took it

        second_slave = slave_workflow_id(handle.id, 2)
        dispatch_id, agent, mode = await _pending(client, second_slave, local_env)
        await client.get_workflow_handle(second_slave).signal("agent_complete", _complete(dispatch_id, agent, mode, story_key="1-2"))
        latest = client.get_workflow_handle(handle.id, result_type=SprintReport)
        report = await sprint_result(latest)
    assert report.stories == {K1: "done", K2: "done"}
    assert (status_values(tmp_path)[K1], status_values(tmp_path)[K2]) == ("done", "done")


async def test_an_update_sent_to_a_run_that_handed_over_before_it_arrived_goes_on_to_the_next_run(local_env, tmp_path: Path):
    """The run current when `bso sprint cc` looked had handed over before the correction arrived: the next run
    takes it."""
    make_project(tmp_path, {K1: "review", K2: "review", "1-3-profile": "review", "1-4-avatar": "review"})
    client = local_env.client
    overrides = {"continue_as_new_after_events": 100, "batch_size": 1, "max_concurrent_slaves": 1}
    async with bso_worker(client) as queue:
        inp = sprint_input(
            tmp_path, agent_backend="external", session_id="cc-late", story_keys=["1-1", "1-3", "1-4"],
            config_overrides=overrides,
        )
        handle = await start_sprint(client, queue, inp)
        first_run = (await handle.describe()).run_id
        for batch, story in ((1, "1-1"), (2, "1-3")):  # the second batch's end hands over
            slave_id = slave_workflow_id(handle.id, batch)
            dispatch_id, agent, mode = await _pending(client, slave_id, local_env)
            await client.get_workflow_handle(slave_id).signal("agent_complete", _complete(dispatch_id, agent, mode, story_key=story))

        async def handed_over() -> bool:
            return (await client.get_workflow_handle(handle.id).describe()).run_id != first_run

        await poll_until(handed_over, "the Master's hand-over")
        runs = SprintRuns(client, handle.id, first_run)
        answer = await _update(runs, "course_correct", {"reason": "new_requirements", "add_stories": ["1-2"]})
        assert answer["added"] == [K2] and runs.run_id != first_run
        await handle.cancel()
