"""Agent-PO gates with the command backend: the real activity and a real sprint (time-skipping server),
the fake agent CLI answering the plan and completion phases (good, missing an AC, out of scope, claiming
fewer files than it changed, invalid)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.backends import command
from activities.git_ops import worktree_path
from activities.session_files import dispatch_answer_path
from bso.answer_size import MAX_ANSWER_HISTORY_BYTES
from bso.constants import slave_workflow_id
from bso.messages import CompletionReportPayload, PlanSubmissionPayload
from bso.po_gates import StoryScope, gates_active, go_gate, next_gate
from bso.states import AgentStatus
from tests.conftest import bso_worker
from tests.fake_agent.project import STORY, git, make_git_project
from tests.workflow.helpers import run_sprint, sprint_input, workflow_task_failures
from tests.workflow.test_command_backend import assignment, dev_project

SCOPE = StoryScope(ac_ids=["AC-1", "AC-2"], files=["src/**", "tests/**"])
MODULE = "story_1_1_hello_world"
PLANNED = [f"src/{MODULE}.py", f"src/{MODULE}_extra.py", f"tests/test_{MODULE}.py"]


def plan_assignment(root: Path, attempt: int = 1):
    po = {"ac_ids": SCOPE.ac_ids, "scope": SCOPE.files, "phase": "plan", "attempt": attempt, "feedback": None}
    return assignment(root, n=1).model_copy(update={"dispatch_id": f"s1/batch-1/1-1/1/plan-{attempt}", "po": po})


def impl_assignment(root: Path, attempt: int = 1, fix: dict | None = None):
    po = {
        "ac_ids": SCOPE.ac_ids, "scope": SCOPE.files, "phase": "implement" if attempt == 1 else "fix",
        "attempt": attempt, "authorized_files": PLANNED, "fix": fix, "fresh_context": False, "anti_patterns": [],
    }
    return assignment(root, n=1).model_copy(update={"dispatch_id": f"s1/batch-1/1-1/1/impl-{attempt}", "po": po})


def gate_plan(done) -> str:
    plan = PlanSubmissionPayload.model_validate(done.po_message)
    return go_gate(plan, SCOPE, revision=1, max_revisions=2, timeout_minutes=5, task_id=STORY)


def gate_report(done, retries_used: int = 0):
    report = CompletionReportPayload.model_validate(done.po_message)
    return next_gate(report, SCOPE, PLANNED, retries_used=retries_used, max_retries=2, task_id=STORY)


def test_the_command_backend_is_po_capable() -> None:
    assert gates_active(None, "command") and not gates_active(False, "command")


async def test_plan_phase_prompt_env_and_a_good_plan(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    a = plan_assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    prompt = (command.run_dir_for(str(root), a.dispatch_id) / "prompt.md").read_text()
    assert "Agent-PO gate: PLAN phase (attempt 1)" in prompt and "- AC-2" in prompt and "PLAN_SUBMISSION" in prompt
    decision = gate_plan(done)
    assert decision.outcome == "GO", decision.issues
    assert decision.go.authorization.authorized_files == sorted(PLANNED)
    # A plan changes nothing: no commit on the story branch, a clean worktree.
    wt = worktree_path(str(root), "s1", STORY)
    assert git(wt, "log", "--format=%s", "main..HEAD") == "" and git(wt, "status", "--porcelain") == ""
    assert done.tokens_used == 400  # the plan's own CLI usage


async def test_a_plan_that_commits_has_its_commit_set_aside(tmp_path: Path) -> None:
    """Real CLIs implement at once: a commit in the plan phase counted as the story's base for what followed, and
    an unplanned file went unseen by the scope guard and the PO into the merge."""
    from activities.git_ops import left_ref

    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="commit-in-plan")
    a = plan_assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    wt = worktree_path(str(root), "s1", STORY)
    assert git(wt, "log", "--format=%s", "main..HEAD") == "" and git(wt, "status", "--porcelain") == ""
    assert any("set back to" in f.summary for f in done.findings), done.findings
    assert git(wt, "log", "-1", "--format=%s", f"{left_ref(a.dispatch_id)}/head").strip() == "implemented during the plan"


async def test_plans_missing_an_ac_or_out_of_scope_get_feedback(tmp_path: Path) -> None:
    missing = await ActivityEnvironment().run(
        command.run, plan_assignment(dev_project(tmp_path / "a", FAKE_AGENT_PO_PLAN="missing-ac"))
    )
    decision = gate_plan(missing)
    assert decision.outcome == "FEEDBACK" and [(i.type, i.ac_id) for i in decision.issues] == [("ac_not_mapped", "AC-2")]
    outside = await ActivityEnvironment().run(
        command.run, plan_assignment(dev_project(tmp_path / "b", FAKE_AGENT_PO_PLAN="out-of-scope"))
    )
    decision = gate_plan(outside)
    assert decision.outcome == "FEEDBACK"
    assert [(i.type, getattr(i, "file", None)) for i in decision.issues] == [("file_out_of_scope", "docs/notes.md")]


async def test_an_invalid_plan_is_answered_with_validation_failed(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_PO_PLAN="invalid")
    a = plan_assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.po_message is None and done.error_type == "validation_failed"
    assert done.error == "validation_failed: plan.ac_mapping: required field missing"
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    seed = json.loads((run_dir / "validation_failed.json").read_text())
    assert seed["type"] == "error" and seed["error_type"] == "validation_failed"
    assert seed["errors"] == [{"field": "plan.ac_mapping", "error": "required field missing"}]
    error = json.loads((run_dir / "po-error.json").read_text())
    assert error["error"]["code"] == "INVALID_MESSAGE" and error["error"]["original_message_type"] == "PLAN_SUBMISSION"


async def test_a_good_completion_report_passes_next_on_the_real_diff(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    a = impl_assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    prompt = (command.run_dir_for(str(root), a.dispatch_id) / "prompt.md").read_text()
    assert "COMPLETION phase (implement, attempt 1)" in prompt and f"- `{PLANNED[0]}`" in prompt
    assert sorted(f["path"] for f in done.po_message["files_changed"]) == sorted(PLANNED)
    assert gate_report(done).outcome == "NEXT"


async def test_missing_ac_evidence_gets_a_fix(tmp_path: Path) -> None:
    done = await ActivityEnvironment().run(
        command.run, impl_assignment(dev_project(tmp_path, FAKE_AGENT_PO_REPORT="missing-ac"))
    )
    decision = gate_report(done)
    assert decision.outcome == "FIX" and [(i.type, i.ac_id) for i in decision.issues] == [("ac_no_evidence", "AC-2")]


async def test_a_report_claiming_fewer_files_is_checked_against_the_real_diff(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_PO_REPORT="fewer-files,good")
    first = impl_assignment(root)
    done = await ActivityEnvironment().run(command.run, first)
    assert done.status is AgentStatus.SUCCESS, done.error
    # The agent claimed only the planned files; it also changed docs/notes.md (committed by the exit gate).
    diff = json.loads((command.run_dir_for(str(root), first.dispatch_id) / "po-diff.json").read_text())
    assert diff["not_claimed"] == ["docs/notes.md"] and "docs/notes.md" not in diff["claimed"]
    assert "docs/notes.md" in [f["path"] for f in done.po_message["files_changed"]]
    decision = gate_report(done)
    assert decision.outcome == "FIX"
    assert [(i.type, getattr(i, "file", None)) for i in decision.issues] == [("unauthorized_file", "docs/notes.md")]
    assert any("left out changed files" in f.summary for f in done.findings)
    # The fix attempt removes the file: the diff since the first attempt began no longer has it.
    fixed = await ActivityEnvironment().run(command.run, impl_assignment(root, 2, fix=decision.fix.model_dump(mode="json")))
    assert fixed.status is AgentStatus.SUCCESS, fixed.error
    prompt = (command.run_dir_for(str(root), "s1/batch-1/1-1/1/impl-2") / "prompt.md").read_text()
    assert "[unauthorized_file] docs/notes.md was changed without authorization" in prompt
    assert sorted(f["path"] for f in fixed.po_message["files_changed"]) == sorted(PLANNED)
    assert gate_report(fixed, retries_used=1).outcome == "NEXT"


async def test_a_command_sprint_runs_the_gates_by_default(ts_env, tmp_path: Path) -> None:
    """po_gates_enabled unset: on for the command backend. FEEDBACK then GO, FIX (real diff) then NEXT."""
    root = make_git_project(
        tmp_path / "proj", FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"),
        FAKE_AGENT_PO_PLAN="missing-ac,good", FAKE_AGENT_PO_REPORT="fewer-files,good",
    )
    base = git(root, "rev-parse", "HEAD").strip()
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-po", agent_backend="command")
        )
    assert report.stories == {STORY: "done"}, report
    gates = root / ".sprint-session" / "gates"
    go = json.loads((gates / f"{STORY}-go.json").read_text())["decisions"]
    nxt = json.loads((gates / f"{STORY}-next.json").read_text())["decisions"]
    assert [d["outcome"] for d in go] == ["FEEDBACK", "GO"]
    assert [d["outcome"] for d in nxt] == ["FIX", "NEXT"]
    assert nxt[0]["issues"][0]["file"] == "docs/notes.md"
    batch = report.batches[0]
    assert (batch.gates_go_issued, batch.gates_next_issued) == (1, 1)
    # Every dispatch's tokens count, the plans' too: create, story review, 2 plans, 2 implementations, review.
    agents = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert len(agents) == 7
    assert report.tokens_used == 5 * 1700 + 2 * 400
    files = git(root, "diff", "--name-only", base, "HEAD").split()
    assert sorted(files) == sorted(PLANNED)  # the unauthorized file never reached main
    assert await workflow_task_failures(ts_env.client, "cmd-po") == []


async def test_a_plan_too_large_for_history_is_refused_by_the_gate_and_kept_whole_on_disk(ts_env, tmp_path: Path) -> None:
    """A valid plan of 300 KB: the agent activity returned it whole, into the batch's history, once per revision
    (a plan or report of megabytes, a completion report's real diff of thousands of files, had no bound; past
    2 MB every attempt of the activity failed). It is refused as an invalid plan is, saying why and where the
    whole answer is; the story needs intervention."""
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_PO_PLAN="huge")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-po-huge", agent_backend="command")
        )
    assert report.stories == {STORY: "needs-intervention"}, report
    (error,) = [r.error for b in report.batches for r in b.results.story_results if r.story_key == STORY]
    answer_file = dispatch_answer_path(str(root), "cmd-po-huge/batch-1/1-1/3/plan-1")
    assert error is not None and "PO gate: no valid PLAN_SUBMISSION (validation_failed: po_message: " in error
    assert f"bytes, over the 128,000 a workflow's history takes; the whole answer: {answer_file}" in error
    whole = json.loads(answer_file.read_text())["answer"]["po_message"]
    assert len(json.dumps(whole)) > 300_000
    history = await ts_env.client.get_workflow_handle(slave_workflow_id("cmd-po-huge", 1)).fetch_history()
    assert max(e.ByteSize() for e in history.events) < MAX_ANSWER_HISTORY_BYTES
    assert await workflow_task_failures(ts_env.client, "cmd-po-huge") == []


async def test_an_agent_complete_in_the_plan_phase_says_so_and_names_the_knob(ts_env, tmp_path: Path) -> None:
    """A home-made agent (it writes an AGENT_COMPLETE, as the README's "How an agent runs" says) under the command
    backend's default gates: the story ended `PO gate: no valid PLAN_SUBMISSION (validation_failed: agent_id: Field
    required; task_id: Field required; plan: Field required)`, three fields of a message the agent never heard of,
    and not what to do. It says an AGENT_COMPLETE came instead, and names the knob that turns the gates off."""
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_PO_PLAN="plain")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(root, session_id="cmd-po-plain", agent_backend="command")
        )
    assert report.stories == {STORY: "needs-intervention"}, report
    (error,) = [r.error for b in report.batches for r in b.results.story_results if r.story_key == STORY]
    assert error is not None and "PO gate: no valid PLAN_SUBMISSION (an AGENT_COMPLETE came" in error, error
    assert "Field required" not in error and "--set po_gates_enabled=false" in error, error
    assert await workflow_task_failures(ts_env.client, "cmd-po-plain") == []
