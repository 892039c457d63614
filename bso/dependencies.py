"""Dependencies between stories across parallel batches, as pure rules.

A story never starts before the stories it depends on are done: the Slave waits (it does not fail) while a
dependency is still on its way; when a dependency ends in needs-intervention or skipped (or its batch ended
without finishing it), the dependant is skipped with that reason. Also the dependency graph's critical
path, against which a plan's makespan is measured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bso.dispatch import Outcome, Transition
from bso.models import TERMINAL_VALUES, StoryMeta, StoryProgress, StoryView
from bso.states import StoryState

# A dependency whose batch ended without bringing it to a terminal state (shutdown, budget, crash).
UNFINISHED = "unfinished"
# The Slave ignores what a DEPENDENCY_UPDATE says of a story none of its stories depends on and records the update
# as rejected (a hand-sent one: the Master names only their dependencies). Before, such a state was kept, never
# read, and nobody told.
PATCH_DEPENDENCY_UPDATE_CHECKED = "slave-dependency-update-checked"
# A dependency done whose branch is still being merged back (command backend): its dependants wait, since a
# worktree made before the merge lands would lack its work.
MERGING = "merging"


def state_for_dependants(view: StoryView, pending: bool) -> str:
    """A planned story's state as its dependants see it; `pending`: its batch runs or is queued."""
    if view.merging and pending:
        return MERGING
    if view.state in TERMINAL_VALUES or pending:
        return view.state
    return f"{UNFINISHED}:{view.state}"


@dataclass(frozen=True)
class DependencyCheck:
    ready: bool  # every dependency is done
    blocked_by: tuple[str, str] | None = None  # (dependency, its final state) when one will never be done
    waiting_for: tuple[str, ...] = ()


def checked_dependency_update(states: dict[str, str], stories: list[StoryMeta]) -> tuple[dict[str, str], str | None]:
    """A DEPENDENCY_UPDATE to the batch of `stories`, checked: the states it gives for their dependencies, and
    why the rest is ignored (None when it names only their dependencies, as the Master's do)."""
    wanted = {dep for meta in stories for dep in meta.depends_on}
    unknown = sorted(key for key in states if key not in wanted)
    if not unknown:
        return states, None
    named = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    taken = {key: state for key, state in states.items() if key in wanted}
    depends_on = ", ".join(sorted(wanted)) or "none"
    return taken, f"ignored for stories no story of this batch depends on: {named} (it depends on: {depends_on})"


def never_done(state: str) -> bool:
    """A dependency in `state` (as state_for_dependants gives it) will not be done in this sprint: its
    dependants are skipped."""
    return state in (StoryState.NEEDS_INTERVENTION, StoryState.SKIPPED) or state.startswith(UNFINISHED)


def dependencies_waited_for(
    running: Iterable[tuple[str, StoryView]], views: Mapping[str, StoryView], stories: Mapping[str, StoryMeta]
) -> dict[str, list[str]]:
    """The running batches' stories no agent works on yet, with their planned dependencies still on their way:
    what each waits for (or will, once its batch reaches it). Status shows it: such a story looked merely idle."""
    waits: dict[str, list[str]] = {}
    for key, view in running:
        if view.state in TERMINAL_VALUES or view.in_flight or view.agents_dispatched or key not in stories:
            continue
        # (one that failed is not waited for: the story is skipped when its batch reaches it)
        pending = [dep for dep in stories[key].depends_on if dep in views and views[dep].state not in TERMINAL_VALUES]
        if pending:
            waits[key] = pending
    return waits


def check_dependencies(depends_on: list[str], states: dict[str, str]) -> DependencyCheck:
    """Where `depends_on` stands, given the known `states` (keys absent from `states` are not planned in
    this sprint and do not count)."""
    waiting: list[str] = []
    for dep in depends_on:
        if dep not in states:
            continue
        state = states[dep]
        if state == StoryState.DONE:
            continue
        if never_done(state):
            return DependencyCheck(ready=False, blocked_by=(dep, state))
        waiting.append(dep)
    return DependencyCheck(ready=not waiting, waiting_for=tuple(waiting))


_SKIPPED_FOR = re.compile(r"dependency (\S+) ended \S+: story skipped")


def skipped_for_dependency(progress: StoryProgress, dependency: str, dep_state: str) -> Transition:
    reason = f"dependency {dependency} ended {dep_state}: story skipped"
    return Transition(
        progress.model_copy(update={"state": StoryState.SKIPPED.value, "error": reason}),
        Outcome.SKIPPED,
        reason,
    )


def skipped_for(view: StoryView) -> str | None:
    """The dependency a skipped story was skipped for (skipped_for_dependency's reason), or None: skipped for
    another reason (a course correction, a human decision), or not skipped."""
    if view.state != StoryState.SKIPPED or view.error is None:
        return None
    match = _SKIPPED_FOR.fullmatch(view.error)
    return match.group(1) if match else None


def critical_path(stories: list[StoryMeta], cost: dict[str, float]) -> tuple[float, list[str]]:
    """The longest chain of planned dependencies, weighted by each story's `cost`: no schedule can finish
    the stories sooner than its length."""
    planned = {s.key for s in stories}
    finish: dict[str, tuple[float, list[str]]] = {}

    def longest(key: str, seen: tuple[str, ...]) -> tuple[float, list[str]]:
        if key in finish:
            return finish[key]
        if key in seen:
            raise ValueError(f"dependency cycle through {key}")
        meta = next(s for s in stories if s.key == key)
        best: tuple[float, list[str]] = (0.0, [])
        for dep in meta.depends_on:
            if dep in planned:
                candidate = longest(dep, (*seen, key))
                if candidate[0] > best[0]:
                    best = candidate
        finish[key] = (best[0] + cost.get(key, 0.0), [*best[1], key])
        return finish[key]

    result: tuple[float, list[str]] = (0.0, [])
    for story in stories:
        candidate = longest(story.key, ())
        if candidate[0] > result[0]:
            result = candidate
    return result
