"""Operator control and human decisions on the time-skipping server: pause/resume (no new dispatch while
paused, the agent in flight finishes), the first-story checkpoint, `story_review_fallback: ask_user`
answered by the `decide` update (on the Master or the Slave), decision timeout, rearm of a
needs-intervention story, shutdown mid-batch."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker
from temporalio import activity

from activities.agents import run_agent
from activities.improvements import add_improvement_stories
from activities.status_file import UNREADABLE_ERROR_TYPE, load_sprint_status, write_story_status
from activities.summary import SummaryInput, write_execution_summary
from bso.cli import QUERY_TIMEOUT, _cancelled_report, _view_from_report
from bso.constants import (
    AGENTS_TASK_QUEUE,
    SIGNAL_PAUSE,
    SIGNAL_PLAN_REQUEST,
    SIGNAL_SHUTDOWN,
    SIGNAL_STOP_NOW,
    SLAVE_CANCEL_WAIT,
    SPRINT_TASK_QUEUE,
    slave_workflow_id,
)
from bso.git_rules import FinishStoryInput, FinishStoryResult
from bso.improvements import AddStoriesInput
from bso.messages import DispatchReceipt, TaskAssignment
from bso.models import (
    DEFAULT_STATUS_FILE,
    LoadStatusInput,
    StatusSnapshot,
    StatusWriteInput,
    StatusWriteResult,
    SprintInput,
    StoryMeta,
)
from bso.models import SprintStatusView
from bso.planning import SHUTTING_DOWN
from bso.roster import resident_workflow_id
from bso.states import SprintPhase, SprintStatus
from activities.session_files import SESSION_DIR
from bso.message_flow import message_flow
from bso.report import work_per_story
from bso.summary import render_summary, summary_filename
from tests.conftest import bso_worker
from tests.workflow.holds import (
    ChildStartHeld,
    SignalDeliveredFirst,
    in_the_hold,
    replay_with,
    timer_of,
    workers_with as workers_held,
)
from tests.workflow.helpers import (
    current_details,
    has_event,
    ledger,
    make_project,
    poll_until,
    sprint_input,
    sprint_result,
    start_sprint,
    status_is,
    status_values,
    wait_status,
    workflow_task_failures,
)
from workflows.sprint_master import SprintMasterWorkflow
from workers.main import SPRINT_ACTIVITIES, WORKFLOW_INTERCEPTORS, WORKFLOWS, build_workers
from workflows.sprint_slave import SprintSlaveWorkflow

K1 = "1-1-login-form"
IMPROVEMENT = {"improvement_id": "imp_001", "description": "Add caching", "priority_score": 8.5}


def with_an_improvement_cycle(root: Path, session_id: str) -> SprintInput:
    """A sprint whose improvement cycle adds one story (IMPROVEMENT)."""
    return sprint_input(
        root, session_id=session_id, simulation={"improvements": [IMPROVEMENT]},
        config_overrides={"improvement_cycle": True, "max_improvements": 1},
    )
K2 = "1-2-logout"
K3 = "1-3-profile-page"


async def rejected(update, match: str) -> None:
    """The update is rejected (by its validator) and the reason says `match`."""
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await update
    assert match in str(info.value.cause), info.value.cause
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.non_retryable, cause  # a refusal: sending it again is no use


@asynccontextmanager
async def workers_with(client: Client, activity_fn: Callable[..., Any], instead_of: Callable[..., Any]) -> AsyncIterator[str]:
    """BSO's workers on fresh task queues, `activity_fn` (a stand-in: slow, so a test can act while a workflow
    awaits it, or acting or failing differently) registered instead of one sprint-queue activity; yields the
    sprint task queue."""
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    sprint_worker = Worker(
        client,
        task_queue=prefix + SPRINT_TASK_QUEUE,
        workflows=WORKFLOWS,
        activities=[activity_fn, *(a for a in SPRINT_ACTIVITIES if a is not instead_of), run_agent],
        interceptors=WORKFLOW_INTERCEPTORS,
    )
    (agents_worker,) = build_workers(client, [AGENTS_TASK_QUEUE], queue_prefix=prefix)
    async with sprint_worker, agents_worker:
        yield prefix + SPRINT_TASK_QUEUE


def file_appears(path: Path) -> Callable[[], Awaitable[bool]]:
    """A poll_until probe: `path` exists (a stand-in activity touches it once a workflow awaits it)."""
    return lambda: asyncio.sleep(0, path.exists())


def started(root: Path) -> list[str]:
    return [e["dispatch_id"] for e in ledger(root) if e["event"] == "started"]


async def start_with_k1_dev_in_flight(client, queue: str, root: Path, session_id: str, default_ms: int) -> WorkflowHandle:
    """A sprint on `root` whose K1 agents take 3 s, once K1's dev agent is in flight: an operator action sent
    then reaches the Slave while that agent still runs, however busy the machine."""
    simulation = {"default": {"duration_ms": default_ms}, "stories": {K1: {"duration_ms": 3000}}}
    handle = await start_sprint(client, queue, sprint_input(root, session_id=session_id, simulation=simulation))
    await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "dev-runner", "first dispatch")
    return handle


async def test_pause_stops_new_dispatches_until_resume(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_with_k1_dev_in_flight(ts_env.client, queue, tmp_path, "pause-1", 600)
        await handle.signal(SprintMasterWorkflow.pause, "lunch")
        slave = ts_env.client.get_workflow_handle(slave_workflow_id("pause-1", 1))
        # The agent in flight finishes (its answer is applied), then nothing new is dispatched.
        await wait_status(handle, lambda s: s.stories[K1].state == "review" and not s.stories[K1].agent_in_flight, "dev done")
        assert (await slave.query(SprintSlaveWorkflow.status)).paused
        seen = started(tmp_path)
        await asyncio.sleep(1.5)
        assert started(tmp_path) == seen
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.phase is SprintPhase.PAUSED and status.pause_reason == "lunch"
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == {K1: "done", K2: "done"}
    assert len(started(tmp_path)) == 4


async def test_a_pause_reason_of_megabytes_is_cut_not_forwarded_whole_to_every_batch(ts_env, tmp_path: Path):
    """1.5 MB of reason, forwarded to three running batches, made the Master's workflow task reply over gRPC's
    4 MB: the server terminated the sprint. It is cut, said so, and the sprint pauses and goes on."""
    keys = [K1, K2, "1-3-profile"]
    make_project(tmp_path, dict.fromkeys(keys, "review"))
    overrides = {"batch_size": 1, "max_concurrent_slaves": 3}
    simulation = {"default": {"duration_ms": 3000}}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(
            tmp_path, session_id="pause-big", config_overrides=overrides, simulation=simulation
        ))  # fmt: skip
        await wait_status(handle, lambda s: len(s.running_batches) == 3, "three batches running")
        await handle.signal(SprintMasterWorkflow.pause, "x" * 1_500_000)
        status = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "paused")
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert status.pause_reason == "x" * 2000 + "... (cut: 1500000 characters)", status.pause_reason[-40:]
    assert report.stories == dict.fromkeys(keys, "done")
    assert await workflow_task_failures(ts_env.client, handle.id) == []


async def test_a_paused_sprint_shut_down_ends_without_another_agent_and_says_no_more_paused(ts_env, tmp_path: Path):
    """A shutdown while paused starts nothing to finish the story in hand (the pause holds): it keeps the state it
    reached. The ended sprint's status no longer says paused (it showed `paused: lunch` after its end)."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_with_k1_dev_in_flight(ts_env.client, queue, tmp_path, "pause-stop", 600)
        await handle.signal(SprintMasterWorkflow.pause, "lunch")
        await wait_status(handle, lambda s: s.stories[K1].state == "review" and not s.stories[K1].agent_in_flight, "dev done")
        await handle.signal(SprintMasterWorkflow.shutdown_request)
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert report.status is SprintStatus.PARTIAL and report.stories == {K1: "review", K2: "ready-for-dev"}
    assert len(started(tmp_path)) == 1  # the dev only
    assert (status.phase, status.pause_reason) == (SprintPhase.COMPLETED, None), status


async def test_first_story_checkpoint_pause_waits_for_resume(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    overrides = {"first_story_checkpoint": "pause"}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="ckpt-1", config_overrides=overrides)
        )
        status = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "checkpoint pause")
        assert status.checkpoint and status.checkpoint.startswith(f"first story {K1} ended done")
        await asyncio.sleep(1.0)
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.stories[K2].agents_dispatched == 0 and status_values(tmp_path)[K2] == "review"
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}


async def test_first_story_checkpoint_report_only_reports(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="ckpt-2"))
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert report.status is SprintStatus.COMPLETE
    assert status.checkpoint is not None and K1 in status.checkpoint


ASK = {"max_story_review_rounds": 1}  # story_review_fallback defaults to ask_user
NEEDS_IMPROVE = {"stories": {"1-1": {"story_review": ["needs-improve", "needs-improve"]}}}


async def _awaiting(handle: WorkflowHandle) -> SprintStatusView:
    return await wait_status(handle, lambda s: K1 in s.awaiting_decision, "awaiting decision")


