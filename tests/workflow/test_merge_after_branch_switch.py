"""A story finished after the user switched their checkout to another branch is not merged into that branch.

Found trying BSO on a small project (command backend): a sprint started with the checkout on `main`; while the
story's dev agent worked, the user ran `git checkout -b experiment <an older commit>` in the checkout to try
something. The story then merged into `experiment` (a fast-forward), carrying along every commit of `main` since
that older commit, and `main`, where the sprint started and the story's branch came from, never got the story.
The sprint said `sprint-complete`, the story `done`, with no word of it. The story's work should go to the branch
it was based on, or, as for a detached HEAD, not be merged, saying which branch the checkout is on and which one
the story came from; never pull the other branch's history into the one the user switched to.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.backends import command
from bso.states import AgentStatus
from tests.fake_agent.project import git
from tests.workflow.test_command_backend import assignment, dev_project, finish


async def test_a_story_based_on_main_does_not_merge_into_the_branch_the_user_switched_to(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    older = git(root, "rev-parse", "HEAD").strip()
    (root / "notes.md").write_text("main moved on\n")
    git(root, "add", "notes.md")
    git(root, "commit", "-q", "-m", "main's own commit")
    main_before = git(root, "rev-parse", "main").strip()
    done = await ActivityEnvironment().run(command.run, assignment(root))  # the worktree is made from main
    assert done.status is AgentStatus.SUCCESS, done.error
    git(root, "checkout", "-q", "-b", "experiment", older)  # the user tries something meanwhile
    result = await finish(root)
    experiment = git(root, "rev-parse", "experiment").strip()
    assert experiment == older, git(root, "log", "--oneline", "experiment")  # main's history not pulled into it
    if result.merged:  # then where the story came from
        assert git(root, "rev-parse", "main").strip() != main_before
    else:
        assert "experiment" in result.note and "main" in result.note, result.note


async def test_a_story_made_on_master_merges_after_master_was_renamed_main(tmp_path: Path) -> None:
    """The branch the story came from renamed since (`git branch -m master main`, or deleted once merged): the
    finish was refused for good, telling the user to check out a branch that is no more (a diff reviewer's)."""
    root = dev_project(tmp_path)
    git(root, "branch", "-M", "master")  # the project's branch is `master` when the story starts
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    git(root, "branch", "-m", "master", "main")  # renamed while the agent worked (or between two runs)
    before = git(root, "rev-parse", "main").strip()
    result = await finish(root)
    assert result.merged, result.note
    assert git(root, "rev-parse", "main").strip() != before
