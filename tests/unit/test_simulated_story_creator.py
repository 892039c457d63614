"""The simulated story-creator's story file (activities/backends/simulated.py)."""

from __future__ import annotations

from pathlib import Path

from activities.backends import simulated
from bso.messages import TaskAssignment
from bso.sprint_status import parse_story_file
from bso.states import AgentMode, AgentType

KEY = "1-1-login"


def assignment(root: Path, mode: AgentMode, mode_round: int = 0) -> TaskAssignment:
    return TaskAssignment(
        dispatch_id=f"s1/batch-1/1-1/{mode_round + 1}", agent_type=AgentType.STORY_CREATOR, mode=mode,
        mode_round=mode_round, story_key=KEY, story_path=f"docs/stories/{KEY}.md", session_id="s1", batch_id=1,
        report_to="s1/batch-1", project_root=str(root), backend="simulated",
    )


def test_create_keeps_a_story_file_written_by_hand(tmp_path: Path):
    """docs/stories/1-1-login.md written by hand, its story in backlog: the simulated create wrote its own
    document over it. A story written is kept; a missing or empty file, or a stub of the lines the sprint reads
    (title, Status, Depends on, Tags, Files), is written (the stub's lines kept); revise rewrites."""
    story = tmp_path / "docs" / "stories" / f"{KEY}.md"
    story.parent.mkdir(parents=True)
    mine = "# Story 1.1: Login by e-mail\n\nStatus: backlog\n\n## Acceptance Criteria\n\n1. My own words\n"
    story.write_text(mine, encoding="utf-8")
    summary = simulated._write_story_doc(assignment(tmp_path, AgentMode.CREATE))
    assert story.read_text(encoding="utf-8") == mine
    assert summary == f"kept docs/stories/{KEY}.md (a story file is there already)"

    story.write_text(" \n", encoding="utf-8")  # empty: written
    assert simulated._write_story_doc(assignment(tmp_path, AgentMode.CREATE)) == f"wrote docs/stories/{KEY}.md"
    assert parse_story_file(story.read_text(encoding="utf-8")).status == "story-doc-review"

    story.unlink()  # missing: written
    assert simulated._write_story_doc(assignment(tmp_path, AgentMode.CREATE)) == f"wrote docs/stories/{KEY}.md"

    stub = "# Story 1.1: Login Form\n\nStatus: backlog\nDepends on: 1-0\n\nFiles:\n- src/login.py\n"
    story.write_text(stub, encoding="utf-8")  # a stub: written, from its lines
    assert simulated._write_story_doc(assignment(tmp_path, AgentMode.CREATE)) == f"wrote docs/stories/{KEY}.md"
    info = parse_story_file(story.read_text(encoding="utf-8"))
    assert (info.title, info.depends_on, info.files) == ("Login Form", ["1-0"], ["src/login.py"])
    assert "## Acceptance Criteria" in story.read_text(encoding="utf-8")
    for written in (mine, "Notes: the login must also work offline.\n", "# Login\n"):  # anything else: kept
        story.write_text(written, encoding="utf-8")
        assert simulated._write_story_doc(assignment(tmp_path, AgentMode.CREATE)).startswith("kept ")
        assert story.read_text(encoding="utf-8") == written

    story.write_text(mine, encoding="utf-8")  # revise: the creator's to rewrite, its title kept
    summary = simulated._write_story_doc(assignment(tmp_path, AgentMode.REVISE, mode_round=1))
    assert summary == f"wrote docs/stories/{KEY}.md (revision 1)"
    assert parse_story_file(story.read_text(encoding="utf-8")).title == "Login by e-mail"
