"""Human decisions on a story, as pure rules.

A story waits for a decision when its story review rounds are exhausted and `story_review_fallback` is
`ask_user`; an operator answers with the `decide` update (on the Slave, or on the Master, which forwards it).
A story that ended in needs-intervention (or skipped) can be re-armed the same way (`rearm`, to a chosen state), through
the Master, which starts a new batch for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from bso.dispatch import Outcome, Transition, intervention
from bso.messages import BatchSpec
from bso.dependencies import skipped_for
from bso.models import StoryMeta, StoryProgress, StoryView, short_key
from bso.planning import dependency_order
from bso.states import StoryState


class Decision(StrEnum):
    FORCE_PASS = "force_pass"  # the story doc is accepted as it is: ready-for-dev
    SKIP_STORY = "skip_story"  # the story is skipped for this sprint
    RETRY = "retry"  # the story doc is revised again, with fresh story-review rounds
    REARM = "rearm"  # a needs-intervention story goes back to `state` (Master only)


# Decisions that answer a story waiting for one; `rearm` answers a needs-intervention story instead.
WAITING_DECISIONS = (Decision.FORCE_PASS, Decision.SKIP_STORY, Decision.RETRY)

# The states a needs-intervention story may be re-armed to: any state the dispatch table has a row for.
REARM_STATES = (
    StoryState.BACKLOG,
    StoryState.STORY_DOC_IMPROVED,
    StoryState.STORY_DOC_REVIEW,
    StoryState.READY_FOR_DEV,
    StoryState.REVIEW,
    StoryState.E2E_VERIFY,
    StoryState.NEEDS_FIX,
)
REARM_STATE_VALUES = tuple(state.value for state in REARM_STATES)


class DecisionRequest(BaseModel):
    """The `decide` update's argument."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    story_key: str = Field(min_length=1)
    decision: Decision
    state: StoryState | None = None  # rearm only: where the story starts again (default ready-for-dev)
    note: str = Field("", max_length=2000)

    def rearm_state(self) -> StoryState:
        return self.state or StoryState.READY_FOR_DEV


class DecisionError(ValueError):
    """A decision that cannot be applied; the message says why (the update is rejected)."""


def check_waiting_decision(request: DecisionRequest, progress: StoryProgress | None) -> None:
    """Raise DecisionError unless `request` answers a story that is waiting for a decision."""
    if request.decision not in WAITING_DECISIONS:
        raise DecisionError(
            f"decision {request.decision.value!r} does not answer a waiting story; use one of: "
            + ", ".join(d.value for d in WAITING_DECISIONS)
        )
    if progress is None:
        raise DecisionError(f"unknown story {request.story_key!r}")
    if not progress.awaiting_decision:
        raise DecisionError(f"story {request.story_key!r} is not awaiting a decision (state {progress.state})")


def check_rearm(request: DecisionRequest, view: StoryView | None, still_failed: Callable[[str], bool]) -> None:
    """A rearm is for a needs-intervention story, or a skipped one, to a state with a dispatch-table row. Its batch
    may still run: its Slave is done with the story (both states are final there), so the rearm's batch is queued
    and runs once a Slave is free, before the sprint ends. A story skipped for a dependency that `still_failed`
    (it will not be done in this sprint) would be skipped again at once: that dependency is the one to rearm; a
    story a course correction dropped comes back by a course correction."""
    key = request.story_key
    if view is None:
        raise DecisionError(f"unknown story {key!r}")
    if view.state == StoryState.SKIPPED:
        if (dependency := skipped_for(view)) is not None and still_failed(dependency):
            raise DecisionError(
                f"story {key!r} was skipped because {dependency} will not be done: rearm {dependency} "
                "(the stories skipped for it come back with it)"
            )
        if view.batch_id is None:
            raise DecisionError(
                f"story {key!r} was dropped by a course correction: add it back with a course correction "
                "(`bso sprint cc ID --add KEY`)"
            )
    elif view.state != StoryState.NEEDS_INTERVENTION:
        raise DecisionError(
            f"story {key!r} is {view.state}, not needs-intervention or skipped: nothing to rearm"
        )
    if (why := cannot_rearm_to(request.rearm_state().value)) is not None:
        raise DecisionError(why)


def rearm_hint(session_id: str, key: str, state: str) -> str:
    """How to run a needs-intervention story again in its sprint, for a refusal of another way (a `retry`, a
    course correction adding it): a rearm, the one way. Empty for a story in another state."""
    if state != StoryState.NEEDS_INTERVENTION:
        return ""
    return f"; to run it again in this sprint: bso sprint decide {session_id} {short_key(key)} rearm [--state STATE]"


