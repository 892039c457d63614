"""An epic is not written `done` over a story skipped (its dependency failed: never implemented): BMAD and the
BSO reference roll an epic up to done "when all its stories are done". An epic done already stays done when a
story of it is skipped (a course correction dropped it).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bso.sprint_status import apply_story_transition

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


@pytest.mark.parametrize("fast", [True, False], ids=["bmad-layout", "yaml-path"])
def test_an_epic_with_a_skipped_story_is_not_written_done(fast: bool) -> None:
    text = "development_status:\n  epic-2: in-progress\n  2-1-a: ready-for-dev\n  2-2-b: done\n  2-2a-c: done\n"
    if not fast:
        text = text.replace("epic-2: in-progress", "epic-2: 'in-progress'")  # quoted: the YAML path
    r = apply_story_transition(text, "2-1", "ready-for-dev", "skipped", NOW, "sprint-status.yaml")
    assert r.outcome == "written"
    assert r.epic_changes.get("epic-2") != "done", r.text


@pytest.mark.parametrize("fast", [True, False], ids=["bmad-layout", "yaml-path"])
def test_an_epic_of_done_and_skipped_stories_is_rolled_up_by_no_write(fast: bool) -> None:
    """Nor by the roll-up of an epic finished by hand (another story's write), nor a backlog epic's first write."""
    text = (
        "development_status:\n  epic-1: in-progress\n  1-1-a: done\n  1-2-b: skipped\n"
        "  epic-2: in-progress\n  2-1-c: ready-for-dev\n  epic-3: backlog\n  3-1-d: skipped\n  3-2-e: review\n"
    )
    if not fast:
        text = text.replace("epic-2: in-progress", "epic-2: 'in-progress'")
    r = apply_story_transition(text, "2-1", "ready-for-dev", "in-progress", NOW, "sprint-status.yaml")
    assert r.outcome == "written" and r.epic_changes == {}, r.text
    r = apply_story_transition(text, "3-2", "review", "done", NOW, "sprint-status.yaml")
    assert r.epic_changes == {"epic-3": "in-progress"}, r.text


@pytest.mark.parametrize("fast", [True, False], ids=["bmad-layout", "yaml-path"])
def test_a_done_epic_stays_done_when_a_story_of_it_is_skipped(fast: bool) -> None:
    text = "development_status:\n  epic-2: done\n  2-1-a: done\n  2-2-b: done\n"
    if not fast:
        text = text.replace("epic-2: done", "epic-2: 'done'")
    r = apply_story_transition(text, "2-2", "done", "skipped", NOW, "sprint-status.yaml")
    assert r.outcome == "written" and r.epic_changes == {}, r.text
