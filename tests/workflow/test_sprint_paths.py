"""Every path of the Master and Slave on the time-skipping server, with the real activities and the
simulated agents writing into a temporary project."""

from __future__ import annotations

import asyncio
import errno
import shutil
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

import activities.status_file as status_file_activities
from activities.session_files import recorded_running_sprint
from bso.cli import (
    BsoError,
    _budget_on,
    _check_selection,
    _refused_at_its_claim,
    _sprint_running_on,
    _status_file_waits,
    _view_from_report,
)
from bso.config import resolve_config
from bso.message_flow import message_flow
from bso.states import BatchStatus, SprintPhase, SprintStatus
from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE, SlaveInput, StoryMeta
from bso.sprint_status import EPIC_NOT_A_BOOL, NO_STORIES, NOTHING_TO_RUN
from bso.summary import render_summary
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow
from tests.workflow.helpers import (
    current_details,
    ledger,
    make_project,
    poll_until,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    wait_status,
    workflow_task_failures,
)

K1 = "1-1-login-form"
K2 = "1-2-logout"
K3 = "1-3-profile-page"


def story_result(report, key):
    for batch in report.batches:
        for result in batch.results.story_results:
            if result.story_key == key:
                return result
    raise KeyError(key)


# (start state, agents dispatched on the way to done, extra config)
ROWS = [
    ("backlog", 4, {}),  # create, story review, dev, code review
    ("story-doc-improved", 4, {}),  # revise, story review, dev, code review
    ("story-doc-review", 3, {}),
    ("ready-for-dev", 2, {}),
    ("in-progress", 2, {}),  # BMAD's own value resumes as dev work
    ("review", 1, {}),
    ("needs-fix", 2, {}),  # fix, then code review
    ("e2e-verify", 1, {"e2e_enabled": True}),
]


@pytest.mark.parametrize("start, dispatched, overrides", ROWS, ids=[r[0] for r in ROWS])
async def test_each_dispatch_table_row_reaches_done(ts_env, tmp_path: Path, start, dispatched, overrides):
    make_project(tmp_path, {K1: start})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides))
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == {K1: "done"}
    assert story_result(report, K1).agents_dispatched == dispatched
    assert status_values(tmp_path)[K1] == "done"
    assert status_values(tmp_path)["epic-1"] == "done"


