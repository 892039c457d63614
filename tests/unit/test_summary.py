"""The execution summary's rendering: its sections and content, from the recorded example sprint."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory

from bso.message_flow import decode
from bso.messages import BatchPlanReady, BatchSpec
from bso.models import CorrectionRecord, SlaveResult, SlaveResults, SprintReport, StoryResult
from bso.summary import SECTIONS, render_from_histories, render_summary, summary_filename

HISTORIES = Path(__file__).resolve().parent.parent / "histories"


def _histories() -> list[WorkflowHistory]:
    return [
        WorkflowHistory.from_json(p.stem.replace("--", "/"), p.read_text())
        for p in sorted(HISTORIES.glob("example-sprint*.json"))
    ]


def _report(histories) -> SprintReport:
    master = next(h for h in histories if h.workflow_id == "example-sprint")
    last = master.events[-1]
    return SprintReport.model_validate(decode(last.workflow_execution_completed_event_attributes.result))


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_sections_in_order():
    histories = _histories()
    text = render_from_histories(_report(histories), histories)
    positions = [text.index(f"\n## {title}\n") for title in SECTIONS]
    assert positions == sorted(positions)
    assert text.startswith("# Execution summary: sprint `example-sprint`")


def test_content():
    histories = _histories()
    text = render_from_histories(_report(histories), histories)
    overview = _section(text, "Results Overview")
    assert "| status | sprint-partial |" in overview
    assert "| done | 4 |" in overview and "| needs intervention | 1 |" in overview
    assert "| tokens used | 27800 / 2000000 |" in overview
    # How each batch ended: a cancelled sprint's failed batch counted among its batches read as run.
    assert "| batches | 2 (complete 1, partial 1) |" in overview, overview
    details = _section(text, "Story Details")
    assert "| 1-3-add-and-list-items-api | 1 | done | 2 |" in details
    failures = _section(text, "Failures")
    assert "`2-2-expiry-reminder-emails`: needs-intervention" in failures
    assert "done" not in failures.replace("needs-intervention", "")
    agents = _section(text, "Agent Performance")
    assert "| dev-runner | 7 | 7 | 1 | 0 |" in agents
    config = _section(text, "Configuration Used")
    assert "| batch_size | 3 |" in config and "| token_budget.limit | 2000000 |" in config


def test_the_tokens_line_shows_the_limit_a_resume_raised():
    """`bso sprint resume --token-limit` raised the budget: the summary still showed the one the sprint began with."""
    histories = _histories()
    raised = _report(histories).model_copy(update={"token_limit": 5_000_000})
    overview = _section(render_from_histories(raised, histories), "Results Overview")
    assert "| tokens used | 27800 / 5000000 |" in overview


def test_overrides_are_marked_and_empty_sprint_reads_well():
    report = SprintReport(session_id="s", status="sprint-complete")
    text = render_summary(report, overrides={"token_budget.limit": 10, "batch_size": 2})
    assert "| batch_size | 3 | (override)" not in text  # the value shown is the config's
    assert "| batch_size | 3 (override) |" in text
    assert "| token_budget.limit | 2000000 (override) |" in text
    assert "No story was in scope." in text and "None." in text and "No agent was dispatched." in text


def test_filename_is_safe():
    assert summary_filename("sprint-1") == "execution-summary-sprint-1.md"
    assert "/" not in summary_filename("a/../b")
    assert summary_filename("a/b") != summary_filename("a_b") == "execution-summary-a_b.md"  # one file each
    json.dumps(summary_filename("x"))


def test_stories_a_shutdown_left_unstarted_are_not_failures():
    report = _report(_histories())
    untouched = "3-1-not-started-yet"
    stopped = report.model_copy(update={"stories": {**report.stories, untouched: "review"}})
    failures = _section(render_summary(stopped), "Failures")
    assert f"`{untouched}`" not in failures.split("Not run")[0]
    assert f"Not run (the sprint ended before them; they keep their state for the next sprint): `{untouched}` (review)." in failures
    assert "`2-2-expiry-reminder-emails`: needs-intervention" in failures  # a real failure stays one


def test_a_story_the_sprint_ended_in_the_middle_of_says_so():
    """A story whose agents ran and that a shutdown or a cancel left between states was listed bare
    (`story-doc-review`), as if it had failed for no reason."""
    report = _report(_histories())
    (worked,) = [key for key, state in report.stories.items() if state == "done"][:1]
    stopped = report.model_copy(update={"stories": {**report.stories, worked: "story-doc-review"}})
    failures = _section(render_summary(stopped), "Failures")
    assert f"- `{worked}`: story-doc-review: the sprint ended with the story at this state" in failures


def _ran(batch_id: int, key: str, state: str) -> SlaveResult:
    return SlaveResult(
        status="batch-complete" if state == "done" else "batch-failed", batch_id=batch_id, session_id="s",
        results=SlaveResults(
            stories_total=1, stories_completed=state == "done", stories_failed=0, stories_skipped=0,
            story_results=[StoryResult(story_key=key, final_state=state, agents_dispatched=1)],
            total_agents_created=1, total_agents_destroyed=1, review_fix_rounds={key: 0},
        ),
    )


def test_a_dropped_story_says_why_and_the_corrections_are_listed_with_their_notes():
    """A story a course correction dropped was a bare `skipped`, shown in the batch it was first planned in (which
    never ran), and the note given with the correction was nowhere in the summary."""
    plan = BatchPlanReady(session_id="s", batches=[BatchSpec(batch_id=i, stories=[k]) for i, k in
                                                   ((1, "1-1-a"), (2, "1-2-b"), (3, "1-3-c"))], total_stories=3)
    cc = CorrectionRecord(reason="user_request", text="digest | settings\nnext sprint", dropped=["1-3-c"],
                          batches=[BatchSpec(batch_id=4, stories=["1-2-b"])], impact="user_request: 1 dropped (skipped)")
    report = SprintReport(
        session_id="s", status="sprint-partial", batch_plan=plan, batches=[_ran(1, "1-1-a", "done"), _ran(4, "1-2-b", "done")],
        stories={"1-1-a": "done", "1-2-b": "done", "1-3-c": "skipped"}, course_corrections=[cc], unstarted_batches=[],
    )
    text = render_summary(report)
    assert "| 1-3-c |  | skipped | 0 | 0 |" in _section(text, "Story Details")
    assert "| 1-2-b | 4 | done |" in _section(text, "Story Details")
    assert _section(text, "Failures").splitlines()[1] == (
        "- `1-3-c`: skipped: dropped by course correction (user_request): digest \\| settings next sprint"
    )
    assert _section(text, "Course Corrections").splitlines()[3] == (
        "| 1 | user_request: digest \\| settings next sprint |  | 1-3-c | user_request: 1 dropped (skipped) |"
    )
    # Left unstarted by a shutdown: the story keeps the batch it waited in.
    stopped = report.model_copy(update={"unstarted_batches": [BatchSpec(batch_id=4, stories=["1-2-b"])],
                                        "batches": report.batches[:1], "stories": {**report.stories, "1-2-b": "review"}})
    assert "| 1-2-b | 4 | review | 0 | 0 |" in _section(render_summary(stopped), "Story Details")
    # No correction: no section.
    assert "## Course Corrections" not in render_summary(SprintReport(session_id="s", status="sprint-complete"))


def test_a_story_rearmed_into_a_batch_that_never_started_is_not_run_not_failed():
    """1-2-b failed in batch 1 and was rearmed to ready-for-dev; the sprint was cancelled before its new batch
    started. The summary put it in batch 1, among the failures with batch 1's error, and not among those not run."""
    failed = _ran(1, "1-2-b", "needs-intervention")
    failed.results.story_results[0].error = "story-creator/create: no AGENT_COMPLETE within 5s"
    report = SprintReport(
        session_id="s", status="sprint-cancelled", batches=[failed], stories={"1-2-b": "ready-for-dev"},
        unstarted_batches=[BatchSpec(batch_id=6, stories=["1-2-b"])],
    )
    text = render_summary(report)
    assert "| 1-2-b | 6 | ready-for-dev | 0 | 1 |" in _section(text, "Story Details")
    failures = _section(text, "Failures")
    assert "no AGENT_COMPLETE" not in failures and "`1-2-b` (ready-for-dev, rearmed)" in failures, failures


