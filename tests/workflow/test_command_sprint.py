"""A real sprint with the command backend on the time-skipping server: the fake agent CLI writes the
story, implements it in the story's worktree, BSO verifies, squashes and merges it back."""

from __future__ import annotations

import asyncio
import json

from pathlib import Path

import pytest

from bso.states import SprintStatus
from tests.conftest import bso_worker
from tests.fake_agent.project import STORY, git, make_git_project
from tests.workflow.helpers import (
    poll_until,
    run_sprint,
    signals_sent,
    slow_down_merges,
    sprint_input,
    status_values,
    workflow_task_failures,
)
from activities.git_ops import back_on_story_branch, ensure_worktree, status_file_in_project, worktree_path
from bso.constants import slave_workflow_id


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
    # In the user's checkout only the status file changed and the story's doc is new: BSO's lock file is
    # excluded (.git/info/exclude), as .sprint-session/ is even without the project's .gitignore.
    assert git(root, "status", "--porcelain").splitlines() == [
        " M _bmad-output/implementation-artifacts/sprint-status.yaml",
        f"?? _bmad-output/implementation-artifacts/{STORY}.md",
    ]
    assert ".sprint-session/" in (root / ".git" / "info" / "exclude").read_text()
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
    assert len(agents) == 5  # create, story review, dev plan (PO gates: on by default), dev, code review
    assert await workflow_task_failures(ts_env.client, "cmd-sprint") == []
    # auto_clear_git_track (default true): the merged story's branch and process scratch files are gone,
    # its transcripts stay.
    assert git(root, "branch", "--list", f"bso/cmd-sprint/{STORY}").strip() == ""
    runs = list((root / ".sprint-session" / "agents").glob("*/command.json"))
    assert len(runs) == len(agents)  # one transcript directory per agent run
    for run in runs:
        assert (run.parent / "stdout.log").exists() and (run.parent / "complete.json").exists()
        assert not (run.parent / "pid.json").exists() and not (run.parent / "exit.json").exists()


async def test_auto_clear_git_track_false_keeps_the_story_track(ts_env, tmp_path: Path) -> None:
    from temporalio.testing import ActivityEnvironment

    from activities.git_ops import finish_story_git
    from bso.git_rules import FinishStoryInput

    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev"})
    (root / "_bmad-output" / "implementation-artifacts" / f"{STORY}.md").write_text(
        "# Story 1.1: Hello\n\nFile scope: src/**, tests/**\n"
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue,
            sprint_input(root, session_id="cmd-keep", agent_backend="command",
                         config_overrides={"auto_clear_git_track": False}),
        )
    assert report.stories == {STORY: "done"}, report
    assert git(root, "log", "-1", "--format=%s").strip() == "feat: Story 1.1: Hello"
    wt = worktree_path(str(root), "cmd-keep", STORY)
    assert wt.exists() and git(root, "branch", "--list", f"bso/cmd-keep/{STORY}").strip()
    assert list((root / ".sprint-session" / "agents").glob("*/exit.json"))
    # The merge is recorded: finishing the story again (a retried activity) reports it, changes nothing.
    head = git(root, "rev-parse", "HEAD").strip()
    again = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="cmd-keep", story_key=STORY)
    )
    assert again.merged and again.commit == head and git(root, "rev-parse", "HEAD").strip() == head


async def test_the_squash_and_merge_heartbeats_while_it_waits_its_turn(tmp_path: Path, monkeypatch) -> None:
    """With no heartbeat, a worker killed mid-merge left the story `merging` until the activity's 10-minute
    timeout; the Slave's heartbeat timeout ends that attempt within 30 s, and this one beats all along (here
    while another merge holds the repository)."""
    from temporalio.testing import ActivityEnvironment

    import activities.git_ops
    from activities.git_ops import finish_story_git, repo_lock
    from bso.git_rules import FinishStoryInput

    monkeypatch.setattr(activities.git_ops, "FINISH_GIT_HEARTBEAT", 0.6)  # a beat every 0.1 s
    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev"})
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    async with repo_lock(str(root)):
        merging = asyncio.create_task(
            env.run(finish_story_git, FinishStoryInput(project_root=str(root), session_id="beat", story_key=STORY))
        )
        await poll_until(lambda: asyncio.sleep(0, len(beats) >= 5), "5 beats while the merge waits its turn")
        assert beats[0] == (f"squash and merge {STORY}",), beats
        assert not merging.done()  # all the while it waited for the lock
    done = await merging
    assert not done.merged  # no branch of the story to merge: it says so