@pytest.mark.parametrize(
    "decision, after, final, story_reviews",
    [
        ("force_pass", "ready-for-dev", "done", 1),
        ("skip_story", "skipped", "skipped", 1),
        ("retry", "story-doc-improved", "story-doc-review", 2),  # revised, reviewed again, waits again
    ],
)
async def test_ask_user_waits_for_a_decision_on_the_master(ts_env, tmp_path: Path, decision, after, final, story_reviews):
    make_project(tmp_path, {K1: "story-doc-review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id=f"ask-{decision}", config_overrides=ASK, simulation=NEEDS_IMPROVE),
        )
        status = await _awaiting(handle)
        assert status.stories[K1].state == "story-doc-review"
        assert "force_pass, skip_story or retry" in status.awaiting_decision[K1]
        # What the Web UI shows of the Master: progress, the running batch's stories, who waits for whom.
        details = await current_details(handle)
        assert "0/1 stories done" in details and f"| `{K1}` | 1 | story-doc-review |" in details
        assert f"Awaiting a human decision (`decide` update): {K1} (" in details
        # Bad decisions are rejected by the validator and change nothing.
        for bad, why in (
            ({"story_key": "9-9-nope", "decision": "force_pass"}, "unknown story"),
            ({"story_key": K1, "decision": "maybe"}, "invalid decision"),
            ({"story_key": K1, "decision": "rearm"}, "not needs-intervention"),
            ("not an object", "invalid decision"),
        ):
            await rejected(handle.execute_update(SprintMasterWorkflow.decide, bad), why)
        view = await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": decision})
        assert view.state == after and view.awaiting_decision is None
        if decision == "retry":
            # A fresh round of story review, which needs improvement again: asks again; skip it this time.
            await _awaiting(handle)
            slave = ts_env.client.get_workflow_handle(slave_workflow_id(f"ask-{decision}", 1))
            view = await slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": K1, "decision": "skip_story"})
            assert view.state == "skipped" and view.story_review_rounds == 1
            final = "skipped"
            # `bso messages` lists the decision sent to the batch itself too (it listed only those the Master forwarded).
            flow = message_flow([await slave.fetch_history()])
            assert [(m.sender, m.recipient, m.detail) for m in flow if m.type == "DECISION"] == [
                ("sprint-master", "slave-batch-1", "retry"), ("operator", "slave-batch-1", "skip_story")
            ]
        report = await sprint_result(handle)
        details = await current_details(handle)
    assert report.stories == {K1: final}
    assert f"{int(final == 'done')}/1 stories done" in details and "Awaiting" not in details  # the decision counted
    assert status_values(tmp_path)[K1] == final


async def test_a_story_whose_batch_was_terminated_no_longer_awaits_a_decision(local_env, tmp_path: Path):
    """K1 waits for a decision when its batch's Slave is terminated: the sprint ends, and its status no longer
    lists K1 as awaiting a decision that could never land (it invited one). On the dev server: the time-skipping
    server times the sprint out once the Slave is terminated."""
    make_project(tmp_path, {K1: "story-doc-review"})
    session = f"ask-terminated-{uuid.uuid4().hex[:6]}"
    async with bso_worker(local_env.client) as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(
            tmp_path, session_id=session, config_overrides=ASK, simulation=NEEDS_IMPROVE
        ))
        await _awaiting(handle)
        await local_env.client.get_workflow_handle(slave_workflow_id(session, 1)).terminate("by hand")
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "story-doc-review"}
    assert status.awaiting_decision == {} and status.stories[K1].awaiting_decision is None, status.awaiting_decision


async def test_two_decisions_for_one_story_apply_once(ts_env, tmp_path: Path):
    """Two operators (or a retried call) answer at once: both may pass the validator in one workflow task;
    one decision is applied, the other refused, and the Master's task never fails."""
    make_project(tmp_path, {K1: "story-doc-review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="decide-twice", config_overrides=ASK, simulation=NEEDS_IMPROVE)
        )
        await _awaiting(handle)
        decision = {"story_key": K1, "decision": "force_pass"}
        answers = await asyncio.wait_for(  # a failing workflow task would retry, and the updates wait, forever
            asyncio.gather(
                *(handle.execute_update(SprintMasterWorkflow.decide, decision) for _ in range(2)), return_exceptions=True
            ),
            60,
        )
        report = await asyncio.wait_for(handle.result(), 60)
        failures = await workflow_task_failures(ts_env.client, handle.id)
    views = [a for a in answers if not isinstance(a, BaseException)]
    refusals = [a for a in answers if isinstance(a, WorkflowUpdateFailedError)]
    assert len(views) == 1 and views[0].state == "ready-for-dev", answers
    assert len(refusals) == 1 and "already on its way" in str(refusals[0].cause), answers
    assert failures == []
    assert report.stories == {K1: "done"}


async def test_batches_held_for_the_masters_hand_over_say_so(ts_env, tmp_path: Path):
    """Past continue_as_new_after_events the Master starts no batch until the running ones end (it continues as
    new with nothing running): with K1 waiting for a decision, the queued batches waited for it with a Slave free,
    and status and the Web UI said only `running`."""
    keys = [K1, K2, K3, "1-4-settings", "1-5-search"]
    make_project(tmp_path, {K1: "story-doc-review", **{k: "review" for k in keys[1:]}})
    overrides = {**ASK, "batch_size": 1, "max_concurrent_slaves": 2, "continue_as_new_after_events": 100}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(tmp_path, session_id="held-long", config_overrides=overrides, simulation=NEEDS_IMPROVE),
        )
        status = await wait_status(
            handle, lambda s: "history is long" in (s.batch_held or "") and K1 in s.awaiting_decision, "held for K1"
        )
        batch = status.stories[K1].batch_id
        assert status.batch_held == (
            f"no new batch starts until batch {batch} ends: the sprint's history is long, and it continues as new "
            f"once nothing runs (batch {batch} waits for your decision: `bso sprint decide`)"
        ), status.batch_held
        assert status.batch_held in await current_details(handle)
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
        report = await sprint_result(handle)
    assert set(report.stories.values()) == {"done"}, report.stories


async def test_a_decision_racing_a_shutdown_gets_an_answer_and_the_sprint_ends(ts_env, tmp_path: Path):
    """The batch may end on the shutdown before its Slave takes the decision: the update then says so
    (it used to wait forever, and the sprint with it, for all its handlers to finish)."""
    make_project(tmp_path, {K1: "story-doc-review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="decide-stop", config_overrides=ASK, simulation=NEEDS_IMPROVE)
        )
        await _awaiting(handle)
        await handle.signal(SprintMasterWorkflow.shutdown_request)
        try:
            view = await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
            assert view.state == "ready-for-dev"  # the Slave took it before it stopped
        except WorkflowUpdateFailedError as err:  # refused, or the batch ended first
            assert "not running" in str(err.cause) or "ended before the decision reached it" in str(err.cause), err.cause
        report = await sprint_result(handle)  # time skips: a sprint stuck here would time out, not return
        ended = await handle.query(SprintMasterWorkflow.status)
    assert ended.awaiting_decision == {}, ended.awaiting_decision  # an ended sprint asks for no decision
    assert report.status is SprintStatus.PARTIAL
    assert report.stories[K1] in ("story-doc-review", "ready-for-dev", "done")


@activity.defn(name="write_execution_summary")
async def slow_write_execution_summary(inp: SummaryInput) -> str:
    Path(inp.project_root, "summarizing").touch()  # the Master is ending: it writes its summary last
    await asyncio.sleep(3)
    return await write_execution_summary(inp)


async def test_a_rearm_while_the_sprint_ends_is_refused_not_lost(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}}}
    async with workers_with(ts_env.client, slow_write_execution_summary, instead_of=write_execution_summary) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="rearm-end", simulation=simulation)
        )
        await poll_until(file_appears(tmp_path / "summarizing"), "the Master writing its summary")
        await rejected(
            handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm"}),
            "the sprint is ending",
        )
        report = await sprint_result(handle)
    assert report.stories[K1] == status_values(tmp_path)[K1] == "needs-intervention"
    assert [b.batch_id for b in report.batches] == [1]


async def test_shutdown_when_a_batch_has_just_closed_still_ends_the_sprint(local_env, tmp_path: Path):
    """The Master learns of a Slave's end only in its next workflow task: a shutdown signalled before that
    must not fail on the Slave that is gone (it failed the sprint and left its residents running)."""
    client = local_env.client
    make_project(tmp_path, {K1: "ready-for-dev"})
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    async with AsyncExitStack() as stack:
        for worker in build_workers(client, queue_prefix=prefix):
            await stack.enter_async_context(worker)
        handle = await start_sprint(
            client, prefix + SPRINT_TASK_QUEUE, sprint_input(tmp_path, session_id="stop-closed", agent_backend="external")
        )
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "dev-runner", "dev in flight")
    # No worker (a restart, a laptop asleep): the batch closes and the operator stops the sprint meanwhile.
    await client.get_workflow_handle(slave_workflow_id("stop-closed", 1)).terminate("stuck batch")
    await handle.signal(SprintMasterWorkflow.shutdown_request)
    async with AsyncExitStack() as stack:
        for worker in build_workers(client, queue_prefix=prefix):
            await stack.enter_async_context(worker)
        report = await asyncio.wait_for(handle.result(), 60)
        for role in ("scrum-master", "knowledge-researcher", "debugger"):  # the default resident slots
            resident = await client.get_workflow_handle(resident_workflow_id("stop-closed", role)).describe()
            assert resident.status is WorkflowExecutionStatus.COMPLETED, (role, resident.status)
    assert report.status is SprintStatus.PARTIAL
    assert any("Slave ended abnormally" in e for b in report.batches for e in b.errors), report.batches


