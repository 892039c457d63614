"""bso.report: the sprint's outcome from its stories' final states."""

from __future__ import annotations

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


def test_only_done_stories_with_an_error_are_undelivered() -> None:
    views = {
        K1: StoryView(state="needs-intervention", error="agent activity failed"),
        K2: StoryView(state="done"),
    }
    assert undelivered_stories(views) == []