async def test_a_cancel_never_cuts_a_squash_and_merge_in_the_middle(tmp_path: Path) -> None:
    """The merge heartbeats, so a sprint's cancel now reaches it: git killed mid-merge would leave the user's
    checkout half-written. The merge (here still waiting for the repository) finishes, then the cancel is taken."""
    from temporalio.testing import ActivityEnvironment

    from activities.git_ops import finish_story_git, repo_lock
    from bso.git_rules import FinishStoryInput

    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev"})
    env = ActivityEnvironment()
    async with repo_lock(str(root)):
        merging = asyncio.create_task(
            env.run(finish_story_git, FinishStoryInput(project_root=str(root), session_id="cut", story_key=STORY))
        )
        await asyncio.sleep(0.3)
        env.cancel()
        await asyncio.sleep(0.5)
        assert not merging.done()  # still its turn to wait for, not cut off
    with pytest.raises(asyncio.CancelledError):
        await merging


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


async def _sprint_done_despite(ts_env, tmp_path: Path, behavior: str) -> tuple[Path, list[str]]:
    """A one-story sprint with the fake agent misbehaving so; it must end complete, the story done, with no
    workflow task failed: the project and the files its branch brought."""
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_BEHAVIOR=behavior)
    base = git(root, "rev-parse", "HEAD").strip()
    session = f"cmd-{behavior}"
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(root, session_id=session, agent_backend="command"))
    assert report.status is SprintStatus.COMPLETE and report.stories == {STORY: "done"}, report
    assert status_values(root)[STORY] == "done"
    assert await workflow_task_failures(ts_env.client, session) == []
    return root, git(root, "diff", "--name-only", base, "HEAD").split()


@pytest.mark.parametrize("behavior", ["own-branch", "detach"])
async def test_an_agent_that_leaves_the_story_branch_still_has_its_work_merged(
    ts_env, tmp_path: Path, behavior: str
) -> None:
    """A dev agent that made a branch of its own (or detached HEAD) and worked there, as coding agents do: the
    story ended `done` and the sprint complete, its work on a branch the merge never looks at."""
    _, merged = await _sprint_done_despite(ts_env, tmp_path, behavior)
    assert "src/story_1_1_hello_world.py" in merged and "src/story_1_1_hello_world_extra.py" in merged, merged


@pytest.mark.parametrize("behavior", ["edit-status", "commit-status"])
async def test_an_agent_that_edits_the_status_file_has_its_change_undone_and_the_story_merged(
    ts_env, tmp_path: Path, behavior: str
) -> None:
    """BMAD's dev agents set their story to `review` in sprint-status.yaml themselves. In the worktree, that change
    was committed and merged into the project's checkout, where BSO's own status writes wait uncommitted: the
    merge failed and the story was never merged. BSO alone writes the file; the agent's change is undone."""
    _, merged = await _sprint_done_despite(ts_env, tmp_path, behavior)
    status = "_bmad-output/implementation-artifacts/sprint-status.yaml"
    assert "src/story_1_1_hello_world.py" in merged and status not in merged, merged


async def test_a_story_creator_that_sets_its_story_ready_in_the_status_file_is_set_back(ts_env, tmp_path: Path) -> None:
    """BMAD's create-story sets the story to `ready-for-dev` in sprint-status.yaml: the Slave's next write, expecting
    the value it left, found another, and the story stopped (`changed under the Slave`) after its first agent."""
    root, _ = await _sprint_done_despite(ts_env, tmp_path, "creator-sets-status")
    [created] = [p for p in (root / ".sprint-session" / "agents").glob("*/complete.json") if "create" in p.read_text()]
    findings = json.loads(created.read_text())["findings"]
    assert any("set the story to 'ready-for-dev' in the status file" in f["summary"] for f in findings), findings


