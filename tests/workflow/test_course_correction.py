"""Course correction on the time-skipping server: add and drop stories mid-sprint (COURSE_CORRECTION),
rejected corrections (CC_REJECTED), and the Master's own repeated_failures correction."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from bso.cli import _progress, _view_from_report
from bso.message_flow import message_flow
from bso.states import SprintPhase, SprintStatus
from bso.summary import render_summary
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from bso.models import DEFAULT_STATUS_FILE
from tests.workflow.helpers import (
    done_of,
    make_project,
    shown_done,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    workflow_task_failures,
)
from tests.workflow.helpers import wait_status
from workflows.sprint_master import SprintMasterWorkflow

K1, K2, K3 = "1-1-login-form", "1-2-logout", "1-3-profile-page"
OTHER = "2-1-search"


async def rejected(update, match: str) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await update
    assert "CC_REJECTED" in str(info.value.cause) and match in str(info.value.cause), info.value.cause
    assert info.value.cause.non_retryable  # the CLI printed "retryable: true" for a rejection


async def paused_after_first_batch(client, queue: str, root: Path, **inp):
    """A sprint of `root` (`inp`: its input's other fields) in batches of one story, started and paused at its
    first-story checkpoint: its handle and status then."""
    overrides = {"batch_size": 1, "first_story_checkpoint": "pause"}
    handle = await start_sprint(client, queue, sprint_input(root, config_overrides=overrides, **inp))
    status = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done == 1, "checkpoint")
    return handle, status


OTHER2 = "2-2-filters"


def make_project_with_a_cycle_outside(root: Path) -> None:
    """1-1 to 1-3 in review; 2-1 and 2-2, outside the sprint, depend on each other: added, they cannot be planned."""
    make_project(
        root,
        {K1: "review", K2: "review", K3: "review", OTHER: "skipped", OTHER2: "skipped"},
        story_files={OTHER: "# Story 2.1: Search\n\nDepends on: 2-2\n", OTHER2: "# Story 2.2: Filters\n\nDepends on: 2-1\n"},
    )


async def test_course_correction_adds_and_drops_stories_mid_sprint(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review", OTHER: "skipped"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-1", epic=1)
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["9-9"]}),
            "add_stories",
        )
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": [K1]}),
            "done stories are untouched",
        )
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "whim"}),
            "reason",
        )
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct,
            {"reason": "new_requirements", "add_stories": ["2-1"], "drop_stories": ["1-3"], "text": "search first"},
        )
        assert cc.msg_type == "COURSE_CORRECTION"
        assert (cc.added, cc.dropped, cc.untouched_done) == ([OTHER], [K3], [K1])
        assert [(b.batch_id, b.stories) for b in cc.batches] == [(4, [K2]), (5, [OTHER])]
        assert "1 added, 1 dropped" in cc.impact and "Pending batches before: 2: 1-2-logout; 3: 1-3-profile-page" in cc.impact
        values = status_values(tmp_path)
        assert (values[K3], values[OTHER]) == ("skipped", "backlog")
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.course_corrections == [cc.impact]
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        shown = await shown_done(handle)  # the details' count, kept story by story (bso.story_tally)
    assert report.stories == {K1: "done", K2: "done", K3: "skipped", OTHER: "done"}
    assert shown == done_of(report) == (3, 4)
    assert [b.batch_id for b in report.batches] == [1, 4, 5]
    values = status_values(tmp_path)
    assert (values[K1], values[K2], values[K3], values[OTHER]) == ("done", "done", "skipped", "done")
    assert report.status is SprintStatus.PARTIAL  # a story was dropped


async def test_a_correction_while_the_sprint_plans_is_refused_and_the_plan_kept(ts_env, tmp_path: Path):
    """The sprint has read its stories and still plans (its knowledge-researcher slow to start): a correction
    accepted then asked a second plan beside the first, whose answer it displaced. It is refused, and the
    sprint plans and runs as started. (No result is awaited meanwhile: the 60 s readiness wait is real time.)"""
    make_project(tmp_path, {K1: "review", OTHER: "backlog"})
    simulation = {"residents_slow_start": ["knowledge-researcher"]}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="cc-planning", epic=1, simulation=simulation)
        )
        await wait_status(
            handle,
            lambda s: s.phase is SprintPhase.PLANNING and s.roster is not None and "scrum-master" in s.roster.residents,
            "planning, the scrum-master running",
        )
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["2-1"]}),
            "still planning",
        )
        report = await sprint_result(handle)
    assert report.stories == {K1: "done"} and status_values(tmp_path)[OTHER] == "backlog"
    assert report.planner == "scrum-master"  # the first plan answered, not displaced
    assert await workflow_task_failures(ts_env.client, "cc-planning") == []


async def test_repeated_failures_trigger_a_course_correction_and_a_pause(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev", K3: "review"})
    overrides = {"batch_size": 1, "consecutive_failure_threshold": 2}
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}}, "1-2": {"fail": {"dev": "error"}}}}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client,
            queue,
            sprint_input(tmp_path, session_id="cc-2", config_overrides=overrides, simulation=simulation),
        )
        status = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "repeated failures pause")
        assert status.course_corrections[0].startswith("repeated_failures:")
        assert "repeated failures: 2 stories in a row ended needs-intervention" in status.pause_reason
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "needs-intervention", K2: "needs-intervention", K3: "done"}
    assert [b.batch_id for b in report.batches] == [1, 2, 4]  # 1-3 re-planned after batch 3


async def test_a_correction_the_planner_cannot_plan_changes_nothing(ts_env, tmp_path: Path):
    """The added stories depend on each other: no plan exists. CC_REJECTED, and neither the dropped story nor the
    added ones were written to the status file (they used to be, before the plan failed)."""
    make_project_with_a_cycle_outside(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-cycle", epic=1)
        before = status_values(tmp_path)
        await rejected(
            handle.execute_update(
                SprintMasterWorkflow.course_correct,
                {"reason": "new_requirements", "add_stories": ["2-1", "2-2"], "drop_stories": ["1-3"]},
            ),
            "cannot be re-planned",
        )
        assert status_values(tmp_path) == before
        status = await handle.query(SprintMasterWorkflow.status)
        assert OTHER not in status.stories and status.stories[K3].state == "review"
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        shown = await shown_done(handle)
        flow = message_flow(await fetch_sprint_histories(ts_env.client, handle.id))
    assert report.stories == {K1: "done", K2: "done", K3: "done"}
    assert shown == done_of(report) == (3, 3)  # the refused correction's stories left the count with it
    # `bso messages`: the correction asked, and the refusal that answered it.
    assert [(m.type, m.detail) for m in flow if m.type.startswith("C")] == [
        ("CC_TRIGGER", "new_requirements (add 2-1, 2-2; drop 1-3)"),
        ("CC_REJECTED", "CC_REJECTED: the pending stories cannot be re-planned"),
    ]
    assert report.course_corrections == []  # the correction refused is not one the sprint applied


async def test_a_finished_story_of_a_running_batch_is_done_not_in_flight(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    simulation = {"stories": {"1-2": {"duration_ms": 5000}}}
    inp = sprint_input(tmp_path, session_id="cc-flight", simulation=simulation, config_overrides={"batch_size": 2})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(
            handle, lambda s: s.stories[K1].state == "done" and s.stories[K2].agent_in_flight, "K1 done, K2 running"
        )
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"]}
        )
        await sprint_result(handle)
    assert (cc.untouched_done, cc.in_flight) == ([K1], [K2])


async def test_adding_a_story_gone_from_the_file_is_rejected(ts_env, tmp_path: Path):
    """2-1 was outside the sprint at its start (epic 1 only) and has been removed from the file since: the update
    is rejected (it failed the Master's workflow task on every retry, a KeyError, and the sprint was stuck)."""
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review", OTHER: "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-gone", epic=1)
        status_file = tmp_path / DEFAULT_STATUS_FILE
        text = status_file.read_text(encoding="utf-8")
        status_file.write_text("".join(line for line in text.splitlines(True) if OTHER not in line), encoding="utf-8")
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["2-1"]}),
            "CC_REJECTED: 2-1-search no longer in sprint-status.yaml",
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}
    assert await workflow_task_failures(ts_env.client, "cc-gone") == []


