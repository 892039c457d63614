"""bso.report: the sprint's outcome from its stories' final states."""

from __future__ import annotations

from bso.git_rules import MERGE_CUT_SHORT, NOTHING_TO_MERGE, FinishStoryResult, MergeOutcome, not_merged
from bso.models import StoryView
from bso.report import sprint_status, undelivered_stories
from bso.states import SprintStatus

K1, K2 = "1-1-login-form", "1-2-logout"


def test_all_done_is_complete_and_none_done_is_failed() -> None:
    assert sprint_status({K1: "done", K2: "done"}, stopped_early=False) is SprintStatus.COMPLETE
    assert sprint_status({K1: "needs-intervention"}, stopped_early=False) is SprintStatus.FAILED
    assert sprint_status({K1: "done", K2: "review"}, stopped_early=False) is SprintStatus.PARTIAL
    assert sprint_status({K1: "done"}, stopped_early=True) is SprintStatus.PARTIAL
    assert sprint_status({}, stopped_early=False) is SprintStatus.COMPLETE


def test_a_sprint_whose_stories_were_all_skipped_is_partial_not_failed() -> None:
    # skipped by hand, by a skip_story decision or a course correction's drop: no agent failed
    assert sprint_status({K1: "skipped"}, stopped_early=False) is SprintStatus.PARTIAL
    assert sprint_status({K1: "skipped", K2: "skipped"}, stopped_early=False) is SprintStatus.PARTIAL
    assert sprint_status({K1: "done", K2: "skipped"}, stopped_early=False) is SprintStatus.PARTIAL
    # one that failed still fails the sprint when none is done, its skipped dependants or not
    assert sprint_status({K1: "needs-intervention", K2: "skipped"}, stopped_early=False) is SprintStatus.FAILED


def test_a_done_story_not_merged_back_leaves_the_sprint_partial() -> None:
    views = {
        K1: StoryView(state="done"),
        K2: StoryView(state="done", error="not merged: merge of bso/s/1-2-logout failed", work_left_out=True),
    }
    assert undelivered_stories(views) == [K2]
    final = {key: view.state for key, view in views.items()}
    assert sprint_status(final, stopped_early=False, undelivered=1) is SprintStatus.PARTIAL


def _merge(merged: bool, note: str = "") -> FinishStoryResult:
    return FinishStoryResult(story_key=K1, merged=merged, note=note)


def test_only_a_merge_that_failed_or_was_cut_short_leaves_work_out() -> None:
    assert MergeOutcome.of(_merge(True)) == MergeOutcome(note=None, work_left_out=False)
    for nothing in NOTHING_TO_MERGE:  # set done by hand before any commit: nothing is missing
        assert MergeOutcome.of(_merge(False, nothing)) == MergeOutcome(note=not_merged(nothing), work_left_out=False)
    conflict = "merge of bso/s/1-1-login-form failed; worktree kept"
    assert MergeOutcome.of(_merge(False, conflict)) == MergeOutcome(note=not_merged(conflict), work_left_out=True)
    assert MergeOutcome.failed("git: not found") == MergeOutcome(note=not_merged("git: not found"), work_left_out=True)
    assert MergeOutcome.cut_short() == MergeOutcome(note=MERGE_CUT_SHORT, work_left_out=True)


def test_only_done_stories_whose_work_was_left_out_are_undelivered() -> None:
    views = {
        K1: StoryView(state="needs-intervention", error="agent activity failed", work_left_out=True),  # not done
        K2: StoryView(state="done"),
        "1-3-a": StoryView(state="done", error=not_merged("no branch: nothing to merge")),  # set done by hand
        # An error that reads like a failed merge is not what decides: the merge's outcome is.
        "1-5-c": StoryView(state="done", error="not merged: conflict", work_left_out=False),
        "1-6-d": StoryView(state="done", error=MERGE_CUT_SHORT, work_left_out=True),
        "1-7-e": StoryView(state="done", error="agent activity failed", work_left_out=True),  # its own error shown
    }
    assert undelivered_stories(views) == ["1-6-d", "1-7-e"]


def test_a_story_recorded_before_the_flag_is_judged_by_its_error() -> None:
    """A sprint running across the upgrade: its views made by the code before have no flag."""
    views = {
        K1: StoryView(state="done", error=not_merged("merge of bso/s/1-1 failed; worktree kept")),
        K2: StoryView(state="done", error=MERGE_CUT_SHORT),
        "1-3-a": StoryView(state="done", error=not_merged("no branch: nothing to merge")),
        "1-4-b": StoryView(state="done"),
    }
    assert [v.work_left_out for v in views.values()] == [None] * 4
    assert undelivered_stories(views) == [K1, K2]