async def test_a_dev_agent_that_writes_the_story_file_in_its_worktree_has_it_moved_to_the_checkout(
    ts_env, tmp_path: Path
) -> None:
    """BMAD's dev-story writes its Dev Agent Record into the story file. Written at the story's path in the
    worktree, it was merged over the checkout's untracked copy (BSO's story-creator wrote it there): git
    refused, and the sprint ended partial with the story's work unmerged."""
    root, merged = await _sprint_done_despite(ts_env, tmp_path, "story-in-worktree")
    story = f"_bmad-output/implementation-artifacts/{STORY}.md"
    assert "src/story_1_1_hello_world.py" in merged and story not in merged, merged
    assert "## Dev Agent Record" in (root / story).read_text()


def test_the_status_file_agents_must_leave_is_found_however_the_sprint_was_given_it(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "docs").mkdir(parents=True)
    assert status_file_in_project(str(root), None) == ["_bmad-output/implementation-artifacts/sprint-status.yaml"]
    assert status_file_in_project(str(root), "docs/../status.yaml") == ["status.yaml"]
    assert status_file_in_project(str(root), str(root / "docs" / "s.yaml")) == ["docs/s.yaml"]
    (tmp_path / "alias").symlink_to(root)
    assert status_file_in_project(str(tmp_path / "alias"), str(root / "s.yaml")) == ["s.yaml"]
    assert status_file_in_project(str(root), "../elsewhere.yaml") == []
    (root / "docs" / "link.yaml").symlink_to("../status.yaml")  # the link, and where it leads
    assert status_file_in_project(str(root), "docs/link.yaml") == ["docs/link.yaml", "status.yaml"]


async def test_the_status_files_undo_commits_it_alone_and_mends_a_link_the_agent_replaced(tmp_path: Path) -> None:
    """The undo's commit took the whole index: a secret the agent staged, which the Exit Gate refuses and leaves
    uncommitted, went onto the branch with it. A status file kept as a link to another file was not looked at
    by its own path: an agent's save that replaced the link with a file was merged."""
    from activities.git_ops import undo_status_file_change

    root = make_git_project(tmp_path / "proj")
    status = "_bmad-output/implementation-artifacts/sprint-status.yaml"
    (root / "status.yaml").write_bytes((root / status).read_bytes())
    (root / status).unlink()
    (root / status).symlink_to("../../status.yaml")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the status file kept at the top, linked from where BMAD looks")
    wt = await ensure_worktree(str(root), "s1", STORY)
    agent_copy = Path(wt.path, status)
    text = agent_copy.read_text()
    agent_copy.unlink()
    agent_copy.write_text(text.replace(f"{STORY}: backlog", f"{STORY}: review"))  # saved aside, then renamed over
    git(Path(wt.path), "add", "-A")
    git(Path(wt.path), "commit", "-qm", "status review")
    (Path(wt.path) / ".env").write_text("OPENAI_API_KEY=sk-fake\n")
    git(Path(wt.path), "add", "-f", ".env")
    files = status_file_in_project(str(root), None)
    assert await undo_status_file_change(wt, files, agent_type="dev-runner", dispatch_id="d1") is True
    assert git(Path(wt.path), "diff", "--name-only", wt.base, "HEAD").split() == []
    assert Path(wt.path, status).is_symlink()
    assert git(Path(wt.path), "diff", "--cached", "--name-only").split() == [".env"]  # staged, never committed
    assert await undo_status_file_change(wt, files, agent_type="dev-runner", dispatch_id="d1") is False