async def test_backlog_story_gets_a_real_story_file_and_review_fix_loop(ts_env, tmp_path: Path):
    # K1's stub declares its file scope: the story-creator's document keeps it (P29, the PO gates read it).
    stub = "# Story 1.1: Login Form\n\nStatus: backlog\n\nFiles: src/login.py, src/forms/\n"
    make_project(tmp_path, {K1: "backlog", K2: "backlog"}, story_files={K1: stub})
    simulation = {"stories": {"1-1": {"story_review": ["needs-improve", "passed"], "review": ["HIGH", "MEDIUM"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    assert report.stories == {K1: "done", K2: "done"}
    batch = report.batches[0]
    assert batch.status is BatchStatus.COMPLETE
    assert batch.results.review_fix_rounds == {K1: 2, K2: 0}
    # create, review(needs-improve), revise, review(passed), dev, review, fix, review, fix, review
    assert story_result(report, K1).agents_dispatched == 10
    assert batch.results.total_agents_created == batch.results.total_agents_destroyed == 14
    story_file = tmp_path / "_bmad-output/implementation-artifacts" / f"{K1}.md"
    text = story_file.read_text()
    assert text.startswith("# Story 1.1: Login Form")
    assert "## Acceptance Criteria" in text and "## Dev Agent Record" in text
    assert "\nFiles: src/login.py, src/forms/\n" in text
    assert report.tokens_used == 14 * 1000


async def test_degradation_forces_intervention_at_round_8(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    simulation = {"stories": {"1-1": {"review": ["CRITICAL"] * 12}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    result = story_result(report, K1)
    assert result.final_state == "needs-intervention"
    assert "forced" in result.error
    assert report.batches[0].results.review_fix_rounds[K1] == 7
    assert result.agents_dispatched == 15  # 8 reviews + 7 fixes
    assert report.stories[K2] == "done"  # the batch goes on
    assert report.status is SprintStatus.PARTIAL
    assert status_values(tmp_path)[K1] == "needs-intervention"


async def test_degradation_lets_medium_findings_pass_from_round_5(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    simulation = {"stories": {"1-1": {"review": ["MEDIUM"] * 10}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    # normal: MEDIUM needs a fix in rounds 1-2; lenient from round 3 lets it pass.
    assert report.stories[K1] == "done"
    assert report.batches[0].results.review_fix_rounds[K1] == 2


async def test_max_review_rounds_cap(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    simulation = {"stories": {"1-1": {"review": ["HIGH", "HIGH", "HIGH"]}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, simulation=simulation, config_overrides={"max_review_rounds": 1}),
        )
    result = story_result(report, K1)
    assert result.final_state == "needs-intervention"
    assert "max_review_rounds" in result.error
    assert report.batches[0].results.review_fix_rounds[K1] == 1


async def test_agent_failure_marks_story_and_batch_goes_on(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    assert report.stories == {K1: "needs-intervention", K2: "done"}
    assert "simulated dev agent error" in story_result(report, K1).error
    batch = report.batches[0]
    assert batch.status is BatchStatus.PARTIAL
    assert (batch.results.stories_completed, batch.results.stories_failed) == (1, 1)
    assert status_values(tmp_path)[K1] == "needs-intervention"


async def test_agent_timeout_marks_needs_intervention(own_ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "timeout"}}}}
    async with bso_worker(own_ts_env.client) as queue:  # time skips over the agent's 30 minutes
        report = await run_sprint(own_ts_env.client, queue, sprint_input(tmp_path, simulation=simulation))
    result = story_result(report, K1)
    assert result.final_state == "needs-intervention"
    assert "no AGENT_COMPLETE within 1800s" in result.error
    assert report.stories[K2] == "done"


async def test_flaky_activity_is_retried_and_counted_once(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"flaky": {"dev": 2}}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(
                tmp_path, simulation=simulation, config_overrides={"agent_retry.initial_interval_seconds": 0.1}
            ),
        )
    assert report.stories[K1] == "done"
    assert story_result(report, K1).agents_dispatched == 2
    dev_attempts = [e for e in ledger(tmp_path) if e["dispatch_id"].endswith("/1-1/1") and e["event"] == "started"]
    assert [e["attempt"] for e in dev_attempts] == [1, 2, 3]
    assert report.tokens_used == 2000  # the retried dispatch is paid once


async def test_unknown_state_needs_intervention_without_dispatch(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "half-done", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path))
    result = story_result(report, K1)
    assert result.final_state == "needs-intervention"
    assert result.agents_dispatched == 0
    assert "half-done" in result.error
    assert status_values(tmp_path)[K1] == "needs-intervention"
    assert report.stories[K2] == "done"


async def test_budget_stop_ends_sprint_partial(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(
                tmp_path,
                config_overrides={"batch_size": 1, "token_budget": {"limit": 1500, "action": "stop"}},
            ),
        )
    # Story 1 uses 1000 tokens, story 2 takes the sprint to 2000 >= 1500: story 3 never starts.
    assert report.status is SprintStatus.PARTIAL
    assert report.stories == {K1: "done", K2: "done", K3: "review"}
    assert status_values(tmp_path)[K3] == "review"
    assert len(report.batches) == 2


async def test_budget_exhausted_inside_a_batch_skips_the_rest(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, config_overrides={"token_budget": {"limit": 1000, "action": "stop"}}),
        )
    batch = report.batches[0]
    assert batch.budget_exhausted
    assert batch.status is BatchStatus.PARTIAL
    assert batch.results.stories_skipped == 2
    assert report.stories == {K1: "done", K2: "review", K3: "review"}


async def test_budget_pause_and_report_waits_for_resume(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, config_overrides={"token_budget.limit": 1000}),
        )
        for _ in range(200):
            status = await handle.query(SprintMasterWorkflow.status)
            if status.phase == "paused":
                break
            await ts_env.sleep(1)
        assert status.phase == "paused"
        assert "token budget exhausted" in status.pause_reason
        assert status.stories[K2].state == "review"
        await handle.signal("resume", {"token_limit": 10_000})
        report = await sprint_result(handle)
        final = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "done", K2: "done"}
    assert report.status is SprintStatus.COMPLETE
    # K2, never started in batch 1, ran in batch 2: batch 1's bar stayed at 1/2 beside every story done.
    assert final.finished_batches == {1: (1, 1), 2: (1, 1)}, final.finished_batches
    assert report.token_limit == 10_000  # the execution summary's tokens line shows it


async def test_a_sprint_with_its_budget_off_shows_no_limit(ts_env, tmp_path: Path):
    """token_budget.enabled false: the sprint runs past its limit knob, and neither its status (live, or from its
    report) nor its execution summary shows that limit as if it held the sprint."""
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(tmp_path, config_overrides={"token_budget": {"enabled": False, "limit": 1000}}),
        )
        report = await sprint_result(handle)
        final = await handle.query(SprintMasterWorkflow.status)
        budget_on = await _budget_on(handle)
        details = await current_details(handle)  # the Web UI's
    assert report.status is SprintStatus.COMPLETE and report.tokens_used > 1000
    assert f"tokens {report.tokens_used} (no budget)" in details, details
    assert (final.tokens_used, final.token_limit) == (report.tokens_used, 0)
    assert budget_on is False and _view_from_report(report, budget_on).token_limit == 0
    summary = next((tmp_path / ".sprint-session").glob("execution-summary-*.md")).read_text()
    assert f"| tokens used | {report.tokens_used} (no budget: token_budget.enabled is false) |" in summary, summary


async def test_a_batch_whose_history_grows_long_hands_its_unstarted_stories_to_a_new_batch(ts_env, tmp_path: Path):
    """A batch_size of hundreds put every story's events in one Slave's history, which no run ever continued:
    past Temporal's limit the server terminates the batch. A batch now ends after the story in hand once its
    history is long (Temporal's suggestion, or batch_hand_over_after_events), and the Master queues the stories it
    did not start as a new batch."""
    keys = [f"1-{n}-story-{n}" for n in range(1, 7)]
    make_project(tmp_path, dict.fromkeys(keys, "ready-for-dev"))
    overrides = {"batch_size": 6, "batch_hand_over_after_events": 50}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides))
        report = await sprint_result(handle)
        final = await handle.query(SprintMasterWorkflow.status)
        lengths = {
            r.batch_id: len((await ts_env.client.get_workflow_handle(slave_workflow_id(handle.id, r.batch_id))
                             .fetch_history()).events)
            for r in report.batches
        }
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == dict.fromkeys(keys, "done")
    assert all(status_values(tmp_path)[key] == "done" for key in keys)
    assert len(report.batches) > 1 and all(r.handed_over for r in report.batches[:-1])
    assert not report.batches[-1].handed_over
    # Each story ran in one batch only, its agents once (dev, code review).
    ran = [r.story_key for b in report.batches for r in b.results.story_results if r.agents_dispatched]
    assert sorted(ran) == keys
    assert all(r.agents_dispatched == 2 for b in report.batches for r in b.results.story_results if r.agents_dispatched)
    # A batch's bar counts the stories it ran, not those it handed over.
    assert all(done == total for done, total in final.finished_batches.values()), final.finished_batches
    # One story more than the line at most: ~20 events a story here.
    assert max(lengths.values()) < 50 + 40, lengths
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    handed = sum(r.handed_over for r in report.batches)
    assert f"| batches handed over | {handed} (their history grew long" in render_summary(report)


async def _k1_dispatched_then_ignored_answers(
    client: Client, queue: str, project: Path, session_id: str, overrides: dict, ignored: int
) -> tuple[WorkflowHandle, WorkflowHandle, str, dict]:
    """A sprint of external agents, K1's dev dispatched, then `ignored` answers to no open dispatch (recorded and
    ignored: the batch's history grows long); the sprint, its batch, K1's dispatch id and the shape of its answer."""
    handle = await start_sprint(client, queue, sprint_input(
        project, session_id=session_id, agent_backend="external", config_overrides=overrides
    ))
    slave = client.get_workflow_handle(slave_workflow_id(session_id, 1))
    status = await wait_status(handle, lambda s: s.stories[K1].dispatch_id is not None, "K1's dev dispatched")
    answer = {"story_key": "1-1", "agent_type": "dev-runner", "mode": "dev", "status": "success"}
    for n in range(ignored):
        await slave.signal("agent_complete", {**answer, "dispatch_id": f"nope-{n}"})
    return handle, slave, status.stories[K1].dispatch_id, answer


async def test_a_batch_stopped_by_fail_fast_or_its_working_time_hands_nothing_over(own_ts_env, tmp_path: Path):
    """A batch whose history was long when fail_fast or its working time stopped it said it handed its stories over
    (the summary counted it), and one out of time had the Master queue them as a new batch with fresh working time:
    stories that must keep their state ran."""
    env = own_ts_env
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"})
    overrides = {"fail_fast": True, "batch_size": 3, "batch_hand_over_after_events": 50}
    async with bso_worker(env.client) as queue:
        # The history is long only once the failure that stops the batch arrives, however the worker grouped its
        # tasks (a story that passed with the history long hands the rest over, rightly).
        handle, slave, dispatch_id, answer = await _k1_dispatched_then_ignored_answers(
            env.client, queue, tmp_path, "fatal-long", overrides, ignored=30
        )
        await slave.signal("agent_complete", {
            **answer, "dispatch_id": dispatch_id, "status": "failure",
            "error": "the backend is gone", "recoverable": False,
        })
        report = await sprint_result(handle)
        slave_events = len((await slave.fetch_history()).events)
    assert len(report.batches) == 1 and report.batches[0].fatal_error and slave_events > 50, slave_events
    assert report.stories[K2] == report.stories[K3] == "ready-for-dev" and not report.batches[0].handed_over
    assert "batches handed over" not in render_summary(report)

    late = tmp_path / "late"
    make_project(late, {K1: "ready-for-dev", K2: "review"})
    overrides = {"slave_timeout_seconds": 60, "batch_hand_over_after_events": 50}
    async with bso_worker(env.client) as queue:
        handle, slave, dispatch_id, answer = await _k1_dispatched_then_ignored_answers(
            env.client, queue, late, "late-long", overrides, ignored=20
        )
        await env.sleep(timedelta(minutes=2))
        await slave.signal("agent_complete", {**answer, "dispatch_id": dispatch_id})
        report = await sprint_result(handle)
    assert "out of time" in report.batches[0].errors[0] and not report.batches[0].handed_over
    assert len(report.batches) == 1 and report.stories[K2] == "review"


async def test_filters_epic_and_short_story_keys(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", "2-1-search": "review", "2-2-export": "review"})
    async with bso_worker(ts_env.client) as queue:
        by_epic = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, epic=2))
        by_key = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, story_keys=["1-2"]))
    assert by_epic.stories == {"2-1-search": "done", "2-2-export": "done"}
    assert by_key.stories == {K2: "done"}
    assert status_values(tmp_path)[K1] == "review"


