"""Gear 2's improvement cycle through the Master: proposals, the top ones as stories, the same pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from bso.constants import slave_workflow_id
from tests.conftest import bso_worker
from tests.workflow.test_external_agents import _complete, _pending
from tests.workflow.helpers import make_project, run_sprint, sprint_input, sprint_result, start_sprint, status_values
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"
K2 = "1-2-logout"
IMPROVEMENTS = [
    {"improvement_id": "imp_001", "description": "Add caching layer to reduce database queries",
     "category": "performance", "priority": "high", "priority_score": 8.5,
     "acceptance_criteria": ["Cache implemented with configurable TTL", "Cache invalidated on data modification"]},
    {"improvement_id": "imp_002", "description": "Structured logging", "priority_score": 9.1},
    {"improvement_id": "imp_003", "description": "Rename variables", "priority_score": 2.0},
]


async def test_top_improvement_runs_through_the_pipeline(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "review"})
    simulation = {"improvements": IMPROVEMENTS, "stories": {"1-4": {"review": ["HIGH"]}}}
    inp = sprint_input(tmp_path, simulation=simulation,
                       config_overrides={"improvement_cycle": True, "max_improvements": 2})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert [i.improvement_id for i in report.improvements] == ["imp_002", "imp_001"]
    assert [i.story_key for i in report.improvements] == ["1-3-imp-002", "1-4-imp-001"]
    assert report.stories == {K1: "done", K2: "done", "1-3-imp-002": "done", "1-4-imp-001": "done"}
    values = status_values(tmp_path)
    assert values["1-3-imp-002"] == values["1-4-imp-001"] == "done"
    # The improvement story went through dev, a review that asked for a fix, the fix, and a clean review.
    imp_result = next(r for b in report.batches for r in b.results.story_results if r.story_key == "1-4-imp-001")
    assert imp_result.agents_dispatched == 4
    assert len(report.batches) == 2 and report.batches[1].results.stories_total == 2
    story_file = next(tmp_path.rglob("1-4-imp-001.md")).read_text()
    assert "Cache implemented with configurable TTL" in story_file and "Tags: improvement, performance" in story_file


async def test_no_cycle_unless_every_story_is_done(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev", K2: "ready-for-dev"})
    simulation = {"improvements": IMPROVEMENTS, "stories": {"1-2": {"fail": {"dev": "error"}}}}
    inp = sprint_input(tmp_path, simulation=simulation, config_overrides={"improvement_cycle": True})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert report.improvements == [] and set(report.stories) == {K1, K2}


async def test_external_proposals_file_with_an_invalid_entry(ts_env, tmp_path: Path):
    """Any other backend: the scrum-master's proposals come from .sprint-session/improvements.json."""
    make_project(tmp_path, {K1: "review"})
    (tmp_path / ".sprint-session").mkdir(exist_ok=True)
    gear2 = {"message_id": "msg_mno345", "message_type": "improvement_requested", "from_agent": "moderator",
             "to_agent": "techlead", "timestamp": "2024-10-15T11:15:00", "payload": IMPROVEMENTS[0]}
    (tmp_path / ".sprint-session" / "improvements.json").write_text(json.dumps([gear2, {"improvement_id": "x"}]))
    inp = sprint_input(tmp_path, agent_backend="external", session_id="imp-ext",
                       config_overrides={"improvement_cycle": True})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        slave_id = slave_workflow_id(inp.session_id, 1)
        dispatch_id, agent, mode = await _pending(ts_env.client, slave_id, ts_env)
        await ts_env.client.get_workflow_handle(slave_id).signal(
            "agent_complete", _complete(dispatch_id, agent, mode)
        )
        # The Master planned the proposal as a new story; answer its dev and review agents as they come.
        imp_slave = slave_workflow_id(inp.session_id, 2)
        last = None
        for _ in range(2):  # dev, then code review
            last, agent, mode = await _pending(ts_env.client, imp_slave, ts_env, after=last)
            await ts_env.client.get_workflow_handle(imp_slave).signal(
                "agent_complete", {**_complete(last, agent, mode), "story_key": "1-2-imp-001"}
            )
        report = await sprint_result(handle)
        view = await handle.query(SprintMasterWorkflow.status)
    assert any("improvement proposal rejected: [1] validation_failed" in e for e in view.errors)
    assert [i.story_key for i in report.improvements] == ["1-2-imp-001"]
    assert report.stories == {K1: "done", "1-2-imp-001": "done"}
    assert status_values(tmp_path)["1-2-imp-001"] == "done"


