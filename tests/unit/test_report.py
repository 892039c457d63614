"""bso.report: the sprint's outcome from its stories' final states."""

from __future__ import annotations

from bso.git_rules import MERGE_CUT_SHORT, not_merged
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


def test_a_done_story_not_merged_back_leaves_the_sprint_partial() -> None:
    views = {
        K1: StoryView(state="done"),
        K2: StoryView(state="done", error="not merged: merge of bso/s/1-2-logout failed; worktree kept"),
    }
    assert undelivered_stories(views) == [K2]
    final = {key: view.state for key, view in views.items()}
    assert sprint_status(final, stopped_early=False, undelivered=1) is SprintStatus.PARTIAL


def test_only_done_stories_whose_merge_failed_or_was_cut_short_are_undelivered() -> None:
    views = {
        K1: StoryView(state="needs-intervention", error="agent activity failed"),
        K2: StoryView(state="done"),
        "1-3-a": StoryView(state="done", error=not_merged("no branch: nothing to merge")),  # set done by hand
        "1-4-b": StoryView(state="done", error=not_merged("no commits on the story branch")),
        "1-5-c": StoryView(state="done", error="dropped by course correction (user_request)"),  # done by hand
        "1-6-d": StoryView(state="done", error=MERGE_CUT_SHORT),
        "1-7-e": StoryView(state="done", error=not_merged("activity failed: merge conflict in src/x.py")),
    }
    assert undelivered_stories(views) == ["1-6-d", "1-7-e"]