async def test_an_agent_branch_that_does_not_hold_the_story_branch_fails_the_dispatch_naming_it(tmp_path: Path):
    root = make_git_project(tmp_path / "proj")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(Path(wt.path), "commit", "-q", "--allow-empty", "-m", "on the story branch")
    git(Path(wt.path), "checkout", "-q", "-b", "elsewhere", wt.base)  # from before the branch's commit
    said = await back_on_story_branch(wt)
    assert said is not None and said.startswith(
        f"the agent left the story branch {wt.branch} for branch elsewhere at "
    ), said
    assert "which does not hold the branch's commits" in said
    # One that deleted the story branch has it made again where its work is; an orphan branch is named.
    git(Path(wt.path), "checkout", "-q", "-b", "renamed", wt.base)
    git(Path(wt.path), "commit", "-q", "--allow-empty", "-m", "the agent's work")
    git(Path(wt.path), "branch", "-q", "-D", wt.branch)
    assert await back_on_story_branch(wt) is None
    assert git(Path(wt.path), "rev-parse", "--abbrev-ref", "HEAD").strip() == wt.branch
    git(Path(wt.path), "checkout", "-q", "--orphan", "fresh")
    assert await back_on_story_branch(wt) == f"the agent left the story branch {wt.branch} for fresh, which has no commit"


async def test_two_stories_merge_one_after_the_other_and_stale_worktrees_go(ts_env, tmp_path: Path) -> None:
    k2 = "1-2-second-story"
    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev", k2: "ready-for-dev"})
    stories = root / "_bmad-output" / "implementation-artifacts"
    for key, title in ((STORY, "Hello"), (k2, "Second")):
        (stories / f"{key}.md").write_text(
            f"# Story {key[0]}.{key[2]}: {title}\n\nStatus: ready-for-dev\n\nFile scope: src/**, tests/**\n\n"
            "## Acceptance Criteria\n\n1. it works\n"
        )
    base = git(root, "rev-parse", "HEAD").strip()
    # A clean, merged worktree left by an earlier sprint is removed; a dirty one (a failed story) stays.
    stale_merged = root / ".sprint-session" / "worktrees" / "old-sprint" / "x"
    stale_failed = root / ".sprint-session" / "worktrees" / "old-sprint" / "y"
    git(root, "worktree", "add", "-q", "-b", "bso/old/x", str(stale_merged), base)
    git(root, "worktree", "add", "-q", "-b", "bso/old/y", str(stale_failed), base)
    (stale_failed / ".env").write_text("LEAK=1\n")
    # A clean one on a detached HEAD holding commits not merged: its branch's name read `HEAD`, the project's own,
    # always merged, and it was removed, commits and all.
    stale_detached = root / ".sprint-session" / "worktrees" / "old-sprint" / "z"
    git(root, "worktree", "add", "-q", "--detach", str(stale_detached), base)
    git(stale_detached, "commit", "-q", "--allow-empty", "-m", "work on a detached HEAD")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-two", agent_backend="command")
        )
    assert report.stories == {STORY: "done", k2: "done"}, report
    subjects = git(root, "log", "--format=%s", "--first-parent", f"{base}..HEAD").splitlines()
    assert subjects[-1] == "feat: Story 1.1: Hello"
    assert subjects[0] in ("feat: Story 1.2: Second", "Merge feat: Story 1.2: Second")
    tracked = git(root, "ls-files", "src").split()
    assert "src/story_1_1_hello_world.py" in tracked and "src/story_1_2_second_story.py" in tracked
    assert not stale_merged.exists() and stale_failed.exists() and stale_detached.exists()


