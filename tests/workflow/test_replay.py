"""Replay recorded histories of the example sprint against today's workflow code: a change that would
make running sprints non-deterministic fails here (re-record with scripts/record_histories.py only
for an intentional, versioned change)."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
import temporalio.workflow
from temporalio.workflow import UnfinishedUpdateHandlersWarning
from temporalio.client import WorkflowHistory
from temporalio.api.enums.v1 import EventType

from bso.constants import SIGNAL_DEBUG_REQUEST, SIGNAL_SHUTDOWN, SIGNAL_STOP_NOW, slave_workflow_id
from bso.dispatch import SLAVE_PATCH_ROLLUP_2
from bso.message_flow import decode
from bso.data_converter import data_converter
from temporalio.worker import Interceptor, Replayer

from tests.collapsed_history import collapsed
from tests.conftest import histories_of, assert_replays, bso_worker
from tests.workflow.holds import ChildStartHeld, SignalDeliveredFirst
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint
from workers.main import WORKFLOW_INTERCEPTORS, WORKFLOWS
from workflows import sprint_slave
from workflows.course_corrector import PATCH_CC_ADD_UNWRITTEN, PATCH_CC_DROP_UNWRITTEN
from workflows.delivery import PATCH_CANCELLED_SEND_IS_A_CANCEL
from workflows.planner import PATCH_PLAN_NUMBERING_CHECKED
from workflows.sprint_master import (
    PATCH_BATCH_END_SENDS_A_COMMAND,
    PATCH_CANCEL_STARTED_SLAVES,
    PATCH_EMPTY_SELECTION_REFUSED,
    PATCH_EPIC_SPELLINGS,
    PATCH_IMPROVEMENTS_ADD_CANCELLED,
    PATCH_BRING_BACK_TAKES_DONE_BY_HAND,
    PATCH_BRINGS_BACK_SKIPPED_AFTER_REARM,
    PATCH_REARM_BRINGS_BACK_DEPENDANTS,
    PATCH_SESSION_ID_IS_WORKFLOW_ID,
    PATCH_SHARED_NUMBERS_REFUSED,
    PATCH_STORIES_OUTSIDE_EPIC_REFUSED,
    PATCH_SIMULATION_UNCONVERTED,
    PATCH_SWALLOWED_CANCEL_ENDS_SPRINT,
    PATCH_UPDATES_ANSWERED_ON_CANCEL,
)
from workflows.sprint_slave import (
    PATCH_AGENT_WAKES_AFTER_SLEEP,
    PATCH_AGENT_WAKES_AFTER_WORKER_STOP,
    PATCH_ANSWER_FITS_HISTORY,
    PATCH_CANCEL_AFTER_DEBUG_REQUEST,
    PATCH_DECIDE_ANSWERED_ON_CANCEL,
    PATCH_EXTERNAL_AGENT_WAKES_AFTER_SLEEP,
    PATCH_UPDATES_HELD_AFTER_CLOSE,
    PATCH_SAME_STATE_COMPARED,
    PATCH_WORKING_TIME_WAKES_AFTER_SLEEP,
    PATCH_WRITE_SURVIVES_CANCEL,
)
from workflows.residents import PATCH_CANCEL_STOPS_RESIDENT_STARTS, PATCH_RESIDENT_ENDS_ON_ANY_CANCEL, PATCH_ROSTER_ALWAYS_HELD, PATCH_ROSTER_HELD_AFTER_FLUSH

ROOT = Path(__file__).resolve().parent.parent / "histories"
# Sub-folders keep histories recorded by earlier versions: sprints those versions started must still replay.
# Those in a `held-` folder ran with a test's hold (tests/workflow/holds.py) and replay with it.
HISTORIES = sorted(p for p in ROOT.glob("**/*.json") if not p.parent.name.startswith("held-"))


def test_histories_are_recorded():
    names = {str(p.relative_to(ROOT)) for p in HISTORIES}
    assert {"example-sprint.json", "example-sprint--batch-1.json", "before-2026-11-23/example-sprint--batch-1.json"} <= names


# Recorded runs that ended with an update unanswered (the bug their patch mends): their replay warns as they did.
LEFT_AN_UPDATE_UNANSWERED = {
    "before-2026-11-27-decide-cancel/cancel-decide--batch-1.json",
    "before-2026-11-27-rearm-cancel/rearm-cancel.json",
}


@pytest.mark.parametrize("path", HISTORIES, ids=[str(p.relative_to(ROOT).with_suffix("")) for p in HISTORIES])
async def test_replay(path: Path):
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    history = WorkflowHistory.from_json(path.stem.replace("--", "/"), path.read_text())
    unanswered = str(path.relative_to(ROOT)) in LEFT_AN_UPDATE_UNANSWERED
    with pytest.warns(UnfinishedUpdateHandlersWarning) if unanswered else contextlib.nullcontext():
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_every_history_a_test_makes_is_replayed_with_todays_code(ts_env, tmp_path: Path, monkeypatch):
    """The suite-wide check (tests/conftest.py: assert_replays, run after every test on the shared servers)
    replays the Master, its Slaves and residents, and fails on a history the code would now take another path
    through: here, a Slave whose story-updates hold was dropped unversioned, which turns the timer it started
    in the run into a signal sent at once on replay."""
    make_project(tmp_path, {"1-1-login-form": "backlog", "1-2-logout": "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id=f"replayed-{uuid.uuid4().hex[:6]}"))
        await sprint_result(handle)
    histories = await histories_of(ts_env.client, [handle.id])
    assert {h.workflow_id for h in histories} >= {handle.id, f"{handle.id}/batch-1", f"{handle.id}/resident-debugger"}
    await assert_replays(ts_env.client, [handle.id])

    async def sent_unheld(self, handle) -> None:
        while self._outbox:
            updates, self._outbox = self._outbox, []
            await handle.signal(sprint_slave.SIGNAL_STORY_UPDATES, sprint_slave.StoryUpdates(updates=updates))

    monkeypatch.setattr(sprint_slave.SprintSlaveWorkflow, "_send_updates_held", sent_unheld)
    with pytest.raises(AssertionError, match=rf"{handle.id}/batch-1 .*Nondeterminism"):
        await assert_replays(ts_env.client, [handle.id])


# test_operator_control's cancel-3: the Slave's U4 write (a local activity, slowed by the test) ran past its workflow
# task's timeout, and sdk-core kept the task alive with heartbeat completions (no command) while the story updates
# hold's timer fired and the cancel came. Joined on replay with the tasks after them, the agent's answer (the
# activity's result), the timer and the cancel come in one activation.
HEARTBEAT_HISTORY_BEFORE = ROOT / "heartbeat-2026-11-27" / "cancel-3--batch-1.json"  # before PATCH_WRITE_SURVIVES_CANCEL
HEARTBEAT_HISTORY = ROOT / "heartbeat-write-survives-cancel" / "cancel-3--batch-1.json"


async def test_a_local_activity_heartbeat_joined_with_the_tasks_after_it_replays():
    history = WorkflowHistory.from_json("cancel-3/batch-1", HEARTBEAT_HISTORY.read_text())
    joined, moved = collapsed(history)
    assert moved == 2
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    assert (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure is None


async def test_a_slave_from_before_the_write_survives_a_cancel_fails_that_shape_without_the_patch(monkeypatch):
    """The same moment recorded before PATCH_WRITE_SURVIVES_CANCEL, joined: the Slave, cancelled as its answer
    came, started no U4 write, where live it had started it a task before the cancel (`Missing associated machine
    for LocalActivity(3)`). With the patch it writes the answer's state first, as it did live."""
    history = WorkflowHistory.from_json("cancel-3/batch-1", HEARTBEAT_HISTORY_BEFORE.read_text())
    joined, moved = collapsed(history)
    assert moved == 2
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    failure = (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure
    assert failure is not None and "Missing associated machine for LocalActivity(3)" in str(failure), failure
    real_patched = temporalio.workflow.patched
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch: patch == PATCH_WRITE_SURVIVES_CANCEL or real_patched(patch))
    assert (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure is None


@pytest.mark.unreplayable_on_purpose
async def test_a_history_whose_tasks_are_joined_on_replay_is_replayed_in_that_shape_too(ts_env, tmp_path: Path, monkeypatch):
    """sdk-core joins, on replay, a workflow task that completed with no command with the next one, when the
    server wrote that one's WorkflowTaskScheduled before the events that woke it (tests/collapsed_history.py).
    The Master's roster broadcasts before PATCH_ROSTER_ALWAYS_HELD held a change or not by which came first, the
    acknowledgements of the last broadcast or a Slave's story update: in a full run of the suite under load a
    Master's task failed on every retry with `Timer machine does not handle this event:
    SignalExternalWorkflowExecutionInitiated`. The suite's check replays every history in that shape too; here
    it finds the old roster code out, which the plain replay does not."""
    make_project(tmp_path, {"1-1-login-form": "review", "1-2-logout": "review", "1-3-signup": "review"})
    real_patched = temporalio.workflow.patched
    # Nor the batch end's command: it keeps a batch's end from being joined, which hides the old roster code too.
    old_code = (PATCH_ROSTER_ALWAYS_HELD, PATCH_BATCH_END_SENDS_A_COMMAND)
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch_id: patch_id not in old_code and real_patched(patch_id))
    async with bso_worker(ts_env.client) as queue:
        inp = sprint_input(tmp_path, session_id=f"joined-{uuid.uuid4().hex[:6]}", config_overrides={"batch_size": 1})
        handle = await start_sprint(ts_env.client, queue, inp)
        await sprint_result(handle)
    monkeypatch.setattr(temporalio.workflow, "patched", real_patched)
    (master,) = [h for h in await histories_of(ts_env.client, [handle.id]) if h.workflow_id == handle.id]
    joined, moved = collapsed(master)
    assert moved > 0
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    assert (await replayer.replay_workflow(master, raise_on_replay_failure=False)).replay_failure is None
    failure = (await replayer.replay_workflow(joined, raise_on_replay_failure=False)).replay_failure
    assert failure is not None and "Nondeterminism" in str(failure), failure


