"""Mends of a review of the command backend's git handling: a file removed then written anew, the story file's
text after a retry or under a reused sprint id, a non-UTF-8 name the story untracked."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

import activities.git_ops as git_ops
from activities.backends import command
from activities.git_ops import ensure_worktree
from bso.states import AgentMode, AgentStatus
from tests.fake_agent.project import STORY, git
from tests.workflow.test_command_backend import STORY_PATH, STORY_TEXT, assignment, dev_gate, dev_project, finish


async def test_a_file_removed_then_written_anew_by_the_agent_reaches_the_checkout_with_its_new_text(tmp_path: Path) -> None:
    """`git rm notes.txt`, then notes.txt written anew (a rewrite, a regenerated file): its status is `D ` and
    `??`. The gate that decided on the index committed only the removal: the new text was left untracked in the
    worktree (lost with it), the user's branch lost notes.txt, and the finish put the checkout's OLD copy back,
    untracked."""
    root = dev_project(tmp_path)
    (root / "notes.txt").write_text("old\n")
    git(root, "add", "notes.txt")
    git(root, "commit", "-qm", "notes")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "notes.txt")
    (Path(wt.path) / "notes.txt").write_text("new, by the agent\n")
    gate = await dev_gate(wt)
    assert gate.refused == []
    assert git(wt.path, "show", "HEAD:notes.txt") == "new, by the agent\n", git(wt.path, "status", "--porcelain")
    done = await finish(root)
    assert done.merged, done.note
    tracked = git(root, "ls-files", "notes.txt").strip()
    on_disk = (root / "notes.txt").read_text() if (root / "notes.txt").exists() else None
    assert (tracked, on_disk) == ("notes.txt", "new, by the agent\n"), (tracked, on_disk, done.note)


async def test_p20_retry_after_a_crash_during_verification_puts_the_story_text_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies while BSO's checks run after the agent (the story file already moved to the checkout,
    its removal committed in the worktree). The retry's P20 rollback must still put the story text back."""
    root = dev_project(tmp_path)
    dev = await ActivityEnvironment().run(command.run, assignment(root))
    assert dev.status is AgentStatus.SUCCESS, dev.error
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace(
        "[profiles.fake.env]\n", '[profiles.fake.env]\nFAKE_AGENT_BEHAVIOR = "break-tests,story-in-worktree"\n'
    ))
    real_verify, calls = command.verify, [0]

    async def crashing_verify(*args, **kw):
        calls[0] += 1
        if calls[0] == 2:  # the first is P20's snapshot before the agent; the second is after it
            raise RuntimeError("worker died during BSO's checks")
        return await real_verify(*args, **kw)

    fix_a = assignment(root, n=2, mode=AgentMode.FIX)
    monkeypatch.setattr(command, "verify", crashing_verify)
    with pytest.raises(Exception):
        await ActivityEnvironment().run(command.run, fix_a)
    assert (root / STORY_PATH).read_text() != STORY_TEXT  # the agent's text went to the checkout
    monkeypatch.setattr(command, "verify", real_verify)
    fix = await ActivityEnvironment().run(command.run, fix_a)  # Temporal's retry
    assert fix.status is AgentStatus.FAILURE and "rolled back" in fix.error, fix.error
    # As without the crash (test_a_fix_rolled_back_has_the_story_files_text_from_before_it_put_back):
    assert (root / STORY_PATH).read_text() == STORY_TEXT, (root / STORY_PATH).read_text()


async def test_a_reused_sprint_ids_dispatch_keeps_its_own_story_text_not_an_earlier_runs(tmp_path: Path) -> None:
    """Dispatch ids are `<sprint>/batch-N/<story>/<n>`: a failed sprint's id run again (README: id reuse) has the
    same ones. refs/bso-left/<dispatch>/story-file from the earlier run was taken for "a retry keeps the first":
    the text the checkout had before THIS dispatch was not kept, and P20 put the earlier run's text back over it."""
    root = dev_project(tmp_path)
    story = root / STORY_PATH
    wt = await ensure_worktree(str(root), "s1", STORY)
    agents_copy = Path(wt.path, STORY_PATH)
    agents_copy.parent.mkdir(parents=True, exist_ok=True)
    d = "s1/batch-1/1-1/2"

    async def dispatch(agents_text: bytes, run_id: str):
        agents_copy.write_bytes(agents_text)
        git(wt.path, "add", STORY_PATH)
        git(wt.path, "commit", "-qm", "the story, written in the worktree")
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, workflow_run_id=run_id)
        return await env.run(git_ops.move_story_file_out, wt, STORY_PATH, str(story), agent_type="dev-runner",
                             dispatch_id=d)

    story.write_bytes(b"run 1: the story-creator's text\n")
    await dispatch(b"run 1: the fix's record\n", "run-1")                 # the first run of sprint s1
    story.write_bytes(b"run 2: the story-creator's text, rewritten\n")  # s1 run again: its own story text
    moved = await dispatch(b"run 2: the fix's record\n", "run-2")
    assert await git_ops.put_story_text_back(wt, STORY_PATH, str(story), moved)  # P20 rolled run 2's fix back
    assert story.read_bytes() == b"run 2: the story-creator's text, rewritten\n", story.read_bytes()


async def test_a_file_with_a_non_utf8_name_the_story_untracked_stays_in_the_checkout(tmp_path: Path) -> None:
    """git()'s output is decoded with errors="replace": the set-aside read `caf\\ufffd.pem`, found no such file,
    and the merge deleted the checkout's copy of the file the story only untracked."""
    root = dev_project(tmp_path)
    name = os.fsdecode(b"caf\xe9.pem")
    (root / name).write_text("-----BEGIN PRIVATE KEY----- kept\n")
    git(root, "add", "-f", "--", name)
    git(root, "commit", "-qm", "a key")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "--", name)
    (Path(wt.path) / ".gitignore").write_text(".sprint-session/\n*.pem\n")
    git(wt.path, "add", ".gitignore")
    git(wt.path, "commit", "-qm", "untrack the key")
    done = await finish(root)
    assert done.merged, done.note
    assert (root / name).exists(), done.note
    assert "caf\ufffd.pem" in done.note
    done.model_dump_json()  # the activity's result goes to Temporal as JSON