async def test_slave_decide_validator_rejects_a_story_not_waiting(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "story-doc-review", K2: "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id="ask-slave", config_overrides=ASK, simulation=NEEDS_IMPROVE),
        )
        await _awaiting(handle)
        slave = ts_env.client.get_workflow_handle(slave_workflow_id("ask-slave", 1))
        await rejected(
            slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": K2, "decision": "force_pass"}),
            "not awaiting a decision",
        )
        view = await slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
        assert view.state == "ready-for-dev"
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}


async def test_slave_decide_takes_a_short_story_key(ts_env, tmp_path: Path):
    """The Master takes `1-1` for `1-1-login-form` (as `bso sprint decide` and the README's temporal command send
    it); the Slave refused it, `unknown story '1-1'`, though the story waited in its batch."""
    make_project(tmp_path, {K1: "story-doc-review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id="ask-slave-short", config_overrides=ASK, simulation=NEEDS_IMPROVE),
        )
        await _awaiting(handle)
        slave = ts_env.client.get_workflow_handle(slave_workflow_id("ask-slave-short", 1))
        await rejected(
            slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": "9-9", "decision": "force_pass"}),
            "unknown story '9-9'",
        )
        view = await slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": "1-1", "decision": "skip_story"})
        assert view.state == "skipped" and view.awaiting_decision is None
        report = await sprint_result(handle)
    assert report.stories == {K1: "skipped"}
    assert status_values(tmp_path)[K1] == "skipped"


async def test_decision_timeout_gives_needs_intervention(own_ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "story-doc-review"})
    overrides = {**ASK, "decision_timeout_seconds": 3600}
    async with bso_worker(own_ts_env.client) as queue:
        handle = await start_sprint(
            own_ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides, simulation=NEEDS_IMPROVE)
        )
        report = await sprint_result(handle)  # time skips over the hour
    assert report.stories == {K1: "needs-intervention"}
    error = report.batches[0].results.story_results[0].error
    assert "decision_timeout_seconds (3600s)" in error


async def paused_after_k1_failed(client: Client, queue: str, root: Path, session_id: str) -> WorkflowHandle:
    """A sprint of one-story batches whose K1 fails its dev step in batch 1 (needs-intervention): started, and
    held by the first-story checkpoint's pause once batch 1 has ended (a rearm is accepted then)."""
    handle = await start_sprint(
        client, queue,
        sprint_input(
            root, session_id=session_id, config_overrides={"batch_size": 1, "first_story_checkpoint": "pause"},
            simulation={"stories": {"1-1": {"fail": {"dev": "error"}}}},
        ),
    )
    await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done == 1, "checkpoint")
    return handle


async def test_rearm_a_needs_intervention_story_runs_it_in_a_new_batch(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await paused_after_k1_failed(ts_env.client, queue, tmp_path, "rearm-1")
        assert status_values(tmp_path)[K1] == "needs-intervention"
        failed = (await handle.query(SprintMasterWorkflow.status)).stories[K1]
        assert failed.agents_dispatched == 1 and failed.tokens_used > 0, failed
        await rejected(
            handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K2, "decision": "rearm"}),
            "not needs-intervention",
        )
        await rejected(
            handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "done"}),
            "cannot rearm to 'done'",
        )
        view = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"}
        )
        assert view.state == "review" and view.batch_id == 3
        assert status_values(tmp_path)[K1] == "review"
        # The status keeps counting the first attempt's work: the new batch starts from none.
        rearmed = (await handle.query(SprintMasterWorkflow.status)).stories[K1]
        assert (rearmed.agents_dispatched, rearmed.tokens_used) == (1, failed.tokens_used), rearmed
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        final = (await handle.query(SprintMasterWorkflow.status)).stories[K1]
    assert report.status is SprintStatus.COMPLETE
    assert report.stories == {K1: "done", K2: "done"}
    assert [b.batch_id for b in report.batches] == [1, 2, 3]
    # The summary counts both attempts' agents (the failed dev in batch 1, then code review in batch 3).
    details = render_summary(report).split("## Story Details", 1)[1]
    assert f"| {K1} | 3 | done | 0 | 2 |" in details, details
    # The status agrees: both batches' agents and tokens, live and from the report alone.
    assert final.agents_dispatched == 2 and final.tokens_used > failed.tokens_used, final
    from_report = _view_from_report(report).stories[K1]
    assert (from_report.agents_dispatched, from_report.tokens_used) == (2, final.tokens_used), from_report