async def test_proposals_that_cannot_be_read_leave_the_sprint_done_with_an_error(ts_env, tmp_path: Path, monkeypatch):
    """The proposals activity failing for good (whatever broke it) failed the whole sprint, its stories done."""
    import activities.improvements

    def broken(inp):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(activities.improvements, "_read_proposals", broken)
    make_project(tmp_path, {K1: "review"})
    inp = sprint_input(tmp_path, agent_backend="external", session_id="imp-broken",
                       config_overrides={"improvement_cycle": True})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        slave_id = slave_workflow_id(inp.session_id, 1)
        dispatch_id, agent, mode = await _pending(ts_env.client, slave_id, ts_env)
        await ts_env.client.get_workflow_handle(slave_id).signal("agent_complete", _complete(dispatch_id, agent, mode))
        report = await sprint_result(handle)
        view = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "done"} and report.improvements == []
    assert [e for e in view.errors if "improvement" in e] == [
        "improvement cycle: proposals not read (RuntimeError: disk on fire)"
    ]


async def test_an_error_message_among_the_proposals_is_rejected_not_a_crash(tmp_path: Path):
    """A Gear 2 error message (no payload) in the file made the activity fail with AttributeError."""
    from temporalio.testing import ActivityEnvironment

    from activities.improvements import propose_improvements
    from bso.improvements import ProposeInput

    (tmp_path / ".sprint-session").mkdir()
    error = {"type": "error", "error_type": "validation_failed", "original_message_id": "msg-12345678",
             "errors": [{"field": "x", "error": "bad"}]}
    (tmp_path / ".sprint-session" / "improvements.json").write_text(json.dumps([error, IMPROVEMENTS[0]]))
    read = await ActivityEnvironment().run(
        propose_improvements, ProposeInput(project_root=str(tmp_path), session_id="imp-err", backend="command")
    )
    assert [p.improvement_id for p in read.proposals] == [IMPROVEMENTS[0]["improvement_id"]]
    assert read.rejected == ["not an improvement_requested: ValidationFailed"]


async def test_a_sprints_own_proposals_file_wins_over_the_shared_one(tmp_path: Path):
    from temporalio.testing import ActivityEnvironment

    from activities.improvements import propose_improvements
    from bso.improvements import ProposeInput

    session_dir = tmp_path / ".sprint-session"
    (session_dir / "improvements").mkdir(parents=True)
    (session_dir / "improvements.json").write_text(json.dumps([IMPROVEMENTS[0]]))
    own = {**IMPROVEMENTS[0], "improvement_id": "imp_own", "description": "This sprint's own proposal"}
    (session_dir / "improvements" / "imp-own.json").write_text(json.dumps([own]))
    env = ActivityEnvironment()
    mine = await env.run(propose_improvements, ProposeInput(project_root=str(tmp_path), session_id="imp-own",
                                                            backend="command"))
    assert [p.improvement_id for p in mine.proposals] == ["imp_own"]
    other = await env.run(propose_improvements, ProposeInput(project_root=str(tmp_path), session_id="imp-other",
                                                             backend="command"))
    assert [p.improvement_id for p in other.proposals] == [IMPROVEMENTS[0]["improvement_id"]]  # the shared file


async def test_improvement_stories_are_numbered_after_the_epics_stories_outside_the_sprint(ts_env, tmp_path: Path):
    """1-3 is in the file but not in the sprint (--story 1-1): the improvement is 1-4-..., not a second 1-3."""
    make_project(tmp_path, {K1: "review", "1-3-profile-page": "backlog"})
    inp = sprint_input(tmp_path, story_keys=["1-1"], simulation={"improvements": IMPROVEMENTS[:1]},
                       config_overrides={"improvement_cycle": True, "max_improvements": 1})
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    assert [i.story_key for i in report.improvements] == ["1-4-imp-001"]
    assert status_values(tmp_path)["1-3-profile-page"] == "backlog"
