"""The Master's side of planning by the scrum-master resident (mixed into SprintMasterWorkflow).

The Master sends a `plan_request` signal to its scrum-master resident and waits for the `plan_result`
signal that answers it: BATCH_PLAN_READY when the sprint starts, COURSE_CORRECTION for a course
correction's re-plan. Only when no scrum-master runs (resident_slots.scrum_master is off) or it does not
answer does the Master plan by itself, with the same pure rules (bso/scrum_master.py), and say so in the
log and in the answer's `planner` ("fallback").
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from bso.constants import SIGNAL_PLAN_REQUEST, SIGNAL_PLAN_RESULT
    from bso.messages import describe_validation_error
    from bso.models import StoryMeta
    from bso.scrum_master import FALLBACK, SCRUM_MASTER, PlanAnswer, PlanRequest, ReplanContext, answer

PLAN_ANSWER_TIMEOUT = timedelta(minutes=5)


class ScrumMasterPlanning:
    _state: Any  # MasterState

    def _init_planning(self) -> None:
        self._plan_answers: dict[str, PlanAnswer] = {}

    @workflow.signal(name=SIGNAL_PLAN_RESULT)
    def plan_result(self, payload: Any) -> None:
        """The scrum-master's answer to a plan request (BATCH_PLAN_READY or COURSE_CORRECTION)."""
        try:
            parsed = PlanAnswer.model_validate(payload)
        except ValidationError as err:
            workflow.logger.warning("plan_result ignored: %s", describe_validation_error(err))
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
            course_correction=ctx,
        )
        what = "re-plan" if ctx is not None else "plan"
        resident = s.residents.get(SCRUM_MASTER)
        if resident is None:
            why = s.unavailable_residents.get(SCRUM_MASTER) or "resident_slots.scrum_master is off"
            workflow.logger.info("%s %s: no scrum-master resident (%s): the Master's fallback plan", what, request.request_id, why)
            return answer(request, FALLBACK)
        try:
            await workflow.get_external_workflow_handle(resident).signal(
                SIGNAL_PLAN_REQUEST, request.model_dump(mode="json")
            )
            await workflow.wait_condition(
                lambda: request.request_id in self._plan_answers, timeout=PLAN_ANSWER_TIMEOUT
            )
        except asyncio.TimeoutError:
            return self._planner_failed(request, f"no answer within {int(PLAN_ANSWER_TIMEOUT.total_seconds())}s")
        except Exception as err:  # noqa: BLE001 - the resident is gone
            return self._planner_failed(request, f"request not delivered ({err})")
        got = self._plan_answers.pop(request.request_id)
        if got.error is None and (got.plan if ctx is None else got.course_correction) is None:
            return self._planner_failed(request, "its answer has no plan")
        workflow.logger.info("%s %s answered by the scrum-master resident", what, request.request_id)
        return got

    def _planner_failed(self, request: PlanRequest, why: str) -> PlanAnswer:
        reason = f"scrum-master did not plan {request.request_id}: {why}; the Master's fallback plan is used"
        workflow.logger.error(reason)
        self._state.errors.append(reason)
        return answer(request, FALLBACK)
