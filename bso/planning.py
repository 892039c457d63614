"""The Scrum Master's deterministic plan: batches of `batch_size`, dependencies first (a story is never in
the same batch as, or an earlier batch than, a story it depends on)."""

from __future__ import annotations

from collections.abc import Iterable

from bso.messages import BatchPlanReady, BatchSpec
from bso.models import TERMINAL_VALUES, StoryMeta, StoryView


class PlanningError(ValueError):
    pass


def dependency_order(stories: list[StoryMeta]) -> list[StoryMeta]:
    """Stories topologically sorted on their planned dependencies, file order breaking ties."""
    planned = {s.key for s in stories}
    waiting_on = {s.key: [d for d in s.depends_on if d in planned and d != s.key] for s in stories}
    ordered: list[StoryMeta] = []
    placed: set[str] = set()
    remaining = list(stories)
    while remaining:
        ready = next((s for s in remaining if all(d in placed for d in waiting_on[s.key])), None)
        if ready is None:
            cycle = ", ".join(s.key for s in remaining)
            raise PlanningError(f"dependency cycle among stories: {cycle}")
        ordered.append(ready)
        placed.add(ready.key)
        remaining.remove(ready)
    return ordered


def shares_files(story: StoryMeta, others: list[StoryMeta]) -> bool:
    """P29: does `story` touch a file one of `others` touches (its story file's `Files:` line)?"""
    mine = set(story.files)
    return bool(mine) and any(mine.intersection(o.files) for o in others)


def still_on_its_files(view: StoryView | None, batch_id: int) -> bool:
    """Whether a story of running batch `batch_id` may still change the files it touches: it is not finished, or
    it is done and its branch is still being merged back (command backend: a worktree made meanwhile would miss
    that merge). A story rearmed into another batch since is that batch's (its view says which)."""
    if view is None:
        return True  # not heard of yet: as planned, unfinished
    if view.batch_id is not None and view.batch_id != batch_id:
        return False
    return view.state not in TERMINAL_VALUES or view.merging


def file_conflict(waiting: list[StoryMeta], running: dict[int, list[StoryMeta]]) -> str | None:
    """P29 across batches that run at once: why the batch of `waiting` must not start yet (one of its stories
    touches a file an unfinished story of a running batch touches), or None. `running`: batch id -> its
    unfinished stories."""
    for batch_id in sorted(running):
        for story in waiting:
            for other in running[batch_id]:
                shared = [path for path in story.files if path in other.files]
                if shared:
                    return f"{story.key} touches {shared[0]}, as {other.key} of running batch {batch_id} does"
    return None


def startable_batch(
    queued: Iterable[list[StoryMeta]], running: dict[int, list[StoryMeta]]
) -> tuple[int | None, list[tuple[int, str]]]:
    """Which queued batch may start now (its index, None: none) and why each queued batch before it waits
    (index, reason).

    A batch waits while one of its stories touches a file an unfinished story of a running batch touches
    (`running`: batch id -> its unfinished stories). A later batch goes ahead of waiting ones only when none of
    its stories depends on one of theirs: a started batch then never waits for a batch that has not started,
    so every wait ends. Where a running batch already waits for a queued story, nothing is held."""
    queued = [list(batch) for batch in queued]
    waiting_for_queue = {story.key for batch in queued for story in batch}
    if any(dep in waiting_for_queue for stories in running.values() for story in stories for dep in story.depends_on):
        # A running batch waits for a queued story (a budget pause queued its never-started stories again, and a
        # course correction may have re-planned them with others): a hold could wait for ever, so none.
        return (0, []) if queued else (None, [])
    ahead: set[str] = set()
    waits: list[tuple[int, str]] = []
    for index, batch in enumerate(queued):
        conflict = file_conflict(batch, running)
        behind = next(((story.key, dep) for story in batch for dep in story.depends_on if dep in ahead), None)
        if conflict is None and behind is None:
            return index, waits
        waits.append((index, conflict or f"{behind[0]} depends on {behind[1]}, of a batch that waits"))
        ahead.update(story.key for story in batch)
    return None, waits


def level_order(stories: list[StoryMeta]) -> list[StoryMeta]:
    """Stories by dependency level (0: depends on no planned story; else one more than its deepest dependency),
    dependency order breaking ties: every story that can start at once comes before any that waits."""
    planned = {s.key for s in stories}
    level: dict[str, int] = {}
    ordered = dependency_order(stories)
    for story in ordered:
        level[story.key] = max((level[d] + 1 for d in story.depends_on if d in planned and d != story.key), default=0)
    return sorted(ordered, key=lambda story: level[story.key])  # stable: ties keep the dependency order


def plan_batches(
    session_id: str, stories: list[StoryMeta], batch_size: int, concurrent_batches: int = 1
) -> BatchPlanReady:
    """Batches of at most `batch_size` stories. One batch at a time, they follow the file's order (dependencies
    first); with several at once, they follow the dependency levels, so no story that could start waits in its
    batch behind one that waits for another batch."""
    planned = {s.key for s in stories}
    by_key = {s.key: s for s in stories}
    batches: list[list[str]] = []
    batch_of: dict[str, int] = {}
    order = level_order(stories) if concurrent_batches > 1 else dependency_order(stories)
    for story in order:
        deps = [d for d in story.depends_on if d in planned and d != story.key]  # a story on itself: no wait
        current = batches[-1] if batches else None
        needs_new = (
            current is None
            or len(current) >= batch_size
            or any(batch_of[d] == len(batches) for d in deps)
            or shares_files(story, [by_key[k] for k in current])  # P29
        )
        if needs_new:
            batches.append([])
        batches[-1].append(story.key)
        batch_of[story.key] = len(batches)
    graph = {
        s.key: {"depends_on": deps}
        for s in stories
        if (deps := [d for d in s.depends_on if d in planned and d != s.key])
    }
    return BatchPlanReady(
        session_id=session_id,
        total_stories=len(stories),
        batches=[BatchSpec(batch_id=i + 1, stories=keys) for i, keys in enumerate(batches)],
        dependency_graph=graph,
    )


def batch_numbering_problem(batches: list[BatchSpec], first_id: int) -> str | None:
    """What is wrong with a plan's batches as the Master numbers them (ids from `first_id` on, one after another,
    each batch holding a story), or None. A buggy or hand-sent plan answer with ids twice or out of turn started
    two batches under one workflow id, or gave a later batch an id taken; an empty batch ran nothing."""
    expected = list(range(first_id, first_id + len(batches)))
    ids = [spec.batch_id for spec in batches]
    if ids != expected:
        return f"its batches are numbered {ids}, not {expected}"
    if empty := [spec.batch_id for spec in batches if not spec.stories]:
        return f"its batch {empty[0]} holds no story"
    return None


# A shutdown requested: said in status and the Web UI (the phase stays `running` until the running batches end).
SHUTTING_DOWN = "Shutting down: the running batches finish the story in hand; no new batch starts"


def history_hold(running: list[int], deciding: list[int]) -> str:
    """Why queued batches wait while the Master's history is long: it continues as new (a fresh history) only
    with nothing running, so no batch starts until the running ones end; one waiting for a decision holds all."""
    names = ", ".join(str(b) for b in running)
    text = (
        f"no new batch starts until batch{'es' if len(running) > 1 else ''} {names} "
        f"end{'s' if len(running) == 1 else ''}: the sprint's history is long, and it continues as new once "
        "nothing runs"
    )
    if deciding:
        text += f" (batch {', '.join(str(b) for b in deciding)} waits for your decision: `bso sprint decide`)"
    return text