async def test_shutdown_mid_batch_finishes_the_story_in_hand(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_with_k1_dev_in_flight(ts_env.client, queue, tmp_path, "stop-1", 500)
        await handle.signal(SprintMasterWorkflow.shutdown_request)
        # Said while the story in hand finishes (status, the Web UI): it looked like any running sprint.
        winding_down = await handle.query(SprintMasterWorkflow.status)
        assert winding_down.shutting_down and winding_down.phase is SprintPhase.RUNNING
        assert SHUTTING_DOWN in await current_details(handle)
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
        details = await current_details(handle)
    assert not status.shutting_down
    # The ended sprint's details say how it ended, with no empty table of running stories under it.
    assert details.startswith("**Sprint `stop-1`**: completed (sprint-partial), 1/3 stories done"), details
    assert "| story |" not in details and SHUTTING_DOWN not in details
    assert report.status is SprintStatus.PARTIAL
    assert report.stories == {K1: "done", K2: "ready-for-dev", K3: "ready-for-dev"}
    assert status.finished_batches == {1: (1, 3)}  # the bar counts the story finished, not the two never started
    assert status_values(tmp_path)[K1] == "done"
    assert status_values(tmp_path)[K2] == "ready-for-dev"
    assert len(started(tmp_path)) == 2  # dev and code review of the story in hand, nothing else


async def test_cancel_cancels_the_batches_and_stops_the_residents(local_env, tmp_path: Path):
    """A cancelled sprint leaves nothing of it running: its batch ends cancelled (not terminated by the Master's
    close) and its residents, which outlive the Master by design, are stopped; the status query says canceled.
    On the dev server: the time-skipping server does not hand a closed workflow's query to a second worker."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    async with bso_worker(local_env.client) as queue:
        handle = await start_with_k1_dev_in_flight(local_env.client, queue, tmp_path, "cancel-1", 500)
        await handle.cancel(reason="wrong branch")
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
        assert isinstance(failure.value.cause, CancelledError)
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.phase is SprintPhase.CANCELED
        assert status.errors == ["batch 1 cancelled with the sprint", "sprint cancelled: wrong branch"], status.errors
        # The cancelled batch counts (batches, tokens), and nothing of it shows in flight any more.
        assert (status.batches_done, status.stories[K1].agent_in_flight) == (1, None), status
        slave = local_env.client.get_workflow_handle(slave_workflow_id("cancel-1", 1))
        assert (await slave.describe()).status is WorkflowExecutionStatus.CANCELED
        # K1's agent in flight was cancelled with its batch (its TERMINATE_DIRECTIVE), not left to run out.
        events = [e.event_type for e in (await slave.fetch_history()).events]
        assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in events
        assert status.roster.residents == [] and len(status.unavailable_residents) == 0
        for role in ("scrum-master", "knowledge-researcher", "debugger"):  # the default resident slots
            resident = await local_env.client.get_workflow_handle(resident_workflow_id("cancel-1", role)).describe()
            assert resident.status is WorkflowExecutionStatus.COMPLETED, (role, resident.status)
        report = await handle.query(SprintMasterWorkflow.report)  # a cancelled sprint has no result, but a report
    # A worker that has not run the sprint (an empty cache: it replays the history) answers the same report.
    async with bso_worker(local_env.client, queue_prefix=queue.removesuffix(SPRINT_TASK_QUEUE)):
        assert await handle.query(SprintMasterWorkflow.report) == report
    # With no worker at all, `bso sprint status`, `report` and `watch` read it from the history: the summary
    # activity's input (they said `did not complete: Workflow cancelled`, a summary file on disk all the same).
    began = time.monotonic()
    assert await _cancelled_report(handle) == report
    assert time.monotonic() - began < QUERY_TIMEOUT.total_seconds()  # not a query that no worker answers
    assert status_values(tmp_path)[K2] == "ready-for-dev"  # nothing started after the cancel
    assert (report.status, report.error) == (SprintStatus.CANCELLED, "sprint cancelled: wrong branch"), report
    assert report.stories == {K1: "ready-for-dev", K2: "ready-for-dev"} and len(report.batches) == 1, report
    summary = (tmp_path / SESSION_DIR / summary_filename("cancel-1")).read_text()  # written as for any sprint
    assert "| status | sprint-cancelled |" in summary and "- sprint: sprint cancelled: wrong branch" in summary


@activity.defn(name="load_sprint_status")
async def slow_load_sprint_status(inp: LoadStatusInput) -> StatusSnapshot:
    await asyncio.sleep(2)  # the Master awaits this activity while the cancel comes
    return await load_sprint_status(inp)


async def test_cancel_while_the_master_awaits_an_activity_still_winds_down(own_ts_env, tmp_path: Path):
    """The cancel comes while the Master awaits an activity (its status load), not a condition: the sprint
    still ends cancelled (it used to end failed, the load's cancellation read as a status-file error), none
    of its residents runs on, and the status file is as it was. (A server of its own: the slow load still runs
    when the worker stops, and an activity left started held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "ready-for-dev"})
    async with workers_with(own_ts_env.client, slow_load_sprint_status, instead_of=load_sprint_status) as queue:
        handle = await start_sprint(own_ts_env.client, queue, sprint_input(tmp_path, session_id="cancel-2"))
        await asyncio.sleep(0.5)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
        assert isinstance(failure.value.cause, CancelledError), failure.value.cause
        for role in ("scrum-master", "knowledge-researcher", "debugger"):
            try:
                resident = await own_ts_env.client.get_workflow_handle(resident_workflow_id("cancel-2", role)).describe()
            except RPCError as err:  # never started
                assert err.status is RPCStatusCode.NOT_FOUND, err
                continue
            assert resident.status is not WorkflowExecutionStatus.RUNNING, role
    assert status_values(tmp_path)[K1] == "ready-for-dev"


async def ends_cancelled(client: Client, handle: WorkflowHandle) -> SprintStatusView:
    """The cancelled sprint ends cancelled, no workflow task of its Master failing (a failure fails the test at
    once, not after a wait for an end that never comes); its last status."""

    async def closed_or_failing() -> bool:
        described = await handle.describe()
        return described.status is not WorkflowExecutionStatus.RUNNING or bool(await workflow_task_failures(client, handle.id))

    await poll_until(closed_or_failing, "the sprint ends or its workflow task fails")
    assert await workflow_task_failures(client, handle.id) == []
    with pytest.raises(WorkflowFailureError) as failure:
        await sprint_result(handle)
    assert isinstance(failure.value.cause, CancelledError), failure.value.cause
    return await handle.query(SprintMasterWorkflow.status)


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the history with it
async def test_a_cancel_the_delivered_plan_request_swallowed_still_ends_the_sprint(local_env, tmp_path: Path):
    """The cancel comes while the Master's plan request is being delivered, and the delivery wins: the sprint
    runs on, though no batch may start any more. It looped without yielding (a deadlock that failed the
    Master's workflow task on every retry, for ever); it ends cancelled."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    before = status_values(tmp_path)
    hold = SignalDeliveredFirst(SIGNAL_PLAN_REQUEST)
    async with workers_held(local_env.client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id="cancel-swallowed"))
        await poll_until(lambda: in_the_hold(handle, hold), "the Master held after its plan request")
        await handle.cancel(reason="swallowed")
        status = await ends_cancelled(local_env.client, handle)
        assert status.phase is SprintPhase.CANCELED and status.errors == ["sprint cancelled: swallowed"], status
        for role in ("scrum-master", "knowledge-researcher", "debugger"):
            resident = await local_env.client.get_workflow_handle(resident_workflow_id(handle.id, role)).describe()
            assert resident.status is not WorkflowExecutionStatus.RUNNING, (role, resident.status)
    assert status_values(tmp_path) == before  # no batch started
    assert ledger(tmp_path) == []  # no agent ran
    await replay_with(local_env.client, handle, hold)


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the history with it
async def test_a_cancel_the_fail_fast_shutdown_swallowed_still_ends_the_sprint(local_env, tmp_path: Path):
    """fail_fast: batch 1's story fails for good and the Master shuts batch 2 down; the cancel comes while that
    SHUTDOWN is being delivered, and the delivery wins. The sprint ran on to its normal end and reported partial,
    its summary written as for a sprint that completed: it ends cancelled."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "fatal"}}, "1-2": {"duration_ms": 3000}}}
    config = {"fail_fast": True, "batch_size": 1, "max_concurrent_slaves": 2}
    hold = SignalDeliveredFirst(SIGNAL_SHUTDOWN)
    async with workers_held(local_env.client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        handle = await start_sprint(
            local_env.client, queue,
            sprint_input(tmp_path, session_id="cancel-fail-fast", simulation=simulation, config_overrides=config),
        )
        await poll_until(lambda: in_the_hold(handle, hold), "the Master held after batch 2's SHUTDOWN")
        await handle.cancel(reason="after fail_fast")
        status = await ends_cancelled(local_env.client, handle)
    assert status.errors[-1] == "sprint cancelled: after fail_fast", status.errors
    await replay_with(local_env.client, handle, hold)


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the history with it
async def test_a_paused_sprint_whose_cancel_was_swallowed_ends_at_once(local_env, tmp_path: Path):
    """Paused, then cancelled while its plan request is being delivered (the delivery wins): the sprint waited
    for a resume that would never come, and the cancel's wind-down waited its full 30 s for it."""
    make_project(tmp_path, {K1: "ready-for-dev"})
    hold = SignalDeliveredFirst(SIGNAL_PLAN_REQUEST)
    async with workers_held(local_env.client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id="cancel-paused"))
        await poll_until(lambda: in_the_hold(handle, hold), "the Master held after its plan request")
        await handle.signal(SIGNAL_PAUSE, "paused first")
        await handle.cancel(reason="paused, then cancelled")
        await ends_cancelled(local_env.client, handle)
        history = await handle.fetch_history()
    waits = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() == SLAVE_CANCEL_WAIT
    }
    fired = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED]
    assert not [e for e in fired if e.timer_fired_event_attributes.started_event_id in waits]  # not waited out
    assert ledger(tmp_path) == []
    await replay_with(local_env.client, handle, hold)


async def residents_of_a_terminated_run(client: Client, queue: str, root: Path, session_id: str) -> list[Any]:
    """A first run of the sprint, terminated while its agent works: its residents run on (their descriptions)."""
    slow = {"stories": {"1-1": {"duration_ms": 60000}}}
    first = await start_sprint(client, queue, sprint_input(root, session_id=session_id, simulation=slow))
    await wait_status(first, lambda s: s.stories[K1].agent_in_flight is not None, "K1's agent in flight")
    await first.terminate("by hand")
    roles = ("scrum-master", "knowledge-researcher", "debugger")
    lingering = [await client.get_workflow_handle(resident_workflow_id(first.id, r)).describe() for r in roles]
    assert all(d.status is WorkflowExecutionStatus.RUNNING for d in lingering)
    return lingering


async def all_stopped(client: Client, runs: list[Any]) -> bool:
    """A poll_until probe: none of these workflow runs is running."""
    handles = [client.get_workflow_handle(d.id, run_id=d.run_id) for d in runs]
    return all([(await h.describe()).status is not WorkflowExecutionStatus.RUNNING for h in handles])


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the history with it
async def test_a_cancel_while_lingering_residents_are_replaced_starts_none_and_stops_them_all(
    local_env, tmp_path: Path
):
    """A sprint started again after its Master was terminated replaces the residents the first run left; the cancel
    comes while the first of them is told stop_now, and the delivery wins. The sprint went on starting its
    residents during the cancel's wind-down. It starts none after the cancel, and stops every lingering one."""
    client = local_env.client
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    hold = SignalDeliveredFirst(SIGNAL_STOP_NOW, first_only=True)  # the first run sends none: terminated
    async with workers_held(client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        lingering = await residents_of_a_terminated_run(client, queue, tmp_path, "linger-cancel")
        handle = await start_sprint(client, queue, sprint_input(tmp_path, session_id="linger-cancel"))
        await poll_until(lambda: in_the_hold(handle, hold), "the Master held after its stop_now to the scrum-master")
        await handle.cancel(reason="while replacing")
        await ends_cancelled(client, handle)
        await poll_until(lambda: all_stopped(client, lingering), "the first run's residents stopped")
        events = list((await handle.fetch_history()).events)
    cancelled_at = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
    started_after = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED and e.event_id > cancelled_at
    ]
    assert started_after == []
    assert status_values(tmp_path) == before
    await replay_with(local_env.client, handle, hold)


@activity.defn(name="load_sprint_status")
async def load_held_while_told(inp: LoadStatusInput) -> StatusSnapshot:
    """The Master's status load (and claim of the project), held while the file `hold-the-load` exists: the
    sprint has not tried to start a resident yet."""
    while Path(inp.project_root, "hold-the-load").exists():
        Path(inp.project_root, "loading").touch()
        await asyncio.sleep(0.1)
    return await load_sprint_status(inp)