async def test_batches_follow_declared_dependencies(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"},
        story_files={K1: "# Story 1.1: Login Form\n\nStatus: ready-for-dev\n\nDepends on: 1-3\n"},
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, config_overrides={"batch_size": 2}))
    plan = report.batch_plan
    assert [b.stories for b in plan.batches] == [[K2, K3], [K1]]
    assert plan.dependency_graph == {K1: {"depends_on": [K3]}}
    assert report.status is SprintStatus.COMPLETE


async def test_malformed_status_file_fails_the_sprint_at_once(ts_env, tmp_path: Path):
    status = make_project(tmp_path, {K1: "backlog"})
    status.write_text(status.read_text() + "  1-9-broken: [unclosed\n")
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert "sprint-status.yaml" in cause.message and "line" in cause.message
    assert await workflow_task_failures(ts_env.client, handle.id) == []


@pytest.mark.parametrize(
    "overrides, simulation, backend, expected",
    [
        ({"batch_size": 0}, {}, "simulated", "batch_size"),
        ({"no_such_knob": 1}, {}, "simulated", "no_such_knob"),
        ({}, {"stories": {"1-1": {"review": ["HUGE"]}}}, "simulated", "simulation"),
        ({}, {}, "carrier-pigeon", "carrier-pigeon"),
    ],
)
async def test_invalid_input_fails_clearly(ts_env, tmp_path: Path, overrides, simulation, backend, expected):
    make_project(tmp_path, {K1: "backlog"})
    before = status_values(tmp_path)
    inp = sprint_input(tmp_path, config_overrides=overrides, simulation=simulation, agent_backend=backend)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert expected in str(failure.value.cause)
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    assert status_values(tmp_path) == before


def _json_payload(data: bytes) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))


@pytest.mark.parametrize("workflow_type", ["SprintMasterWorkflow", "SprintSlaveWorkflow", "ResidentWorkflow"])
@pytest.mark.parametrize(
    "args, expected",
    [
        ([{"project_root": 42, "surprise": True, "story_keys": [1, None]}], "invalid input"),
        (["just a string"], "invalid input"),
        ([[1, 2]], "invalid input"),
        ([None], "needs its input"),
        ([], "needs its input"),  # `temporal workflow start` without --input
        # JSON no parser here reads: the workflow failed with pydantic's multi-line report of the input's union.
        ([_json_payload(b'{"project_root": "/p", "config_overrides": {"batch_size": ' + b"9" * 5000 + b"}}")],
         "its JSON could not be read: Invalid JSON: number out of range"),
        ([_json_payload(b'{"project_root": "/p", "simulation": {"x": ' + b"[" * 600 + b"]" * 600 + b"}}")],
         "its JSON could not be read: Invalid JSON: recursion limit exceeded"),
    ],
    ids=["wrong-types", "string", "list", "null", "no-input", "huge-number", "too-deep"],
)
async def test_wrongly_shaped_workflow_input_fails_without_task_retries(
    ts_env, tmp_path: Path, workflow_type: str, args, expected
):
    """Started by hand with a bad input, any BSO workflow fails at once with a clear error, never retrying its task."""
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(
            workflow_type, args=args, id=f"bad-input-{uuid.uuid4().hex[:6]}", task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
    message = str(failure.value.cause)
    assert f"{workflow_type}" in message and expected in message and "\n" not in message, message
    if args and isinstance(args[0], dict):
        assert "project_root: Input should be a valid string" in message and "surprise" in message, message
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    if workflow_type == "SprintMasterWorkflow":  # `bso messages` reads such a start without tripping
        (start, *_) = message_flow(await fetch_sprint_histories(ts_env.client, handle.id))
        assert start.type == "SPRINT_START", start
        # (Python's parser reads the 600 levels, and the start's summary does not look into the simulation.)
        assert "without a usable input" in start.detail or "/p (all open stories" in start.detail, start


async def test_an_unknown_epic_fails_the_sprint_instead_of_running_an_empty_one(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, epic=7))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
        done = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, epic="epic-1"))
        assert (await done.result()).stories == {K1: "done"}
    assert "unknown epic 7: the status file has no story of epic-7 (its epics with stories: epic-1)" in str(
        failure.value.cause
    )
    assert await workflow_task_failures(ts_env.client, handle.id) == []


