"""The command backend in real sprints on the local dev server (the real Temporal server, not the
time-skipping one): the fake agent CLI in a real temporary git repository.

A full story from backlog to done (squashed and merged back), an agent hanging past its timeout (its process
group killed), a worker killed -9 while BSO checked a finished agent's work or while the agent itself worked (either way the
retry does not rerun the agent), a leaked `.env` refused, and BSO's verification overriding the agent's false success (the failing
output goes to a fix, and the fix makes the story done).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError

from activities.backends import command
from bench.infra import WorkerProcess
from bso.constants import SPRINT_TASK_QUEUE
from bso.models import SprintReport
from bso.states import SprintStatus
from tests.conftest import bso_worker
from tests.fake_agent.project import STORY, git, make_git_project
from bso.constants import slave_workflow_id
from tests.workflow.helpers import (
    run_sprint,
    slow_down_merges,
    sprint_input,
    start_sprint,
    status_values,
    wait_status,
    workflow_task_failures,
)
from bso.git_rules import MERGE_CUT_SHORT
from workflows.sprint_master import SprintMasterWorkflow
from tests.workflow.test_command_backend import alive, gone

pytestmark = pytest.mark.e2e

STORY_DIR = Path("_bmad-output") / "implementation-artifacts"
STORY_TEXT = (
    "# Story 1.1: Hello\n\nStatus: ready-for-dev\n\nFile scope: src/**, tests/**\n\n"
    "## Acceptance Criteria\n\n1. greet() says hello\n2. tests cover it\n"
)
# A sprint on a shared, slow machine: generous, never asserted on.
SPRINT_TIMEOUT = 240


def ready_project(
    tmp_path: Path, agents_toml: str = "", verification: list[list[str]] | None = None, **env: str
) -> Path:
    """A git project whose one story is ready for dev (no story-creator / story-review round)."""
    root = make_git_project(
        tmp_path / "proj", stories={STORY: "ready-for-dev"}, agents_toml=agents_toml, verification=verification,
        FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"), **env,
    )
    (root / STORY_DIR / f"{STORY}.md").write_text(STORY_TEXT)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "story file")
    return root


def worker_processes(local_env, tmp_path: Path, name: str) -> tuple[str, Path, list[WorkerProcess]]:
    """Two BSO worker processes (not started) on a queue prefix of their own, logging to one file: a worker and
    the one that replaces it."""
    prefix = f"{name}-{uuid.uuid4().hex[:6]}-"
    address = local_env.client.service_client.config.target_host
    logs = tmp_path / "worker.log"
    return prefix, logs, [WorkerProcess(address, logs, ["--queue-prefix", prefix]) for _ in range(2)]


def agent_runs(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def story_error(report: SprintReport, key: str = STORY) -> str:
    for batch in report.batches:
        for result in batch.results.story_results:
            if result.story_key == key:
                return result.error or ""
    return ""


async def sprint(local_env, root: Path, session: str, **overrides) -> SprintReport:
    async with bso_worker(local_env.client) as queue:
        inp = sprint_input(root, session_id=session, agent_backend="command", config_overrides=overrides)
        return await asyncio.wait_for(run_sprint(local_env.client, queue, inp), SPRINT_TIMEOUT)


async def test_story_from_backlog_to_done_squashed_and_merged(local_env, tmp_path: Path) -> None:
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"))
    base = git(root, "rev-parse", "HEAD").strip()
    session = f"cmd-local-{uuid.uuid4().hex[:6]}"
    report = await sprint(local_env, root, session)
    assert report.status is SprintStatus.COMPLETE, report
    assert report.stories == {STORY: "done"} and status_values(root)[STORY] == "done"
    assert git(root, "log", "--format=%s", f"{base}..HEAD").splitlines() == ["feat: Story 1.1: Hello"]
    assert "src/story_1_1_hello_world.py" in git(root, "show", "--name-only", "--format=", "HEAD").split()
    assert [(r["agent"], r["mode"], r["phase"]) for r in agent_runs(tmp_path)] == [  # PO gates on: plan first
        ("story-creator", "create", ""), ("story-reviewer", "review", ""),
        ("dev-runner", "dev", "plan"), ("dev-runner", "dev", "implement"), ("review-runner", "review", ""),
    ]
    assert await workflow_task_failures(local_env.client, session) == []


async def test_agent_hanging_past_its_timeout_is_killed_with_its_group(local_env, tmp_path: Path) -> None:
    pids = tmp_path / "pids.json"
    root = ready_project(
        tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 3\n",
        FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(pids),
    )
    base = git(root, "rev-parse", "HEAD").strip()
    report = await sprint(local_env, root, f"cmd-hang-{uuid.uuid4().hex[:6]}")
    assert report.stories == {STORY: "needs-intervention"}, report
    assert "timed out after 3s; process group killed" in story_error(report)
    recorded = json.loads(pids.read_text())  # the agent and the children it started
    assert len(recorded) == 3
    assert await gone(*recorded), recorded  # killed: gone once the kernel has reaped them
    assert git(root, "rev-parse", "HEAD").strip() == base


async def test_a_cancelled_sprint_stops_its_agent_within_seconds(local_env, tmp_path: Path) -> None:
    """The agent hangs; the sprint is cancelled: its process group is killed within seconds. The activity heard
    of the cancel with its next heartbeat the SDK let through, ~48 s later, and the agent worked on meanwhile."""
    pids = tmp_path / "pids.json"
    root = ready_project(tmp_path, FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(pids))
    session = f"cmd-cancel-{uuid.uuid4().hex[:6]}"
    async with bso_worker(local_env.client) as queue:
        handle = await start_sprint(local_env.client, queue, sprint_input(
            root, session_id=session, agent_backend="command", config_overrides={"po_gates_enabled": False}
        ))
        for _ in range(600):  # the agent and the children it started are up
            if pids.exists() and len(json.loads(pids.read_text() or "[]")) == 3:
                break
            await asyncio.sleep(0.1)
        recorded = json.loads(pids.read_text())
        await asyncio.sleep(3)  # a heartbeat or two went out before the cancel
        await handle.cancel()
        loop = asyncio.get_running_loop()
        cancelled_at = loop.time()
        while any(alive(pid) for pid in recorded) and loop.time() - cancelled_at < 30:
            await asyncio.sleep(0.2)
        stopped_after = loop.time() - cancelled_at
    assert await gone(*recorded), recorded  # killed: gone once the kernel has reaped them
    assert stopped_after < 15, f"the agent ran {stopped_after:.0f}s after the cancel"


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
async def test_a_sprint_cancelled_while_its_worker_is_down_stops_its_agent(local_env, tmp_path: Path, stop: str) -> None:
    """The worker is killed hard while the agent works (the agent runs on, for a retry to adopt once the
    attempt's heartbeat times out); the sprint is cancelled before that, so no attempt of the dispatch comes
    again to hear of it. Once a worker is back, the cancelled sprint stops the agent. It ran on until its
    launcher's backstop (its timeout plus 60 s). A worker stopped gracefully leaves its agent too, and its
    attempt's retry comes at once; when it adopts the agent as the sprint stops it (timing decides), it must
    not take that for a crash and run the agent again."""
    pids = tmp_path / "pids.json"
    root = ready_project(tmp_path, FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(pids))
    prefix, logs, (first_worker, second_worker) = worker_processes(local_env, tmp_path, "down")
    inp = sprint_input(
        root, session_id=f"cmd-down-{uuid.uuid4().hex[:6]}", agent_backend="command",
        config_overrides={"po_gates_enabled": False},
    )
    recorded: list[int] = []
    first_worker.start()
    try:
        handle = await start_sprint(local_env.client, prefix + SPRINT_TASK_QUEUE, inp)
        for _ in range(1800):  # the agent and the children it started are up
            if pids.exists() and len(json.loads(pids.read_text() or "[]")) == 3:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the dev agent never started; worker log:\n{logs.read_text()[-3000:]}")
        recorded = json.loads(pids.read_text())
        await asyncio.to_thread(first_worker.kill9 if stop == "kill -9" else first_worker.stop)
        assert all(alive(pid) for pid in recorded)
        await handle.cancel()
        await asyncio.sleep(2)  # the cancel is recorded; no worker heard it
        second_worker.start()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), SPRINT_TIMEOUT)
        loop = asyncio.get_running_loop()
        ended_at = loop.time()
        while any(alive(pid) for pid in recorded) and loop.time() - ended_at < 10:
            await asyncio.sleep(0.2)
    finally:
        first_worker.kill9()
        second_worker.stop()
        latest = json.loads(pids.read_text() or "[]") if pids.exists() else []
        survivors = [pid for pid in dict.fromkeys([*recorded, *latest]) if alive(pid)]
        for pid in survivors:  # the fake agents this test started (a failed run leaves them)
            os.kill(pid, signal.SIGKILL)
    assert not survivors, f"the cancelled sprint's agent runs on: {survivors}"
    assert len(agent_runs(tmp_path)) == 1, agent_runs(tmp_path)  # stopped, never run again


async def test_leaked_env_file_is_refused_and_never_committed(local_env, tmp_path: Path) -> None:
    root = ready_project(tmp_path, FAKE_AGENT_BEHAVIOR="leak-env")
    base = git(root, "rev-parse", "HEAD").strip()
    report = await sprint(local_env, root, f"cmd-leak-{uuid.uuid4().hex[:6]}")
    assert report.stories == {STORY: "needs-intervention"}, report
    error = story_error(report)
    assert "secret-looking files refused by the Git Exit Gate: .env" in error
    assert git(root, "rev-parse", "HEAD").strip() == base
    assert ".env" not in git(root, "log", "--all", "--name-only", "--format=").split()


async def test_verification_overrides_a_false_success_and_its_output_goes_to_the_fix(
    local_env, tmp_path: Path
) -> None:
    # The dev-runner breaks the story's test and claims success; the fix (told the failing output) repairs it.
    root = ready_project(tmp_path, FAKE_AGENT_BEHAVIOR="break-tests-in-dev")
    base = git(root, "rev-parse", "HEAD").strip()
    session = f"cmd-verify-{uuid.uuid4().hex[:6]}"
    report = await sprint(local_env, root, session)
    assert report.stories == {STORY: "done"}, report
    assert [(r["agent"], r["mode"], r["phase"]) for r in agent_runs(tmp_path)] == [
        ("dev-runner", "dev", "plan"), ("dev-runner", "dev", "implement"),
        ("dev-runner", "fix", "plan"), ("dev-runner", "fix", "implement"), ("review-runner", "review", ""),
    ]
    fix = next(r for r in agent_runs(tmp_path) if r["mode"] == "fix" and r["phase"] == "implement")
    fix_prompt = (command.run_dir_for(str(root), fix["dispatch_id"]) / "prompt.md").read_text()
    # The failing output reached the fix: among its findings, and as the last verification run.
    assert "## Findings to fix" in fix_prompt and "BSO's verification failed" in fix_prompt
    assert "FAIL tests/test_story_1_1_hello_world.py" in fix_prompt
    assert "the last verification run failed" in fix_prompt
    merged_test = git(root, "show", "HEAD:tests/test_story_1_1_hello_world.py")
    assert "'hello'" in merged_test and "'goodbye'" not in merged_test
    assert git(root, "log", "--format=%s", f"{base}..HEAD").splitlines() == ["feat: Story 1.1: Hello"]
    assert await workflow_task_failures(local_env.client, session) == []


SLOW_CHECK = '''import os, sys, time
with open(os.environ["CHECK_LOG"], "a") as fh:
    fh.write(f"{os.getpid()}\\n")
deadline = time.monotonic() + 120
while os.path.exists(os.environ["CHECK_HOLD"]) and time.monotonic() < deadline:
    time.sleep(0.2)
print("1 passed, 0 failed")
'''


async def test_worker_killed_while_checking_a_finished_agent_does_not_rerun_it(local_env, tmp_path: Path) -> None:
    """kill -9 of the worker process after the agent finished and committed, while BSO's verification ran;
    a restarted worker's retry checks the work again and the agent ran exactly once."""
    check, check_log, hold = tmp_path / "slow_check.py", tmp_path / "checks.log", tmp_path / "hold"
    check.write_text(SLOW_CHECK)
    hold.touch()
    root = ready_project(
        tmp_path, verification=[["python3", "run_checks.py"], [sys.executable, str(check)]],
        CHECK_LOG=str(check_log), CHECK_HOLD=str(hold),
    )

    prefix, logs, (first_worker, second_worker) = worker_processes(local_env, tmp_path, "crash")
    session = f"cmd-crash-{uuid.uuid4().hex[:6]}"
    inp = sprint_input(
        root, session_id=session, agent_backend="command",
        config_overrides={"agent_retry": {"heartbeat_timeout_seconds": 5, "initial_interval_seconds": 0.5}},
    )
    first_worker.start()
    try:
        handle = await start_sprint(local_env.client, prefix + SPRINT_TASK_QUEUE, inp)
        for _ in range(1800):  # the dev agent finished and committed; BSO's slow check runs
            if check_log.exists() and check_log.read_text().strip():
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"verification never started; worker log:\n{logs.read_text()[-3000:]}")
        first_worker.kill9()
        hold.unlink()  # the orphaned check of the dead worker ends; the retry's check is quick
        second_worker.start()
        report = await asyncio.wait_for(handle.result(), SPRINT_TIMEOUT)
    finally:
        first_worker.kill9()
        second_worker.stop()
        hold.unlink(missing_ok=True)
    assert report.stories == {STORY: "done"}, report
    devs = [r for r in agent_runs(tmp_path) if r["agent"] == "dev-runner" and r["phase"] == "implement"]
    assert len(devs) == 1, devs  # the agent ran once for its dispatch ...
    run_dir = command.run_dir_for(str(root), devs[0]["dispatch_id"])
    assert json.loads((run_dir / "command.json").read_text())["attempt"] >= 2  # ... though its activity ran twice
    assert len(check_log.read_text().split()) >= 2  # the retry verified the work again
    assert "feat: Story 1.1: Hello" in git(root, "log", "-1", "--format=%s")


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
async def test_worker_stopped_while_its_agent_works_does_not_rerun_it(local_env, tmp_path: Path, stop: str) -> None:
    """The worker process dies while the dev agent works: killed hard, the orphaned agent finishes alone, then
    a worker is restarted; stopped gracefully (Ctrl-C, a deploy), the agent goes on and the next worker's
    retry adopts it while it still runs. Either way the agent never runs again. A graceful stop used to kill
    the agent, and the retry ran it from scratch."""
    root = ready_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="3" if stop == "kill -9" else "8")
    prefix, logs, (first_worker, second_worker) = worker_processes(local_env, tmp_path, "orphan")
    inp = sprint_input(
        root, session_id=f"cmd-orphan-{uuid.uuid4().hex[:6]}", agent_backend="command",
        config_overrides={"agent_retry": {"heartbeat_timeout_seconds": 5, "initial_interval_seconds": 0.5}},
    )
    first_worker.start()
    try:
        handle = await start_sprint(local_env.client, prefix + SPRINT_TASK_QUEUE, inp)
        for _ in range(1800):  # the dev agent started (after its plan)
            devs = [r for r in agent_runs(tmp_path) if r["agent"] == "dev-runner" and r["phase"] == "implement"]
            if devs:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the dev agent never started; worker log:\n{logs.read_text()[-3000:]}")
        if stop == "kill -9":
            first_worker.kill9()
            assert alive(devs[0]["pid"])
            for _ in range(300):  # the orphan finishes while no worker runs
                if not alive(devs[0]["pid"]):
                    break
                await asyncio.sleep(0.1)
        else:
            await asyncio.to_thread(first_worker.stop)
            assert alive(devs[0]["pid"]), "the worker's graceful stop killed its agent"
        second_worker.start()
        report = await asyncio.wait_for(handle.result(), SPRINT_TIMEOUT)
    finally:
        first_worker.kill9()
        second_worker.stop()
    assert report.stories == {STORY: "done"}, report
    devs = [r for r in agent_runs(tmp_path) if r["agent"] == "dev-runner" and r["phase"] == "implement"]
    assert len(devs) == 1, devs
    run_dir = command.run_dir_for(str(root), devs[0]["dispatch_id"])
    assert "thinking slowly" in (run_dir / "stdout.log").read_text() and not (run_dir / "previous").exists()
    assert "feat: Story 1.1: Hello" in git(root, "log", "-1", "--format=%s")