async def test_adding_a_story_of_an_unknown_value_is_rejected_and_the_value_kept(ts_env, tmp_path: Path):
    """2-1 is `wip`, no state BSO knows: the correction is refused, and the value stays (it was written `backlog`
    over). Its second form: 2-2 was `backlog` at the sprint's start (the validator's view) and is `wip` now."""
    other2 = "2-2-filters"
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review", OTHER: "wip", other2: "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-wip", epic=1)
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["2-1"]}),
            "CC_REJECTED: no agent starts from the state of 2-1-search: 'wip'",
        )
        status_file = tmp_path / DEFAULT_STATUS_FILE
        status_file.write_text(
            status_file.read_text(encoding="utf-8").replace(f"{other2}: backlog", f"{other2}: wip"), encoding="utf-8"
        )
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["2-2"]}),
            f"CC_REJECTED: no agent starts from the state of {other2}: 'wip'",
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}
    assert (status_values(tmp_path)[OTHER], status_values(tmp_path)[other2]) == ("wip", "wip")
    assert await workflow_task_failures(ts_env.client, "cc-wip") == []
    # The first was refused by the validator (no trace in history), the second by the update itself.
    history = await handle.fetch_history()
    assert [e.event_type for e in history.events].count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED) == 1


async def test_adding_a_story_that_shares_a_number_with_one_of_the_sprint_is_rejected(ts_env, tmp_path: Path):
    """1-2-logoff, outside the sprint, has 1-2-logout's number: added, its agents' work would be taken for the
    other's (in one batch the second story took the first one's answers). Refused, and the file left as it was."""
    logoff = "1-2-logoff"
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review", logoff: "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-shared", story_keys=[K1, K2])
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": [logoff]}),
            f"CC_REJECTED: stories that share a number: {K2} and {logoff} (1-2). ",
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}
    assert status_values(tmp_path)[logoff] == "backlog"
    assert await workflow_task_failures(ts_env.client, "cc-shared") == []