async def test_an_epic_given_as_true_is_refused_and_one_spelled_01_names_epic_1(ts_env, tmp_path: Path):
    """With the temporal CLI, `"epic": true` ran epic 1 (pydantic read true as 1), and `"epic": "01"` failed as
    an unknown epic although the file's stories `1-...` are epic 1's."""
    make_project(tmp_path, {K1: "review", "2-1-profile": "review"})
    async with bso_worker(ts_env.client) as queue:
        refused = await ts_env.client.start_workflow(
            "SprintMasterWorkflow", {"project_root": str(tmp_path), "epic": True}, id=f"epic-true-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(refused.result(), 60)
        numbered = await ts_env.client.start_workflow(
            "SprintMasterWorkflow", {"project_root": str(tmp_path), "epic": "01"}, id=f"epic-01-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
        )
        report = await asyncio.wait_for(numbered.result(), 60)
    assert EPIC_NOT_A_BOOL in str(failure.value.cause)
    assert report["stories"] == {K1: "done"}, report
    assert await workflow_task_failures(ts_env.client, refused.id) == []


async def test_an_epic_with_stories_outside_it_fails_the_sprint_as_bso_refuses_it(ts_env, tmp_path: Path):
    """`{"epic": 1, "story_keys": ["1-1", "2-1"]}` with the temporal CLI ran 1-1 and dropped 2-1 in silence;
    `bso sprint start --epic 1 --story 1-1 --story 2-1` refuses it."""
    other = "2-1-profile"
    make_project(tmp_path, {K1: "review", other: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, epic=1, story_keys=["1-1", "2-1"]))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert (
        "2-1-profile not in epic-1: with an epic, the stories named are picked among its own (name the epic's "
        "stories, or leave the epic out)"
    ) in str(failure.value.cause)
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    assert status_values(tmp_path)[other] == "review" and status_values(tmp_path)[K1] == "review"


async def test_a_session_id_other_than_the_workflow_id_is_refused_before_it_reaches_another_sprint(
    ts_env, tmp_path: Path
):
    """The input `bso sprint start` printed, with its --workflow-id changed and not its session_id, named a
    running sprint's session: the new sprint talked to that sprint's residents and, failing, stopped them."""
    running_id = f"first-{uuid.uuid4().hex[:6]}"
    make_project(tmp_path / "a", {K1: "review"})
    make_project(tmp_path / "b", {K1: "review"})
    slow = {"default": {"duration_ms": 3000}}
    async with bso_worker(ts_env.client) as queue:
        first = await start_sprint(ts_env.client, queue, sprint_input(tmp_path / "a", session_id=running_id, simulation=slow))
        await wait_status(first, lambda v: v.phase == SprintPhase.RUNNING, "the first sprint's residents")
        second = await ts_env.client.start_workflow(
            SprintMasterWorkflow.run, sprint_input(tmp_path / "b", session_id=running_id), id=f"second-{running_id}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(second)
        assert (await sprint_result(first)).status == SprintStatus.COMPLETE
    assert (
        f"session_id '{running_id}' is not the sprint's workflow id 'second-{running_id}': its batches and residents "
        f"would take the ids of sprint '{running_id}''s; leave session_id out (it is the workflow id)"
    ) in str(failure.value.cause)
    events = [e.event_type for e in (await second.fetch_history()).events]
    assert EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED not in events  # no stop to its residents
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED not in events
    assert await workflow_task_failures(ts_env.client, second.id) == []


@pytest.mark.parametrize(
    ("sprint_id", "why"),
    [
        # `zz` then failed to start that batch with only "Workflow execution already started".
        ("zz/batch-1", "sprint id 'zz/batch-1' is the id sprint 'zz' gives its batch workflow"),
        # Every story failed: its agent's answer could not hold the dispatch id.
        ("s" * 101, "sprint id of 101 characters: at most 100 (its agents' dispatch ids carry it)"),
    ],
)
async def test_a_sprint_id_that_cannot_work_is_refused(ts_env, tmp_path: Path, sprint_id: str, why: str):
    """A sprint started (with the temporal CLI) under an id sprint `zz` gives its first batch, or one too long for
    its dispatch ids, fails at once, saying so."""
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id=sprint_id))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert failure.value.cause.type == "InvalidSprintInput"
    assert why in failure.value.cause.message
    assert status_values(tmp_path)[K1] == "review"
    assert await workflow_task_failures(ts_env.client, handle.id) == []


@pytest.mark.parametrize(
    ("session_id", "why"),
    [
        # Its residents' ids, told to stop as the sprint failed, too long for the server: the first workflow task
        # failed on every retry, and the sprint answered no query.
        ("s" * 1500, "sprint id of 1500 characters: at most 100"),
        # Its search attribute too long: the server terminated the sprint.
        ("s" * 5000, "sprint id of 5000 characters: at most 100"),
        # Taken: its workflows were named 'a\nb/batch-1' and so on (`bso sprint start` refuses such an id).
        ("a\nb", "sprint id 'a\\nb': use no spaces, line breaks or other control characters"),
    ],
    ids=["1500-characters", "5000-characters", "line-break"],
)
async def test_a_session_id_given_in_the_input_that_cannot_work_is_refused_first(
    ts_env, tmp_path: Path, session_id: str, why: str
):
    """`temporal workflow start --input '{"session_id": ...}'` under a workflow id of its own: refused before any
    command carries the session id."""
    make_project(tmp_path, {K1: "review"})
    inp = sprint_input(tmp_path, session_id=session_id)
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(
            SprintMasterWorkflow.run, inp, id=f"by-hand-{uuid.uuid4().hex[:6]}", task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert failure.value.cause.type == "InvalidSprintInput"
    assert why in failure.value.cause.message, failure.value.cause.message
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    events = (await handle.fetch_history()).events
    upserted = {
        name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        for name in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    }
    assert upserted <= {"TemporalChangeVersion"}, upserted  # the patch's marker: no BsoSessionId
    assert EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED not in [e.event_type for e in events]


@pytest.mark.parametrize(
    ("story", "error"),
    [
        # The Slave would refuse each such answer, and the story waited out its agent's time.
        ({"tokens": 10**30}, "tokens of 1-1: at most 1,000,000,000 (no agent run uses more)"),
        # Read as 1 token: the sprint run on a mistake.
        ({"tokens": True}, "stories.1-1.tokens: Input should be a valid integer"),
    ],
    ids=["implausible-tokens", "converted-value"],
)
async def test_a_simulation_the_slaves_would_misread_is_refused_at_the_start(ts_env, tmp_path: Path, story, error):
    """Started with the temporal CLI."""
    make_project(tmp_path, {K1: "review"})
    inp = sprint_input(tmp_path, session_id=f"sim-{uuid.uuid4().hex[:6]}", simulation={"stories": {"1-1": story}})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert (failure.value.cause.type, failure.value.cause.message) == (
        "InvalidSprintInput", f"invalid simulation script: {error}"
    )
    assert status_values(tmp_path)[K1] == "review"


async def test_a_simulation_too_large_to_copy_is_refused_at_the_start(ts_env, tmp_path: Path):
    """A script of ~1.4 MB, copied into each resident's start, made the Master's history long before its first
    batch: it continued as new, started its residents again, and so on for ever, no story run."""
    make_project(tmp_path, {K1: "review"})
    big = {"stories": {"1-1": {"blocking": ["x" * 1000] * 300}}}
    inp = sprint_input(tmp_path, session_id=f"big-sim-{uuid.uuid4().hex[:6]}", simulation=big)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert failure.value.cause.type == "InvalidSprintInput"
    assert failure.value.cause.message.startswith("invalid simulation script: 301,227 bytes"), failure.value.cause.message
    assert "bytes, over the 256,000 a script may take" in failure.value.cause.message
    events = [e.event_type for e in (await handle.fetch_history()).events]
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED not in events
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW not in events
    assert status_values(tmp_path)[K1] == "review"


async def test_missing_project_root_is_a_clear_error(ts_env, tmp_path: Path):
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path / "nowhere"))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
    assert "nowhere" in str(failure.value.cause)


async def test_master_continues_as_new_between_batches_and_keeps_everything(ts_env, tmp_path: Path):
    stories = {f"{e}-{n}-story-{e}-{n}": "review" for e in (1, 2) for n in range(1, 6)}
    make_project(tmp_path, stories)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(
                tmp_path,
                simulation={"stories": {"1-2": {"review": ["HIGH"]}}},
                config_overrides={"batch_size": 2, "continue_as_new_after_events": 100},
            ),
        )
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == {k: "done" for k in stories}
    assert [b.batch_id for b in report.batches] == [1, 2, 3, 4, 5]
    assert report.tokens_used == 12 * 1000  # 10 reviews + 1 fix + 1 review, across every run
    assert status.runs > 1 and status.phase == "completed"
    assert len(status.stories) == 10