def cannot_rearm_to(state: str) -> str | None:
    """Why a rearm cannot take a story to `state` (no dispatch-table row for it), or None."""
    return None if state in REARM_STATE_VALUES else f"cannot rearm to {state!r}; use one of: {', '.join(REARM_STATE_VALUES)}"


def rearm_position(queue: list[BatchSpec], story_keys: str | list[str], stories: Mapping[str, StoryMeta]) -> int:
    """Where a rearmed batch (its story, and the dependants that come back with it) goes in the queue: before
    the first queued batch holding a story that depends on one of them (that batch would wait for it, and with
    one Slave at a time hold up everything behind it), at the end when none does; and in any case after the
    queued batches holding what they depend on themselves."""
    keys = [story_keys] if isinstance(story_keys, str) else story_keys
    own = {dep for key in keys if key in stories for dep in stories[key].depends_on}
    after_own = max((i + 1 for i, spec in enumerate(queue) if own.intersection(spec.stories)), default=0)
    for position, spec in enumerate(queue):
        if any(key in stories[other].depends_on for other in spec.stories if other in stories for key in keys):
            return max(position, after_own)
    return len(queue)


def dependants_brought_back(
    story_key: str, views: Mapping[str, StoryView], stories: Mapping[str, StoryMeta]
) -> list[str]:
    """The stories skipped because `story_key` would never be done, directly or through one another (each
    skipped for a dependency among these), in dependency order: a rearm of `story_key` brings them back with it,
    in its batch (a rearm could not take a skipped story, nor a course correction one of the sprint's own)."""
    return _in_dependency_order(_skipped_through({story_key}, views, stories) - {story_key}, stories)


def skipped_for_stories_pending_again(
    ended: Iterable[str],
    views: Mapping[str, StoryView],
    stories: Mapping[str, StoryMeta],
    blocks: Callable[[str], bool],
) -> list[str]:
    """The stories of an ended batch it skipped for a dependency that no longer `blocks` them (a rearm made it
    pending again after the batch had seen it fail: the story sat behind another, or its skip was on its way),
    with the stories skipped for them in turn, in dependency order: they come back as the rearm's own do."""
    roots = {
        key for key in ended
        if key in views and (dependency := skipped_for(views[key])) in views and not blocks(dependency)
    }
    return _in_dependency_order(_skipped_through(roots, views, stories), stories) if roots else []


def _skipped_through(causes: set[str], views: Mapping[str, StoryView], stories: Mapping[str, StoryMeta]) -> set[str]:
    """`causes` and every story skipped for one of them, directly or through one another."""
    found = set(causes)
    grew = True
    while grew:
        grew = False
        for key, view in views.items():
            if key not in found and key in stories and skipped_for(view) in found:
                found.add(key)
                grew = True
    return found


def _in_dependency_order(keys: set[str], stories: Mapping[str, StoryMeta]) -> list[str]:
    return [meta.key for meta in dependency_order([m for k, m in stories.items() if k in keys])]


def apply_decision(progress: StoryProgress, request: DecisionRequest) -> Transition:
    """The story's progress once a human answered its waiting decision."""
    base = {"awaiting_decision": None, "error": None}
    note = f" ({request.note})" if request.note else ""
    if request.decision is Decision.FORCE_PASS:
        return Transition(
            progress.model_copy(update={**base, "state": StoryState.READY_FOR_DEV.value}),
            Outcome.ADVANCED,
            f"decision force_pass -> ready-for-dev{note}",
        )
    if request.decision is Decision.SKIP_STORY:
        return Transition(
            progress.model_copy(
                update={**base, "state": StoryState.SKIPPED.value, "error": f"skipped by a human decision{note}"}
            ),
            Outcome.SKIPPED,
            f"decision skip_story -> skipped{note}",
        )
    if request.decision is Decision.RETRY:
        return Transition(
            progress.model_copy(
                update={**base, "state": StoryState.STORY_DOC_IMPROVED.value, "story_review_rounds": 0}
            ),
            Outcome.ADVANCED,
            f"decision retry -> story-doc-improved, story review rounds reset{note}",
        )
    raise DecisionError(f"decision {request.decision.value!r} does not answer a waiting story")


def decision_timed_out(progress: StoryProgress, seconds: int) -> Transition:
    return intervention(
        progress.model_copy(update={"awaiting_decision": None}),
        f"no human decision within decision_timeout_seconds ({seconds}s): {progress.awaiting_decision}",
    )