async def test_a_sprint_cancelled_before_it_starts_residents_stops_those_an_earlier_run_left(local_env, tmp_path: Path):
    """A sprint started again after its Master was terminated, cancelled while it waits for its status load (the
    project's claim may wait for another sprint): it had not tried to start its residents, so it knew of none of
    the first run's, which ran on for ever. It tells every resident id of the sprint stop_now."""
    client = local_env.client
    make_project(tmp_path, {K1: "review"})
    async with workers_with(client, load_held_while_told, instead_of=load_sprint_status) as queue:
        lingering = await residents_of_a_terminated_run(client, queue, tmp_path, "unseen-linger")
        (tmp_path / "hold-the-load").touch()
        handle = await start_sprint(client, queue, sprint_input(tmp_path, session_id="unseen-linger"))
        await poll_until(file_appears(tmp_path / "loading"), "the second run's status load")
        await handle.cancel(reason="while loading")
        (tmp_path / "hold-the-load").unlink()
        await ends_cancelled(client, handle)
        await poll_until(lambda: all_stopped(client, lingering), "the first run's residents stopped", timeout=30)
        assert await workflow_task_failures(client, handle.id) == []


@pytest.mark.unreplayable_on_purpose  # the hold is the second run's: the test replays that run with it
async def test_a_sprint_cancelled_while_its_first_resident_starts_stops_those_an_earlier_run_left(local_env, tmp_path: Path):
    """The same, the cancel coming while the start of the sprint's first resident has no answer yet (held here on
    a timer): it had found none of the first run's residents yet, and cancelling the one it was starting left
    the others running. It tells every resident id of the sprint stop_now."""
    client = local_env.client
    make_project(tmp_path, {K1: "review"})
    hold = ChildStartHeld("ResidentWorkflow", 30)  # the second run's only: the first one's runs on its own queues
    async with bso_worker(client) as first_queue, workers_held(client, hold, f"t-{uuid.uuid4().hex[:8]}-") as queue:
        lingering = await residents_of_a_terminated_run(client, first_queue, tmp_path, "unseen-linger-2")
        handle = await start_sprint(client, queue, sprint_input(tmp_path, session_id="unseen-linger-2"))
        await poll_until(lambda: in_the_hold(handle, hold), "the first resident's start held")
        await handle.cancel(reason="while a resident starts")
        await ends_cancelled(client, handle)
        await poll_until(lambda: all_stopped(client, lingering), "the first run's residents stopped", timeout=30)
        assert await workflow_task_failures(client, handle.id) == []
    await replay_with(client, handle, hold, handle_run_only=True)


@pytest.mark.unreplayable_on_purpose  # the hold is the test's: the test replays the history with it
async def test_a_cancel_in_the_task_that_starts_a_batch_ends_the_sprint(local_env, tmp_path: Path):
    """The cancel comes in the very workflow task in which the Master starts a batch's Slave. The server
    refuses a task that starts a child and requests its cancel together: the Master's task failed on every
    retry, and the sprint never ended. The Slave is cancelled once it has started."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    hold = ChildStartHeld(SprintSlaveWorkflow.__name__, 2)
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    async with workers_held(local_env.client, hold, prefix) as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(tmp_path, session_id="cancel-at-start"))
        await poll_until(lambda: in_the_hold(handle, hold), "batch 1's start held")
    # No worker: the hold's timer fires, and the cancel joins the workflow task it made.
    await poll_until(lambda: timer_of(handle, hold, EventType.EVENT_TYPE_TIMER_FIRED), "the hold over")
    await handle.cancel(reason="as the batch starts")
    async with workers_held(local_env.client, hold, prefix):
        status = await ends_cancelled(local_env.client, handle)
        slave = await local_env.client.get_workflow_handle(slave_workflow_id(handle.id, 1)).describe()
    assert status.errors == ["batch 1 cancelled with the sprint", "sprint cancelled: as the batch starts"], status.errors
    assert slave.status is WorkflowExecutionStatus.CANCELED, slave.status
    # The race happened: the workflow task that took the cancel is the one that started the Slave.
    events = (await handle.fetch_history()).events
    (cancel,) = [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED]
    (start,) = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_task_completed_event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        and e.start_child_workflow_execution_initiated_event_attributes.workflow_id == slave_workflow_id(handle.id, 1)
    ]
    completed = [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    assert cancel < start and not [c for c in completed if cancel < c < start], (cancel, start)
    await replay_with(local_env.client, handle, hold)


@activity.defn(name="add_improvement_stories")
async def slow_add_improvement_stories(inp: AddStoriesInput) -> list[StoryMeta]:
    Path(inp.project_root, "adding").touch()  # the Master now awaits this activity: the test cancels
    await asyncio.sleep(30)
    return await add_improvement_stories(inp)


async def test_a_cancel_while_the_improvement_stories_are_added_ends_the_sprint_cancelled(own_ts_env, tmp_path: Path):
    """The cancel comes while the improvement cycle adds its stories: the cancelled activity was taken for a
    failure to add them, and the sprint ran on to its end and reported complete, the cancel lost. (A server of its
    own: the slow activity still runs when the worker stops, and held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "review"})
    async with workers_with(own_ts_env.client, slow_add_improvement_stories, instead_of=add_improvement_stories) as queue:
        handle = await start_sprint(
            own_ts_env.client, queue,
            with_an_improvement_cycle(tmp_path, "cancel-improving"),
        )
        await poll_until(file_appears(tmp_path / "adding"), "the improvement stories being added")
        await handle.cancel(reason="no improvements")
        status = await ends_cancelled(own_ts_env.client, handle)
    assert status.phase is SprintPhase.CANCELED, status
    assert status.errors == ["sprint cancelled: no improvements"], status.errors
    assert status_values(tmp_path)[K1] == "done"


@activity.defn(name="write_story_status")
async def write_held_until_the_cancel(inp: StatusWriteInput) -> StatusWriteResult:
    Path(inp.project_root, "writing").touch()  # the Slave now awaits this write: the test cancels
    # Longer than the Slave's workflow task timeout (5 s) allows a local activity within one task: the SDK then
    # ends the task while the write goes on, and the cancel reaches the Slave during the write (the test says
    # when it has).
    while not Path(inp.project_root, "cancel-reached-the-slave").exists():
        await asyncio.sleep(0.1)
    if Path(inp.project_root, "write-fails").exists():
        raise ApplicationError("sprint-status.yaml does not parse (the test's)", type=UNREADABLE_ERROR_TYPE, non_retryable=True)
    return await write_story_status(inp)


@pytest.mark.parametrize("write_fails", [False, True], ids=["written", "write-fails"])
async def test_cancel_while_a_slave_writes_the_status_ends_the_batch_cancelled(ts_env, tmp_path: Path, write_fails):
    """The cancel comes while the Slave awaits its U4 write (a local activity): the write is finished (before,
    it was cancelled, the file written or not and the Slave taking it as not), then the batch ends cancelled.
    A write that then fails (the file does not parse) leaves the story needing intervention: the batch does not
    wait for the file to be mended, nor go on to its next story, as one that is not cancelled does."""
    make_project(tmp_path, {K1: "review", K2: "review"})
    session = "cancel-4" if write_fails else "cancel-3"
    if write_fails:
        (tmp_path / "write-fails").touch()
    async with workers_with(ts_env.client, write_held_until_the_cancel, instead_of=write_story_status) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(tmp_path, session_id=session, config_overrides={"batch_size": 2}),
        )
        await poll_until(file_appears(tmp_path / "writing"), "K1's status write")
        await asyncio.sleep(5)  # past the workflow task the write began in
        await handle.cancel()
        slave = ts_env.client.get_workflow_handle(slave_workflow_id(session, 1))
        await poll_until(lambda: has_event(slave, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED), "the Slave's cancel")
        (tmp_path / "cancel-reached-the-slave").touch()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        await poll_until(lambda: status_is(slave, WorkflowExecutionStatus.CANCELED), "the batch ends cancelled", timeout=30)
        shown = (await handle.query(SprintMasterWorkflow.status)).stories[K1]
    assert started(tmp_path) == [f"{session}/batch-1/1-1/1"]  # K2 was never dispatched
    if write_fails:
        assert status_values(tmp_path)[K1] == "review"
        assert shown.state == "needs-intervention" and "could not be written" in (shown.error or ""), shown
    else:
        assert status_values(tmp_path)[K1] == "done" and shown.state == "done", shown


@activity.defn(name="write_story_status")
async def decision_write_held_until_the_cancel(inp: StatusWriteInput) -> StatusWriteResult:
    """The held write of test_cancel_while_a_slave_writes_the_status_ends_the_batch_cancelled, for the writes
    after the test has sent its decision only."""
    if Path(inp.project_root, "decision-sent").exists():
        return await write_held_until_the_cancel(inp)
    return await write_story_status(inp)


