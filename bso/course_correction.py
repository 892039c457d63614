"""Course correction (CC_TRIGGER -> COURSE_CORRECTION | CC_REJECTED), as pure rules.

A `course_correct` update on the Master (or the Master itself after `consecutive_failure_threshold`
stories in a row ended needs-intervention) changes the sprint mid-way: done stories are untouched, stories
of running batches finish, the pending ones (queued batches) are re-planned with batch ids continuing after
the last one; dropped stories become `skipped` in the status file, added ones join the plan (a story whose
value has no dispatch-table row, e.g. skipped, is written `backlog` first). A story dropped earlier in the
sprint may be added again: it takes back the value it had.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.decisions import rearm_hint
from bso.dispatch import DISPATCH_TABLE, normalize_state, unknown_values, unknown_values_message
from bso.messages import BatchSpec, cut_text
from bso.models import CorrectionRecord, StoryMeta
from bso.planning import plan_batches
from bso.sprint_status import SHORT_KEY_RE, STORY_KEY_RE, StoryKeyError, resolve_story_keys
from bso.states import StoryState
from bso.terminal_text import printable


class CCReason(StrEnum):
    USER_REQUEST = "user_request"
    REPEATED_FAILURES = "repeated_failures"
    NEW_REQUIREMENTS = "new_requirements"


class CourseCorrectionRequest(BaseModel):
    """CC_TRIGGER: the `course_correct` update's argument."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: CCReason
    add_stories: list[str] = Field(default_factory=list)
    drop_stories: list[str] = Field(default_factory=list)
    text: str = Field("", max_length=4000)


class CourseCorrection(BaseModel):
    """COURSE_CORRECTION: the impact analysis and the new plan of the pending stories."""

    model_config = ConfigDict(extra="forbid")

    msg_type: Literal["COURSE_CORRECTION"] = "COURSE_CORRECTION"
    reason: CCReason
    text: str = ""
    added: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    untouched_done: list[str] = Field(default_factory=list)
    in_flight: list[str] = Field(default_factory=list)  # stories of running batches: they finish as planned
    replanned: list[str] = Field(default_factory=list)
    batches: list[BatchSpec] = Field(default_factory=list)  # the new plan of the pending stories
    impact: str = ""
    planner: str = ""  # who re-planned: "scrum-master" (the resident) or "fallback" (the Master itself)


class CCRejected(ValueError):
    """CC_REJECTED: the message says why."""


def resolve_keys(requested: list[str], known: list[str], what: str) -> list[str]:
    if not requested:
        return []
    try:
        return resolve_story_keys(requested, known)
    except ValueError as err:
        raise CCRejected(f"CC_REJECTED: {what}: {err}") from None


def check_request(
    request: CourseCorrectionRequest,
    sprint_states: dict[str, str],
    pending: list[str],
    outside: dict[str, str],
    dropped: Collection[str] = (),
    session_id: str | None = None,
) -> tuple[list[str], list[str]]:
    """The full keys to add and to drop; CCRejected when the correction cannot be applied.

    `sprint_states`: the sprint's stories and their state; `pending`: those in queued batches (not started);
    `outside`: stories of the status file not in the sprint, with their value; `dropped`: the sprint's stories an
    earlier correction dropped; `session_id`: the sprint's, for a refusal's hint (a needs-intervention story added
    runs again by a rearm)."""
    drop = resolve_keys(request.drop_stories, [*sprint_states, *outside], "drop_stories")
    add = resolve_keys(request.add_stories, [*sprint_states, *outside], "add_stories")
    for key in drop:
        if key not in sprint_states:
            raise CCRejected(f"CC_REJECTED: {key} is not in this sprint: nothing to drop")
        if sprint_states[key] == StoryState.DONE:
            raise CCRejected(f"CC_REJECTED: {key} is done: done stories are untouched")
        if key not in pending:
            raise CCRejected(f"CC_REJECTED: {key} is in a running batch or has ended: it finishes as planned")
    for key in add:
        # A story an earlier correction dropped may come back (one skipped otherwise may be in a running batch).
        if key in sprint_states and not (key in dropped and sprint_states[key] == StoryState.SKIPPED):
            hint = rearm_hint(session_id, key, sprint_states[key]) if session_id else ""
            raise CCRejected(f"CC_REJECTED: {key} is already in this sprint{hint}")
        if outside.get(key) == StoryState.DONE:
            raise CCRejected(f"CC_REJECTED: {key} is done already")
    if set(add) & set(drop):
        raise CCRejected("CC_REJECTED: a story cannot be both added and dropped")
    return add, drop


