"""Planning by the scrum-master resident on the time-skipping server: the sprint's batch plan
(BATCH_PLAN_READY) and a course correction's re-plan (COURSE_CORRECTION) are answered by the resident
(plan_request -> plan_result); with resident_slots.scrum_master off the Master's fallback plans."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from bso.constants import SIGNAL_PLAN_REQUEST, SIGNAL_PLAN_RESULT
from bso.message_flow import message_flow
from bso.roster import resident_workflow_id
from bso.states import SprintPhase
from tests.conftest import bso_worker
from tests.workflow.helpers import (
    make_project,
    poll_until,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    workflow_task_failures,
)
from tests.workflow.helpers import wait_status
from tests.workflow.test_residents import signal_names
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow

K1, K2, K3 = "1-1-login-form", "1-2-logout", "1-3-profile-page"
OTHER = "2-1-search"


async def test_the_plan_comes_from_the_scrum_master_resident(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="sm-1", config_overrides={"batch_size": 2})
        )
    assert report.planner == "scrum-master"
    assert [b.stories for b in report.batch_plan.batches] == [[K1, K2], [K3]]
    assert report.stories == {K1: "done", K2: "done", K3: "done"}
    resident_signals = await signal_names(ts_env.client, resident_workflow_id("sm-1", "scrum-master"))
    assert resident_signals.count(SIGNAL_PLAN_REQUEST) == 1
    master_signals = await signal_names(ts_env.client, "sm-1")
    assert master_signals.count(SIGNAL_PLAN_RESULT) == 1
    # The resident was up (it reported ready) before the plan was asked of it.
    assert master_signals.index("resident_ready") < master_signals.index(SIGNAL_PLAN_RESULT)


async def test_without_a_scrum_master_the_fallback_plans(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    overrides = {"batch_size": 2, "resident_slots.scrum_master": False}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="sm-2", config_overrides=overrides)
        )
    assert report.planner == "fallback"
    assert [b.stories for b in report.batch_plan.batches] == [[K1, K2], [K3]]
    assert report.stories == {K1: "done", K2: "done", K3: "done"}
    assert SIGNAL_PLAN_RESULT not in await signal_names(ts_env.client, "sm-2")
    with pytest.raises(RPCError, match="not found"):  # no scrum-master resident ran
        await ts_env.client.get_workflow_handle(resident_workflow_id("sm-2", "scrum-master")).describe()
    await ts_env.client.get_workflow_handle(resident_workflow_id("sm-2", "debugger")).describe()  # the others did


async def run_course_correction(ts_env, tmp_path: Path, session: str, overrides: dict):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review", OTHER: "skipped"})
    overrides = {"batch_size": 1, "first_story_checkpoint": "pause", **overrides}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id=session, epic=1, config_overrides=overrides)
        )
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done == 1, "checkpoint")
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct,
            {"reason": "new_requirements", "add_stories": ["2-1"], "drop_stories": ["1-3"]},
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        assert (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED
    assert [(b.batch_id, b.stories) for b in cc.batches] == [(4, [K2]), (5, [OTHER])]
    assert report.stories == {K1: "done", K2: "done", K3: "skipped", OTHER: "done"}
    return cc, report


async def test_a_course_correction_is_replanned_by_the_scrum_master(ts_env, tmp_path: Path):
    cc, report = await run_course_correction(ts_env, tmp_path, "sm-3", {})
    assert cc.planner == "scrum-master" and report.planner == "scrum-master"
    assert "1 added, 1 dropped" in cc.impact
    resident_signals = await signal_names(ts_env.client, resident_workflow_id("sm-3", "scrum-master"))
    assert resident_signals.count(SIGNAL_PLAN_REQUEST) == 2  # the sprint's plan, then the re-plan


async def test_a_course_correction_without_a_scrum_master_is_replanned_by_the_fallback(ts_env, tmp_path: Path):
    cc, report = await run_course_correction(ts_env, tmp_path, "sm-4", {"resident_slots.scrum_master": False})
    assert cc.planner == "fallback" and report.planner == "fallback"


async def test_a_plan_result_sent_before_its_request_is_not_taken_for_the_answer(ts_env, tmp_path: Path):
    """A plan_result for no request in flight (here sent with the sprint's start, a forged plan) was kept, and
    taken for the answer once the request of that id went out; late ones piled up for good. It is ignored: the
    scrum-master's own plan is used."""
    make_project(tmp_path, {K1: "review"})
    forged = {
        "request_id": "plan-1", "planner": "scrum-master",
        "plan": {"session_id": "early-plan", "total_stories": 1,
                 "batches": [{"batch_id": 1, "stories": ["9-9-not-in-this-sprint"]}]},
    }
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(
            SprintMasterWorkflow.run, sprint_input(tmp_path, session_id="early-plan"), id="early-plan",
            task_queue=queue, start_signal="plan_result", start_signal_args=[forged],
        )
        report = await sprint_result(handle)
        errors = (await handle.query(SprintMasterWorkflow.status)).errors
        flow = message_flow([await handle.fetch_history()])
    assert report.stories == {K1: "done"} and report.planner == "scrum-master"
    assert errors == []
    assert await workflow_task_failures(ts_env.client, "early-plan") == []
    # `bso messages` judges the answers by the Master's rule: the forged one ignored, the scrum-master's taken.
    answers = [(m.sender, m.rejected) for m in flow if m.type == "PLAN_RESULT"]
    assert answers == [("scrum-master", "no plan request 'plan-1' awaits an answer"), ("scrum-master", None)], answers


async def test_bso_messages_shows_a_plan_answer_after_its_timeout_as_ignored(ts_env, tmp_path: Path, monkeypatch):
    """The scrum-master answers under another request id (ignored), the Master's wait times out (its fallback
    plans), and the right answer comes late: `bso messages` shows both ignored, as the Master took neither (the
    late one was shown taken, its plan as the plan used)."""
    import bso.scrum_master

    plan = bso.scrum_master.answer

    def misaddressed(request, planner=bso.scrum_master.SCRUM_MASTER):
        answered = plan(request, planner)
        return answered if planner != bso.scrum_master.SCRUM_MASTER else answered.model_copy(update={"request_id": "plan-x"})

    monkeypatch.setattr(bso.scrum_master, "answer", misaddressed)
    make_project(tmp_path, {K1: "review", K2: "review"})
    overrides = {"resident_query_timeout_ms": 1000, "batch_size": 1, "first_story_checkpoint": "pause"}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="late-plan", config_overrides=overrides))
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "the first-story checkpoint")
        late = {"request_id": "plan-1", "planner": "scrum-master",
                "plan": {"session_id": "late-plan", "total_stories": 2,
                         "batches": [{"batch_id": 1, "stories": [K1, K2]}]}}
        await handle.signal(SIGNAL_PLAN_RESULT, late)
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        flow = message_flow([await handle.fetch_history()])
    assert report.planner == "fallback" and report.stories == {K1: "done", K2: "done"}
    answers = [(m.payload.get("request_id"), m.rejected) for m in flow if m.type == "PLAN_RESULT"]
    assert answers == [
        ("plan-x", "no plan request 'plan-x' awaits an answer"), ("plan-1", "no plan request 'plan-1' awaits an answer")
    ], answers
    (planned,) = [m for m in flow if m.type == "BATCH_PLAN_READY"]
    assert [b["stories"] for b in planned.payload["batches"]] == [[K1], [K2]]  # the fallback's, as used


