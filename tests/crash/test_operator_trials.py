"""Operator trials: sprints cancelled, shut down, paused and resumed, or course-corrected at moments spread over their run
(the residents' start, planning, a batch's first write, an agent in flight, a debugger round, a fix, two batches
at once, the end). Every one must close cleanly: the Master cancelled or completed, each Slave cancelled or
completed by itself (never terminated because the Master gave up waiting for it), every resident stopped, no
workflow task failed in any history, and the status file valid; a paused and resumed sprint ends as one left
alone (every story done), and a course-corrected one with every story done but the one it dropped (skipped, or
done if the drop was refused). A cancel some await swallowed (the SDK lets a signal already sent decide) showed up
here as a Slave terminated after 30 s, and a cancel in the task that started a Slave as a Master failing that
task for ever.

BSO_CANCEL_TRIALS=N (default 10; 6 for the other actions) runs N trials; BSO_CANCEL_SEED=S spreads them at
random instead (printed)."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError, RPCStatusCode
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError

from bso.constants import SIGNAL_PAUSE, SIGNAL_RESUME, SIGNAL_SHUTDOWN, UPDATE_COURSE_CORRECT, slave_workflow_id
from bso.course_correction import CCReason, CourseCorrectionRequest
from bso.roster import RESIDENT_ROLES, resident_workflow_id
from bso.sprint_status import parse_status_text
from bso.models import DEFAULT_STATUS_FILE
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, poll_until, sprint_input, start_sprint, workflow_task_failures

pytestmark = pytest.mark.e2e

STORIES = {
    "1-1-login-form": "ready-for-dev",
    "1-2-logout": "backlog",
    "1-3-signup": "review",
    "2-1-profile": "ready-for-dev",
    "2-2-avatar": "backlog",
    "2-3-settings": "ready-for-dev",
}
SIMULATION = {
    "default": {"duration_ms": 120},
    "stories": {
        "1-1": {"fail": {"dev": "error"}, "debug": ["fixable"]},  # a debugger round, then a fix
        "2-1": {"review": ["HIGH"]},  # a review-fix round
    },
}
DROPPED = "2-2-avatar"  # the course correction's: in the last batch
CONFIG = {"max_concurrent_slaves": 2, "batch_size": 2}
LATEST_CANCEL_SECONDS = 3.5  # about as long as the uncancelled sprint takes here
PAUSED_SECONDS = 0.5
CLOSE_PATIENCE = 90  # the Master waits 30 s for its Slaves; then the slow CI machine
ENDED = (WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.COMPLETED)


def action_delays(default_trials: int) -> tuple[list[float], str]:
    trials = int(os.environ.get("BSO_CANCEL_TRIALS", default_trials))
    seed = os.environ.get("BSO_CANCEL_SEED")
    if seed is None:
        return [LATEST_CANCEL_SECONDS * i / max(1, trials - 1) for i in range(trials)], "spread evenly"
    rng = random.Random(int(seed))
    return sorted(rng.uniform(0, LATEST_CANCEL_SECONDS) for _ in range(trials)), f"seed {seed}"


async def act(handle: WorkflowHandle, action: str) -> None:
    if action == "cancel":
        await handle.cancel(reason="cancel trial")
    elif action == "shutdown":
        await handle.signal(SIGNAL_SHUTDOWN)
    elif action == "course-correct":
        request = CourseCorrectionRequest(reason=CCReason.USER_REQUEST, drop_stories=[DROPPED], text="trial")
        try:
            await handle.execute_update(UPDATE_COURSE_CORRECT, request.model_dump(mode="json"))
        except WorkflowUpdateFailedError:
            pass  # refused (the story has started, or the sprint is not planned yet): said so, nothing lost
    else:
        await handle.signal(SIGNAL_PAUSE, "pause trial")
        await asyncio.sleep(PAUSED_SECONDS)
        await handle.signal(SIGNAL_RESUME)


async def one_trial(client: Client, queue: str, root: Path, delay: float, action: str) -> dict:
    make_project(root, STORIES)
    session = f"{action}-trial-{uuid.uuid4().hex[:6]}"
    handle = await start_sprint(client, queue, sprint_input(root, session_id=session, simulation=SIMULATION, config_overrides=CONFIG))
    await asyncio.sleep(delay)
    phase = await _phase(handle)
    acted_at = time.monotonic()
    try:
        await act(handle, action)
    except RPCError as err:
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
        phase = "ended"  # the sprint was over first
    problems = []
    try:
        await poll_until(lambda: _closed(handle), f"{session} closed after its {action}", timeout=CLOSE_PATIENCE)
    except AssertionError as err:
        last = [EventType.Name(e.event_type) for e in (await handle.fetch_history()).events[-6:]]
        problems.append(f"{err}; the Master's last events: {last}")
    closed_after = time.monotonic() - acted_at
    master = (await handle.describe()).status
    if master not in ENDED:
        problems.append(f"Master {master.name}")
    for history in await fetch_sprint_histories(client, session):
        if failures := await workflow_task_failures(client, history.workflow_id):
            problems.append(f"{history.workflow_id}: {failures}")
    ids = [slave_workflow_id(session, b) for b in range(1, 5)] + [resident_workflow_id(session, r) for r in RESIDENT_ROLES]
    for workflow_id in ids:
        try:
            status = (await client.get_workflow_handle(workflow_id).describe()).status
        except Exception:  # noqa: BLE001 - never started (the cancel came first)
            continue
        if status not in ENDED:
            problems.append(f"{workflow_id} {status.name}")
    try:
        parsed = parse_status_text((root / DEFAULT_STATUS_FILE).read_text(encoding="utf-8"), "sprint-status.yaml")
    except Exception as err:  # noqa: BLE001 - any error is the finding
        problems.append(f"status file: {err}")
    else:
        values = {story.key: story.value for story in parsed.stories()}
        if action == "pause-resume" and values != dict.fromkeys(STORIES, "done"):
            problems.append(f"paused and resumed, it ended with {values}")
        if action == "course-correct" and {k: v for k, v in values.items() if k != DROPPED} != dict.fromkeys(set(STORIES) - {DROPPED}, "done"):
            problems.append(f"with {DROPPED} dropped, it ended with {values}")
        if action == "course-correct" and values[DROPPED] not in ("done", "skipped"):
            problems.append(f"{DROPPED}, dropped or refused, ended {values[DROPPED]}")
    return {"delay": delay, "phase": phase, "master": master.name, "closed_after": closed_after, "problems": problems}


async def _phase(handle: WorkflowHandle) -> str:
    try:
        return str((await handle.query("status"))["phase"])
    except Exception:  # noqa: BLE001 - not started yet
        return "-"


async def _closed(handle: WorkflowHandle) -> bool:
    return (await handle.describe()).status is not WorkflowExecutionStatus.RUNNING


@pytest.mark.parametrize(
    ("action", "default_trials"), [("cancel", 10), ("shutdown", 6), ("pause-resume", 6), ("course-correct", 6)]
)
async def test_sprints_acted_on_at_any_moment_close_cleanly(local_env, tmp_path: Path, capsys, action: str, default_trials: int):
    delays, spread = action_delays(default_trials)
    async with bso_worker(local_env.client) as queue:
        # Five at a time: as many workflows at once as the 2-core CI machine runs without starving them.
        trials = []
        for first in range(0, len(delays), 5):
            wave = delays[first : first + 5]
            trials += await asyncio.gather(
                *(one_trial(local_env.client, queue, tmp_path / f"t{first + i}", d, action) for i, d in enumerate(wave))
            )
    with capsys.disabled():
        print(f"\n{action} trials ({spread}): delay s, phase at the {action}, Master, closed after s, problems")
        for t in trials:
            print(f"  {t['delay']:.2f}  {t['phase']:<10} {t['master']:<9} {t['closed_after']:5.1f}  {t['problems'] or ''}")
    assert [t for t in trials if t["problems"]] == []
    if action == "cancel":
        assert any(t["master"] == "CANCELED" for t in trials)