async def test_a_decision_sent_to_the_slave_whose_write_meets_the_cancel_is_answered(own_ts_env, tmp_path: Path):
    """A `decide` update sent to the Slave itself: the cancel comes while the Slave writes the decision's state.
    The write is finished, the update answered with the story as written, then the batch ends cancelled (the
    update was left unanswered, its caller told the batch had ended). (A server of its own: what the cancel leaves
    held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "story-doc-review"})
    async with workers_with(own_ts_env.client, decision_write_held_until_the_cancel, instead_of=write_story_status) as queue:
        handle = await start_sprint(
            own_ts_env.client, queue,
            sprint_input(tmp_path, session_id="cancel-decide", config_overrides=ASK, simulation=NEEDS_IMPROVE),
        )
        await _awaiting(handle)
        slave = own_ts_env.client.get_workflow_handle(slave_workflow_id("cancel-decide", 1))
        (tmp_path / "decision-sent").touch()
        decided = asyncio.create_task(
            slave.execute_update(SprintSlaveWorkflow.decide, {"story_key": K1, "decision": "force_pass"})
        )
        await poll_until(file_appears(tmp_path / "writing"), "the decision's status write")
        await asyncio.sleep(5)  # past the workflow task the write began in
        await handle.cancel()
        await poll_until(lambda: has_event(slave, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED), "the Slave's cancel")
        (tmp_path / "cancel-reached-the-slave").touch()
        view = await decided
        await poll_until(lambda: status_is(slave, WorkflowExecutionStatus.CANCELED), "the batch ends cancelled", timeout=30)
    assert view.state == "ready-for-dev" and view.awaiting_decision is None, view
    assert status_values(tmp_path)[K1] == "ready-for-dev"


async def test_a_rearm_whose_write_meets_the_sprints_cancel_is_answered_and_reported(local_env, tmp_path: Path):
    """The cancel comes while the rearm's status write waits for the file's lock: the sprint waits for the write
    and answers the update before it reports and ends. It ended at once, the update unanswered, and the write
    landed after: the file said ready-for-dev, the report and the summary needs-intervention."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    async with bso_worker(local_env.client) as queue:
        handle = await paused_after_k1_failed(local_env.client, queue, tmp_path, "rearm-cancel")
        lock = os.open(os.path.realpath(tmp_path / DEFAULT_STATUS_FILE) + ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(lock, fcntl.LOCK_EX)  # held as by a user's editor: the rearm's write waits for it
        try:
            rearm = await handle.start_update(
                SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm"},
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )  # fmt: skip
            await handle.cancel()
            await poll_until(lambda: has_event(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED), "the cancel")
            await asyncio.sleep(2)  # the wind-down has reached its report, were it not waiting for the write
            assert await status_is(handle, WorkflowExecutionStatus.RUNNING)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
        view = await rearm.result()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        report = await handle.query(SprintMasterWorkflow.report)
    assert view.state == "ready-for-dev", view
    assert status_values(tmp_path)[K1] == "ready-for-dev"
    assert (report.status, report.stories[K1]) == (SprintStatus.CANCELLED, "ready-for-dev"), report
    assert await workflow_task_failures(local_env.client, handle.id) == []


async def test_a_cancel_during_the_story_updates_hold_still_shows_the_last_states(own_ts_env, tmp_path: Path):
    """A Slave sends story updates at most once a second; cancelled within that hold, it sends what it held:
    the sprint's status shows K1 done (as the status file does), not K1 as it was a moment before. (A server of its
    own: K2's agent still works when the worker stops, and held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "review", K2: "ready-for-dev"})
    simulation = {"stories": {K2: {"duration_ms": 5000}}}
    async with bso_worker(own_ts_env.client) as queue:
        handle = await start_sprint(
            own_ts_env.client, queue,
            sprint_input(tmp_path, session_id="cancel-hold", simulation=simulation, config_overrides={"batch_size": 2}),
        )
        await poll_until(lambda: asyncio.sleep(0, status_values(tmp_path)[K1] == "done"), "K1 done in the file", interval=0.01)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    assert status.stories[K1].state == "done", status.stories
    assert status.stories[K2].agent_in_flight is None


@pytest.mark.parametrize("slaves", [1, 2])
async def test_a_story_rearmed_while_its_batch_runs_runs_again_before_the_sprint_ends(ts_env, tmp_path: Path, slaves):
    """K1 fails in the sprint's last batch while K2's agent still works: the rearm is taken at once (it was
    refused until the batch ended, and then the sprint had ended with it), and K1 runs in a new batch: after
    batch 1 with one Slave, beside it with two."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-2": {"duration_ms": 4000}}}
    inp = sprint_input(
        tmp_path, session_id=f"rearm-running-{slaves}", simulation=simulation,
        config_overrides={"max_concurrent_slaves": slaves},
    )
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].state == "needs-intervention", "K1 given up")
        view = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"}
        )
        status = await handle.query(SprintMasterWorkflow.status)
        report = await sprint_result(handle)
        final = await handle.query(SprintMasterWorkflow.status)
    assert view.state == "review" and view.batch_id == 2
    assert status.stories[K2].agent_in_flight is not None  # batch 1 was still running
    # K1's first tokens still count in the sprint's total (they dropped out until batch 1 ended).
    assert status.tokens_used == sum(v.tokens_used for v in status.stories.values()) > 0, status
    assert final.finished_batches == {1: (2, 2), 2: (1, 1)}  # batch 1 still counts K1 (bso sprint status's bars)
    assert _view_from_report(report).finished_batches == final.finished_batches  # and from the report alone
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done", K2: "done"}
    runs_of_k1 = [b.batch_id for b in report.batches if any(r.story_key == K1 for r in b.results.story_results)]
    assert runs_of_k1 == [1, 2] and status_values(tmp_path)[K1] == "done"


async def test_a_rearmed_storys_tokens_stay_counted_when_its_first_batch_is_cancelled(own_ts_env, tmp_path: Path):
    """K1 is rearmed out of batch 1 while K2 still runs there; the sprint is then cancelled. Batch 1's result,
    built by the Master from its remaining story, left K1's first run out: its tokens out of the sprint's total
    (1000 -> 0), its agent out of the report. (A server of its
    own: K2's agent still works when the worker stops, and held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-2": {"duration_ms": 60000}}}
    async with bso_worker(own_ts_env.client) as queue:
        handle = await start_sprint(own_ts_env.client, queue, sprint_input(tmp_path, session_id="rearm-cancel", simulation=simulation))
        await wait_status(handle, lambda s: s.stories[K1].state == "needs-intervention", "K1 given up")
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"})
        before = await handle.query(SprintMasterWorkflow.status)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        after = await handle.query(SprintMasterWorkflow.status)
        report = await handle.query(SprintMasterWorkflow.report)
    assert before.tokens_used == after.tokens_used == report.tokens_used > 0, (before.tokens_used, after.tokens_used)
    # The report has K1's first run too (in batch 1's result, as a Slave's own result would): its failed dev.
    assert work_per_story(report.batches)[K1].agents_dispatched == 1, report.batches


async def test_a_rearmed_storys_first_batch_ending_abnormally_leaves_its_new_run_alone(local_env, tmp_path: Path):
    """K1 is rearmed while batch 1 runs and its review runs in batch 2 beside it; then batch 1's Slave is
    terminated (on the dev server: the time-skipping test server does not tell the parent). The Master's
    wind-up of batch 1 must not touch K1, which batch 2 now runs: its agent stays in flight in the status and
    on the roster, and K1 ends done."""
    client = local_env.client
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "duration_ms": 2500}, "1-2": {"duration_ms": 6000}}}
    inp = sprint_input(
        tmp_path, session_id="rearm-abnormal", simulation=simulation, config_overrides={"max_concurrent_slaves": 2}
    )
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].state == "needs-intervention", "K1 given up")
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"})
        await wait_status(handle, lambda s: s.stories[K1].agent_in_flight == "review-runner", "K1 in batch 2")
        await client.get_workflow_handle(slave_workflow_id("rearm-abnormal", 1)).terminate("stuck batch")
        status = await wait_status(handle, lambda s: "slave-batch-1" not in s.roster.slaves, "batch 1 wound up")
        report = await sprint_result(handle)
    assert status.stories[K1].agent_in_flight == "review-runner" and status.stories[K1].batch_id == 2
    assert any(t.startswith("review-runner") for t in status.roster.temps), status.roster
    assert report.stories[K1] == "done", report.stories


async def test_a_paused_sprint_at_its_end_takes_a_rearm_of_its_last_batchs_story(ts_env, tmp_path: Path):
    """A sprint paused while its last batch ends holds with nothing left to run, and a rearm then runs the story."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-2": {"duration_ms": 4000}}}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="rearm-last", simulation=simulation)
        )
        await wait_status(handle, lambda s: s.stories[K1].state == "needs-intervention", "K1 given up")
        await handle.signal(SprintMasterWorkflow.pause, "rearm 1-1")
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done == 1, "batch 1 over")
        view = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"}
        )
        assert view.state == "review" and view.batch_id == 2
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE and report.stories == {K1: "done", K2: "done"}
    assert status_values(tmp_path)[K1] == "done"