async def test_failed_verification_goes_to_a_fix_that_makes_the_story_done(ts_env, tmp_path: Path) -> None:
    import json

    ledger = tmp_path / "ledger.jsonl"
    root = make_git_project(
        tmp_path / "proj", stories={STORY: "ready-for-dev"}, FAKE_AGENT_BEHAVIOR="break-tests-in-dev",
        FAKE_AGENT_LEDGER=str(ledger),
    )
    (root / "_bmad-output" / "implementation-artifacts" / f"{STORY}.md").write_text(
        "# Story 1.1: Hello\n\nFile scope: src/**, tests/**\n"
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-verify", agent_backend="command")
        )
    assert report.stories == {STORY: "done"}, report
    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(r["agent"], r["mode"], r["phase"]) for r in runs] == [  # PO gates (on): a plan before each
        ("dev-runner", "dev", "plan"), ("dev-runner", "dev", "implement"),
        ("dev-runner", "fix", "plan"), ("dev-runner", "fix", "implement"), ("review-runner", "review", ""),
    ]
    assert report.batches[0].results.review_fix_rounds == {STORY: 1}
    # The debugger was asked first (the command backend has no analysis of its own: unavailable).
    signals = await signals_sent(ts_env.client.get_workflow_handle(slave_workflow_id("cmd-verify", 1)))
    assert signals.count("debug_request") == 1
    assert await workflow_task_failures(ts_env.client, "cmd-verify") == []


async def test_files_the_checks_write_are_not_taken_for_the_agents_work(ts_env, tmp_path: Path) -> None:
    """A verification that also writes a report (junit, coverage) and touches a tracked file: the next Exit Gate
    committed them as the fix's work, the PO gate blocked the story for changes nobody authorized (with gates
    off, they were merged into the project)."""
    checks = [["sh", "-c", "echo '<testsuite/>' > test-report.xml; echo stamp >> README.md; python3 run_checks.py"]]
    root = make_git_project(
        tmp_path / "proj", stories={STORY: "ready-for-dev"}, verification=checks, FAKE_AGENT_BEHAVIOR="break-tests-in-dev",
    )
    (root / "README.md").write_text("the project\n")
    git(root, "add", "README.md")
    git(root, "commit", "-qm", "readme")
    (root / "_bmad-output" / "implementation-artifacts" / f"{STORY}.md").write_text(
        "# Story 1.1: Hello\n\nFile scope: src/**, tests/**\n"
    )
    base = git(root, "rev-parse", "HEAD").strip()
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-artifacts", agent_backend="command")
        )
    assert report.stories == {STORY: "done"}, report
    assert report.batches[0].results.review_fix_rounds == {STORY: 1}  # the fix round ran
    merged = git(root, "diff", "--name-only", base, "HEAD").split()
    assert "test-report.xml" not in merged and "README.md" not in merged, merged
    assert "src/story_1_1_hello_world.py" in merged


CHECKS = [["sh", "-c", "echo '<testsuite/>' > test-report.xml; python3 -c 'import subprocess; "
           "subprocess.Popen([\"sleep\", \"300\"], start_new_session=True)'; echo started > started; sleep 300"]]
CHECKER = f"""
import asyncio, sys
from activities.git_ops import verify
from bso.agent_profiles import Verification
asyncio.run(verify(sys.argv[1], Verification(commands={CHECKS!r}), {{"PATH": "/usr/bin:/bin"}}, sys.argv[2]))
"""


async def test_checks_cut_short_by_a_worker_killed_hard_are_undone_before_the_retry_works(tmp_path: Path) -> None:
    """A worker killed during BSO's checks left their report in the worktree, for the retry's Exit Gate to commit
    as the agent's work, and their processes running, a server started with `setsid` among them. Only the same
    dispatch's retry undoes the files: a later dispatch of the story would undo a person's work since."""
    import os
    import signal
    import subprocess
    import sys

    from activities.git_ops import changed_paths, undo_interrupted_checks
    from tests.workflow.test_command_backend import gone

    root = make_git_project(tmp_path / "proj")
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "agent_work.py").write_text("the agent's\n")  # left for the Exit Gate, before the checks
    assert await undo_interrupted_checks(wt.path, "d1 run-1 host") is False  # no checks ran

    async def checks_killed_hard() -> list[int]:
        checker = subprocess.Popen([sys.executable, "-c", CHECKER, wt.path, "d1 run-1 host"], cwd=Path(__file__).parents[2])
        try:
            async def started() -> bool:
                return (Path(wt.path) / "started").exists()

            await poll_until(started, "the checks started")
        finally:
            checker.send_signal(signal.SIGKILL)
            checker.wait()
        left = set(await changed_paths(wt.path))
        assert {"agent_work.py", "test-report.xml", "started"} <= left, left
        marked = [int(p) for p in os.listdir("/proc") if p.isdigit() and _has_checks_mark(int(p))]
        assert marked, "the checks' processes outlive their worker"
        return marked

    marked = await checks_killed_hard()
    assert await undo_interrupted_checks(wt.path, "d2 run-1 host") is True  # another dispatch
    assert await gone(*marked, seconds=5), marked
    assert {"test-report.xml", "started"} <= set(await changed_paths(wt.path))  # kept: not its to judge
    for name in ("test-report.xml", "started"):
        (Path(wt.path) / name).unlink()
    marked = await checks_killed_hard()
    assert await undo_interrupted_checks(wt.path, "d1 run-1 host") is True  # the dispatch's retry
    assert await changed_paths(wt.path) == ["agent_work.py"]
    assert await gone(*marked, seconds=5), marked
    assert await undo_interrupted_checks(wt.path, "d1 run-1 host") is False  # done once