async def test_the_story_updates_hold_timer_is_never_cancelled(ts_env, tmp_path: Path):
    """Holds end on agents' answers, their timers left to fire: a CancelTimer racing the firing would leave the
    Slave without workflow tasks on the time-skipping test server (temporalio/sdk-java#3088)."""
    stories = {f"1-{n}-story-{n}": "review" for n in range(1, 7)}
    make_project(tmp_path, stories)
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="hold", config_overrides={"batch_size": 6})
        )
        history = await ts_env.client.get_workflow_handle("hold/batch-1").fetch_history()
    assert report.stories == {k: "done" for k in stories}
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_TIMER_STARTED in kinds  # the hold was used
    assert EventType.EVENT_TYPE_TIMER_CANCELED not in kinds


async def edited_while_in_flight(
    client, queue: str, inp, story: str, agent: str, old: str, new: str
) -> WorkflowHandle:
    """Start the sprint; once `story`'s `agent` is in flight, replace `old` by `new` in the status file, as a
    user editing it by hand would."""
    handle = await start_sprint(client, queue, inp)
    await wait_status(handle, lambda s: s.stories[story].agent_in_flight == agent, f"{story}'s {agent} in flight")
    status_file = Path(inp.project_root) / DEFAULT_STATUS_FILE
    status_file.write_text(status_file.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    return handle


async def test_a_disk_full_for_a_while_is_waited_for_and_the_story_goes_on(ts_env, tmp_path: Path, monkeypatch):
    """The disk full (or remounted read-only) while K1's agent works: its state write failed a few times and
    K1 ended needs-intervention, the file still saying `ready-for-dev`. Now the story waits, shown so, and goes
    on once the disk takes the write."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    real, full = tempfile.mkstemp, asyncio.Event()

    def mkstemp(*args, **kwargs):  # the status file's folder: its writes and the wait's probes
        if full.is_set() and str(kwargs.get("prefix", "")).startswith((".sprint-status.yaml", ".bso-write-probe")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(status_file_activities.tempfile, "mkstemp", mkstemp)
    inp = sprint_input(tmp_path, session_id="disk-full", simulation={"stories": {"1-1": {"duration_ms": 1000}}})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "dev-runner", "K1's dev-runner")
        full.set()
        waiting = await wait_status(handle, lambda s: s.stories[K1].status_file_problem is not None, "K1 waiting")
        full.clear()
        report = await sprint_result(handle)
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("disk-full", 1))
    assert "cannot be written now (No space left on device)" in waiting.stories[K1].status_file_problem
    assert [line.plain for line in _status_file_waits(waiting)][0].startswith(
        "sprint-status.yaml cannot be written now (No space left on device): make room"
    )
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert status_values(tmp_path)[K1] == "done" and failures == []


async def test_a_story_renamed_in_the_status_file_mid_run_stops_that_story_not_the_batch(ts_env, tmp_path: Path):
    """The user renames K1 in sprint-status.yaml while its agent runs: K1's next write cannot be made (an
    unknown key, not retried), so K1 needs intervention with the reason; K2 still runs; no workflow task fails."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"duration_ms": 2000}}}
    inp = sprint_input(tmp_path, session_id="renamed", simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await edited_while_in_flight(ts_env.client, queue, inp, K1, "dev-runner", K1, "1-1-login-page")
        report = await sprint_result(handle)
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("renamed", 1))
    assert report.stories == {K1: "needs-intervention", K2: "done"}
    error = story_result(report, K1).error
    assert "sprint-status.yaml could not be written" in error and "ready-for-dev -> review not recorded" in error, error
    written = status_values(tmp_path)
    assert (written["1-1-login-page"], written[K2]) == ("ready-for-dev", "done")
    assert failures == []


async def test_a_status_file_broken_for_a_moment_delays_the_write_and_loses_nothing(ts_env, tmp_path: Path):
    """Someone saves the file with a half-typed line while an agent works: the Slave's write after the agent
    retries until the file parses again, and the story goes on (it used to end needs-intervention)."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"duration_ms": 800}}}
    inp = sprint_input(tmp_path, session_id="broken", simulation=simulation)
    broken, good = f"{K2}: [unclosed", f"{K2}: review"  # a line typed half-way
    async with bso_worker(ts_env.client) as queue:
        handle = await edited_while_in_flight(ts_env.client, queue, inp, K1, "dev-runner", good, broken)
        await asyncio.sleep(2.5)  # the agent answers meanwhile; its write is retried
        status_file = tmp_path / DEFAULT_STATUS_FILE
        status_file.write_text(status_file.read_text(encoding="utf-8").replace(broken, good), encoding="utf-8")
        report = await sprint_result(handle)
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("broken", 1))
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert (status_values(tmp_path)[K1], status_values(tmp_path)[K2]) == ("done", "done")
    assert failures == []


async def test_a_status_file_left_broken_is_waited_for_and_the_agents_result_kept(ts_env, tmp_path: Path):
    """The file stays broken well past the write's quick retries: the story waits, shown so in the status, not
    counted against the batch's working time; once the file is mended its change lands and the sprint goes on.
    No agent runs twice and nothing is lost (it used to end the story needs-intervention after ~25 s)."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"duration_ms": 2500}}}
    inp = sprint_input(tmp_path, session_id="left-broken", simulation=simulation)
    broken, good = f"{K2}: [unclosed", f"{K2}: review"
    status_file = tmp_path / DEFAULT_STATUS_FILE
    async with bso_worker(ts_env.client) as queue:
        handle = await edited_while_in_flight(ts_env.client, queue, inp, K1, "dev-runner", good, broken)
        waiting = await wait_status(
            handle, lambda s: s.stories[K1].status_file_problem is not None, f"{K1} waiting for the status file"
        )
        await asyncio.sleep(3)  # longer than the quick retries: the story still waits
        still = await handle.query(SprintMasterWorkflow.status)
        lines = [line.plain for line in _status_file_waits(still)]
        status_file.write_text(status_file.read_text(encoding="utf-8").replace(broken, good), encoding="utf-8")
        report = await sprint_result(handle)
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("left-broken", 1))
    assert "YAML error" in (waiting.stories[K1].status_file_problem or ""), waiting.stories[K1]
    assert (still.stories[K1].state, still.stories[K1].error) == ("ready-for-dev", None)
    assert still.stories[K1].status_file_problem is not None
    assert lines[0].startswith("sprint-status.yaml does not parse: ") and K1 in lines[1], lines
    # Whole, with the line that opened the bracket (the file's path took its room, and the line was cut)
    assert "started at line" in lines[0] and str(tmp_path) not in lines[0] and not lines[0].endswith("..."), lines
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert status_values(tmp_path)[K1] == "done"
    started = [e["dispatch_id"] for e in ledger(tmp_path) if e["event"] == "started"]
    assert len(started) == len(set(started)) and story_result(report, K1).agents_dispatched == len(
        [d for d in started if "/1-1/" in d]
    ), started
    assert failures == []