async def test_a_plan_naming_a_story_not_asked_for_is_not_used(ts_env, tmp_path: Path, monkeypatch):
    """A scrum-master's plan that names an unknown story (a buggy or forged answer) failed the Master's workflow
    task on every retry. It is refused: the Master plans itself, says why, and the sprint runs."""
    import bso.scrum_master

    plan = bso.scrum_master.answer

    def buggy(request, planner=bso.scrum_master.SCRUM_MASTER):
        answered = plan(request, planner)
        if planner != bso.scrum_master.SCRUM_MASTER or answered.plan is None:
            return answered
        wrong = answered.plan.model_copy(update={"batches": [answered.plan.batches[0].model_copy(
            update={"stories": ["9-9-not-in-this-sprint"]})]})
        return answered.model_copy(update={"plan": wrong})

    monkeypatch.setattr(bso.scrum_master, "answer", buggy)  # the resident workflow imports it when it runs
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="forged-plan"))
        report = await sprint_result(handle)
        errors = (await handle.query(SprintMasterWorkflow.status)).errors
    assert report.stories == {K1: "done"} and report.planner == "fallback"
    assert any("does not hold exactly the stories asked for" in e for e in errors), errors
    assert await workflow_task_failures(ts_env.client, "forged-plan") == []


@pytest.mark.parametrize("numbering", ["twice", "out-of-turn", "empty-batch"])
async def test_a_plan_whose_batches_are_misnumbered_is_not_used(ts_env, tmp_path: Path, monkeypatch, numbering):
    """A scrum-master's plan (or course correction) numbering its batches otherwise than the Master does: the
    same id twice started two batches under one workflow id (the sprint failed), ids from 1 again in a course
    correction reused a finished batch's id, an empty batch ran nothing. Refused: the Master plans itself, says why."""
    import bso.scrum_master

    plan = bso.scrum_master.answer

    def misnumbered(request, planner=bso.scrum_master.SCRUM_MASTER):
        answered = plan(request, planner)
        planned = answered.plan if answered.plan is not None else answered.course_correction
        if planner != bso.scrum_master.SCRUM_MASTER or planned is None:
            return answered
        batches = planned.batches
        if numbering == "twice":
            batches = [spec.model_copy(update={"batch_id": batches[0].batch_id}) for spec in batches]
        elif numbering == "out-of-turn":  # a course correction numbering from 1 again
            batches = [spec.model_copy(update={"batch_id": i + 1}) for i, spec in enumerate(batches)]
        else:
            batches = [*batches, batches[0].model_copy(update={"batch_id": batches[-1].batch_id + 1, "stories": []})]
        field = "plan" if answered.plan is not None else "course_correction"
        return answered.model_copy(update={field: planned.model_copy(update={"batches": batches})})

    monkeypatch.setattr(bso.scrum_master, "answer", misnumbered)
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    # One batch at a time for the course correction: two stories still queued at the checkpoint.
    concurrent = 1 if numbering == "out-of-turn" else 2
    overrides = {"batch_size": 1, "max_concurrent_slaves": concurrent, "first_story_checkpoint": "pause"}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(tmp_path, session_id=f"misnumbered-{numbering}", config_overrides=overrides),
        )
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and not s.running_batches, "the checkpoint")
        if numbering == "out-of-turn":  # the plan's ids were right: the re-plan's are wrong
            await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": [K3]})
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    done = {K1: "done", K2: "done"}
    assert report.stories == (done | {K3: "skipped"} if numbering == "out-of-turn" else done | {K3: "done"}), report
    refused = [e for e in status.errors if "its batches are numbered" in e or "holds no story" in e]
    assert len(refused) == 1, status.errors
    assert await workflow_task_failures(ts_env.client, handle.id) == []