async def test_checks_cut_short_by_a_cancel_leave_nothing(tmp_path: Path) -> None:
    """Cancelled (the Slave's deadline, a TERMINATE), the checks left their files and their record: a later
    dispatch of the story found them."""
    from activities.git_ops import changed_paths, undo_interrupted_checks, verify
    from bso.agent_profiles import Verification

    root = make_git_project(tmp_path / "proj")
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "agent_work.py").write_text("the agent's\n")
    checks = asyncio.create_task(verify(wt.path, Verification(commands=CHECKS), {"PATH": "/usr/bin:/bin"}, "d1"))

    async def started() -> bool:
        return (Path(wt.path) / "started").exists()

    await poll_until(started, "the checks started")
    checks.cancel()
    with pytest.raises(asyncio.CancelledError):
        await checks
    assert await changed_paths(wt.path) == ["agent_work.py"]
    assert await undo_interrupted_checks(wt.path, "d1") is False  # no record left


def _has_checks_mark(pid: int) -> bool:
    try:
        return b"BSO_PROCESS_GROUP=checks:" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


MISSING_CLI = '\n[profiles.fake-missing]\nextends = "generic"\nargv = ["/nonexistent/agent-cli", "{prompt}"]\n' \
    '\n[agents.story-creator]\nprofile = "fake-missing"\n'
SECOND = "1-2-second-story"


async def test_a_missing_agent_cli_stops_the_sprint_with_fail_fast(ts_env, tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj", stories={STORY: "backlog", SECOND: "backlog"}, agents_toml=MISSING_CLI)
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue,
            sprint_input(root, session_id="cmd-missing-ff", agent_backend="command",
                         config_overrides={"fail_fast": True, "batch_size": 2}),
        )
    assert report.status is SprintStatus.PARTIAL and report.batches[0].fatal_error
    assert "fake-missing" in report.batches[0].fatal_error and "agent_config_error" in report.batches[0].fatal_error
    assert report.stories[STORY] == "needs-intervention"
    assert status_values(root)[SECOND] == "backlog"  # never started: the same error would have failed it too
    assert await workflow_task_failures(ts_env.client, "cmd-missing-ff") == []


@pytest.mark.parametrize(("agent", "state"), [("story-creator", "backlog"), ("dev-runner", "ready-for-dev")])
async def test_a_missing_agent_cli_without_fail_fast_marks_the_story_naming_the_profile(
    ts_env, tmp_path: Path, agent: str, state: str
) -> None:
    """The user's setup: the story is needs-intervention with "agent setup" at once, no debugger asked (a
    dev-runner's went to the debugger first: "debugger unavailable: ...")."""
    agents_toml = MISSING_CLI.replace("[agents.story-creator]", f"[agents.{agent}]")
    root = make_git_project(tmp_path / "proj", stories={STORY: state}, agents_toml=agents_toml)
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id=f"cmd-missing-{agent}", agent_backend="command")
        )
    assert report.stories == {STORY: "needs-intervention"}
    error = report.batches[0].results.story_results[0].error or ""
    assert "agent setup" in error and "fake-missing" in error and "debugger" not in error, error
    assert "debug_request" not in await signals_sent(ts_env.client.get_workflow_handle(slave_workflow_id(f"cmd-missing-{agent}", 1)))
    assert await workflow_task_failures(ts_env.client, f"cmd-missing-{agent}") == []


