"""Where BSO keeps a sprint's scratch files (activities.session_files.session_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.session_files import SESSION_DIR, session_path


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
