"""The command backend's trust-nothing verification (activities.git_ops.verify): its time is for all the
commands together, so that the Slave's deadline for the activity holds however many there are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.git_ops import verify
from bso.agent_profiles import Verification


@pytest.fixture
def worktree(tmp_path: Path) -> str:
    """verify runs in a story's worktree: a git repository (it undoes what the checks change there)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return str(tmp_path)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_passing_commands_pass_with_their_output(worktree: str):
    checks = Verification(commands=[py("print('3 passed')"), py("print('clean')")], timeout_seconds=30)
    result = await verify(worktree, checks, dict(os.environ))
    assert result.ok and "3 passed" in result.output and "clean" in result.output


async def test_the_time_is_for_all_the_commands_together(worktree: str):
    """Each command alone fits in the time, together they do not: the second one is stopped when it is spent."""
    slow = py("import time; time.sleep(1.2); print('done')")
    checks = Verification(commands=[slow, slow, py("print('never')")], timeout_seconds=2)
    result = await verify(worktree, checks, dict(os.environ))
    assert not result.ok
    assert "(exit 0)" in result.output and "(timed out)" in result.output, result.output
    assert "never" not in result.output


async def test_what_the_checks_leave_is_undone_staged_or_many(worktree: str):
    """A check that staged a new file (lint-staged, a generator) failed the undo (`checkout HEAD --` of a path
    not in HEAD); thousands of new files (a coverage folder) overran the argument list."""
    subprocess.run(["git", "-C", worktree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "base"], check=True)
    Path(worktree, "mine.txt").write_text("the agent's, not committed\n")
    write = "import pathlib, subprocess; pathlib.Path('gen').mkdir(); [pathlib.Path(f'gen/f{i}.txt').write_text('x') for i in range(3000)]; pathlib.Path('staged.txt').write_text('s'); subprocess.run(['git', 'add', 'staged.txt'], check=True)"
    result = await verify(worktree, Verification(commands=[py(write)], timeout_seconds=60), dict(os.environ))
    assert result.ok, result.output
    left = subprocess.run(["git", "-C", worktree, "status", "--porcelain"], capture_output=True, text=True).stdout
    assert left == "?? mine.txt\n", left  # what was there before the checks stays; theirs is gone