def test_a_note_with_carriage_returns_and_control_characters_stays_on_its_row():
    """A correction's note `a\\r\\nb | c`, `x\\ry` and a NUL and an ESC (a `course_correct` update sent by hand): a
    carriage return split the table's row in three, and the NUL made the file binary to grep and git."""
    cc = CorrectionRecord(reason="user_request", text="a\r\nb | c x\ry nul\x00byte \x1b[31mred", dropped=["1-3-c"])
    report = SprintReport(session_id="s", status="sprint-partial", stories={"1-3-c": "skipped"},
                          course_corrections=[cc], unstarted_batches=[])
    text = render_summary(report)
    assert "\r" not in text and "\x00" not in text and "\x1b" not in text
    rows = _section(text, "Course Corrections").splitlines()
    assert rows[3] == "| 1 | user_request: a b \\| c x y nul\\x00byte \\x1b[31mred |  | 1-3-c |  |", rows
    assert len(rows) == 4, rows
    assert _section(text, "Failures").splitlines()[1] == (
        "- `1-3-c`: skipped: dropped by course correction (user_request): a b \\| c x y nul\\x00byte \\x1b[31mred"
    )


def test_the_report_of_a_partial_sprint_names_the_done_story_whose_work_was_not_merged():
    """A user's uncommitted edit to src/app.py in the checkout made a done story's merge fail. `bso sprint watch`
    said so and sent the user to the report, whose Failures said `None.`: nothing said why the sprint was partial,
    that the story's work was not in the project, nor which branch held it."""
    key = "8-1-app-again"
    note = (
        "not merged: merge of bso/u2-s10/8-1-app-again failed; worktree kept: error: Your local changes to the "
        "following files would be overwritten by merge:\n\tsrc/app.py"
    )
    done = _ran(1, key, "done")
    done.results.story_results[0].error = note
    report = SprintReport(session_id="u2-s10", status="sprint-partial", stories={key: "done"}, batches=[done])
    failures = _section(render_summary(report), "Failures")
    assert "None." not in failures, failures
    assert f"`{key}`: done" in failures and "`bso/u2-s10/8-1-app-again`" in failures, failures
    assert "src/app.py" in failures, failures
    # A done story with nothing to merge (set done by hand before any commit) is no failure.
    done.results.story_results[0].error = "not merged: no commits on the story branch"
    assert _section(render_summary(report), "Failures").strip() == "None."


def test_a_cancelled_batchs_end_is_listed_once_under_failures():
    """`bso sprint cancel` of a sprint whose batch 1 ran: Failures listed `- batch 1: batch 1 cancelled with the
    sprint` and `- sprint: batch 1 cancelled with the sprint` (the Master records a batch's end among the sprint's
    errors too), where `bso sprint status` says it once."""
    key = "1-2-pantry-item-model-and-storage"
    batch = _ran(1, key, "backlog")
    batch.errors = ["batch 1 cancelled with the sprint"]
    report = SprintReport(
        session_id="u2-ext3", status="sprint-cancelled", stories={key: "backlog"}, batches=[batch],
        errors=["batch 1 cancelled with the sprint", "sprint cancelled: no reason given"],
    )
    failures = _section(render_summary(report), "Failures")
    assert failures.count("batch 1 cancelled with the sprint") == 1, failures
    assert "- batch 1: batch 1 cancelled with the sprint" in failures, failures
    assert "sprint cancelled: no reason given" in failures, failures
