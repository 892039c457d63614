"""bso.decisions: where a rearmed story's batch goes in the queue."""

from __future__ import annotations

from bso.decisions import rearm_position
from bso.messages import BatchSpec
from bso.models import StoryMeta


def meta(key: str, *depends_on: str) -> StoryMeta:
    return StoryMeta(key=key, epic="epic-1", short_key=key[:3], state="backlog", story_path=f"s/{key}.md",
                     depends_on=list(depends_on))


STORIES = {m.key: m for m in (meta("1-1-a"), meta("1-2-b", "1-1-a"), meta("1-3-c", "1-2-b"), meta("1-4-d"))}


def test_before_the_first_queued_batch_with_a_dependant():
    queue = [BatchSpec(batch_id=2, stories=["1-4-d"]), BatchSpec(batch_id=3, stories=["1-2-b", "1-3-c"])]
    assert rearm_position(queue, "1-1-a", STORIES) == 1


def test_at_the_end_when_nothing_queued_depends_on_it():
    queue = [BatchSpec(batch_id=2, stories=["1-4-d"]), BatchSpec(batch_id=3, stories=["1-3-c"])]
    assert rearm_position(queue, "1-1-a", STORIES) == 2  # 1-3-c depends on 1-2-b, not directly on 1-1-a
    assert rearm_position([], "1-1-a", STORIES) == 0


def test_after_the_queued_batches_of_what_it_depends_on():
    """1-2-b (rearmed) depends on 1-1-a, queued in batch 3 behind 1-3-c's batch 2 (a dependant of 1-2-b): it
    goes after batch 3, not ahead of it, where it would wait for 1-1-a."""
    queue = [BatchSpec(batch_id=2, stories=["1-3-c"]), BatchSpec(batch_id=3, stories=["1-1-a"])]
    assert rearm_position(queue, "1-2-b", STORIES) == 2
