"""BSO's own files in a git project stay out of `git status` (activities.git_ops.exclude_session_files)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from activities.git_ops import SESSION_EXCLUDES, exclude_session_files
from tests.fake_agent.project import git, make_git_project


def test_the_exclude_file_gets_bso_files_once_whatever_it_held(tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj")
    exclude = root / ".git" / "info" / "exclude"
    exclude.write_bytes(b"# \xdcberpr\xfcfung (latin-1, as git takes it)\n*.tmp")  # no newline at the end
    (root / "_bmad-output" / "implementation-artifacts" / "sprint-status.yaml.lock").write_text("")
    for _ in range(2):
        asyncio.run(exclude_session_files(str(root)))
    text = exclude.read_bytes()
    assert text.startswith(b"# \xdcberpr\xfcfung (latin-1, as git takes it)\n*.tmp\n")  # kept as it was
    assert [text.count(f"\n{p}\n".encode()) for p in SESSION_EXCLUDES] == [1, 1]
    assert "sprint-status.yaml.lock" not in git(root, "status", "--porcelain")


def test_a_project_in_a_subdirectory_of_its_repository(tmp_path: Path) -> None:
    repo = make_git_project(tmp_path / "repo")
    project = repo / "services" / "api"
    project.mkdir(parents=True)
    asyncio.run(exclude_session_files(str(project)))
    assert ".sprint-session/" in (repo / ".git" / "info" / "exclude").read_text(encoding="utf-8")