def keys_not_seen(requested: list[str], known: list[str]) -> list[str]:
    """The keys to add that name no story the sprint knows yet but are story keys: lines added to the status file
    since the sprint started (BMAD's create-story adds them), which the Master reads the file for before it
    checks the correction (a key still unknown then is refused, named)."""
    unseen = []
    for key in requested:
        try:
            resolve_story_keys([key], known)
        except StoryKeyError:
            if STORY_KEY_RE.match(key.strip()) or SHORT_KEY_RE.match(key.strip()):
                unseen.append(key)
    return unseen


def check_added_values(add: list[str], values: dict[str, str]) -> None:
    """CCRejected when an added story's status-file value is no state BSO knows (a typo such as `wip`):
    written `backlog` over, what the user meant would be lost. Known end states are reset (`start_value`)."""
    if unknown := unknown_values(values, add):
        raise CCRejected(f"CC_REJECTED: {unknown_values_message(unknown, 'fix the file, then add the story')}")


def start_value(file_value: str, before_drop: str | None = None) -> str | None:
    """The value to write for an added story before it runs, or None to keep its value. A story an earlier
    correction dropped (`before_drop`: its value then) that is still `skipped` takes that value back: written
    `backlog`, it would have its story document, code and review done again."""
    state = normalize_state(file_value)
    if before_drop is not None and state is StoryState.SKIPPED and normalize_state(before_drop) in DISPATCH_TABLE:
        return before_drop
    if state is None or state in (StoryState.SKIPPED, StoryState.NEEDS_INTERVENTION, StoryState.DONE):
        return StoryState.BACKLOG.value
    return None


def replan(
    session_id: str, pending: list[StoryMeta], batch_size: int, next_batch_id: int, concurrent_batches: int = 1
) -> list[BatchSpec]:
    """The pending stories in new batches (dependencies first, P29), numbered from `next_batch_id`."""
    plan = plan_batches(session_id, pending, batch_size, concurrent_batches)
    return [BatchSpec(batch_id=next_batch_id + i, stories=list(b.stories)) for i, b in enumerate(plan.batches)]


def impact_text(cc: CourseCorrection, old_batches: list[BatchSpec]) -> str:
    before = "; ".join(f"{b.batch_id}: {', '.join(b.stories)}" for b in old_batches) or "none"
    after = "; ".join(f"{b.batch_id}: {', '.join(b.stories)}" for b in cc.batches) or "none"
    return (
        f"{cc.reason.value}: {len(cc.added)} added, {len(cc.dropped)} dropped (skipped), "
        f"{len(cc.untouched_done)} done untouched, {len(cc.in_flight)} in flight finish as planned, "
        f"{len(cc.replanned)} pending re-planned. Pending batches before: {before}. After: {after}."
    )


# The note shown with a dropped story (its error): the correction's whole note is in the report's record of it.
DROPPED_NOTE_CHARS = 300


def dropped_note(reason: CCReason | str, text: str) -> str:
    """Why a story a course correction dropped is skipped: the correction's reason and the note given with it."""
    reason = reason.value if isinstance(reason, CCReason) else reason
    note = printable(" ".join(text.split()))  # on one line, a NUL or an ESC shown as its escape
    return f"dropped by course correction ({reason})" + (f": {cut_text(note, DROPPED_NOTE_CHARS)}" if note else "")


def correction_record(cc: CourseCorrection) -> CorrectionRecord:
    """A course correction as the sprint's report keeps it."""
    return CorrectionRecord(
        reason=cc.reason.value, text=cc.text, added=list(cc.added), dropped=list(cc.dropped),
        batches=list(cc.batches), impact=cc.impact, planner=cc.planner,
    )


def dropped_stories(corrections: list[CorrectionRecord]) -> dict[str, str]:
    """The stories the sprint's course corrections left dropped, and why (`dropped_note`): a story a later
    correction added again is not."""
    dropped: dict[str, str] = {}
    for cc in corrections:
        for key in cc.added:
            dropped.pop(key, None)
        for key in cc.dropped:
            dropped[key] = dropped_note(cc.reason, cc.text)
    return dropped