async def test_a_real_reviewer_scores_the_work_and_a_low_score_goes_to_a_fix(ts_env, tmp_path: Path) -> None:
    """The review-runner CLI answers a scored review (criteria, score, blocking issues, feedback): round 1
    scores 55 and blocks, the fix gets its feedback, round 2 scores 90 and the story is done."""
    import json

    ledger = tmp_path / "ledger.jsonl"
    root = make_git_project(
        tmp_path / "proj", stories={STORY: "ready-for-dev"}, FAKE_AGENT_REVIEW_SCORES="55,90",
        FAKE_AGENT_LEDGER=str(ledger),
    )
    (root / "_bmad-output" / "implementation-artifacts" / f"{STORY}.md").write_text(
        "# Story 1.1: Hello\n\nFile scope: src/**, tests/**\n"
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-scored", agent_backend="command")
        )
    assert report.stories == {STORY: "done"}, report
    result = report.batches[0].results.story_results[0]
    assert result.review_scores == [55, 90]
    runs = [(r["agent"], r["mode"]) for r in map(json.loads, ledger.read_text().splitlines())]
    assert runs.count(("review-runner", "review")) == 2 and ("dev-runner", "fix") in runs
    prompts = [p.read_text() for p in (root / ".sprint-session" / "agents").glob("*/prompt.md")]
    fix_text = next(t for t in prompts if "Review feedback" in t)  # the fix was told what the review found
    assert "[blocking/documentation] greet() has no docstring (round 1)" in fix_text
    review_text = next(t for t in prompts if "Score the work" in t)
    assert "a score of at least 80" in review_text and "criteria_scores" in review_text


@pytest.fixture
def slow_merges(monkeypatch):
    slow_down_merges(monkeypatch, 2)


@pytest.mark.parametrize("ordered_by", ["files", "dependencies"])
async def test_stories_touching_one_file_in_parallel_batches_all_merge(
    ts_env, tmp_path: Path, slow_merges, ordered_by: str
) -> None:
    """Three stories append to src/shared.py, in one-story batches, two at once, each merge slow. The Master
    holds a batch while another works on that file (their Files: lines say so), or while a story it depends on
    is not merged; each story's worktree starts from what merged before it: all three merge. Before, the agents
    of the first two batches edited the file at once from the same base; then a held batch (or a dependant)
    started once the story before it was done, before its merge landed; the later merges conflicted."""
    keys = [STORY, "1-2-second-story", "1-3-third-story"]
    root = make_git_project(
        tmp_path / "proj", stories={k: "ready-for-dev" for k in keys}, FAKE_AGENT_BEHAVIOR="shared-file"
    )
    stories = root / "_bmad-output" / "implementation-artifacts"
    for before, key in zip([None, *keys], keys):
        module = "story_" + key.replace("-", "_")  # the fake agent's own files (the Files: line is its scope too)
        scope = (
            f"Files: src/shared.py, src/{module}.py, src/{module}_extra.py, tests/test_{module}.py"
            if ordered_by == "files"
            else f"Depends on: {before}" if before else ""
        )
        (stories / f"{key}.md").write_text(
            f"# Story 1.{key[2]}: Story {key[2]}\n\nStatus: ready-for-dev\n\n{scope}\n\n"
            "## Acceptance Criteria\n\n1. it works\n"
        )
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "story files")
    # The fake agent's PO plan names its own files, not src/shared.py: without gates, the agents' work as it is.
    overrides = {"batch_size": 1, "max_concurrent_slaves": 2, "po_gates_enabled": False}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue,
            sprint_input(
                root, session_id=f"cmd-shared-{ordered_by}", agent_backend="command", config_overrides=overrides
            ),
        )
    assert report.stories == {k: "done" for k in keys}, report
    notes = [r.error for b in report.batches for r in b.results.story_results if r.error]
    assert (root / "src" / "shared.py").read_text().splitlines() == [f"# {k}" for k in keys], notes