async def test_a_story_key_too_long_for_an_answer_is_left_out_and_cannot_be_added(ts_env, tmp_path: Path):
    """A key over 200 characters cannot be named by its agents' answers (each was refused until the step's
    deadline ended the story): the sprint leaves such a story out, saying why, and a correction cannot add one."""
    long_in, long_out = "1-9-" + "x" * 200, "2-9-" + "y" * 200
    make_project(tmp_path, {K1: "review", K2: "review", long_in: "review", long_out: "backlog"})
    async with bso_worker(ts_env.client) as queue:
        handle, status = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-long", epic=1)
        await rejected(
            handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["2-9"]}),
            "a story key of 204 characters (at most 200",
        )
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    assert [e for e in status.errors if "204 characters" in e] == [
        f"{long_in[:60]}...: a story key of 204 characters (at most 200: an agent's answer names its story) is left "
        "out of the sprint; rename it in sprint-status.yaml and its story file"
    ]
    values = status_values(tmp_path)
    assert (values[long_in], values[long_out]) == ("review", "backlog")
    assert await workflow_task_failures(ts_env.client, "cc-long") == []


async def test_a_sprint_of_only_story_keys_too_long_fails_saying_why(ts_env, tmp_path: Path):
    long_key = "1-9-" + "x" * 200
    make_project(tmp_path, {long_key: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="only-long"))
        with pytest.raises(WorkflowFailureError) as failed:
            await sprint_result(handle)
    assert "a story key of 204 characters" in str(failed.value.cause), failed.value.cause
    assert status_values(tmp_path)[long_key] == "review"


NOTE = "digest settings next sprint"


async def test_a_dropped_story_says_why_with_the_corrections_note(ts_env, tmp_path: Path):
    """A story a course correction dropped showed in the report and the execution summary as a bare `skipped`, and the
    note given with the correction was nowhere: not in the status, the summary nor `bso messages`."""
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-why")
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"], "text": NOTE}
        )
        why = f"dropped by course correction (user_request): {NOTE}"
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.stories[K3].error == why  # `bso sprint status` shows it under the story table
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        histories = await fetch_sprint_histories(ts_env.client, handle.id)
    summary = render_summary(report)
    failures = summary.split("## Failures\n", 1)[1].split("\n## ", 1)[0]
    assert f"- `{K3}`: skipped: {why}" in failures, failures
    assert f"| {K3} |  | skipped | 0 | 0 |" in summary  # in no batch: its planned batch 3 never ran
    corrections = summary.split("## Course Corrections\n", 1)[1].split("\n## ", 1)[0]
    assert f"user_request: {NOTE}" in corrections and cc.impact in corrections, corrections
    # The summary file the sprint wrote says the same.
    written = (tmp_path / ".sprint-session" / "execution-summary-cc-why.md").read_text(encoding="utf-8")
    assert f"- `{K3}`: skipped: {why}" in written
    (record,) = report.course_corrections
    assert (record.reason, record.text, record.dropped, record.impact) == ("user_request", NOTE, [K3], cc.impact)
    from_report = _view_from_report(report)  # `bso sprint status` once no worker answers
    assert from_report.stories[K3].error == why and from_report.stories[K3].batch_id is None
    assert from_report.course_corrections == [cc.impact]
    flow = message_flow(histories)
    (trigger,) = [m for m in flow if m.type == "CC_TRIGGER"]
    assert (trigger.sender, trigger.recipient) == ("operator", "sprint-master")
    assert trigger.detail == f"user_request (drop 1-3): {NOTE}", trigger.detail
    assert trigger.payload["text"] == NOTE
    (answered,) = [m for m in flow if m.type == "COURSE_CORRECTION"]
    assert (answered.sender, answered.recipient) == ("sprint-master", "operator")
    assert answered.payload["text"] == NOTE and answered.payload["impact"] == cc.impact