async def assert_replays_only_behind(monkeypatch, recorded: str, patch_id: str, hold: Interceptor | None = None) -> None:
    """The history recorded before `patch_id` (with the test hold it ran with, if any) replays with today's code,
    and fails with a nondeterminism error when the patch is forced on: the patch is what keeps it replaying."""
    path = ROOT / recorded
    history = WorkflowHistory.from_json(path.stem.replace("--", "/"), path.read_text())
    interceptors = [*WORKFLOW_INTERCEPTORS, *([hold] if hold else [])]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, interceptors=interceptors)
    assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    real_patched = temporalio.workflow.patched
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch: patch == patch_id or real_patched(patch))
    failure = (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure
    assert failure is not None and "Nondeterminism" in str(failure), failure


async def test_a_resident_that_served_on_after_a_cancel_replays_only_behind_its_patch(monkeypatch):
    """A debugger recorded before PATCH_RESIDENT_ENDS_ON_ANY_CANCEL took a cancel for its analysis's failure,
    answered and served on until stopped: today's code, were it not behind the patch, ends it cancelled there."""
    await assert_replays_only_behind(
        monkeypatch, "before-2026-11-27-resident-cancel/cancel-busy--resident-debugger.json", PATCH_RESIDENT_ENDS_ON_ANY_CANCEL
    )


async def test_a_slave_that_ran_on_after_a_swallowed_cancel_replays_only_behind_its_patch(monkeypatch):
    """A Slave recorded before PATCH_CANCEL_AFTER_DEBUG_REQUEST was cancelled while its DEBUG_REQUEST was being
    delivered, the delivery won, and it ran the story on (the analysis, the fix, the code review) to the end:
    today's code, were it not behind the patch, ends it cancelled there."""
    await assert_replays_only_behind(
        monkeypatch, "held-before-2026-11-27-debug-request-cancel/dbg-swallowed--batch-1.json",
        PATCH_CANCEL_AFTER_DEBUG_REQUEST, SignalDeliveredFirst(SIGNAL_DEBUG_REQUEST),
    )


async def test_a_master_that_cancelled_a_starting_slave_replays_only_behind_its_patch(monkeypatch):
    """A Master recorded before PATCH_CANCEL_STARTED_SLAVES was cancelled while its batch's Slave was starting:
    it requested that Slave's cancel at once (which found no Slave yet), and the Slave then ran its stories.
    Today's code, were it not behind the patch, waits for the start and cancels it then."""
    await assert_replays_only_behind(
        monkeypatch, "held-before-2026-11-27-cancel-at-start/cancel-held.json",
        PATCH_CANCEL_STARTED_SLAVES, ChildStartHeld("SprintSlaveWorkflow", 2),
    )


async def test_a_master_that_ran_on_after_a_swallowed_cancel_replays_only_behind_its_patch(monkeypatch):
    """A Master recorded before PATCH_SWALLOWED_CANCEL_ENDS_SPRINT was cancelled while its fail_fast SHUTDOWN was
    being delivered, the delivery won, and it ran on to its normal end: today's code, were it not behind the
    patch, ends it cancelled there."""
    await assert_replays_only_behind(
        monkeypatch, "held-before-2026-11-27-fail-fast-cancel/cancel-fail-fast.json",
        PATCH_SWALLOWED_CANCEL_ENDS_SPRINT, SignalDeliveredFirst(SIGNAL_SHUTDOWN),
    )


async def test_a_master_that_started_residents_after_a_swallowed_cancel_replays_only_behind_its_patch(monkeypatch):
    """A Master recorded before PATCH_CANCEL_STOPS_RESIDENT_STARTS, started again after its first run was
    terminated, was cancelled while a lingering resident's stop_now was being delivered, the delivery won, and it
    went on starting its residents during the wind-down: today's code, were it not behind the patch, starts none."""
    await assert_replays_only_behind(
        monkeypatch, "held-before-2026-11-27-linger-cancel/linger-cancel.json",
        PATCH_CANCEL_STOPS_RESIDENT_STARTS, SignalDeliveredFirst(SIGNAL_STOP_NOW, first_only=True),
    )


@pytest.mark.parametrize(
    ("recorded", "patch_id"),
    [
        ("before-2026-11-27-holds-after-end/holds-4.json", PATCH_ROSTER_HELD_AFTER_FLUSH),
        ("before-2026-11-27-holds-after-end/holds-4--batch-1.json", PATCH_UPDATES_HELD_AFTER_CLOSE),
        # Cancelled while it added its improvement stories, it took that for their failure and ran on to its end.
        ("before-2026-11-27-improvements-cancel/cancel-improving.json", PATCH_IMPROVEMENTS_ADD_CANCELLED),
        # Cancelled with a failing answer, its DEBUG_REQUEST's send cancelled before it went out: sent again 1 s later.
        ("before-2026-11-27-cancelled-send/answer-cancel-f9eba1--batch-1.json", PATCH_CANCELLED_SEND_IS_A_CANCEL),
        # A `decide` update sent to it was left unanswered when the cancel met the decision's write.
        ("before-2026-11-27-decide-cancel/cancel-decide--batch-1.json", PATCH_DECIDE_ANSWERED_ON_CANCEL),
        # A rearm's write met its cancel: it ended with the update unanswered, the write landing after.
        ("before-2026-11-27-rearm-cancel/rearm-cancel.json", PATCH_UPDATES_ANSWERED_ON_CANCEL),
        # Two of its stories shared a number (1-2-login, 1-2-logout): it ran them in one batch.
        ("before-2026-11-27-shared-numbers/shared-numbers.json", PATCH_SHARED_NUMBERS_REFUSED),
        # An epic and a story outside it (`{"epic": 1, "story_keys": ["1-1", "2-1"]}`): it ran 1-1 alone.
        ("before-2026-11-28-outside-epic/outside-epic.json", PATCH_STORIES_OUTSIDE_EPIC_REFUSED),
        # `"epic": true` (the temporal CLI's input): it ran epic 1.
        ("before-2026-11-28-epic-spellings/epic-true.json", PATCH_EPIC_SPELLINGS),
        # `"epic": "01"`: it named no epic and the sprint failed (unknown epic).
        ("before-2026-11-28-epic-spellings/epic-01.json", PATCH_EPIC_SPELLINGS),
        # `"story_keys": []`: taken for no selection, it ran every open story of the file.
        ("before-2026-11-29-empty-story-keys/empty-keys.json", PATCH_EMPTY_SELECTION_REFUSED),
        # Its session_id was another running sprint's (sess-a): it ran, talking to that sprint's residents.
        ("before-2026-11-28-session-id/sess-b.json", PATCH_SESSION_ID_IS_WORKFLOW_ID),
        # Its simulation script's `"tokens": true` was read as 1 token: it ran.
        ("before-2026-11-28-unconverted/lax-sim.json", PATCH_SIMULATION_UNCONVERTED),
        # 1-1 rearmed after 1-2 and 1-3 were skipped for it: they stayed skipped.
        ("before-2026-11-29-rearm-dependants/rearm-deps.json", PATCH_REARM_BRINGS_BACK_DEPENDANTS),
        # 1-1 rearmed while its dependant 1-4 waited behind a slow story: its batch skipped 1-4 after, for good.
        ("before-2026-11-29-skipped-after-rearm/rearm-running.json", PATCH_BRINGS_BACK_SKIPPED_AFTER_REARM),
        # 1-2, skipped for 1-1, set to done by hand before 1-1's rearm: it stayed skipped, and 1-3 skipped for it.
        ("before-2026-11-29-rearm-hand-done/rearm-hand-done.json", PATCH_BRING_BACK_TAKES_DONE_BY_HAND),
        # Its review-fix rounds kept the state `review` and wrote nothing, not comparing the file's value.
        ("example-sprint--batch-1.json", PATCH_SAME_STATE_COMPARED),
        # A closed laptop (worker and server stopped) past the dev agent's deadline: the story ended
        # needs-intervention for time nobody worked; past the batch's working time: the batch ended out of time.
        ("before-2026-11-29-laptop-agent/laptop--batch-1.json", PATCH_AGENT_WAKES_AFTER_SLEEP),
        ("before-2026-11-29-laptop-working-time/laptop--batch-1.json", PATCH_WORKING_TIME_WAKES_AFTER_SLEEP),
        # The same past an external agent's deadline (the batch's own timer): the story ended needs-intervention.
        ("before-2026-11-29-laptop-external/laptop-ext--batch-1.json", PATCH_EXTERNAL_AGENT_WAKES_AFTER_SLEEP),
        # A course correction dropping a story whose status line was removed by hand: the failed write failed the
        # update with the queue re-planned already, the story in no batch and not skipped.
        ("before-2026-11-29-cc-drop-unwritten/cc-unwritten.json", PATCH_CC_DROP_UNWRITTEN),
        # A course correction adding two stories, the second's line removed by hand after the update read the file:
        # the failed write failed the update with the queue re-planned already, both stories in it, the first
        # written `backlog`.
        # (Its sibling cc-add-drop-unwritten.json, one story added and one dropped, the dropped one written `skipped`
        # before the add failed, is replayed by test_replay only: the patch writes the same two in the other order,
        # which a replay does not tell apart.)
        ("before-2026-11-29-cc-add-unwritten/cc-add-unwritten.json", PATCH_CC_ADD_UNWRITTEN),
        # A course correction's re-plan numbered its batch 1 again (the first batch's id): it was used.
        ("before-2026-11-29-plan-numbering/misnumbered-out-of-turn.json", PATCH_PLAN_NUMBERING_CHECKED),
        # A worker stopped on purpose (SIGTERM) handed the dev agent's attempt back 1.5 s before its deadline (the
        # retry did not fit), or five times during its run (its attempts used up): the story ended needs-intervention.
        ("before-2026-11-29-worker-stop/stop--batch-1.json", PATCH_AGENT_WAKES_AFTER_WORKER_STOP),
        ("before-2026-11-29-worker-stop/restart--batch-1.json", PATCH_AGENT_WAKES_AFTER_WORKER_STOP),
        # A review's empty blocking issue failed it (the fix's feedback could not carry it).
        ("before-2026-11-27-blank-issue/blank-issue--batch-1.json", PATCH_ANSWER_FITS_HISTORY),
        # Its batches' ends were taken in by workflow tasks with no command.
        ("before-2026-11-25-parallel/rv7-chain-False.json", PATCH_BATCH_END_SENDS_A_COMMAND),
    ],
)
@pytest.mark.filterwarnings("ignore::temporalio.workflow.UnfinishedUpdateHandlersWarning")  # LEFT_AN_UPDATE_UNANSWERED
async def test_a_sprint_recorded_before_a_patch_replays_only_behind_it(monkeypatch, recorded, patch_id):
    """Histories recorded before a patch, each where the patched code would go another way. Before
    PATCH_ROSTER_HELD_AFTER_FLUSH and PATCH_UPDATES_HELD_AFTER_CLOSE the Master sent its last roster broadcasts
    (as every Master with two residents or more does), and the Slave a story-updates signal, after its end
    without a hold: today's code starts the hold's timer there."""
    await assert_replays_only_behind(monkeypatch, recorded, patch_id)


async def test_a_slave_records_one_patch_marker_for_all_its_patches(ts_env, tmp_path: Path):
    """Each patch a run meets first records a marker and upserts TemporalChangeVersion (a visibility write): a
    Slave met seven in every batch. It records its rollup's marker only (workflows/patches.py), and its history
    replays (the suite's check)."""
    make_project(tmp_path, {"1-1-login-form": "backlog", "1-2-logout": "ready-for-dev"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id=f"rollup-{uuid.uuid4().hex[:6]}"))
        await sprint_result(handle)
    slave = ts_env.client.get_workflow_handle(slave_workflow_id(handle.id, 1))
    events = list((await slave.fetch_history()).events)
    markers = [
        decode(e.marker_recorded_event_attributes.details["patch-data"])["id"]
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert markers == [SLAVE_PATCH_ROLLUP_2]
    assert sum(e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES for e in events) <= 1
