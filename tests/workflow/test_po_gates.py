"""Agent-PO gates through the real Slave (time-skipping): GO/FEEDBACK/BLOCKED on plans, NEXT/FIX/BLOCKED on reports."""

from __future__ import annotations

import json
from pathlib import Path

from bso.constants import slave_workflow_id
from bso.models import DEFAULT_STATUS_FILE
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, run_sprint, sprint_input

K1 = "1-1-login-form"
STORY = """# Story 1.1: Login form

Status: ready-for-dev
Files: src/login.py, tests/test_login.py

## Acceptance Criteria

1. The form shows
2. Errors are reported

## Tasks / Subtasks

- [ ] Task 1
"""


def _gates(root: Path, gate: str) -> list[dict]:
    path = root / ".sprint-session" / "gates" / f"{K1}-{gate}.json"
    return json.loads(path.read_text())["decisions"] if path.exists() else []


async def _assignments(ts_env, session_id: str) -> list[dict]:
    slave = ts_env.client.get_workflow_handle(slave_workflow_id(session_id, 1))
    out = []
    async for event in slave.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "run_agent":
                out.append(json.loads(attrs.input.payloads[0].data))
    return out


async def _run(ts_env, root: Path, po: dict, **overrides):
    make_project(root, {K1: "ready-for-dev"}, {K1: STORY})
    assert (root / DEFAULT_STATUS_FILE).parent.joinpath(f"{K1}.md").exists()
    inp = sprint_input(
        root,
        simulation={"stories": {"1-1": {"po": po}}},
        config_overrides={"po_gates_enabled": True, "story_review_enabled": False, **overrides},
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
    batch = report.batches[0]
    assert batch.gates_go_issued >= batch.gates_next_issued  # the invariant
    story = next(r for r in batch.results.story_results if r.story_key == K1)
    return report, batch, story


async def test_go_first_time_then_next(ts_env, tmp_path: Path):
    report, batch, _ = await _run(ts_env, tmp_path, {})
    assert report.stories == {K1: "done"}
    assert (batch.gates_go_issued, batch.gates_next_issued) == (1, 1)
    go = _gates(tmp_path, "go")
    assert [d["outcome"] for d in go] == ["GO"] and len(go[0]["plan_sha256"]) == 64
    assert go[0]["directive"]["authorization"]["authorized_files"] == ["src/login.py", "tests/test_login.py"]
    assert [d["outcome"] for d in _gates(tmp_path, "next")] == ["NEXT"]


async def test_feedback_then_go(ts_env, tmp_path: Path):
    report, batch, _ = await _run(ts_env, tmp_path, {"plan": ["missing_ac", "out_of_scope", "good"]})
    assert report.stories == {K1: "done"}
    go = _gates(tmp_path, "go")
    assert [d["outcome"] for d in go] == ["FEEDBACK", "FEEDBACK", "GO"]
    assert go[0]["issues"][0]["ac_id"] == "AC-2"
    assert go[1]["issues"][0]["type"] == "file_out_of_scope"
    plans = [a["po"] for a in await _assignments(ts_env, report.session_id) if a["po"].get("phase") == "plan"]
    assert [p["feedback"] is None for p in plans] == [True, False, False]
    assert plans[1]["feedback"]["status"] == "NEEDS_REVISION"
    assert (batch.gates_go_issued, batch.gates_next_issued) == (1, 1)


async def test_blocked_after_max_revisions(ts_env, tmp_path: Path):
    report, batch, story = await _run(ts_env, tmp_path, {"plan": ["no_tests"] * 3})
    assert report.stories == {K1: "needs-intervention"}
    assert [d["outcome"] for d in _gates(tmp_path, "go")] == ["FEEDBACK", "FEEDBACK", "BLOCKED"]
    assert "PO gate BLOCKED" in (story.error or "")
    assert (batch.gates_go_issued, batch.gates_next_issued) == (0, 0)
    assert _gates(tmp_path, "next") == []


async def test_fix_then_next(ts_env, tmp_path: Path):
    report, batch, _ = await _run(ts_env, tmp_path, {"report": ["failing_tests", "out_of_scope", "good"]})
    assert report.stories == {K1: "done"}
    nxt = _gates(tmp_path, "next")
    assert [d["outcome"] for d in nxt] == ["FIX", "FIX", "NEXT"]
    assert nxt[1]["directive"]["retry"]["count"] == 2
    impl = [a["po"] for a in await _assignments(ts_env, report.session_id) if a["po"].get("phase") in ("implement", "fix")]
    assert [(p["phase"], p["fresh_context"]) for p in impl] == [("implement", False), ("fix", False), ("fix", True)]
    assert impl[1]["fix"]["validation"]["issues"][0]["type"] == "tests_failed"
    assert impl[2]["anti_patterns"] == [
        "attempt 1: 1 test(s) failed",
        "attempt 2: somewhere/else/unrelated.py was changed without authorization",
    ]
    assert (batch.gates_go_issued, batch.gates_next_issued) == (1, 1)


async def test_blocked_after_max_retries(ts_env, tmp_path: Path):
    report, batch, story = await _run(ts_env, tmp_path, {"report": ["failing_tests"] * 3}, po_max_retries=1)
    assert report.stories == {K1: "needs-intervention"}
    assert [d["outcome"] for d in _gates(tmp_path, "next")] == ["FIX", "BLOCKED"]
    assert "completion rejected after 1 fix retry" in (story.error or "")
    assert (batch.gates_go_issued, batch.gates_next_issued) == (1, 0)


def _story(key: str) -> str:
    return STORY.replace("Story 1.1: Login form", f"Story {key[0]}.{key[2]}: Story {key}")


async def test_master_sums_the_gate_counters_of_its_slaves(ts_env, tmp_path: Path):
    """Four stories in several batches, one per gate path: the report and the status sum the Slaves' counters."""
    keys = ["1-1-login-form", "1-2-logout", "1-3-profile", "1-4-settings"]
    make_project(tmp_path, {k: "ready-for-dev" for k in keys}, {k: _story(k) for k in keys})
    po = {
        "1-1": {},  # GO, NEXT
        "1-2": {"plan": ["no_tests"] * 3},  # FEEDBACK, FEEDBACK, BLOCKED
        "1-3": {"report": ["failing_tests", "good"]},  # GO, FIX, NEXT
        "1-4": {"plan": ["missing_ac", "good"], "report": ["failing_tests"] * 3},  # FEEDBACK, GO, FIX, BLOCKED
    }
    inp = sprint_input(
        tmp_path,
        session_id="gate-totals",
        simulation={"stories": {k: {"po": v} for k, v in po.items()}},
        config_overrides={"po_gates_enabled": True, "story_review_enabled": False, "po_max_retries": 1},
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, inp)
        status = await ts_env.client.get_workflow_handle("gate-totals").query("status")
    assert report.stories == {keys[0]: "done", keys[1]: "needs-intervention", keys[2]: "done", keys[3]: "needs-intervention"}
    assert len(report.batches) >= 2  # they share their Files: scope, so the planner keeps them apart
    totals = report.po_gates
    assert (totals.go_issued, totals.next_issued, totals.feedback_issued, totals.fix_issued, totals.blocked) == (
        3, 2, 3, 2, 2,
    )
    for name, field in (("go_issued", "gates_go_issued"), ("next_issued", "gates_next_issued"),
                        ("feedback_issued", "gates_feedback_issued"), ("fix_issued", "gates_fix_issued"),
                        ("blocked", "gates_blocked")):
        assert getattr(totals, name) == sum(getattr(b, field) for b in report.batches)
    assert all(b.gates_go_issued >= b.gates_next_issued for b in report.batches)
    assert totals.go_issued >= totals.next_issued  # the invariant, sprint-wide
    assert status["po_gates"] == totals.model_dump(mode="json")
    summary = (tmp_path / ".sprint-session" / "execution-summary-gate-totals.md").read_text()
    assert "| PO gates | GO 3, NEXT 2, FEEDBACK 3, FIX 2, BLOCKED 2 |" in summary