async def test_a_project_moved_away_mid_sprint_is_waited_for_not_made_again(local_env, tmp_path: Path):
    """`mv project project-moved` while an agent works, then back: the worker made the folder again, empty, for
    the sprint's files (moved back, the project landed inside it), and a status write meanwhile ended the story
    needs-intervention. Now nothing is made, the agent's attempt is retried, and the sprint goes on. (On the dev
    server: the retries' backoff in real time.)"""
    root, moved = tmp_path / "project", tmp_path / "project-moved"
    root.mkdir()
    make_project(root, {K1: "ready-for-dev", K2: "review"})
    inp = sprint_input(root, session_id="moved", simulation={"stories": {"1-1": {"duration_ms": 1500}}})
    async with bso_worker(local_env.client) as queue:
        handle = await start_sprint(local_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "dev-runner", "K1's dev-runner")
        root.rename(moved)
        await asyncio.sleep(3)  # the agent answers meanwhile, with nowhere to record it
        made_again = root.exists()
        moved.rename(root)
        report = await sprint_result(handle)
        failures = await workflow_task_failures(local_env.client, slave_workflow_id("moved", 1))
    assert not made_again
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert status_values(root)[K1] == "done" and failures == []


async def test_a_sprint_cancelled_while_a_story_waits_for_the_status_file_says_what_was_lost(local_env, tmp_path: Path):
    """While it waits, the story shows no agent in flight (its agent answered) and that agent's tokens count;
    cancelled then, the story says its last agent's result was not recorded (nothing said so), and the tokens
    still count. (On the dev server: its query of a closed sprint.)"""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    inp = sprint_input(tmp_path, session_id="cancel-broken", simulation={"stories": {"1-1": {"duration_ms": 2500}}})
    broken, good = f"{K2}: [unclosed", f"{K2}: review"
    async with bso_worker(local_env.client) as queue:
        handle = await edited_while_in_flight(local_env.client, queue, inp, K1, "dev-runner", good, broken)
        waiting = await wait_status(
            handle, lambda s: s.stories[K1].status_file_problem is not None, f"{K1} waiting for the status file"
        )
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert waiting.stories[K1].agent_in_flight is None and waiting.stories[K1].tokens_used > 0, waiting.stories[K1]
    story = status.stories[K1]
    assert (story.state, story.status_file_problem) == ("ready-for-dev", None)
    assert (story.error or "").startswith("the batch ended while sprint-status.yaml did not parse ("), story.error
    assert "its last agent's result was not recorded" in story.error
    assert story.tokens_used == waiting.stories[K1].tokens_used and status.tokens_used >= story.tokens_used


def slave_of_a_broken_file(root: Path, session: str) -> tuple[SlaveInput, str]:
    """A one-story batch whose status file does not parse when it starts; the file's good text."""
    make_project(root, {K1: "review"})
    status_file = root / DEFAULT_STATUS_FILE
    good = status_file.read_text(encoding="utf-8")
    status_file.write_text(good.replace(f"{K1}: review", f"{K1}: [unclosed"), encoding="utf-8")
    inp = SlaveInput(
        batch_id=1, session_id=session, project_root=str(root), status_file=DEFAULT_STATUS_FILE,
        stories=[StoryMeta(key=K1, epic="1", short_key="1-1", state="review",
                           story_path=f"_bmad-output/implementation-artifacts/{K1}.md")],
        config=resolve_config({}),
    )
    return inp, good


async def slave_waiting_for_the_file(handle: WorkflowHandle):
    """The Slave's status once K1 is shown waiting for the status file."""

    async def waiting():
        try:
            status = await handle.query(SprintSlaveWorkflow.status)
        except Exception:  # noqa: BLE001 - not started yet
            return None
        return status if status.stories[K1].status_file_problem else None

    return await poll_until(waiting, f"{K1} waiting for the status file")


async def test_a_batch_whose_first_read_finds_the_file_broken_waits_for_it(ts_env, tmp_path: Path):
    """A batch starting while the file does not parse waits for it (its stories shown waiting) and then runs
    them, where it ended at once with its stories unrun."""
    inp, good = slave_of_a_broken_file(tmp_path, "first-read")
    async with bso_worker(ts_env.client) as queue:
        handle = await ts_env.client.start_workflow(
            SprintSlaveWorkflow.run, inp, id=slave_workflow_id("first-read", 1), task_queue=queue
        )
        seen = await slave_waiting_for_the_file(handle)
        (tmp_path / DEFAULT_STATUS_FILE).write_text(good, encoding="utf-8")
        result = await handle.result()
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("first-read", 1))
    assert "YAML error" in seen.stories[K1].status_file_problem
    assert result.errors == [] and [r.final_state for r in result.results.story_results] == ["done"]
    assert status_values(tmp_path)[K1] == "done" and failures == []


async def test_a_batch_shut_down_while_its_first_read_waits_ends_with_its_stories_unstarted(own_ts_env, tmp_path: Path):
    """Nothing of the batch has started: a shutdown (the sprint's, or fail_fast's) ends it at once, where its
    wait would have held the shutdown until someone mended the file. (A server of its
    own: what the shutdown leaves held the shared server's clock for later tests.)"""
    inp, _ = slave_of_a_broken_file(tmp_path, "first-read-stop")
    async with bso_worker(own_ts_env.client) as queue:
        handle = await own_ts_env.client.start_workflow(
            SprintSlaveWorkflow.run, inp, id=slave_workflow_id("first-read-stop", 1), task_queue=queue
        )
        await slave_waiting_for_the_file(handle)
        await handle.signal(SprintSlaveWorkflow.shutdown_request)
        result = await asyncio.wait_for(handle.result(), timeout=30)
    [error] = result.errors
    assert error.startswith("sprint-status.yaml unreadable: ") and "shut down while it waited" in error, error
    assert [(r.final_state, r.agents_dispatched) for r in result.results.story_results] == [("review", 0)]


async def test_a_new_sprint_leaves_settled_stories_out(ts_env, tmp_path: Path):
    """needs-intervention waits for a human (who sets the state back in the file) and skipped was dropped: a new
    sprint neither runs them nor counts them as its own failures."""
    make_project(tmp_path, {K1: "needs-intervention", K2: "review", K3: "skipped"})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="settled"))
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == {K2: "done"}
    assert status_values(tmp_path)[K1] == "needs-intervention" and status_values(tmp_path)[K3] == "skipped"


