"""An earlier sprint's clean, merged worktree goes with its branch; one with work not merged keeps both.

Found trying BSO on a small project (command backend, auto_clear_git_track at its default, true): sprint u2-s1
ended two stories needs-intervention (their worktrees kept for inspection, as the README says); the user set
them back to ready-for-dev and the next sprint u2-s2 did them, merged. u2-s2's first worktree removed u2-s1's two
worktrees (clean, their commits merged: "worktrees of earlier sprints whose commits are merged ... are removed"),
but not their branches: `git branch` still lists `bso/u2-s1/1-2-add-farewell` and `bso/u2-s1/1-3-add-counter`,
and likewise after a story not merged on a conflict that the user merged by hand (`bso/u2-s3/2-1-change-app`),
one more with every sprint, though nothing on them is missing from the project. A story's own track cleanup
removes its worktree and its branch together (`clear_story_track`); the stale worktree's cleanup should too.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.git_ops import ensure_worktree
from tests.fake_agent.project import STORY, git, make_git_project


async def test_an_earlier_sprints_merged_worktree_goes_with_its_branch(tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev"})
    base = git(root, "rev-parse", "HEAD").strip()
    old = root / ".sprint-session" / "worktrees" / "old-sprint" / STORY
    git(root, "worktree", "add", "-q", "-b", f"bso/old-sprint/{STORY}", str(old), base)  # left by a failed story
    kept = root / ".sprint-session" / "worktrees" / "kept-sprint" / "1-2-other"
    git(root, "worktree", "add", "-q", "-b", "bso/kept-sprint/1-2-other", str(kept), base)
    (kept / "work.py").write_text("w = 1\n")
    git(kept, "add", "work.py")
    git(kept, "commit", "-q", "-m", "work the project lacks")
    await ActivityEnvironment().run(ensure_worktree, str(root), "new-sprint", STORY)
    assert not old.exists()  # its worktree went: clean, and its commit is in the project
    assert git(root, "branch", "--list", f"bso/old-sprint/{STORY}").strip() == "", git(root, "branch")
    assert kept.exists()  # not merged: its worktree and its branch stay
    assert git(root, "branch", "--list", "bso/kept-sprint/1-2-other").strip(), git(root, "branch")
