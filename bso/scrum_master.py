"""The scrum-master resident's planning, as pure models and rules.

The Master asks its scrum-master resident for the sprint's batch plan when the sprint starts (answered
with BATCH_PLAN_READY) and for the re-plan of a course correction (answered with COURSE_CORRECTION): a
`plan_request` signal to the resident, answered by a `plan_result` signal to `report_to`, as the other
residents answer their requests. The resident computes the answer with these functions (no I/O); the
Master uses the very same functions for its fallback plan when no scrum-master runs (its slot is off, or
it did not answer), and says in the report which planner planned.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.course_correction import CCReason, CourseCorrection, impact_text, replan
from bso.messages import BatchPlanReady, BatchSpec
from bso.models import StoryMeta
from bso.planning import PlanningError, plan_batches

Planner = Literal["scrum-master", "fallback"]
SCRUM_MASTER: Planner = "scrum-master"
FALLBACK: Planner = "fallback"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplanContext(_Model):
    """What a course correction's re-plan needs besides the stories to plan."""

    reason: CCReason
    text: str = ""
    added: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    untouched_done: list[str] = Field(default_factory=list)
    in_flight: list[str] = Field(default_factory=list)
    old_batches: list[BatchSpec] = Field(default_factory=list)
    next_batch_id: int = Field(1, ge=1)


class PlanRequest(_Model):
    """Master -> scrum-master: plan these stories (sprint start) or re-plan them (course correction)."""

    msg_type: Literal["PLAN_REQUEST"] = "PLAN_REQUEST"
    request_id: str = Field(min_length=1)
    session_id: str
    report_to: str = Field(min_length=1)
    stories: list[StoryMeta]
    batch_size: int = Field(ge=1)
    # max_concurrent_slaves: above 1 the plan follows the dependency levels (bso.planning.plan_batches); 1 in
    # requests recorded before it was sent
    concurrent_batches: int = Field(1, ge=1)
    course_correction: ReplanContext | None = None  # None: the sprint's first plan
    timeout_ms: int | None = Field(None, ge=1000, le=30000)  # message-schemas' query timeout (None: none)


class PlanAnswer(_Model):
    """Scrum-master -> Master: BATCH_PLAN_READY or COURSE_CORRECTION, or why it could not plan."""

    msg_type: Literal["PLAN_RESULT"] = "PLAN_RESULT"
    request_id: str
    planner: Planner
    plan: BatchPlanReady | None = None
    course_correction: CourseCorrection | None = None
    error: str | None = None


def course_correction_plan(
    session_id: str, stories: list[StoryMeta], batch_size: int, ctx: ReplanContext, concurrent_batches: int = 1
) -> CourseCorrection:
    """COURSE_CORRECTION: the pending stories re-planned, batch ids from ctx.next_batch_id, with its impact."""
    cc = CourseCorrection(
        reason=ctx.reason,
        text=ctx.text,
        added=list(ctx.added),
        dropped=list(ctx.dropped),
        untouched_done=list(ctx.untouched_done),
        in_flight=list(ctx.in_flight),
        replanned=[s.key for s in stories],
        batches=replan(session_id, stories, batch_size, ctx.next_batch_id, concurrent_batches),
    )
    cc.impact = impact_text(cc, list(ctx.old_batches))
    return cc


def stories_named_twice(request: PlanRequest) -> str | None:
    """Why the request cannot be planned as sent, or None: the Master names each story once; a hand-sent request
    naming one twice could fail the planner (a KeyError in some shapes), so the resident refuses it."""
    if repeated := sorted(key for key, times in Counter(s.key for s in request.stories).items() if times > 1):
        return f"stories named more than once: {', '.join(repeated)}"
    return None


def answer(request: PlanRequest, planner: Planner = SCRUM_MASTER) -> PlanAnswer:
    """The answer to a plan request, by `planner`; a planning error (a dependency cycle) is answered, not raised."""
    try:
        if request.course_correction is None:
            return PlanAnswer(
                request_id=request.request_id,
                planner=planner,
                plan=plan_batches(
                    request.session_id, request.stories, request.batch_size, request.concurrent_batches
                ),
            )
        return PlanAnswer(
            request_id=request.request_id,
            planner=planner,
            course_correction=course_correction_plan(
                request.session_id,
                request.stories,
                request.batch_size,
                request.course_correction,
                request.concurrent_batches,
            ),
        )
    except PlanningError as err:
        return PlanAnswer(request_id=request.request_id, planner=planner, error=str(err))
