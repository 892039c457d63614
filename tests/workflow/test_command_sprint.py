"""A real sprint with the command backend on the time-skipping server: the fake agent CLI writes the
story, implements it in the story's worktree, BSO verifies, squashes and merges it back."""

from __future__ import annotations

from pathlib import Path

from bso.states import SprintStatus
from tests.conftest import bso_worker
from tests.fake_agent.project import STORY, git, make_git_project
from tests.workflow.helpers import run_sprint, sprint_input, status_values, workflow_task_failures
from activities.git_ops import worktree_path


async def test_story_backlog_to_done_squashed_and_merged(ts_env, tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"))
    base = git(root, "rev-parse", "HEAD").strip()
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-sprint", agent_backend="command")
        )
    assert report.status is SprintStatus.COMPLETE, report
    assert report.stories == {STORY: "done"}
    assert status_values(root)[STORY] == "done"
    # One squashed commit on main, on top of the base, with the story's files.
    log = git(root, "log", "--format=%s", f"{base}..HEAD").splitlines()
    assert log == ["feat: Story 1.1: Hello"]
    files = git(root, "show", "--name-only", "--format=", "HEAD").split()
    assert sorted(files) == sorted(
        ["src/story_1_1_hello_world.py", "src/story_1_1_hello_world_extra.py", "tests/test_story_1_1_hello_world.py"]
    )
    # The done story's worktree is gone; its originals are kept under refs/bso-originals.
    assert not worktree_path(str(root), "cmd-sprint", STORY).exists()
    assert git(root, "for-each-ref", "refs/bso-originals").strip()
    agents = [line for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert len(agents) == 4  # create, story review, dev, code review
    assert await workflow_task_failures(ts_env.client, "cmd-sprint") == 0


async def test_failed_story_keeps_its_worktree(ts_env, tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_BEHAVIOR="leak-env")
    base = git(root, "rev-parse", "HEAD").strip()
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-leak", agent_backend="command")
        )
    assert report.stories == {STORY: "needs-intervention"}
    assert git(root, "rev-parse", "HEAD").strip() == base  # nothing merged
    wt = worktree_path(str(root), "cmd-leak", STORY)
    assert (wt / ".env").exists() and ".env" not in git(wt, "ls-files")
