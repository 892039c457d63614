"""The Master's side of planning by the scrum-master resident (mixed into SprintMasterWorkflow).

The Master sends a `plan_request` signal to its scrum-master resident and waits for the `plan_result`
signal that answers it: BATCH_PLAN_READY when the sprint starts, COURSE_CORRECTION for a course
correction's re-plan. Only when no scrum-master runs (resident_slots.scrum_master is off) or it does not
answer does the Master plan by itself, with the same pure rules (bso/scrum_master.py), and say so in the
log and in the answer's `planner` ("fallback").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from bso.constants import SIGNAL_PLAN_REQUEST, SIGNAL_PLAN_RESULT
    from bso.messages import (
        PATCH_PLAN_ANSWER_AWAITED,
        describe_validation_error,
        plan_answer_not_awaited,
        plan_answer_timeout_summary,
    )
    from bso.models import StoryMeta
    from bso.planning import batch_numbering_problem
    from bso.scrum_master import FALLBACK, SCRUM_MASTER, PlanAnswer, PlanRequest, ReplanContext, answer
    from bso.delivery import describe as describe_delivery, keep_error, query_timeout
    from workflows.delivery import await_answer, deliver

PLAN_ANSWER_TIMEOUT = timedelta(minutes=5)


PATCH_PLAN_CHECKED = "master-plan-holds-the-stories-asked"
# Its batches numbered as the Master numbers them (bso.planning.batch_numbering_problem): ids twice or out of turn
# failed the sprint (two batches under one workflow id) or reused an id taken.
PATCH_PLAN_NUMBERING_CHECKED = "master-plan-numbering-checked"
# Plans asked before it were made in file order whatever max_concurrent_slaves (the Master's fallback plan is
# made in its own history and must replay as it was).
PATCH_PLAN_BY_LEVELS = "master-plan-by-levels"


class ScrumMasterPlanning:
    _state: Any  # MasterState

    def _init_planning(self) -> None:
        self._plan_answers: dict[str, PlanAnswer] = {}
        self._plan_awaited: str | None = None  # the request id of the plan request in flight

    @workflow.signal(name=SIGNAL_PLAN_RESULT)
    def plan_result(self, payload: Any) -> None:
        """The scrum-master's answer to a plan request (BATCH_PLAN_READY or COURSE_CORRECTION)."""
        try:
            parsed = PlanAnswer.model_validate(payload)
        except ValidationError as err:
            workflow.logger.warning("plan_result ignored: %s", describe_validation_error(err))
            return
        if parsed.request_id != self._plan_awaited and workflow.patched(PATCH_PLAN_ANSWER_AWAITED):
            workflow.logger.warning("plan_result ignored: %s", plan_answer_not_awaited(parsed.request_id))
            return
        self._plan_answers[parsed.request_id] = parsed

    async def _ask_planner(self, stories: list[StoryMeta], ctx: ReplanContext | None = None) -> PlanAnswer:
        """The plan (ctx None) or the course correction's re-plan, by the scrum-master resident if one runs."""
        s = self._state
        s.plan_requests += 1
        request = PlanRequest(
            request_id=f"plan-{s.plan_requests}",
            session_id=s.session_id,
            report_to=workflow.info().workflow_id,
            stories=stories,
            batch_size=s.config.batch_size,
            concurrent_batches=s.config.max_concurrent_slaves if workflow.patched(PATCH_PLAN_BY_LEVELS) else 1,
            course_correction=ctx,
            timeout_ms=s.config.resident_query_timeout_ms,
        )
        what = "re-plan" if ctx is not None else "plan"
        resident = s.residents.get(SCRUM_MASTER)
        if resident is None:
            why = s.unavailable_residents.get(SCRUM_MASTER) or "resident_slots.scrum_master is off"
            workflow.logger.info("%s %s: no scrum-master resident (%s): the Master's fallback plan", what, request.request_id, why)
            return answer(request, FALLBACK)
        sent = request.model_dump(mode="json", exclude_none=True)
        self._plan_awaited = request.request_id  # before it is sent: the answer may come with the send's completion
        try:
            failed = await deliver(resident, SIGNAL_PLAN_REQUEST, sent, cancellable=True)  # retried, then delivery_failed
            if failed is not None:  # the resident is gone
                s.message_errors = keep_error(s.message_errors, failed)
                return self._planner_failed(request, f"request not delivered ({describe_delivery(failed)})")
            timeout = query_timeout(request.timeout_ms, PLAN_ANSWER_TIMEOUT)  # the query's timeout_ms, if any
            late = await await_answer(
                lambda: request.request_id in self._plan_answers, timeout, request=sent, recipient=resident,
                timeout_summary=plan_answer_timeout_summary(request.request_id),
            )
        finally:
            self._plan_awaited = None
        if late is not None:
            s.message_errors = keep_error(s.message_errors, late)
            return self._planner_failed(
                request, f"no answer within {int(timeout.total_seconds())}s ({describe_delivery(late)})"
            )
        got = self._plan_answers.pop(request.request_id)
        planned = got.plan if ctx is None else got.course_correction
        if got.error is None and planned is None:
            return self._planner_failed(request, "its answer has no plan")
        # A plan naming a story it was not asked for (a buggy or forged answer) failed the Master's workflow task
        # on every retry; one leaving a story out would never run it.
        if planned is not None and workflow.patched(PATCH_PLAN_CHECKED):
            if sorted(key for spec in planned.batches for key in spec.stories) != sorted(m.key for m in stories):
                return self._planner_failed(request, "its plan does not hold exactly the stories asked for")
        first_id = ctx.next_batch_id if ctx is not None else 1
        if planned is not None and (why := batch_numbering_problem(planned.batches, first_id)) is not None:
            if workflow.patched(PATCH_PLAN_NUMBERING_CHECKED):  # (asked where it refuses)
                return self._planner_failed(request, why)
        workflow.logger.info("%s %s answered by the scrum-master resident", what, request.request_id)
        return got

    def _planner_failed(self, request: PlanRequest, why: str) -> PlanAnswer:
        reason = f"scrum-master did not plan {request.request_id}: {why}; the Master's fallback plan is used"
        workflow.logger.error(reason)
        self._state.errors.append(reason)
        return answer(request, FALLBACK)
