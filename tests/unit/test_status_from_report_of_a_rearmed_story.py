"""A finished sprint shown from its report (`bso sprint watch` of a cancelled sprint, `bso sprint
status` with no worker running) showed a story rearmed into a batch that never started in its old batch, at
the state it failed with and with its old error; and a batch whose only story was rearmed into a later one lost
its bar (bso.cli._view_from_report read each batch's result over the report's states, and no finished batch's
count).

Seen: an external-backend sprint; story 1-2's reviewer answers `failure`, the story ends needs-intervention in
batch 1; `bso sprint decide ID 1-2 rearm --state story-doc-review` writes `story-doc-review` and queues it in a
new batch 3; `bso sprint cancel ID` before batch 3 starts. The status file and the execution summary say
story-doc-review, batch 3 ("Not run ...: 1-2 (story-doc-review, rearmed)"), and so does `bso sprint status`
while a worker answers the query; but `bso sprint watch ID` (and `bso sprint status` without a worker) shows

    1-2-pantry-item-model-and-storage  1  needs-intervention  ...
    1-2-pantry-item-model-and-storage: needs-intervention: story-reviewer/review failed: reviewer crashed

and counts the story among the ended ones (`overall 1/5 stories (0 done)`). The story's state is the report's
(`report.stories`), as the summary shows it (tests/unit/test_summary.py, the rearmed story not run).
"""

from __future__ import annotations

from bso.cli import _view_from_report
from bso.messages import BatchSpec
from bso.models import SlaveResult, SlaveResults, SprintReport, StoryResult


def _failed_in_batch_1(key: str) -> SlaveResult:
    return SlaveResult(
        status="batch-failed", batch_id=1, session_id="s",
        results=SlaveResults(
            stories_total=1, stories_completed=0, stories_failed=1, stories_skipped=0,
            story_results=[StoryResult(story_key=key, final_state="needs-intervention", agents_dispatched=2,
                                       error="story-reviewer/review failed: reviewer crashed")],
            total_agents_created=2, total_agents_destroyed=2, review_fix_rounds={key: 0},
        ),
    )


def test_a_story_rearmed_into_a_batch_that_never_started_shows_its_rearmed_state():
    key = "1-2-b"
    report = SprintReport(
        session_id="s", status="sprint-cancelled", batches=[_failed_in_batch_1(key)],
        stories={key: "story-doc-review"}, unstarted_batches=[BatchSpec(batch_id=3, stories=[key])],
    )
    story = _view_from_report(report).stories[key]
    assert story.state == "story-doc-review", story
    assert story.batch_id == 3, story
    assert story.error is None, story
    assert story.agents_dispatched == 2  # its agents of batch 1 still count


def _ran(batch_id: int, key: str, state: str) -> SlaveResult:
    return SlaveResult(
        status="batch-complete" if state == "done" else "batch-partial", batch_id=batch_id, session_id="s",
        results=SlaveResults(
            stories_total=1, stories_completed=int(state == "done"), stories_failed=int(state != "done"),
            stories_skipped=0,
            story_results=[StoryResult(story_key=key, final_state=state, agents_dispatched=3)],
            total_agents_created=3, total_agents_destroyed=3, review_fix_rounds={key: 1},
        ),
    )


def test_a_batch_whose_only_story_was_rearmed_into_a_later_one_keeps_its_bar():
    """Sprint rr1: 2-1 failed in batch 1, was rearmed and failed again in batch 3; 2-2a ran in batch 2. With a
    worker the status shows `batch 1 ... 1/1`; from the report (no worker) it says `batches ended 3/3` but draws
    bars for batches 2 and 3 only: batch 1, which ran, is gone."""
    import io

    from rich.console import Console

    from bso.cli import _progress

    report = SprintReport(
        session_id="s", status="sprint-partial",
        batches=[_ran(1, "2-1-a", "needs-intervention"), _ran(2, "2-2a-b", "done"), _ran(3, "2-1-a", "needs-intervention")],
        stories={"2-1-a": "needs-intervention", "2-2a-b": "done"}, unstarted_batches=[],
    )
    view = _view_from_report(report)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(_progress(view, None, "sprint-partial", from_report=True))
    text = console.export_text()
    assert "batches ended 3/3" in text
    assert any(line.startswith("batch 1 ") for line in text.splitlines()), text
