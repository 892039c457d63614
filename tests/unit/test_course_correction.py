"""Course correction rules: what may be added and dropped, the start value of an added story, re-planning."""

from __future__ import annotations

import pytest

from bso.course_correction import CCRejected, CourseCorrectionRequest, check_request, replan, start_value
from bso.models import StoryMeta

SPRINT = {"1-1-a": "done", "1-2-b": "review", "1-3-c": "backlog"}
PENDING = ["1-3-c"]
OUTSIDE = {"2-1-d": "skipped", "2-2-e": "done"}


def req(**kw) -> CourseCorrectionRequest:
    return CourseCorrectionRequest(reason="user_request", **kw)


def test_add_and_drop_resolve_short_keys():
    assert check_request(req(add_stories=["2-1"], drop_stories=["1-3"]), SPRINT, PENDING, OUTSIDE) == (["2-1-d"], ["1-3-c"])


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


def test_start_value_of_added_stories():
    assert start_value("skipped") == "backlog" and start_value("weird") == "backlog"
    assert start_value("ready-for-dev") is None and start_value("backlog") is None


def test_replan_numbers_batches_after_the_last_one():
    metas = [StoryMeta(key=k, epic="epic-1", short_key=k[:3], state="backlog", story_path="") for k in ("1-3-c", "2-1-d")]
    assert [(b.batch_id, b.stories) for b in replan("s", metas, 1, 7)] == [(7, ["1-3-c"]), (8, ["2-1-d"])]
