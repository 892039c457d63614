"""bso.decisions: which stories a rearm takes, where its batch goes in the queue, and which skipped stories come
back in it."""

from __future__ import annotations

import re

import pytest

from bso.decisions import (
    Decision,
    DecisionError,
    DecisionRequest,
    check_rearm,
    dependants_brought_back,
    rearm_position,
    skipped_for_stories_pending_again,
)
from bso.dependencies import skipped_for_dependency
from bso.messages import BatchSpec
from bso.models import StoryMeta, StoryProgress, StoryView
from bso.states import StoryState


def meta(key: str, *depends_on: str) -> StoryMeta:
    return StoryMeta(key=key, epic="epic-1", short_key=key[:3], state="backlog", story_path=f"s/{key}.md",
                     depends_on=list(depends_on))


STORIES = {m.key: m for m in (meta("1-1-a"), meta("1-2-b", "1-1-a"), meta("1-3-c", "1-2-b"), meta("1-4-d"))}


def test_before_the_first_queued_batch_with_a_dependant():
    queue = [BatchSpec(batch_id=2, stories=["1-4-d"]), BatchSpec(batch_id=3, stories=["1-2-b", "1-3-c"])]
    assert rearm_position(queue, "1-1-a", STORIES) == 1


def test_at_the_end_when_nothing_queued_depends_on_it():
    queue = [BatchSpec(batch_id=2, stories=["1-4-d"]), BatchSpec(batch_id=3, stories=["1-3-c"])]
    assert rearm_position(queue, "1-1-a", STORIES) == 2  # 1-3-c depends on 1-2-b, not directly on 1-1-a
    assert rearm_position([], "1-1-a", STORIES) == 0


def test_after_the_queued_batches_of_what_it_depends_on():
    """1-2-b (rearmed) depends on 1-1-a, queued in batch 3 behind 1-3-c's batch 2 (a dependant of 1-2-b): it
    goes after batch 3, not ahead of it, where it would wait for 1-1-a."""
    queue = [BatchSpec(batch_id=2, stories=["1-3-c"]), BatchSpec(batch_id=3, stories=["1-1-a"])]
    assert rearm_position(queue, "1-2-b", STORIES) == 2


def test_with_the_dependants_that_come_back_with_it():
    """A rearm of 1-1-a brings back 1-2-b and 1-3-c (a dependant of 1-2-b): their batch goes before a queued
    batch depending on any of them."""
    queue = [BatchSpec(batch_id=2, stories=["1-4-d"]), BatchSpec(batch_id=3, stories=["1-5-e"])]
    stories = {**STORIES, "1-5-e": meta("1-5-e", "1-3-c")}
    assert rearm_position(queue, ["1-1-a", "1-2-b", "1-3-c"], stories) == 1
    assert rearm_position(queue, ["1-1-a"], stories) == rearm_position(queue, "1-1-a", stories) == 2


def skipped(key: str, dependency: str, its_state: str = "needs-intervention") -> StoryView:
    progress = StoryProgress(key=key, state="ready-for-dev")
    done = skipped_for_dependency(progress, dependency, its_state).progress
    return StoryView(state=done.state, error=done.error, batch_id=1)


def test_the_stories_skipped_for_a_rearmed_one_come_back_in_dependency_order():
    stories = {m.key: m for m in (
        meta("1-1-a"), meta("1-3-c", "1-2-b"), meta("1-2-b", "1-1-a"), meta("1-4-d", "1-1-a"), meta("1-5-e", "1-1-a"),
        meta("1-6-f", "1-5-e"), meta("1-7-g", "1-9-z"), meta("1-8-h", "1-1-a"),
    )}
    views = {
        "1-1-a": StoryView(state="needs-intervention", error="dev failed", batch_id=1),
        "1-3-c": skipped("1-3-c", "1-2-b", "skipped"),  # listed before what it was skipped for
        "1-2-b": skipped("1-2-b", "1-1-a"),
        "1-4-d": StoryView(state="skipped", error="skipped by a human decision", batch_id=1),
        "1-5-e": StoryView(state="done", batch_id=1),
        "1-6-f": StoryView(state="skipped", error="dropped by course correction", batch_id=1),
        "1-7-g": skipped("1-7-g", "1-9-z"),  # skipped for another story
        "1-8-h": skipped("1-8-h", "1-1-a", "unfinished:review"),
    }
    assert dependants_brought_back("1-1-a", views, stories) == ["1-2-b", "1-3-c", "1-8-h"]
    assert dependants_brought_back("1-2-b", views, stories) == ["1-3-c"]
    assert dependants_brought_back("1-5-e", views, stories) == []


def test_the_stories_a_batch_skipped_for_one_pending_again_come_back_with_those_skipped_for_them():
    stories = {m.key: m for m in (
        meta("1-1-a"), meta("1-2-b", "1-1-a"), meta("1-3-c", "1-2-b"), meta("1-4-d", "1-9-z"), meta("1-9-z"),
        meta("1-5-e", "1-1-a"), meta("1-6-f"),
    )}
    views = {
        "1-1-a": StoryView(state="review", batch_id=7),  # rearmed: pending again
        "1-9-z": StoryView(state="needs-intervention", error="dev failed", batch_id=1),  # still failed
        "1-3-c": skipped("1-3-c", "1-2-b", "skipped"),  # in another batch, skipped for B in turn
        "1-2-b": skipped("1-2-b", "1-1-a"),
        "1-4-d": skipped("1-4-d", "1-9-z"),
        "1-5-e": StoryView(state="skipped", error="skipped by a human decision", batch_id=1),
        "1-6-f": StoryView(state="done", batch_id=1),
    }
    never_done = {"1-9-z"}.__contains__
    ended = ["1-2-b", "1-4-d", "1-5-e", "1-6-f"]
    assert skipped_for_stories_pending_again(ended, views, stories, never_done) == ["1-2-b", "1-3-c"]
    assert skipped_for_stories_pending_again(["1-4-d", "1-6-f"], views, stories, never_done) == []
    assert skipped_for_stories_pending_again(ended, views, stories, lambda _: True) == []


@pytest.mark.parametrize(
    ("view", "error"),
    [
        (StoryView(state="needs-intervention", error="dev failed", batch_id=1), None),
        (StoryView(state="skipped", error="skipped by a human decision", batch_id=1), None),
        (skipped("1-2-b", "1-9-z"), None),  # what it was skipped for is pending again (rearmed)
        (skipped("1-2-b", "1-1-a"), "skipped because 1-1-a will not be done: rearm 1-1-a"),
        (StoryView(state="skipped", error="dropped by course correction (user_request)", batch_id=None),
         "dropped by a course correction: add it back"),
        (StoryView(state="review", batch_id=1), "is review, not needs-intervention or skipped: nothing to rearm"),
        (None, "unknown story"),
    ],
)
def test_a_rearm_takes_a_failed_story_or_a_skipped_one_that_could_run(view, error):
    request = DecisionRequest(story_key="1-2-b", decision=Decision.REARM)
    still_failed = {"1-1-a"}.__contains__
    if error is None:
        check_rearm(request, view, still_failed)
    else:
        with pytest.raises(DecisionError, match=re.escape(error)):
            check_rearm(request, view, still_failed)
    with pytest.raises(DecisionError, match="cannot rearm to 'done'"):
        check_rearm(request.model_copy(update={"state": StoryState.DONE}), StoryView(state="needs-intervention"), still_failed)
