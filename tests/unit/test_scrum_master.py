"""The scrum-master's planning answers (bso/scrum_master.py): BATCH_PLAN_READY, COURSE_CORRECTION, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bso.messages import BatchSpec
from bso.models import StoryMeta
from bso.scrum_master import FALLBACK, SCRUM_MASTER, PlanAnswer, PlanRequest, ReplanContext, answer, stories_named_twice


def meta(key: str, *deps: str) -> StoryMeta:
    return StoryMeta(key=key, epic="epic-1", short_key=key[:3], state="backlog", story_path="", depends_on=list(deps))


def request(stories: list[StoryMeta], ctx: ReplanContext | None = None) -> PlanRequest:
    return PlanRequest(
        request_id="plan-1", session_id="s", report_to="s", stories=stories, batch_size=2, course_correction=ctx
    )


def test_the_sprint_plan_is_batch_plan_ready_by_the_planner():
    got = answer(request([meta("1-1-a"), meta("1-2-b"), meta("1-3-c")]))
    assert got.planner == SCRUM_MASTER and got.course_correction is None and got.error is None
    assert got.plan.msg_type == "BATCH_PLAN_READY"
    assert [(b.batch_id, b.stories) for b in got.plan.batches] == [(1, ["1-1-a", "1-2-b"]), (2, ["1-3-c"])]
    assert answer(request([meta("1-1-a")]), FALLBACK).planner == FALLBACK


def test_a_replan_is_a_course_correction_numbered_after_the_last_batch():
    ctx = ReplanContext(
        reason="user_request", added=["2-1-d"], dropped=["1-3-c"], untouched_done=["1-1-a"],
        old_batches=[BatchSpec(batch_id=2, stories=["1-2-b"]), BatchSpec(batch_id=3, stories=["1-3-c"])],
        next_batch_id=4,
    )
    got = answer(request([meta("1-2-b"), meta("2-1-d", "1-2-b")], ctx))
    cc = got.course_correction
    assert got.plan is None and cc.msg_type == "COURSE_CORRECTION"
    assert [(b.batch_id, b.stories) for b in cc.batches] == [(4, ["1-2-b"]), (5, ["2-1-d"])]  # dependency first
    assert cc.replanned == ["1-2-b", "2-1-d"] and cc.untouched_done == ["1-1-a"]
    assert "Pending batches before: 2: 1-2-b; 3: 1-3-c. After: 4: 1-2-b; 5: 2-1-d." in cc.impact


def test_a_dependency_cycle_is_answered_with_an_error_not_raised():
    got = answer(request([meta("1-1-a", "1-2-b"), meta("1-2-b", "1-1-a")]))
    assert got.plan is None and "dependency cycle" in got.error


def test_malformed_requests_and_answers_are_refused():
    with pytest.raises(ValidationError):
        PlanRequest.model_validate({"request_id": "", "session_id": "s", "report_to": "s", "stories": [], "batch_size": 1})
    with pytest.raises(ValidationError):
        PlanAnswer.model_validate({"request_id": "plan-1", "planner": "someone"})


@pytest.mark.parametrize("replan", [False, True], ids=["plan", "course correction"])
def test_a_request_for_batches_at_once_is_planned_by_levels(replan):
    """concurrent_batches (the Master's max_concurrent_slaves) reaches the plan and the re-plan; a request
    recorded before the field existed reads as 1 and is planned in file order, as it was."""
    stories = [meta("1-1-a"), meta("1-2-b", "1-1-a"), meta("1-3-c")]
    ctx = ReplanContext(reason="user_request", next_batch_id=1) if replan else None
    sent = request(stories, ctx).model_dump(mode="json", exclude_none=True)
    del sent["concurrent_batches"]

    def batches(got: PlanAnswer) -> list[list[str]]:
        return [b.stories for b in (got.course_correction.batches if replan else got.plan.batches)]

    assert batches(answer(PlanRequest.model_validate(sent))) == [["1-1-a"], ["1-2-b", "1-3-c"]]
    assert batches(answer(PlanRequest.model_validate({**sent, "concurrent_batches": 2}))) == [["1-1-a", "1-3-c"], ["1-2-b"]]


def test_a_story_that_depends_on_itself_waits_for_no_one():
    """A hand-sent request (the Master leaves such a line out): planning it raised a KeyError in the resident."""
    got = answer(request([meta("1-1-a"), meta("1-2-b", "1-2-b", "1-1-a")]))
    assert got.error is None and [b.stories for b in got.plan.batches] == [["1-1-a"], ["1-2-b"]]
    assert got.plan.dependency_graph == {"1-2-b": {"depends_on": ["1-1-a"]}}


KEYS = ["1-1-a", "1-2-b", "1-3-c", "2-1-d"]
ANY_STORY = st.builds(
    lambda key, deps, files: StoryMeta(
        key=key, epic="epic-1", short_key=key[:3], state="backlog", story_path="", depends_on=deps, files=files
    ),
    st.sampled_from(KEYS), st.lists(st.sampled_from([*KEYS, "9-9-z"])), st.lists(st.sampled_from(["a.py", "b.py"])),
)  # fmt: skip
ANY_REPLAN = st.none() | st.builds(
    ReplanContext, reason=st.just("user_request"), added=st.lists(st.sampled_from(KEYS)),
    dropped=st.lists(st.sampled_from(KEYS)), untouched_done=st.lists(st.sampled_from(KEYS)),
    in_flight=st.lists(st.sampled_from(KEYS)), next_batch_id=st.integers(1, 10),
    old_batches=st.lists(
        st.builds(BatchSpec, batch_id=st.integers(1, 5), stories=st.lists(st.sampled_from(KEYS), min_size=1)), max_size=3
    ),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(ANY_STORY, max_size=6), st.integers(1, 4), st.integers(1, 3), ANY_REPLAN)
def test_a_plan_request_of_any_shape_is_answered_or_refused_never_raised(stories, batch_size, concurrent, replan):
    """What a hand-sent `plan_request` may hold: the resident refuses what does not validate and answers the
    rest (a plan, or why there is none); an exception would fail its workflow task on every retry."""
    fields = dict(request_id="r", session_id="s", report_to="s", stories=stories, batch_size=batch_size)
    planned = PlanRequest(**fields, concurrent_batches=concurrent, course_correction=replan)
    if stories_named_twice(planned) is not None:  # refused as it comes in (workflows/residents.py)
        assert len({s.key for s in stories}) < len(stories)
        return
    got = answer(planned)
    assert (got.error is None) == (got.plan is not None or got.course_correction is not None), got