class _BlindVisibility:
    """A client whose visibility store has not seen any workflow yet (it lags a second or two on a real server)."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    async def list_workflows(self, *args, **kwargs):
        for _ in ():
            yield


async def test_a_second_sprint_on_a_running_sprints_project_is_refused_by_its_claim(ts_env, tmp_path: Path):
    """Started past `bso sprint start`'s check (the temporal CLI, or a moment after the first one, which the
    server's visibility search does not see yet): the Master's first step finds the project claimed by a sprint
    that is running, and fails clearly without touching the file. Once that sprint has ended, the project is
    free again."""
    make_project(tmp_path, {K1: "review", K2: "review"})
    slow = {"stories": {"1-1": {"duration_ms": 1500}}}
    async with bso_worker(ts_env.client) as queue:
        first = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="first", simulation=slow))
        await wait_status(first, lambda s: s.phase == "running", "the first sprint running")
        # `bso sprint start` sees it by its claim, even where the visibility store has not caught up yet.
        assert await _sprint_running_on(_BlindVisibility(ts_env.client), tmp_path) == "first"
        second = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="second"))
        # `bso sprint start` of the second one says so instead of "started" (it waits for the claim).
        refused = await _refused_at_its_claim(ts_env.client, "second", tmp_path)
        assert refused is not None and "sprint first is already running" in refused, refused
        assert await _refused_at_its_claim(ts_env.client, "first", tmp_path) is None
        with pytest.raises(WorkflowFailureError) as failure:
            await second.result()
        assert status_values(tmp_path)[K2] == "review"  # the refused sprint ran nothing
        assert (await first.result()).status is SprintStatus.COMPLETE
        third = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="third"))
        with pytest.raises(WorkflowFailureError) as nothing_left:  # the first one did it all
            await third.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ProjectBusy"
    assert f"sprint first is already running on {tmp_path}" in cause.message, cause.message
    assert await workflow_task_failures(ts_env.client, second.id) == []
    # Free again (not refused by the claim): it fails for having nothing to run, as `bso sprint start` refuses it.
    assert isinstance(nothing_left.value.cause, ApplicationError), nothing_left.value.cause
    assert (nothing_left.value.cause.type, nothing_left.value.cause.message) == ("InvalidSprintInput", NOTHING_TO_RUN)
    assert await workflow_task_failures(ts_env.client, third.id) == []


async def test_a_second_sprint_is_refused_when_the_running_ones_claim_record_was_deleted(local_env, tmp_path: Path):
    """`.sprint-session/` deleted mid-sprint (`git clean -fdX`: the README has it ignored): the claim record gone,
    a second sprint started with the temporal CLI ran every story left a second time. Its first step now asks
    the server too. (On the dev server: its visibility store.)"""
    make_project(tmp_path, {K1: "review", K2: "review"})
    slow = {"default": {"duration_ms": 1500}}
    async with bso_worker(local_env.client) as queue:
        first = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id="kept", simulation=slow))
        await wait_status(first, lambda s: s.phase == "running", "the first sprint running")

        async def listed_running() -> bool:
            query = 'WorkflowId = "kept" AND BsoPhase = "running"'
            return [wf.id async for wf in local_env.client.list_workflows(query)] == ["kept"]

        await poll_until(listed_running, "the first sprint running in the visibility store")
        shutil.rmtree(tmp_path / ".sprint-session")
        second = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id="again"))
        with pytest.raises(WorkflowFailureError) as failure:
            await second.result()
        assert (await first.result()).status is SprintStatus.COMPLETE
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ProjectBusy", cause
    assert f"sprint kept is already running on {tmp_path}" in cause.message, cause.message
    started = [e for e in (await second.fetch_history()).events if e.HasField("activity_task_scheduled_event_attributes")]
    assert [e.activity_task_scheduled_event_attributes.activity_type.name for e in started] == ["load_sprint_status"]
    assert await workflow_task_failures(local_env.client, second.id) == []


async def test_sprints_run_one_after_the_other_are_not_refused_by_the_visibility_stores_lag(local_env, tmp_path: Path):
    """(From a review.) The server search at a sprint's start took the last sprint, just ended, for running (the
    visibility store lags its end): the next one failed ProjectBusy. A match is asked of the server now."""
    refused = []
    async with bso_worker(local_env.client) as queue:
        for n in range(10):
            make_project(tmp_path, {K1: "review"})
            handle = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id=f"lag-{n}"))
            try:
                await handle.result()
            except WorkflowFailureError as err:
                refused.append(f"lag-{n}: {err.cause}")
    assert refused == [], refused


async def test_a_second_sprint_on_the_same_status_file_through_another_root_is_refused(ts_env, tmp_path: Path):
    """The second sprint names a folder of the project as its root and the same status file below it: each
    claimed its own root, and both ran every story. Now its claim finds the first sprint's on the file."""
    make_project(tmp_path, {K1: "review", K2: "review"})
    inner = tmp_path / "_bmad-output"
    inner_status = "implementation-artifacts/sprint-status.yaml"
    assert (inner / inner_status).resolve() == (tmp_path / DEFAULT_STATUS_FILE).resolve()
    slow = {"stories": {"1-1": {"duration_ms": 1500}}}
    async with bso_worker(ts_env.client) as queue:
        first = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="outer", simulation=slow))
        await wait_status(first, lambda s: s.phase == "running", "the first sprint running")
        # `bso sprint start` sees it by its claim on the file.
        assert await _sprint_running_on(_BlindVisibility(ts_env.client), inner, inner / inner_status) == "outer"
        second = await start_sprint(
            ts_env.client, queue, sprint_input(inner, session_id="inner", status_file=inner_status)
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await second.result()
        assert (await first.result()).status is SprintStatus.COMPLETE
    started = [e for e in (await second.fetch_history()).events if e.HasField("start_child_workflow_execution_initiated_event_attributes")]
    assert started == []  # the refused sprint ran nothing
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ProjectBusy", cause
    assert f"sprint outer is already running on {tmp_path}, on " in cause.message, cause.message
    assert await workflow_task_failures(ts_env.client, second.id) == []
    assert not (inner / ".sprint-session" / "running-sprint.json").exists()


async def test_a_claim_left_by_a_sprint_whose_id_runs_again_elsewhere_does_not_hold_the_project(ts_env, tmp_path: Path):
    """Sprint `reused` claimed project A and failed there; its id, free again, now runs a sprint on project B. A
    sprint on A is not refused for it: the claim names the run that made it, and that run's sprint is over."""
    a, b = tmp_path / "a", tmp_path / "b"
    make_project(a, {K1: "done"})  # nothing to run: it fails after its claim
    make_project(b, {K1: "review"})
    slow = {"stories": {"1-1": {"duration_ms": 3000}}}
    async with bso_worker(ts_env.client) as queue:
        failed = await start_sprint(ts_env.client, queue, sprint_input(a, session_id="reused"))
        with pytest.raises(WorkflowFailureError):
            await failed.result()
        assert recorded_running_sprint(str(a)) == "reused"
        again = await start_sprint(ts_env.client, queue, sprint_input(b, session_id="reused", simulation=slow))
        await wait_status(again, lambda s: s.phase == "running", "the id running again, on project B")
        assert await _sprint_running_on(_BlindVisibility(ts_env.client), a) is None
        (a / DEFAULT_STATUS_FILE).write_text((a / DEFAULT_STATUS_FILE).read_text().replace(f"{K1}: done", f"{K1}: review"))
        report = await run_sprint(ts_env.client, queue, sprint_input(a, session_id="on-a"))
        assert report.status is SprintStatus.COMPLETE, report
        await again.result()


async def test_a_story_set_done_by_hand_before_its_batch_shows_as_done(ts_env, tmp_path: Path):
    """K2 is set to done in the file while batch 1 runs: batch 2 finds it done, runs nothing for it, and the
    sprint's status, report and batch result say done (they said backlog and "not run", or both done and
    skipped)."""
    make_project(tmp_path, {K1: "review", K2: "backlog"})
    simulation = {"stories": {"1-1": {"duration_ms": 2500}}}
    inp = sprint_input(tmp_path, session_id="by-hand", simulation=simulation, config_overrides={"batch_size": 1})
    async with bso_worker(ts_env.client) as queue:
        handle = await edited_while_in_flight(
            ts_env.client, queue, inp, K1, "review-runner", f"{K2}: backlog", f"{K2}: done"
        )
        report = await sprint_result(handle)
        view = await handle.query(SprintMasterWorkflow.status)
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done", K2: "done"}
    assert view.stories[K2].state == "done" and view.stories[K2].agents_dispatched == 0
    second = report.batches[1].results
    assert (second.stories_completed, second.stories_skipped, second.stories_total) == (1, 0, 1)
    assert not any(e.get("dispatch_id", "").startswith("by-hand/batch-2") for e in ledger(tmp_path))


async def test_a_story_set_done_by_hand_while_its_agent_works_is_taken_as_done(ts_env, tmp_path: Path):
    """K2 is set to done in the file while its dev agent works: the Slave's write (ready-for-dev -> review) finds
    done and takes it, with no code review (it was needs-intervention, against the file)."""
    make_project(tmp_path, {K1: "review", K2: "ready-for-dev"})
    simulation = {"stories": {"1-2": {"duration_ms": 4000}}}
    inp = sprint_input(tmp_path, session_id="done-by-hand", simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await edited_while_in_flight(
            ts_env.client, queue, inp, K2, "dev-runner", f"{K2}: ready-for-dev", f"{K2}: done"
        )
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done", K2: "done"}
    assert status_values(tmp_path)[K2] == "done"
    assert story_result(report, K2).agents_dispatched == 1  # the dev run only


async def test_stories_set_by_hand_in_a_started_batch_run_no_agent(ts_env, tmp_path: Path):
    """K2 is set to done and K3 to skipped while K1's agent works, in the same batch: the write after K1's agent
    reads them back, so no agent ever runs for them (before, K2's create-story agent ran first and its answer
    was set aside)."""
    make_project(tmp_path, {K1: "review", K2: "backlog", K3: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"duration_ms": 2500}}}
    inp = sprint_input(tmp_path, session_id="in-batch", simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "review-runner", "K1's review in flight")
        status_file = tmp_path / DEFAULT_STATUS_FILE
        text = status_file.read_text(encoding="utf-8")
        text = text.replace(f"{K2}: backlog", f"{K2}: done").replace(f"{K3}: ready-for-dev", f"{K3}: skipped")
        status_file.write_text(text, encoding="utf-8")
        report = await sprint_result(handle)
        view = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "done", K2: "done", K3: "skipped"}, report.stories
    started = [e["dispatch_id"] for e in ledger(tmp_path) if e["event"] == "started"]
    assert started == ["in-batch/batch-1/1-1/1"], started  # one agent: K1's review
    assert view.stories[K2].agents_dispatched == 0 and view.stories[K3].agents_dispatched == 0
    assert (status_values(tmp_path)[K2], status_values(tmp_path)[K3]) == ("done", "skipped")
    batch = report.batches[0].results
    assert (batch.stories_completed, batch.stories_skipped) == (2, 1)


