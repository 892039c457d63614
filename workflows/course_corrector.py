"""The Master's side of course correction (mixed into SprintMasterWorkflow): the `course_correct` update
(CC_TRIGGER -> COURSE_CORRECTION, or CC_REJECTED by its validator) and the Master's own course correction
after `consecutive_failure_threshold` stories in a row ended needs-intervention. Rules in
bso/course_correction.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.status_file import load_sprint_status, write_story_status
    from bso.constants import UPDATE_COURSE_CORRECT
    from bso.course_correction import (
        CCReason,
        CCRejected,
        CourseCorrection,
        CourseCorrectionRequest,
        check_added_values,
        check_request,
        correction_record,
        dropped_note,
        keys_not_seen,
        start_value,
    )
    from bso.scrum_master import ReplanContext
    from bso.messages import describe_validation_error, story_key_too_long
    from bso.sprint_status import shared_numbers
    from bso.models import (
        TERMINAL_VALUES,
        BatchSpec,
        LoadStatusInput,
        StatusSnapshot,
        StatusWriteInput,
        StatusWriteResult,
        StoryMeta,
        StoryView,
        short_key,
    )
    from bso.states import SprintPhase, StoryState

_WRITE = {
    "start_to_close_timeout": timedelta(seconds=30),
    "retry_policy": RetryPolicy(maximum_attempts=5, non_retryable_error_types=["StatusFileError"]),
}


# A course correction is planned before the status file is written (a rejected one changed the file).
PATCH_CC_PLAN_FIRST = "master-cc-plans-first"
# A course correction accepted together with a rearm (one workflow task: the validator saw neither) is refused.
PATCH_CC_AFTER_REARM = "master-cc-waits-for-rearm"
# An added story whose value BSO does not know (`wip`) is refused instead of written `backlog` over.
PATCH_CC_KNOWN_VALUES = "master-cc-refuses-unknown-values"
# A re-plan plans again when a batch was queued while the scrum-master planned (a rearm, a budget stop's unstarted
# stories): the new queue replaced it, and the rearmed story never ran.
PATCH_REPLAN_SEES_QUEUED = "master-replan-sees-batches-queued-meanwhile"
# A dropped story whose status line cannot be written (removed by hand) is dropped all the same, said among the
# errors: the failed write failed the update with the queue re-planned already, the story in no batch. Asked there.
PATCH_CC_DROP_UNWRITTEN = "master-cc-drop-unwritten"
# The added stories are written before the dropped ones, and one whose write fails (its line removed by hand since
# the update read the file) refuses the whole correction, undone: it failed the update with the queue re-planned
# already, the added stories in it, the dropped ones written `skipped`. Asked where the order changes (a correction
# adding and dropping) and where a write failed.
PATCH_CC_ADD_UNWRITTEN = "master-cc-add-unwritten"
CC_DURING_REARM = "CC_REJECTED: a rearm is being applied: send the course correction again once it is done"
# An added story that shares its number with a story of the sprint (`1-2-logout` beside `1-2-login`) is refused: its
# agents' work would be taken for the other's (bso.sprint_status.shared_numbers).
SHARED_NUMBER_ADDED = "add stories with numbers of their own"


def _cc_rejected(message: str) -> ApplicationError:
    """CC_REJECTED: the correction is refused, and sending it again as it is would be refused again."""
    return ApplicationError(message, type="CC_REJECTED", non_retryable=True)


class CourseCorrector:
    _state: Any  # MasterState
    _rearm_in_flight: Callable[[], bool]
    _running_batches: dict[int, str]
    _project_root: str
    _not_replannable: Callable[[], str | None]
    _put_view: Callable[[str, StoryView], None]  # every change of a story's view (the Master keeps its tally)
    _drop_view: Callable[[str], None]

    def _init_course_correction(self) -> None:
        self._replanning = False  # no batch starts while a course correction is being applied
        self._auto_corrections: list[asyncio.Task[None]] = []  # repeated_failures re-plans in progress
        self._replaced_queue: list[BatchSpec] = []  # the queued batches the last re-plan replaced

    @workflow.update(name=UPDATE_COURSE_CORRECT)
    async def course_correct(self, request: Any) -> CourseCorrection:
        parsed = CourseCorrectionRequest.model_validate(request)
        if self._rearm_in_flight() and workflow.patched(PATCH_CC_AFTER_REARM):  # accepted with a rearm in one task
            raise _cc_rejected(CC_DURING_REARM)
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
            raise _cc_rejected(f"CC_REJECTED: {describe_validation_error(err)}") from None
        if (why := self._not_replannable()) is not None:
            raise _cc_rejected(f"CC_REJECTED: {why}")
        if self._state.phase in (SprintPhase.STARTING, SprintPhase.PLANNING):
            # Its re-plan would be a second plan request beside the first plan's, whose answer it would displace.
            raise _cc_rejected("CC_REJECTED: the sprint is still planning its batches; send it again once it runs")
        if self._replanning:
            raise _cc_rejected("CC_REJECTED: another course correction is being applied")
        if self._rearm_in_flight():
            raise _cc_rejected(CC_DURING_REARM)
        # Stories added to the file since the sprint started: the update reads it, and checks them then.
        unseen = self._keys_not_seen(parsed)
        try:
            add, _ = self._cc_check(parsed.model_copy(update={"add_stories": [k for k in parsed.add_stories if k not in unseen]}))
            check_added_values(add, self._state.outside_stories)
        except CCRejected as err:
            raise _cc_rejected(str(err)) from None
        if (why := self._added_keys_problem(add)) is not None:  # (the validator only: one accepted before replays as it ran)
            raise _cc_rejected(why)

    def _keys_not_seen(self, request: CourseCorrectionRequest) -> list[str]:
        return keys_not_seen(request.add_stories, [*self._state.views, *self._state.outside_stories])

    def _added_keys_problem(self, add: list[str]) -> str | None:
        """CC_REJECTED for added keys too long for an answer, or sharing a number with a story of the sprint."""
        for key in add:
            if (why := story_key_too_long(key)) is not None:
                return f"CC_REJECTED: {why}"
        numbers = {short_key(key) for key in add}  # the added stories' own: two older ones sharing one are let be
        sharing = [key for key in self._state.views if short_key(key) in numbers]
        if add and (why := shared_numbers(dict.fromkeys([*sharing, *add]), SHARED_NUMBER_ADDED)):
            return f"CC_REJECTED: {why}"
        return None

    def _cc_check(self, request: CourseCorrectionRequest) -> tuple[list[str], list[str]]:
        s = self._state
        return check_request(
            request,
            {k: v.state for k, v in s.views.items()},
            [k for spec in s.queue for k in spec.stories],
            s.outside_stories,
            s.dropped_from,
            s.session_id,  # (a refusal's text only)
        )

    async def _apply_course_correction(self, request: CourseCorrectionRequest) -> CourseCorrection:
        s = self._state
        snapshot = None
        if unseen := self._keys_not_seen(request):  # (none in a correction accepted before: the validator refused)
            # Lines added to the file since the start: read, then checked as the validator checks the others.
            snapshot = await self._read_status_file()
            known = {*s.views, *s.outside_stories}
            s.outside_stories.update({m.key: m.state for m in snapshot.stories if m.key not in known})
        try:
            add, drop = self._cc_check(request)
            if unseen:
                check_added_values(add, s.outside_stories)
        except CCRejected as err:
            raise _cc_rejected(str(err)) from None
        if unseen and (why := self._added_keys_problem([k for k in add if k not in s.views])) is not None:
            raise _cc_rejected(why)
        metas = {}
        if add:
            snapshot = snapshot or await self._read_status_file()
            metas = {m.key: m for m in snapshot.stories}
            # Outside the sprint when it started, gone from the file since (removed or renamed by hand).
            if missing := [key for key in add if key not in metas]:
                raise _cc_rejected(f"CC_REJECTED: {', '.join(missing)} no longer in sprint-status.yaml")
            try:  # the value may have changed since the sprint started (the validator's)
                check_added_values(add, {key: metas[key].state for key in add})
            except CCRejected as err:
                if workflow.patched(PATCH_CC_KNOWN_VALUES):  # recorded only where it refuses
                    raise _cc_rejected(str(err)) from None
        note = dropped_note(request.reason, request.text)  # the story's error (state only: no command changes)
        if not workflow.patched(PATCH_CC_PLAN_FIRST):  # corrections started before: written, then planned
            for key in drop:
                current = await self._cc_write(key, s.views[key].state, StoryState.SKIPPED.value)
                self._put_view(key, s.views[key].model_copy(update={"state": current, "error": note, "batch_id": None}))
            for key in add:
                meta = metas[key]
                first = start_value(meta.state)
                if first is not None:
                    meta = meta.model_copy(update={"state": await self._cc_write(key, meta.state, first)})
                s.stories[key] = meta
                self._put_view(key, StoryView(state=meta.state))
                s.outside_stories.pop(key, None)
            cc = await self._replan_pending(request.reason, request.text, add, drop)
            if cc is None:
                raise _cc_rejected("CC_REJECTED: the pending stories cannot be re-planned")
        else:
            # Planned first, with the states the added stories will start from: a correction the planner
            # cannot plan (a dependency cycle) is rejected having changed nothing, in the file or the sprint.
            before = {key: (s.stories[key], s.views[key]) for key in add if key in s.views}  # dropped earlier
            for key in add:
                first = start_value(metas[key].state, s.dropped_from.get(key))
                s.stories[key] = metas[key].model_copy(update={"state": first}) if first is not None else metas[key]
                self._put_view(key, StoryView(state=s.stories[key].state))
            cc = await self._replan_pending(request.reason, request.text, add, drop)
            if cc is None:
                self._unadd(add, before)
                self._show()  # (details shown while the scrum-master planned counted the added stories)
                raise _cc_rejected("CC_REJECTED: the pending stories cannot be re-planned")
            # The added stories are written first (before any drop): one whose write fails (its line removed by
            # hand since the read) refuses the whole correction, the others' writes undone. Written after the
            # drops, it failed the update with the queue re-planned already, the added stories in it.
            adds_first = bool(add) and (not drop or workflow.patched(PATCH_CC_ADD_UNWRITTEN))
            if adds_first:
                replanned = (cc, self._replaced_queue, s.next_batch_id, len(s.course_corrections), len(s.corrections))

                def undo() -> None:
                    self._unplan(*replanned)
                    self._unadd(add, before)
                    self._show()  # (once the added stories are out: the details counted them)

                await self._cc_write_added(add, metas, undo)
            for key in drop:
                s.dropped_from[key] = s.views[key].state
                try:
                    current = await self._cc_write(key, s.views[key].state, StoryState.SKIPPED.value)
                    error = note
                except ActivityError as err:
                    if is_cancelled_exception(err) or not workflow.patched(PATCH_CC_DROP_UNWRITTEN):
                        raise
                    # Re-planned without it already: dropped all the same, and said (it failed the update, leaving
                    # the story in no batch, unskipped, and the stories after it dropped unwritten).
                    current, error = StoryState.SKIPPED.value, f"{note}; sprint-status.yaml not written: {err.cause or err}"
                    s.errors.append(f"course correction: {key} dropped, but sprint-status.yaml not written ({err.cause or err})")
                    workflow.logger.warning("course correction: %s dropped; its write failed: %s", key, err.cause or err)
                self._put_view(key, s.views[key].model_copy(update={"state": current, "error": error, "batch_id": None}))
            if not adds_first:  # (a correction adding and dropping, recorded before PATCH_CC_ADD_UNWRITTEN)
                await self._cc_write_added(add, metas, None)
        if drop:
            self._tell_dependants({key: s.views[key].state for key in drop}, None)
        return cc

    async def _cc_write_added(self, add: list[str], metas: dict[str, StoryMeta], undo: Callable[[], None] | None) -> None:
        """The added stories' start values written, in turn. With `undo` (the re-plan's and the additions' undoing
        in the sprint's state), one whose write fails for good refuses the correction: undone, the values written
        before it written back."""
        s = self._state
        dropped_from = {key: s.dropped_from[key] for key in add if key in s.dropped_from}
        outside = {key: s.outside_stories[key] for key in add if key in s.outside_stories}
        # (key, its value before, the value written, the epic lines the write rolled: entry -> (value set, before))
        written: list[tuple[str, str, str, dict[str, tuple[str, str]]]] = []
        for key in add:
            s.dropped_from.pop(key, None)
            if s.stories[key].state != metas[key].state:
                try:
                    result = await self._cc_write_result(key, metas[key].state, s.stories[key].state)
                except ActivityError as err:
                    if undo is None or is_cancelled_exception(err) or not workflow.patched(PATCH_CC_ADD_UNWRITTEN):
                        raise
                    why = f"{key} could not be written to sprint-status.yaml ({err.cause or err})"
                    s.dropped_from.update(dropped_from)
                    s.outside_stories.update(outside)
                    undo()
                    s.errors.append(f"course correction not applied: {why}")
                    workflow.logger.error("course correction not applied: %s", why)
                    await self._cc_write_back(written)
                    raise _cc_rejected(f"CC_REJECTED: {why}; nothing applied") from None
                if result.outcome == "written":
                    epics = {e: (v, result.epics_before[e]) for e, v in result.epic_changes.items() if e in result.epics_before}
                    written.append((key, metas[key].state, result.current, epics))
                s.stories[key] = s.stories[key].model_copy(update={"state": result.current})
                self._put_view(key, s.views[key].model_copy(update={"state": result.current}))
            s.outside_stories.pop(key, None)

    async def _cc_write_back(self, written: list[tuple[str, str, str, dict[str, tuple[str, str]]]]) -> None:
        """The values a refused correction wrote, written back (last first), with the epic lines their writes rolled
        (`epic-2: backlog` -> `in-progress`) where they still hold the value rolled to; one that cannot be is said."""
        for key, before, value, epics in reversed(written):
            try:
                await self._cc_write(key, value, before, epics)
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                self._state.errors.append(
                    f"course correction not applied, but {key} left {value!r} in sprint-status.yaml ({err.cause or err})"
                )

    def _unadd(self, add: list[str], before: dict[str, tuple[StoryMeta, StoryView]]) -> None:
        """The added stories out of the sprint again; one dropped earlier (`before`) stays in it, as it was."""
        s = self._state
        for key in add:
            if key in before:
                s.stories[key] = before[key][0]
                self._put_view(key, before[key][1])
            else:
                del s.stories[key]
                self._drop_view(key)

    def _unplan(
        self, cc: CourseCorrection, replaced: list[BatchSpec], next_batch_id: int, impacts: int, records: int
    ) -> None:
        """A re-plan undone: its batches out of the queue, the batches it `replaced` back with their stories (and a
        batch queued since, a budget stop's unstarted stories, kept), its record gone. `next_batch_id`, `impacts`
        and `records`: the next id and the lengths of the correction lists right after the re-plan."""
        s = self._state
        new = {spec.batch_id for spec in cc.batches}
        s.queue = [spec for spec in s.queue if spec.batch_id not in new] + list(replaced)
        for spec in replaced:
            for key in spec.stories:
                if s.views[key].batch_id in new:
                    self._put_view(key, s.views[key].model_copy(update={"batch_id": spec.batch_id}))
        if s.next_batch_id == next_batch_id:  # (no batch numbered since: its ids are given again)
            s.next_batch_id -= len(cc.batches)
        del s.course_corrections[impacts - 1]
        del s.corrections[records - 1]

    async def _read_status_file(self) -> StatusSnapshot:
        return await workflow.execute_activity(
            load_sprint_status,
            LoadStatusInput(project_root=self._project_root, status_file=self._state.status_file),
            summary="course correction: read sprint-status.yaml",
            **_WRITE,
        )

    async def _cc_write(self, key: str, expected: str, new: str, epics_back: dict[str, tuple[str, str]] | None = None) -> str:
        return (await self._cc_write_result(key, expected, new, epics_back)).current

    async def _cc_write_result(
        self, key: str, expected: str, new: str, epics_back: dict[str, tuple[str, str]] | None = None
    ) -> StatusWriteResult:
        written = await workflow.execute_activity(
            write_story_status,
            StatusWriteInput(
                project_root=self._project_root, status_file=self._state.status_file, story_key=key,
                expected=expected, new=new, epics_back=epics_back or {},
            ),
            summary=f"course correction {key}: {expected} -> {new}",
            **_WRITE,
        )
        if written.outcome == "cas-mismatch":
            self._state.errors.append(f"course correction: {key} was {written.current!r}, not {expected!r}; left as is")
        return written

    async def _replan_pending(
        self, reason: CCReason, text: str, added: list[str], dropped: list[str]
    ) -> CourseCorrection | None:
        """Re-plan the queued stories (and the added ones) into new batches: COURSE_CORRECTION, asked of the
        scrum-master resident (the Master's fallback without one). None when they cannot be planned."""
        s = self._state
        while True:
            old, first_batch_id = list(s.queue), s.next_batch_id
            pending = [k for spec in old for k in spec.stories if k not in dropped] + added
            ctx = ReplanContext(
                reason=reason,
                text=text,
                added=added,
                dropped=dropped,
                untouched_done=[k for k, v in s.views.items() if v.state == StoryState.DONE],
                in_flight=[  # still being worked on: a story of a running batch that has ended is not
                    k for k, v in s.views.items() if v.batch_id in self._running_batches and v.state not in TERMINAL_VALUES
                ],
                old_batches=old,
                next_batch_id=first_batch_id,
            )
            answer = await self._ask_planner([s.stories[k] for k in pending], ctx)
            cc = answer.course_correction
            if cc is None:
                s.errors.append(f"course correction not applied: {answer.error}")
                workflow.logger.error("course correction not applied: %s", answer.error)
                return None
            # No batch starts while `_replanning` is set, but a batch may be queued meanwhile: a rearm written
            # while the scrum-master planned, the unstarted stories of a batch that ran out of budget. Planned
            # without them, the new queue would drop them (and give their batch ids again): plan again.
            if (s.queue == old and s.next_batch_id == first_batch_id) or not workflow.patched(PATCH_REPLAN_SEES_QUEUED):
                break
            workflow.logger.info("the queue changed while the scrum-master planned: planning again")
        self._replaced_queue = old
        cc = cc.model_copy(update={"planner": answer.planner})
        s.next_batch_id += len(cc.batches)
        s.queue = list(cc.batches)
        for spec in cc.batches:
            for key in spec.stories:
                self._put_view(key, s.views[key].model_copy(update={"batch_id": spec.batch_id}))
        s.course_corrections.append(cc.impact)
        s.corrections.append(correction_record(cc))  # for the report: the note given with it, what it dropped
        workflow.logger.info("COURSE_CORRECTION by %s: %s", answer.planner, cc.impact)
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
                text = f"{count} stories in a row ended needs-intervention"
                reason = f"repeated failures: {text}; course_correct, then resume"
                self._forward("pause", reason)  # the running Slaves dispatch no more from now on
                if self._replanning and workflow.patched("master-one-replan-at-a-time"):
                    # A course correction is being applied: a second re-plan from the same queue would race it.
                    workflow.logger.info("repeated failures during a course correction: paused, no re-plan")
                    self._pause(reason)
                    return
                self._replanning = True  # and no batch starts until the re-plan is in
                self._auto_corrections.append(asyncio.create_task(self._auto_correct(text, reason)))

    async def _auto_correct(self, text: str, reason: str) -> None:
        """The Master's own repeated_failures course correction: re-planned by the scrum-master, then paused."""
        try:
            await self._replan_pending(CCReason.REPEATED_FAILURES, text, [], [])
        finally:
            self._replanning = False
        self._pause(reason)

    async def _course_corrections_settled(self) -> None:
        """Wait for the Master's own course corrections in progress (before the sprint ends or continues)."""
        if self._auto_corrections:
            pending, self._auto_corrections = self._auto_corrections, []
            await asyncio.gather(*pending)
