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
