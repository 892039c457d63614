"""Course correction rules: what may be added and dropped, the start value of an added story, re-planning."""

from __future__ import annotations

import pytest

from bso.course_correction import (
    CCRejected,
    CourseCorrectionRequest,
    check_added_values,
    check_request,
    dropped_note,
    dropped_stories,
    keys_not_seen,
    replan,
    start_value,
)
from bso.models import CorrectionRecord, StoryMeta

SPRINT = {"1-1-a": "done", "1-2-b": "review", "1-3-c": "backlog"}
PENDING = ["1-3-c"]
OUTSIDE = {"2-1-d": "skipped", "2-2-e": "done"}


def req(**kw) -> CourseCorrectionRequest:
    return CourseCorrectionRequest(reason="user_request", **kw)


def test_add_and_drop_resolve_short_keys():
    assert check_request(req(add_stories=["2-1"], drop_stories=["1-3"]), SPRINT, PENDING, OUTSIDE) == (["2-1-d"], ["1-3-c"])
    # Neither list: a re-plan of the pending stories only, as the Master's own after repeated failures (README).
    assert check_request(req(), SPRINT, PENDING, OUTSIDE) == ([], [])


@pytest.mark.parametrize(
    "kw, why",
    [
        ({"add_stories": ["9-9"]}, "add_stories"),
        ({"drop_stories": ["1-1"]}, "done stories are untouched"),
        ({"drop_stories": ["1-2"]}, "finishes as planned"),
        ({"drop_stories": ["2-1"]}, "not in this sprint"),
        ({"add_stories": ["1-2"]}, "already in this sprint"),
        ({"add_stories": ["2-2"]}, "done already"),
    ],
)
def test_rejections(kw, why):
    with pytest.raises(CCRejected, match=why):
        check_request(req(**kw), SPRINT, PENDING, OUTSIDE)


def test_a_story_skipped_in_the_sprint_may_be_added_again():
    """Dropped by an earlier correction: it was refused as 'already in this sprint'."""
    sprint = {**SPRINT, "1-4-d": "skipped"}
    assert check_request(req(add_stories=["1-4"]), sprint, PENDING, OUTSIDE, dropped={"1-4-d"}) == (["1-4-d"], [])
    with pytest.raises(CCRejected, match="already in this sprint"):  # skipped otherwise: it may be in a running batch
        check_request(req(add_stories=["1-4"]), sprint, PENDING, OUTSIDE)


def test_start_value_of_added_stories():
    assert start_value("skipped") == "backlog" and start_value("weird") == "backlog"
    assert start_value("ready-for-dev") is None and start_value("backlog") is None


def test_a_story_added_again_takes_back_the_value_it_had_when_dropped():
    assert start_value("skipped", before_drop="review") == "review"
    assert start_value("ready-for-dev", before_drop="review") is None  # set by hand since: kept
    assert start_value("skipped", before_drop="wip") == "backlog"  # not a state: as any skipped story
    assert start_value("skipped", before_drop="needs-intervention") == "backlog"  # no dispatch-table row


def test_an_added_story_of_a_value_bso_does_not_know_is_refused():
    values = {"2-1-a": "wip", "2-2-b": "skipped", "2-3-c": "in-progress", "2-4-d": "needs-intervention"}
    with pytest.raises(CCRejected, match=r"no agent starts from the state of 2-1-a: 'wip'; a story starts from one of backlog"):
        check_added_values(["2-1-a", "2-2-b"], values)
    check_added_values(["2-2-b", "2-3-c", "2-4-d"], values)  # end states are reset to backlog, legacy names read


def test_replan_numbers_batches_after_the_last_one():
    metas = [StoryMeta(key=k, epic="epic-1", short_key=k[:3], state="backlog", story_path="") for k in ("1-3-c", "2-1-d")]
    assert [(b.batch_id, b.stories) for b in replan("s", metas, 1, 7)] == [(7, ["1-3-c"]), (8, ["2-1-d"])]


def test_a_dropped_story_says_which_correction_dropped_it_and_its_note():
    assert dropped_note("user_request", "") == "dropped by course correction (user_request)"
    assert dropped_note("new_requirements", " search\n first ") == "dropped by course correction (new_requirements): search first"
    long = dropped_note("user_request", "x" * 4000)  # the whole note is in the report's record of the correction
    assert len(long) == len("dropped by course correction (user_request): ") + 300 and long.endswith("...")


def test_the_stories_left_dropped_by_the_corrections_in_order():
    first = CorrectionRecord(reason="user_request", text="later", dropped=["1-3-c", "1-4-d"])
    again = CorrectionRecord(reason="new_requirements", text="back in", added=["1-3-c"])
    third = CorrectionRecord(reason="user_request", text="no, out", dropped=["1-3-c"])
    assert dropped_stories([first]) == {
        "1-3-c": "dropped by course correction (user_request): later",
        "1-4-d": "dropped by course correction (user_request): later",
    }
    assert dropped_stories([first, again]) == {"1-4-d": "dropped by course correction (user_request): later"}
    assert dropped_stories([first, again, third])["1-3-c"] == "dropped by course correction (user_request): no, out"
    assert dropped_stories([]) == {}


def test_keys_to_add_the_sprint_has_not_seen_are_story_keys_it_does_not_know():
    """A line added to the file since the sprint started: the Master reads the file for it (it was refused)."""
    known = [*SPRINT, *OUTSIDE]
    assert keys_not_seen(["2-1", "1-9", "1-9-new", "9-9-x", "not a key", "../x"], known) == ["1-9", "1-9-new", "9-9-x"]
    assert keys_not_seen(["1-3-c", "2-2"], known) == []
