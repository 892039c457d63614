"""The Master's side of course correction (mixed into SprintMasterWorkflow): the `course_correct` update
(CC_TRIGGER -> COURSE_CORRECTION, or CC_REJECTED by its validator) and the Master's own course correction
after `consecutive_failure_threshold` stories in a row ended needs-intervention. Rules in
bso/course_correction.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.status_file import load_sprint_status, write_story_status
    from bso.constants import UPDATE_COURSE_CORRECT
    from bso.course_correction import (
        CCReason,
        CCRejected,
        CourseCorrection,
        CourseCorrectionRequest,
        check_request,
        impact_text,
        replan,
        start_value,
    )
    from bso.messages import describe_validation_error
    from bso.models import LoadStatusInput, StatusWriteInput, StoryView
    from bso.states import SprintPhase, StoryState

_WRITE = {
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(maximum_attempts=5, non_retryable_error_types=["StatusFileError"]),
}


class CourseCorrector:
    _state: Any  # MasterState
    _running_batches: dict[int, str]
    _project_root: str

    def _init_course_correction(self) -> None:
        self._replanning = False  # no batch starts while a course correction is being applied

    @workflow.update(name=UPDATE_COURSE_CORRECT)
    async def course_correct(self, request: Any) -> CourseCorrection:
        parsed = CourseCorrectionRequest.model_validate(request)
        self._replanning = True
        try:
            return await self._apply_course_correction(parsed)
        finally:
            self._replanning = False

    @course_correct.validator
    def _validate_course_correct(self, request: Any) -> None:
        try:
            parsed = CourseCorrectionRequest.model_validate(request)
        except ValidationError as err:
            raise ApplicationError(f"CC_REJECTED: {describe_validation_error(err)}", type="CC_REJECTED") from None
        s = self._state
        if s.shutdown or s.stopped_early or s.phase in (SprintPhase.COMPLETED, SprintPhase.FAILED):
            raise ApplicationError("CC_REJECTED: the sprint is ending", type="CC_REJECTED")
        if self._replanning:
            raise ApplicationError("CC_REJECTED: another course correction is being applied", type="CC_REJECTED")
        try:
            self._cc_check(parsed)
        except CCRejected as err:
            raise ApplicationError(str(err), type="CC_REJECTED") from None

    def _cc_check(self, request: CourseCorrectionRequest) -> tuple[list[str], list[str]]:
        s = self._state
        return check_request(
            request,
            {k: v.state for k, v in s.views.items()},
            [k for spec in s.queue for k in spec.stories],
            s.outside_stories,
        )

    async def _apply_course_correction(self, request: CourseCorrectionRequest) -> CourseCorrection:
        s = self._state
        add, drop = self._cc_check(request)
        metas = {}
        if add:
            snapshot = await workflow.execute_activity(
                load_sprint_status,
                LoadStatusInput(project_root=self._project_root, status_file=s.status_file),
                summary="course correction: read sprint-status.yaml",
                **_WRITE,
            )
            metas = {m.key: m for m in snapshot.stories}
        note = f"dropped by course correction ({request.reason.value})"
        for key in drop:
            current = await self._cc_write(key, s.views[key].state, StoryState.SKIPPED.value)
            s.views[key] = s.views[key].model_copy(update={"state": current, "error": note, "batch_id": None})
        for key in add:
            meta = metas[key]
            first = start_value(meta.state)
            if first is not None:
                meta = meta.model_copy(update={"state": await self._cc_write(key, meta.state, first)})
            s.stories[key] = meta
            s.views[key] = StoryView(state=meta.state)
            s.outside_stories.pop(key, None)
        cc = self._replan_pending(request.reason, request.text, add, drop)
        if drop:
            self._tell_dependants({key: s.views[key].state for key in drop}, None)
        return cc

    async def _cc_write(self, key: str, expected: str, new: str) -> str:
        written = await workflow.execute_activity(
            write_story_status,
            StatusWriteInput(
                project_root=self._project_root, status_file=self._state.status_file, story_key=key,
                expected=expected, new=new,
            ),
            summary=f"course correction {key}: {expected} -> {new}",
            **_WRITE,
        )
        if written.outcome == "cas-mismatch":
            self._state.errors.append(f"course correction: {key} was {written.current!r}, not {expected!r}; left as is")
        return written.current

    def _replan_pending(self, reason: CCReason, text: str, added: list[str], dropped: list[str]) -> CourseCorrection:
        """Re-plan the queued stories (and the added ones) into new batches; COURSE_CORRECTION."""
        s = self._state
        old = list(s.queue)
        pending = [k for spec in old for k in spec.stories if k not in dropped] + added
        batches = replan(s.session_id, [s.stories[k] for k in pending], s.config.batch_size, s.next_batch_id)
        s.next_batch_id += len(batches)
        s.queue = batches
        for spec in batches:
            for key in spec.stories:
                s.views[key] = s.views[key].model_copy(update={"batch_id": spec.batch_id})
        in_flight = [k for k, v in s.views.items() if v.batch_id in self._running_batches]
        cc = CourseCorrection(
            reason=reason,
            text=text,
            added=added,
            dropped=dropped,
            untouched_done=[k for k, v in s.views.items() if v.state == StoryState.DONE],
            in_flight=in_flight,
            replanned=pending,
            batches=batches,
        )
        cc.impact = impact_text(cc, old)
        s.course_corrections.append(cc.impact)
        workflow.logger.info("COURSE_CORRECTION %s", cc.impact)
        self._show()
        return cc

    def _count_failure(self, state: str) -> None:
        """`repeated_failures`: after consecutive_failure_threshold needs-intervention stories in a row the
        Master re-plans the pending stories itself and pauses the sprint for a human to look."""
        s = self._state
        if state == StoryState.DONE:
            s.consecutive_failures = 0
        elif state == StoryState.NEEDS_INTERVENTION:
            s.consecutive_failures += 1
            if s.consecutive_failures >= s.config.consecutive_failure_threshold:
                count, s.consecutive_failures = s.consecutive_failures, 0
                cc = self._replan_pending(
                    CCReason.REPEATED_FAILURES, f"{count} stories in a row ended needs-intervention", [], []
                )
                reason = f"repeated failures: {cc.text}; course_correct, then resume"
                self._pause(reason)
                self._forward("pause", reason)
