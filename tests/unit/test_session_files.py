"""Where BSO keeps a sprint's scratch files (activities.session_files.session_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.session_files import SESSION_DIR, session_dir_problem, session_path


def test_a_project_moved_away_mid_sprint_is_not_made_again(tmp_path: Path) -> None:
    """The worker made the moved project's folder again, empty, and wrote the sprint's files there; moved back,
    the project landed inside it. Its absence is now a retried error, and once it is back the files go in it."""
    root = tmp_path / "project"
    with pytest.raises(ApplicationError, match="is gone \\(moved or deleted\\?\\): put it back") as raised:
        session_path(str(root), "dispatches", "d.json")
    assert not raised.value.non_retryable and raised.value.type == "ProjectRootMissing"
    assert not root.exists()
    root.mkdir()
    assert session_path(str(root), "dispatches", "d.json") == root / SESSION_DIR / "dispatches" / "d.json"
    assert (root / SESSION_DIR / "dispatches").is_dir()


def test_a_session_folder_linked_out_of_the_project_mid_sprint_is_never_written_through(tmp_path: Path) -> None:
    """Checked only at the start: a .sprint-session replaced by a link out of the project while the sprint ran had
    its agents' files written wherever it pointed. Each write refuses it now, as the start does."""
    root, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    assert session_path(str(root), "dispatches", "d.json").parent.is_dir()
    (root / SESSION_DIR).rename(elsewhere / SESSION_DIR)
    (root / SESSION_DIR).symlink_to(elsewhere / SESSION_DIR, target_is_directory=True)
    with pytest.raises(ApplicationError) as raised:
        session_path(str(root), "agents", "a", "prompt.md")
    assert raised.value.non_retryable and raised.value.type == "SessionDirError"
    assert raised.value.message == session_dir_problem(root)
    assert f"{SESSION_DIR} is a link out of the project" in raised.value.message
    assert sorted(p.name for p in (elsewhere / SESSION_DIR).iterdir()) == ["dispatches"]  # nothing made there
    (root / SESSION_DIR).unlink()
    (root / "kept").mkdir()
    (root / SESSION_DIR).symlink_to(root / "kept", target_is_directory=True)  # a link inside the project is fine
    assert session_path(str(root), "dispatches", "d.json").parent.is_dir()