async def test_a_status_file_replaced_by_a_directory_mid_batch_ends_its_stories_not_the_batch(ts_env, tmp_path: Path):
    """Someone replaces sprint-status.yaml by a directory while K1's agent works: K1's write cannot be made, and
    the re-read before K2's first agent cannot either. That re-read goes on with the states the batch has (as
    for a file that does not parse) instead of failing the whole Slave, which it did ("Slave ended abnormally:
    StatusFileError"); K2's own write then fails and says why."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"duration_ms": 2500}}}
    inp = sprint_input(tmp_path, session_id="made-a-dir", simulation=simulation)
    status_file = tmp_path / DEFAULT_STATUS_FILE
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "dev-runner", f"{K1}'s dev-runner in flight")
        status_file.unlink()
        status_file.mkdir()
        report = await sprint_result(handle)
        failures = await workflow_task_failures(ts_env.client, slave_workflow_id("made-a-dir", 1))
    assert report.stories == {K1: "needs-intervention", K2: "needs-intervention"}, report
    [batch] = report.batches  # its stories' verdicts, not "Slave ended abnormally: StatusFileError"
    assert not any("abnormally" in e for e in batch.errors) and report.error is None, (batch.errors, report.error)
    for key in (K1, K2):
        assert "sprint-status.yaml" in (story_result(report, key).error or ""), story_result(report, key)
    assert failures == []


async def test_a_status_file_that_lists_no_story_has_nothing_to_run(ts_env, tmp_path: Path):
    """Only epics (a file just generated, or stories all moved to another file): the sprint fails at its start
    saying so, as `bso sprint start` refuses it; it ended sprint-complete with 0 batches, which told nothing."""
    status = tmp_path / DEFAULT_STATUS_FILE
    make_project(tmp_path, {K1: "review"})
    status.write_text(status.read_text(encoding="utf-8").replace(f"  {K1}: review  # story {K1}\n", ""), encoding="utf-8")
    before = status.read_text(encoding="utf-8")
    assert "epic-1: backlog" in before and K1 not in before
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="no-stories"))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and (cause.type, cause.message) == ("InvalidSprintInput", NO_STORIES)
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    assert status.read_text(encoding="utf-8") == before
    with pytest.raises(BsoError, match="lists no story"):
        _check_selection(status, None, [])


async def test_stories_that_share_a_number_are_refused_at_the_start(ts_env, tmp_path: Path):
    """`1-2-login` and `1-2-logout` in one batch: the second took the first one's answers for its own (their
    dispatch ids are named by the number) and ended done with no agent of its own run. Refused at the start now,
    as by `bso sprint start`; the sprint that leaves one of them out runs."""
    login, logout = "1-2-login", "1-2-logout"
    status = make_project(tmp_path, {login: "review", logout: "review"})
    with pytest.raises(BsoError, match=r"^stories that share a number: 1-2-login and 1-2-logout \(1-2\)"):
        _check_selection(status, None, [])
    assert _check_selection(status, None, [logout]) == [logout]
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="shared"))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        one = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="one", story_keys=[logout]))
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidSprintInput", cause
    assert cause.message.startswith(f"stories that share a number: {login} and {logout} (1-2). "), cause.message
    assert await workflow_task_failures(ts_env.client, handle.id) == []
    values = status_values(tmp_path)
    assert (values[login], values[logout]) == ("review", "done")  # the refused sprint wrote nothing
    assert one.stories == {logout: "done"}
    assert [e["dispatch_id"] for e in ledger(tmp_path) if e["event"] == "started"] == ["one/batch-1/1-2/1"]
