"""The Scrum Master's deterministic fallback plan: batches of `batch_size` in status-file order,
dependencies first (a story is never in the same batch as, or an earlier batch than, a story it
depends on)."""

from __future__ import annotations

from bso.messages import BatchPlanReady, BatchSpec
from bso.models import StoryMeta


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


def plan_batches(session_id: str, stories: list[StoryMeta], batch_size: int) -> BatchPlanReady:
    planned = {s.key for s in stories}
    by_key = {s.key: s for s in stories}
    batches: list[list[str]] = []
    batch_of: dict[str, int] = {}
    for story in dependency_order(stories):
        deps = [d for d in story.depends_on if d in planned]
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
        s.key: {"depends_on": [d for d in s.depends_on if d in planned]}
        for s in stories
        if any(d in planned for d in s.depends_on)
    }
    return BatchPlanReady(
        session_id=session_id,
        total_stories=len(stories),
        batches=[BatchSpec(batch_id=i + 1, stories=keys) for i, keys in enumerate(batches)],
        dependency_graph=graph,
    )
