"""A course correction adding a story whose line was removed from sprint-status.yaml by hand after the update read
the file (while the scrum-master planned): its write failed for good, failing the `course_correct` update (the
operator told it was not applied) while the sprint held it half applied: the queue re-planned with the added
stories in it, the stories added before it written `backlog`, the stories dropped with it written `skipped`. Now
the correction is not applied at all, and the update says why (CC_REJECTED)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError

import activities.status_file as status_file_activities
from bso.models import DEFAULT_STATUS_FILE
from bso.states import SprintPhase
from tests.conftest import bso_worker
from tests.workflow.helpers import current_details, make_project, sprint_input, sprint_result, start_sprint, status_values, wait_status
from workflows.sprint_master import SprintMasterWorkflow

IN_SPRINT = ["1-1-one", "1-2-two", "1-3-three"]
GONE = "1-5-five"  # its line removed by hand once the update has read the file


async def _correct_with_a_line_gone(
    ts_env, tmp_path: Path, monkeypatch, session_id: str, request: dict[str, Any],
    others: dict[str, str] | None = None,
):
    """The sprint paused at its first story's checkpoint (1-2-two and 1-3-three queued in batches 2 and 3), the
    correction `request` sent, GONE's line removed right after the update's read of the file; the sprint then
    resumed to its end. The update's failure, the status right after it, the report. `others`: stories of other
    epics in the file (their epic lines `backlog`), outside the sprint."""
    make_project(tmp_path, {**{k: "review" for k in IN_SPRINT}, "1-4-four": "skipped", GONE: "skipped", **(others or {})})
    status_file = tmp_path / DEFAULT_STATUS_FILE
    armed: list[bool] = []
    read = status_file_activities._load_sync

    def read_then_remove(inp):
        snapshot = read(inp)
        if armed and armed.pop():  # the correction's read: the line goes before its write
            text = status_file.read_text()
            status_file.write_text("".join(line for line in text.splitlines(keepends=True) if f"{GONE}:" not in line))
        return snapshot

    monkeypatch.setattr(status_file_activities, "_load_sync", read_then_remove)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(
            tmp_path, session_id=session_id, story_keys=["1-1", "1-2", "1-3"],
            config_overrides={"batch_size": 1, "first_story_checkpoint": "pause"},
        ))
        before = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and not s.running_batches, "the checkpoint")
        armed.append(True)
        with pytest.raises(WorkflowUpdateFailedError) as failed:
            await handle.execute_update(SprintMasterWorkflow.course_correct, request)
        status = await handle.query(SprintMasterWorkflow.status)
        # The Master's details (the Web UI's) count the sprint's stories, not the refused correction's too: they
        # were shown once the re-plan was undone, the added stories still in (a diff reviewer's finding).
        details = await current_details(handle)
        await handle.signal("resume")
        report = await sprint_result(handle)
    assert not armed, "the correction did not read the file"
    assert "/3 stories done" in details, details
    assert {k: v.batch_id for k, v in before.stories.items()} == {"1-1-one": 1, "1-2-two": 2, "1-3-three": 3}
    return getattr(failed.value.cause, "message", str(failed.value.cause)), before, status, report


def _nothing_applied(before, status, report, tmp_path: Path) -> None:
    assert status.stories == before.stories  # the queue as it was: no added story, none dropped
    assert (status.batches_total, status.course_corrections) == (before.batches_total, [])
    assert any(e.startswith(f"course correction not applied: {GONE} could not be written") for e in status.errors), status.errors
    assert report.stories == {k: "done" for k in IN_SPRINT}
    assert ([b.batch_id for b in report.batches], report.course_corrections) == ([1, 2, 3], [])
    values = status_values(tmp_path)
    assert (values["1-3-three"], values["1-4-four"], GONE in values) == ("done", "skipped", False)


async def test_an_added_story_whose_line_is_gone_refuses_the_whole_correction(ts_env, tmp_path: Path, monkeypatch):
    """Two stories added (both written `backlog` from `skipped`), the second's line gone: the first's write is
    undone, and the queue is as it was."""
    message, before, status, report = await _correct_with_a_line_gone(
        ts_env, tmp_path, monkeypatch, "cc-add-unwritten", {"reason": "user_request", "add_stories": ["1-4-four", GONE]},
    )
    assert message.startswith(f"CC_REJECTED: {GONE} could not be written to sprint-status.yaml"), message
    _nothing_applied(before, status, report, tmp_path)


async def test_an_added_story_whose_line_is_gone_leaves_the_dropped_ones_unwritten(ts_env, tmp_path: Path, monkeypatch):
    """One story added, one dropped: the added story's line gone, the dropped one is not written `skipped`."""
    message, before, status, report = await _correct_with_a_line_gone(
        ts_env, tmp_path, monkeypatch, "cc-add-drop-unwritten",
        {"reason": "user_request", "add_stories": [GONE], "drop_stories": ["1-3-three"]},
    )
    assert message.startswith(f"CC_REJECTED: {GONE} could not be written to sprint-status.yaml"), message
    _nothing_applied(before, status, report, tmp_path)


async def test_an_added_story_whose_line_is_gone_leaves_the_epic_line_as_it_was(ts_env, tmp_path: Path, monkeypatch):
    """The first added story's write rolled its epic's line (`epic-2: backlog` -> `in-progress`: 2-2-seven is
    under way): the refused correction puts it back with the story's value. The write-back left it rolled, though
    none of its stories moved."""
    others = {"2-1-six": "skipped", "2-2-seven": "ready-for-dev"}
    message, before, status, report = await _correct_with_a_line_gone(
        ts_env, tmp_path, monkeypatch, "cc-add-unwritten-epic",
        {"reason": "user_request", "add_stories": ["2-1-six", GONE]}, others,
    )
    assert message.startswith(f"CC_REJECTED: {GONE} could not be written to sprint-status.yaml"), message
    _nothing_applied(before, status, report, tmp_path)
    values = status_values(tmp_path)
    assert {k: values[k] for k in ["epic-2", *others]} == {"epic-2": "backlog", **others}
