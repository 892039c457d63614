"""A story branch older than main whose base record is gone: its squash must not undo main's later work.

Found trying BSO on a small project (command backend): a branch `bso/u2-s18/13-1-x` stood two commits behind
`main` when sprint u2-s18 started (as the README has it, a sprint id used again takes up that run's branches; here
`.sprint-session/`, where each story's base commit is recorded, had been cleared since, as `git clean -fdX`
does). The story ran in a worktree of that branch and was done; its squash `feat: Story 13.1: X` was built as
the branch's tree on top of main's HEAD (the sprint's base, the story's own base being unknown) and
fast-forwarded into main: it deleted src/12_1_slow_branch.py and set src/app.py back, undoing the two stories
merged since the branch was made, with `sprint-complete` and no word. A squash must hold the story's own changes
only; the commits of main the branch lacks must stay in main.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.git_ops import ensure_worktree
from tests.fake_agent.project import STORY, git
from tests.workflow.test_command_backend import dev_project, finish


async def test_a_story_branch_older_than_main_merges_without_undoing_mains_commits(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    wt = await ActivityEnvironment().run(ensure_worktree, str(root), "s1", STORY)
    (Path(wt.path) / "story.py").write_text("x = 1\n")
    git(Path(wt.path), "add", "story.py")
    git(Path(wt.path), "commit", "-q", "-m", "the story's work")
    # The sprint stopped; the user clears BSO's scratch folder (its worktrees and records) and goes on on main.
    shutil.rmtree(root / ".sprint-session")
    git(root, "worktree", "prune")
    (root / "mine.py").write_text("y = 2\n")
    git(root, "add", "mine.py")
    git(root, "commit", "-q", "-m", "the user's own work on main")
    # The sprint id is used again: the story's branch is taken up where it stopped, and the story is done.
    await ActivityEnvironment().run(ensure_worktree, str(root), "s1", STORY)
    result = await finish(root)
    assert result.merged, result.note
    tracked = git(root, "ls-files").split()
    assert "story.py" in tracked  # the story's work arrived
    assert "mine.py" in tracked, git(root, "show", "--stat", "HEAD")  # and main's own work was not undone