@pytest.mark.parametrize("cut", ["terminated", "cancelled"])
async def test_a_batch_ended_during_a_merge_has_the_merge_finished_before_the_dependants_go_on(
    local_env, tmp_path: Path, monkeypatch, cut: str
) -> None:
    """A done story holds its dependants until its branch is merged back. Its Slave terminated in the middle
    of the merge (as one timing out would be) sends no word of it: the Master finishes the merge itself, then
    lets the dependants go on, which build on the merged work. Before, the dependant's batch waited until its
    own timeout; later, it went on at once with the merge unconfirmed. A cancelled sprint finishes nothing:
    the story says to check its merge."""
    slow_down_merges(monkeypatch, 8)
    second = "1-2-second-story"
    root = make_git_project(tmp_path / "proj", stories={STORY: "ready-for-dev", second: "ready-for-dev"})
    for key, scope in ((STORY, ""), (second, f"Depends on: {STORY}")):
        (root / STORY_DIR / f"{key}.md").write_text(
            f"# Story 1.{key[2]}: Story {key[2]}\n\nStatus: ready-for-dev\n\n{scope}\n\n"
            "## Acceptance Criteria\n\n1. it works\n"
        )
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "story files")
    session = f"cmd-cut-{uuid.uuid4().hex[:6]}"
    overrides = {"batch_size": 1, "max_concurrent_slaves": 2, "po_gates_enabled": False}
    async with bso_worker(local_env.client) as queue:
        inp = sprint_input(root, session_id=session, agent_backend="command", config_overrides=overrides)
        handle = await start_sprint(local_env.client, queue, inp)
        merging = await wait_status(handle, lambda s: s.stories[STORY].merging, "story 1 merging", timeout=120)
        first, dependant = merging.stories[STORY].batch_id, merging.stories[second].batch_id
        assert first != dependant and dependant in merging.running_batches, merging
        if cut == "cancelled":
            await handle.cancel()
            with pytest.raises(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), SPRINT_TIMEOUT)
            view = (await handle.query(SprintMasterWorkflow.status)).stories[STORY]
            assert not view.merging and view.error == MERGE_CUT_SHORT and view.work_left_out, view
            return
        await local_env.client.get_workflow_handle(slave_workflow_id(session, first)).terminate("test: cut short")
        await wait_status(handle, lambda s: s.stories[second].state == "done", "the dependant done", timeout=120)
        report = await asyncio.wait_for(handle.result(), SPRINT_TIMEOUT)
        view = (await handle.query(SprintMasterWorkflow.status)).stories[STORY]
    assert report.stories == {STORY: "done", second: "done"}, report
    assert not view.merging and view.error is None and not view.work_left_out, view
    assert report.status is SprintStatus.COMPLETE, report.status
    assert git(root, "log", "--no-merges", "--format=%s", "-2").split("\n")[:2] == [
        "feat: Story 1.2: Story 2", "feat: Story 1.1: Story 1"
    ]