async def test_two_rearms_of_one_story_sent_together_queue_it_once(ts_env, tmp_path: Path):
    """An operator retrying, or two terminals: the second rearm's validator ran while the first's status write
    was in flight, its write answered already-applied, and the story was queued and run twice."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await paused_after_k1_failed(ts_env.client, queue, tmp_path, "rearm-twice")
        request = {"story_key": K1, "decision": "rearm", "state": "review"}
        outcomes = await asyncio.gather(
            handle.execute_update(SprintMasterWorkflow.decide, request),
            handle.execute_update(SprintMasterWorkflow.decide, request),
            return_exceptions=True,
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 1 and "a decision is already on its way" in str(refused[0].cause), outcomes
    runs_of_k1 = [b.batch_id for b in report.batches if any(r.story_key == K1 for r in b.results.story_results)]
    assert runs_of_k1 == [1, 3] and report.stories[K1] == "done", runs_of_k1


async def test_a_rearmed_story_runs_before_the_queued_batch_that_depends_on_it(ts_env, tmp_path: Path):
    """K2 depends on K1, which failed in batch 1. Rearmed, K1 was queued behind K2's batch 2, which then waited
    for it while batch 3 could not start before batch 2 ended: the sprint hung until the Slave's timeout."""
    doc = "# Story 1.2: Logout\n\nStatus: ready-for-dev\n\nDepends on: 1-1\n"
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"}, {K2: doc})
    async with bso_worker(ts_env.client) as queue:
        handle = await paused_after_k1_failed(ts_env.client, queue, tmp_path, "rearm-dep")
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"})
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)  # on the old code: after slave_timeout_seconds, skipped in time
    errors = [e for b in report.batches for e in b.errors]
    assert report.stories == {K1: "done", K2: "done"}, (report.stories, errors)
    assert errors == []


A_B_C_D = ("1-1-login-form", "1-2-logout", "1-3-profile", "1-4-slow-page")


async def c_skipped_for_a(client: Client, queue: str, root: Path, session_id: str) -> WorkflowHandle:
    """B depends on A, C on B: A fails its dev step, so B and C are skipped; D (4 s) still runs. Started, and
    returned once C is skipped."""
    a, b, c, d = A_B_C_D
    make_project(
        root, {a: "ready-for-dev", b: "ready-for-dev", c: "backlog", d: "ready-for-dev"},
        {b: "# Story 1.2: Logout\n\nDepends on: 1-1\n", c: "# Story 1.3: Profile\n\nDepends on: 1-2\n"},
    )
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-4": {"duration_ms": 4000}}}
    handle = await start_sprint(client, queue, sprint_input(root, session_id=session_id, simulation=simulation))
    await wait_status(handle, lambda s: s.stories[c].state == "skipped", "C skipped")
    return handle


async def test_a_rearm_brings_back_the_stories_skipped_because_of_it(ts_env, tmp_path: Path):
    """B depends on A, C on B; A failed, so B and C were skipped. Rearmed, A ran again, but B and C stayed
    skipped: no rearm took a skipped story, nor a course correction one of the sprint's own, and their
    `ready-for-dev` was overwritten in the file (the next sprint had nothing to run). They come back in A's new
    batch, after it (a batch of its own each when planned: the plan never puts a dependant beside its dependency)."""
    a, b, c, d = A_B_C_D
    async with bso_worker(ts_env.client) as queue:
        handle = await c_skipped_for_a(ts_env.client, queue, tmp_path, "rearm-deps")
        assert [status_values(tmp_path)[k] for k in (b, c)] == ["skipped", "skipped"]
        # B cannot run while A is failed: the rearm to send is A's (its skipped dependants come with it).
        await rejected(
            handle.execute_update(SprintMasterWorkflow.decide, {"story_key": b, "decision": "rearm"}),
            f"skipped because {a} will not be done: rearm {a}",
        )
        view = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": a, "decision": "rearm", "state": "review"}
        )
        assert view.state == "review" and view.batch_id == 4
        now = await handle.query(SprintMasterWorkflow.status)
        assert [(now.stories[k].state, now.stories[k].batch_id) for k in (b, c)] == [("ready-for-dev", 4), ("backlog", 4)]
        assert [status_values(tmp_path)[k] for k in (a, b, c)] == ["review", "ready-for-dev", "backlog"]
        report = await sprint_result(handle)
    assert report.stories == {a: "done", b: "done", c: "done", d: "done"}, report.stories
    assert [x.batch_id for x in report.batches if any(r.story_key == c for r in x.results.story_results)] == [3, 4]
    assert await workflow_task_failures(ts_env.client, "rearm-deps") == []


async def test_a_skipped_dependant_set_done_by_hand_is_taken_as_done_and_its_own_dependants_come_back(
    ts_env, tmp_path: Path
):
    """B (skipped for A) was set to done by hand before A's rearm: the report said B skipped while the file said
    done, and C (skipped for B) stayed skipped though nothing held it any more."""
    a, b, c, d = A_B_C_D
    async with bso_worker(ts_env.client) as queue:
        handle = await c_skipped_for_a(ts_env.client, queue, tmp_path, "rearm-hand-done")
        status_file = tmp_path / DEFAULT_STATUS_FILE
        status_file.write_text(status_file.read_text().replace(f"{b}: skipped", f"{b}: done"))
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": a, "decision": "rearm", "state": "review"})
        report = await sprint_result(handle)
    assert report.stories == {a: "done", b: "done", c: "done", d: "done"}, report.stories
    assert [status_values(tmp_path)[k] for k in (a, b, c)] == ["done", "done", "done"]
    assert await workflow_task_failures(ts_env.client, "rearm-hand-done") == []


async def test_a_story_skipped_by_a_human_decision_can_be_rearmed_with_its_dependants(ts_env, tmp_path: Path):
    """K1 was skipped by a `skip_story` decision (K2, depending on it, would be skipped too). A rearm took only
    needs-intervention stories: the decision could not be taken back while the sprint ran. Rearmed, K1 runs
    again, and K2 after it."""
    make_project(tmp_path, {K1: "story-doc-review", K2: "ready-for-dev"}, {K2: "# Story 1.2: Logout\n\nDepends on: 1-1\n"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(
                tmp_path, session_id="rearm-skipped", simulation=NEEDS_IMPROVE,
                config_overrides={**ASK, "first_story_checkpoint": "pause"},
            ),
        )
        await _awaiting(handle)
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "skip_story"})
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done == 1, "checkpoint")
        assert status_values(tmp_path)[K1] == "skipped"
        view = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "ready-for-dev"}
        )
        assert view.state == "ready-for-dev" and status_values(tmp_path)[K1] == "ready-for-dev"
        await handle.signal(SprintMasterWorkflow.resume)
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert [status_values(tmp_path)[k] for k in (K1, K2)] == ["done", "done"]
    assert await workflow_task_failures(ts_env.client, "rearm-skipped") == []


async def test_a_dependant_skipped_after_the_rearm_by_a_running_batch_comes_back(ts_env, tmp_path: Path):
    """B depends on A; B's batch runs the slow Y first. A failed and was rearmed while B still waited its turn:
    the batch then skipped B for A's old failure, and B stayed skipped though A was done (the rearm had brought
    back only the stories skipped so far). Once its batch ends, B comes back in a batch of its own, after A."""
    a, x, y, b = "1-1-login-form", "1-2-logout", "1-3-profile", "1-4-settings"
    make_project(
        tmp_path, {a: "ready-for-dev", x: "review", y: "review", b: "review"},
        {y: "# Story 1.3: Profile\n\nDepends on: 1-2\n", b: "# Story 1.4: Settings\n\nDepends on: 1-1\n"},
    )
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-3": {"duration_ms": 4000}}}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="rearm-running", simulation=simulation)
        )
        now = await wait_status(handle, lambda s: s.stories[y].agent_in_flight is not None, "Y running")
        assert now.stories[a].state == "needs-intervention" and now.stories[b].batch_id == now.stories[y].batch_id
        assert now.stories[b].state == "review"  # not reached yet: its batch runs Y first
        assert now.waiting_for == {}  # A failed: B is not waiting for it (it will be skipped)
        await handle.execute_update(SprintMasterWorkflow.decide, {"story_key": a, "decision": "rearm", "state": "review"})
        rearmed = await handle.query(SprintMasterWorkflow.status)
        assert rearmed.waiting_for == {b: [a]}, rearmed.waiting_for  # (status shows it: B looked idle)
        report = await sprint_result(handle)
    assert report.stories == {a: "done", x: "done", y: "done", b: "done"}, (report.stories, status_values(tmp_path))
    assert status_values(tmp_path)[b] == "done"
    ran_b = [x.batch_id for x in report.batches if any(r.story_key == b for r in x.results.story_results)]
    assert len(ran_b) == 2 and ran_b[0] == now.stories[b].batch_id, ran_b  # skipped in its batch, done in a new one
    assert await workflow_task_failures(ts_env.client, "rearm-running") == []