async def test_a_done_story_whose_branch_did_not_merge_leaves_the_sprint_partial(ts_env, tmp_path: Path) -> None:
    """The story's work is done, but an untracked file of the user's blocks its merge: the work is not in the
    project, so the sprint is partial, not complete (it said sprint-complete), and the story says why."""
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"))
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "story_1_1_hello_world.py").write_text("# the user's own, untracked\n")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-unmerged", agent_backend="command")
        )
    assert report.stories == {STORY: "done"}
    [result] = [r for b in report.batches for r in b.results.story_results]
    assert (result.error or "").startswith("not merged: "), result
    assert report.status is SprintStatus.PARTIAL, report.status
    assert (root / "src" / "story_1_1_hello_world.py").read_text() == "# the user's own, untracked\n"


@pytest.mark.parametrize(("behavior", "after"), [("slow", "review"), ("slow,crash", "ready-for-dev")], ids=["done", "crashed"])
async def test_a_cancel_that_comes_with_the_agents_result_writes_the_answer_first(
    local_env, tmp_path: Path, behavior: str, after: str
) -> None:
    """A command agent's answer comes back as its activity's result; the batch's cancel comes in the same workflow
    task (both arrive while no sprint worker runs; the agents worker finishes the agent meanwhile). asyncio raises
    the cancel into the await the result met: the answer was lost, and the finished dev work was to be done again
    by the next sprint. It is written (the story to review), then the batch ends cancelled. An agent that crashed
    (an answer for the debugger) starts no analysis in the cancelled batch: no DEBUG_REQUEST goes out, the story
    keeps its state."""
    import uuid

    from temporalio.api.enums.v1 import EventType
    from bso.constants import AGENTS_TASK_QUEUE, SIGNAL_DEBUG_REQUEST, SPRINT_TASK_QUEUE
    from tests.workflow.helpers import cancelled_while_no_sprint_worker_runs, has_event, in_one_task, start_sprint
    from workers.main import build_workers

    ledger = tmp_path / "ledger.jsonl"
    root = make_git_project(
        tmp_path / "proj", stories={STORY: "ready-for-dev"},
        FAKE_AGENT_LEDGER=str(ledger), FAKE_AGENT_BEHAVIOR=behavior, FAKE_AGENT_SLEEP="5",  # the sprint worker stops meanwhile
    )
    (root / "_bmad-output" / "implementation-artifacts" / f"{STORY}.md").write_text(
        "# Story 1.1: Hello\n\nFile scope: src/**, tests/**\n"
    )
    client = local_env.client
    session, prefix = f"cmd-answer-cancel-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:8]}-"
    inp = sprint_input(root, session_id=session, agent_backend="command", config_overrides={"po_gates_enabled": False})
    slave = client.get_workflow_handle(slave_workflow_id(session, 1))
    (agents_worker,) = build_workers(client, [AGENTS_TASK_QUEUE], queue_prefix=prefix)
    async with agents_worker:
        (sprint_worker,) = build_workers(client, [SPRINT_TASK_QUEUE], queue_prefix=prefix)
        async with sprint_worker:
            handle = await start_sprint(client, prefix + SPRINT_TASK_QUEUE, inp)
            await poll_until(lambda: asyncio.sleep(0, ledger.exists() and "dev-runner" in ledger.read_text()), "the dev agent at work")
        before = status_values(root)[STORY]
        await poll_until(lambda: has_event(slave, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED), "the dev agent's result", timeout=60)
        await cancelled_while_no_sprint_worker_runs(client, prefix, handle, slave)
    assert (before, status_values(root)[STORY]) == ("ready-for-dev", after)
    signals = await signals_sent(slave)
    assert SIGNAL_DEBUG_REQUEST not in signals, signals
    assert await in_one_task(slave, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
    assert await workflow_task_failures(client, slave.id) == []