async def test_a_dropped_story_can_be_added_again(ts_env, tmp_path: Path):
    """A story dropped by mistake was refused when added back ('already in this sprint'): it stayed skipped for
    the rest of the sprint. Added again, it takes back the value it had (`review`: not `backlog`, which would
    have had its story document, code and review done again), is re-planned and run."""
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-back")
        await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"]})
        assert status_values(tmp_path)[K3] == "skipped"
        back = await handle.execute_update(
            SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["1-3"], "text": "oops"}
        )
        assert back.added == [K3] and [(b.batch_id, b.stories) for b in back.batches] == [(5, [K2]), (6, [K3])]
        assert status_values(tmp_path)[K3] == "review"
        status = await handle.query(SprintMasterWorkflow.status)
        assert (status.stories[K3].state, status.stories[K3].error, status.stories[K3].batch_id) == ("review", None, 6)
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
    assert report.stories == {K1: "done", K2: "done", K3: "done"} and status_values(tmp_path)[K3] == "done"
    (k3,) = [r for b in report.batches for r in b.results.story_results if r.story_key == K3]
    assert k3.agents_dispatched == 1  # its code review only, as before the drop
    assert report.status is SprintStatus.COMPLETE
    assert f"`{K3}`" not in render_summary(report).split("## Failures\n", 1)[-1].split("\n## ", 1)[0]
    assert _view_from_report(report).stories[K3].error is None


async def test_a_refused_correction_that_adds_a_dropped_story_back_keeps_it_in_the_sprint(ts_env, tmp_path: Path):
    """Added back with two stories that cannot be planned (a cycle), a dropped story was deleted from the sprint by
    the refused correction's roll-back: it could not be added again and the report left it out."""
    make_project_with_a_cycle_outside(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await paused_after_first_batch(ts_env.client, queue, tmp_path, session_id="cc-rollback", epic=1)
        await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-3"]})
        await rejected(
            handle.execute_update(
                SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["1-3", "2-1", "2-2"]}
            ),
            "cannot be re-planned",
        )
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.stories[K3].state == "skipped" and status_values(tmp_path)[K3] == "skipped"
        back = await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request", "add_stories": ["1-3"]})
        assert back.added == [K3]
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        shown = await shown_done(handle)
    assert report.stories == {K1: "done", K2: "done", K3: "done"}
    assert shown == done_of(report) == (3, 3)


async def test_the_batch_count_after_a_re_plan_is_the_batches_run_and_left(ts_env, tmp_path: Path):
    """A correction renumbers the pending batches (ids after the last one): `bso sprint status` of the ended sprint
    (read from its report when no worker answers) counted the first plan's batches (`batches 2/3`, or `0/2` when
    every pending story was dropped), and put a dropped story in a batch that never ran."""
    make_project(tmp_path, {K1: "review", K2: "review", K3: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, session_id="cc-count", config_overrides={"batch_size": 1}),
            paused="before the first batch",
        )
        await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_total == 3, "paused, planned")
        cc = await handle.execute_update(
            SprintMasterWorkflow.course_correct, {"reason": "user_request", "drop_stories": ["1-2"]}
        )
        assert [(b.batch_id, b.stories) for b in cc.batches] == [(4, [K1]), (5, [K3])]
        live = await handle.query(SprintMasterWorkflow.status)
        assert (live.batches_done, live.batches_total) == (0, 2)
        await handle.signal(SprintMasterWorkflow.resume, {})
        report = await sprint_result(handle)
        ended = await handle.query(SprintMasterWorkflow.status)
    assert [b.batch_id for b in report.batches] == [4, 5]
    assert (ended.batches_done, ended.batches_total) == (2, 2)
    view = _view_from_report(report)
    assert (view.batches_done, view.batches_total) == (2, 2)
    assert {k: v.batch_id for k, v in view.stories.items()} == {K1: 4, K2: None, K3: 5}
    shown = io.StringIO()
    Console(file=shown, width=120, color_system=None).print(_progress(view, None, report.status.value))
    assert "batches ended 2/2" in shown.getvalue() and "batch 2 " not in shown.getvalue(), shown.getvalue()
    details = render_summary(report).split("## Story Details", 1)[1]
    assert f"| {K2} |  | skipped |" in details and f"| {K1} | 4 | done |" in details, details
