"""Large and odd review answers through the real Slave: what enters the batch's history is bounded
(bso.answer_size), the fix still gets what it needs, and a blocking issue the fix's feedback could not carry no
longer fails the batch."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import Client

from bso.answer_size import MAX_ANSWER_HISTORY_BYTES
from bso.constants import slave_workflow_id
from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS
from tests.conftest import bso_worker
from tests.workflow.helpers import (
    fix_assignments,
    make_project,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    workflow_task_failures,
)
from tests.workflow.test_external_agents import _complete, _pending, _published

K1 = "1-1-login-form"
HUGE_FILE = "src/" + "deep/" * 1_400 + "login.py"  # 7,000 characters


async def _history_bytes(client: Client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.to_json().encode())


async def test_a_blocking_issue_longer_than_feedback_holds_is_cut_not_fatal(ts_env, tmp_path: Path):
    """A review naming a 3,000-character blocking issue: the fix's feedback item (at most 2,000) raised a
    ValidationError in the Slave, which failed the batch and left the story where it was."""
    make_project(tmp_path, {K1: "review"})
    simulation = {"stories": {"1-1": {"blocking": ["x" * 3_000]}}}
    inp = sprint_input(tmp_path, simulation=simulation, session_id="long-issue")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.stories == {K1: "done"}, report
    assert status_values(tmp_path)[K1] == "done"
    (fix,) = await fix_assignments(ts_env.client, slave_workflow_id("long-issue", 1))
    assert [f["issue"] for f in fix["fix_feedback"]] == ["x" * MAX_SUMMARY_CHARS]
    assert await workflow_task_failures(ts_env.client, "long-issue") == []


async def test_a_signalled_answer_of_megabytes_reaches_the_fix_bounded(ts_env, tmp_path: Path):
    """An external review answer of 200 findings with 7,000-character paths and an empty blocking issue: the
    Slave takes it fitted (the most severe findings, a note naming the signal for the rest), so the fix's input
    stays small, and the empty blocking issue no longer fails the batch."""
    make_project(tmp_path, {K1: "review"})
    client = ts_env.client
    findings = [
        {"severity": "HIGH" if n < 60 else "LOW", "summary": f"finding {n} " + "s" * 1_900, "file": HUGE_FILE}
        for n in range(MAX_FINDINGS)
    ]
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="big"))
        slave_id = slave_workflow_id("big", 1)
        slave = client.get_workflow_handle(slave_id)
        review_id, agent, mode = await _pending(client, slave_id, ts_env)
        answer = _complete(review_id, agent, mode, findings=findings, blocking_issues=[""])
        assert len(json.dumps(answer)) > 1_500_000
        await slave.signal("agent_complete", answer)

        fix_id, agent, mode = await _pending(client, slave_id, ts_env, after=review_id)
        assert (agent, mode) == ("dev-runner", "fix")
        fix = await _published(tmp_path, fix_id)
        assert len(json.dumps(fix)) < MAX_ANSWER_HISTORY_BYTES
        summaries = [f["summary"] for f in fix["fix_findings"]]
        *kept, note = summaries
        assert [s.split()[1] for s in kept] == [str(n) for n in range(len(kept))]  # HIGH ones, in order
        assert note.startswith(f"{MAX_FINDINGS - len(kept)} more findings of this answer ({MAX_FINDINGS} in all)")
        assert note.endswith(f"the whole answer: the AGENT_COMPLETE signal in the history of {slave_id}")
        assert all(len(f["file"] or "") <= 1_000 for f in fix["fix_findings"])
        await slave.signal("agent_complete", _complete(fix_id, agent, mode))
        review2_id, agent, mode = await _pending(client, slave_id, ts_env, after=fix_id)
        await slave.signal("agent_complete", _complete(review2_id, agent, mode))
        report = await sprint_result(handle)
    assert report.stories == {K1: "done"}
    assert await workflow_task_failures(client, "big") == []
