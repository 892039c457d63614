"""The improvement cycle's pure rules and the byte-preserving insertion of a story into the status file."""

from __future__ import annotations

import pytest

from bso.improvements import improvement_story_keys, insert_after, last_epic, select_improvements
from bso.messages import ImprovementRequestedPayload
from bso.sprint_status import StatusFileError, StoryKeyError, insert_story_entry, parse_status_text


def proposal(improvement_id: str, score: float) -> ImprovementRequestedPayload:
    return ImprovementRequestedPayload(improvement_id=improvement_id, description=f"do {improvement_id}",
                                       priority_score=score)


def test_select_top_by_priority_score() -> None:
    proposals = [proposal("imp_001", 8.5), proposal("imp_002", 9.1), proposal("imp_003", 8.5)]
    assert [p.improvement_id for p in select_improvements(proposals, 1)] == ["imp_002"]
    assert [p.improvement_id for p in select_improvements(proposals, 2)] == ["imp_002", "imp_001"]  # ties: order
    assert select_improvements(proposals, 0) == []
    assert len(select_improvements([*proposals, proposal("imp_002", 1.0)], 10)) == 3  # one per id


def test_priority_score_is_bounded() -> None:
    with pytest.raises(ValueError):
        proposal("imp_x", 11)


def test_story_keys_follow_the_epic() -> None:
    existing = ["1-1-a", "1-2-b", "2-1-c", "2-2a-d"]
    assert last_epic(existing) == 2
    assert improvement_story_keys([proposal("imp_001", 1), proposal("Cache Layer!", 1)], existing, 2) == [
        "2-3-imp-001",
        "2-4-imp-cache-layer",
    ]
    assert insert_after(existing, 2) == "2-2a-d" and insert_after(existing, 3) is None


TEXT = """development_status:
  epic-1: in-progress   # keep me
  1-1-login: done
  1-2-logout: done  # a comment
  epic-1-retrospective: optional
"""


def test_insert_story_entry_touches_one_line() -> None:
    out = insert_story_entry(TEXT, "1-2-logout", "1-3-imp-001", "ready-for-dev", "s.yaml")
    assert out == TEXT.replace("  # a comment\n", "  # a comment\n  1-3-imp-001: ready-for-dev\n")
    assert [e.key for e in parse_status_text(out, "s").entries][-2:] == ["1-3-imp-001", "epic-1-retrospective"]
    crlf = TEXT.replace("\n", "\r\n")
    assert insert_story_entry(crlf, "1-2-logout", "1-3-x", "backlog", "s") == crlf.replace(
        "comment\r\n", "comment\r\n  1-3-x: backlog\r\n"
    )
    no_final_newline = TEXT.rstrip("\n")
    assert insert_story_entry(no_final_newline, "epic-1-retrospective", "1-3-x", "backlog", "s").endswith(
        "optional\n  1-3-x: backlog"
    )


def test_insert_story_entry_refuses() -> None:
    with pytest.raises(StatusFileError):
        insert_story_entry(TEXT, "1-2-logout", "1-1-login", "done", "s")  # already there
    with pytest.raises(StatusFileError):
        insert_story_entry(TEXT, "9-9-nope", "1-3-x", "done", "s")
    with pytest.raises(StoryKeyError):
        insert_story_entry(TEXT, "1-2-logout", "not-a-key", "done", "s")
    with pytest.raises(StatusFileError):
        insert_story_entry(TEXT, "1-2-logout", "1-3-x", "two words", "s")