async def test_a_cancel_during_squash_and_merge_ends_the_batch(own_ts_env, tmp_path: Path):
    """command backend: K1 is done and its squash-and-merge runs when the sprint is cancelled. The cancel was
    taken for a merge failure and the Slave went on to K2, dispatching a new agent after the cancel. (A server of
    its own: what the cancel leaves held the shared server's clock for later tests.)"""
    make_project(tmp_path, {K1: "review", K2: "review"})
    dispatched: list[str] = []

    @activity.defn(name="run_agent")
    async def passing_review(a: TaskAssignment) -> DispatchReceipt:
        dispatched.append(a.dispatch_id)
        answer = {"dispatch_id": a.dispatch_id, "story_key": a.story_key, "agent_type": a.agent_type.value,
                  "mode": a.mode.value, "status": "success", "verdict": "passed"}
        return DispatchReceipt(dispatch_id=a.dispatch_id, delivered=True, answer=answer)

    @activity.defn(name="finish_story_git")
    async def endless_squash(inp: FinishStoryInput) -> FinishStoryResult:
        (tmp_path / "squash-started").touch()
        while True:  # until cancelled
            activity.heartbeat()
            await asyncio.sleep(0.1)

    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    sprint_worker = Worker(
        own_ts_env.client, task_queue=prefix + SPRINT_TASK_QUEUE, workflows=WORKFLOWS, activities=list(SPRINT_ACTIVITIES),
        interceptors=WORKFLOW_INTERCEPTORS,
    )
    agents_worker = Worker(own_ts_env.client, task_queue=prefix + AGENTS_TASK_QUEUE, activities=[passing_review, endless_squash])
    overrides = {"resident_slots": {"knowledge_researcher": False, "debugger": False, "e2e_live": False},
                 "po_gates_enabled": False}
    async with sprint_worker, agents_worker:
        handle = await start_sprint(
            own_ts_env.client, prefix + SPRINT_TASK_QUEUE,
            sprint_input(tmp_path, session_id="cancel-squash", agent_backend="command", config_overrides=overrides),
        )
        await poll_until(lambda: asyncio.sleep(0, (tmp_path / "squash-started").exists()), "the squash started")
        before = list(dispatched)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await sprint_result(handle)
        slave = await own_ts_env.client.get_workflow_handle(slave_workflow_id("cancel-squash", 1)).describe()
        view = await handle.query(SprintMasterWorkflow.status)
    assert dispatched == before, dispatched  # no agent after the cancel
    assert slave.status is WorkflowExecutionStatus.CANCELED
    # K1's done, still held by the Slave when the cancel came, reached the Master (as it is in the file).
    assert status_values(tmp_path)[K1] == "done" and view.stories[K1].state == "done", view.stories[K1]


async def test_a_checkpoint_on_a_story_settled_before_its_slave_read_it_pauses_the_sprint(ts_env, tmp_path: Path):
    """K1 is set to done by hand after the Master read the file, before its Slave did. The Slave took the
    first-story checkpoint and paused itself, but told the Master nothing: the sprint never paused, nothing
    resumed the Slave, and K2 waited until the Slave's timeout."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    status_file = tmp_path / DEFAULT_STATUS_FILE

    @activity.defn(name="load_sprint_status")
    async def finished_by_hand_meanwhile(inp: LoadStatusInput) -> StatusSnapshot:
        if inp.only_stories is not None:  # the Slave's read
            status_file.write_text(status_file.read_text().replace(f"{K1}: ready-for-dev", f"{K1}: done"))
        return await load_sprint_status(inp)

    async with workers_with(ts_env.client, finished_by_hand_meanwhile, instead_of=load_sprint_status) as queue:
        handle = await start_sprint(
            ts_env.client, queue,
            sprint_input(tmp_path, session_id="settled-ckpt", config_overrides={"first_story_checkpoint": "pause"}),
        )
        paused = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "the checkpoint's pause")
        assert paused.stories[K1].state == "done" and paused.checkpoint and K1 in paused.checkpoint
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert [e for b in report.batches for e in b.errors] == []


async def test_a_sprint_that_fails_stops_its_residents(ts_env, tmp_path: Path):
    """The scrum-master resident cannot plan the stories (they depend on each other): the sprint fails, and its
    residents (which outlive the Master by design) are stopped with it instead of running for ever."""
    make_project(
        tmp_path, {K1: "review", K2: "review"},
        story_files={K1: "# Story 1.1: Login\n\nDepends on: 1-2\n", K2: "# Story 1.2: Logout\n\nDepends on: 1-1\n"},
    )
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="fails-late"))
        with pytest.raises(WorkflowFailureError) as failure:
            await sprint_result(handle)
        assert "cycle" in str(failure.value.cause), failure.value.cause
        residents = [
            await ts_env.client.get_workflow_handle(resident_workflow_id("fails-late", role)).describe()
            for role in ("scrum-master", "debugger", "knowledge-researcher")
        ]
    assert [r.status for r in residents] == [WorkflowExecutionStatus.COMPLETED] * 3


async def test_a_bug_in_the_sprint_leaves_its_residents_running_for_the_fixed_worker(own_ts_env, tmp_path: Path):
    """A plain exception (a bug) fails the Master's workflow task, which Temporal retries until a fixed worker
    runs it: the residents must not be stopped then (only a failure that ends the sprint stops them). (A server of
    its own: the failing task, retried, held the shared server's clock for later tests.)"""

    @activity.defn(name="add_improvement_stories")
    async def adds_nothing(inp: AddStoriesInput) -> list[StoryMeta]:
        return []  # the Master's zip(metas, chosen, strict=True) raises ValueError: its workflow task fails

    make_project(tmp_path, {K1: "review"})
    async with workers_with(own_ts_env.client, adds_nothing, instead_of=add_improvement_stories) as queue:
        handle = await start_sprint(
            own_ts_env.client, queue,
            with_an_improvement_cycle(tmp_path, "wft-bug"),
        )
        await poll_until(lambda: workflow_task_failures(own_ts_env.client, "wft-bug"), "the workflow task fails")
        master = await handle.describe()
        residents = [
            (await own_ts_env.client.get_workflow_handle(resident_workflow_id("wft-bug", role)).describe()).status
            for role in ("scrum-master", "debugger", "knowledge-researcher")
        ]
    assert master.status is WorkflowExecutionStatus.RUNNING
    assert residents == [WorkflowExecutionStatus.RUNNING] * 3, residents


@activity.defn(name="write_story_status")
async def rearm_write_held_until_released(inp: StatusWriteInput) -> StatusWriteResult:
    """The rearm's status write (K1 -> review) waits for the test's `release` file; every other write is as is."""
    if inp.story_key == K1 and inp.new == "review":
        Path(inp.project_root, "rearm-writing").touch()
        while not Path(inp.project_root, "release").exists():
            await asyncio.sleep(0.05)
    return await write_story_status(inp)


async def test_a_course_correction_waits_for_a_rearm_being_applied(ts_env, tmp_path: Path):
    """A correction replaces the queue: accepted while a rearm's batch was being queued, it dropped that batch
    (the story never ran) and planned with a batch id the rearm took too. It is refused until the rearm is in."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review", K3: "review"})
    async with workers_with(ts_env.client, rearm_write_held_until_released, instead_of=write_story_status) as queue:
        handle = await paused_after_k1_failed(ts_env.client, queue, tmp_path, "rearm-cc")
        rearm = asyncio.create_task(
            handle.execute_update(SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"})
        )
        await poll_until(file_appears(tmp_path / "rearm-writing"), "the rearm's write")
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"]}),
            "a rearm is being applied",
        )
        (tmp_path / "release").touch()
        assert (await rearm).state == "review"
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"]}
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert K1 in [k for b in cc.batches for k in b.stories]  # the rearmed story is in the new plan
    assert report.stories == {K1: "done", K2: "done", K3: "skipped"}


async def test_the_masters_own_course_correction_keeps_a_rearm_written_while_it_plans(ts_env, tmp_path: Path, monkeypatch):
    """Repeated failures make the Master re-plan the queue on its own. A rearm accepted just before, written while
    the scrum-master planned, queued its batch; the new plan then replaced the queue, the rearmed story never ran
    and the sprint ended with it in `review`. The Master plans again with it."""
    import bso.scrum_master

    plan = bso.scrum_master.answer

    def slow_replan(request, planner=bso.scrum_master.SCRUM_MASTER):
        if request.course_correction is not None:  # the re-plan: the rearm's write ends while it is made
            Path(tmp_path, "release").touch()
            time.sleep(1.0)
        return plan(request, planner)

    monkeypatch.setattr(bso.scrum_master, "answer", slow_replan)  # the resident workflow imports it when it runs
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "review"})
    inp = sprint_input(
        tmp_path, session_id="rearm-auto-cc", config_overrides={"batch_size": 2, "consecutive_failure_threshold": 2},
        simulation={"stories": {"1-1": {"fail": {"dev": "error"}}, "1-2": {"fail": {"dev": "error"}, "duration_ms": 3000}}},
    )
    async with workers_with(ts_env.client, rearm_write_held_until_released, instead_of=write_story_status) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(handle, lambda s: s.stories[K1].state == "needs-intervention", "K1 given up")
        # K2 fails while the rearm is written: the second failure in a row, and the Master re-plans.
        rearmed = await handle.execute_update(
            SprintMasterWorkflow.decide, {"story_key": K1, "decision": "rearm", "state": "review"}
        )
        status = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and not s.running_batches, "paused")
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    (replanned,) = status.course_corrections
    assert replanned.startswith("repeated_failures") and "2 pending re-planned" in replanned, replanned
    assert rearmed.state == "review"
    batch_ids = [b.batch_id for b in report.batches]
    assert len(batch_ids) == len(set(batch_ids)), batch_ids  # no batch id given twice
    assert report.stories == {K1: "done", K2: "needs-intervention", K3: "done"}
    assert status_values(tmp_path)[K1] == "done"
    assert await workflow_task_failures(ts_env.client, handle.id) == []