def _forged_plan_request(*stories: tuple[str, list[str]]) -> dict:
    """A PLAN_REQUEST sent by hand (`temporal workflow signal`), answered to nobody."""
    return {
        "request_id": "by-hand", "session_id": "sm-odd", "report_to": "nobody", "batch_size": 5,
        "stories": [
            {"key": key, "epic": "epic-1", "short_key": key[:3], "state": "backlog", "story_path": f"x/{key}.md",
             "depends_on": depends_on}
            for key, depends_on in stories
        ],
    }  # fmt: skip


async def test_hand_sent_plan_requests_of_odd_shapes_are_answered_or_refused(ts_env, tmp_path: Path):
    """A story that depends on itself failed the scrum-master's workflow task on every retry, and the sprint could
    not end (its end waits for its residents to stop); a request naming a story twice did too. The first is
    planned (a story never waits for itself), the second refused as malformed; the sprint ends as usual."""
    make_project(tmp_path, {K1: "review"})
    slow = {"stories": {"1-1": {"duration_ms": 1500}}}
    async with bso_worker(ts_env.client) as queue:
        sprint = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="sm-odd", simulation=slow))
        await wait_status(sprint, lambda s: s.batches_total > 0, "the sprint planned")
        scrum_master = ts_env.client.get_workflow_handle(resident_workflow_id("sm-odd", "scrum-master"))
        served = (await scrum_master.query(ResidentWorkflow.status)).requests_served
        await scrum_master.signal(SIGNAL_PLAN_REQUEST, _forged_plan_request((K1, []), (K2, [K2])))
        await scrum_master.signal(SIGNAL_PLAN_REQUEST, _forged_plan_request((K1, []), (K1, [])))

        async def both_taken():
            status = await scrum_master.query(ResidentWorkflow.status)
            return status.requests_served == served + 1 and status.rejected_total == 1 and status

        status = await poll_until(both_taken, "the scrum-master to answer one and refuse the other")
        report = await sprint_result(sprint)
    (refused,) = status.rejected_messages
    assert refused.msg_type == "PLAN_REQUEST" and f"stories named more than once: {K1}" in refused.reason, refused
    assert report.stories == {K1: "done"}
    assert await workflow_task_failures(ts_env.client, scrum_master.id) == []
    assert (await scrum_master.describe()).status is WorkflowExecutionStatus.COMPLETED  # stopped with the sprint
