"""The command backend's Agent-PO rules (bso/po_agent.py): prompt section, answer validation, real diff."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from bso.messages import FileChanged, TaskAssignment
from bso.po_agent import gated_id, parse_name_status, parse_po_answer, po_complete, render_po_section, with_real_diff
from bso.prompting import BUILTIN_PROMPTS_DIR
from bso.states import AgentMode, AgentStatus, AgentType

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _a(po: dict) -> TaskAssignment:
    return TaskAssignment(
        dispatch_id="s/batch-1/1-1/3/plan-1", agent_type=AgentType.DEV_RUNNER, mode=AgentMode.DEV, story_key="1-1-x",
        story_path="x.md", session_id="s", batch_id=1, report_to="s/batch-1", project_root="/p", backend="command",
        po=po,
    )


def test_gated_id() -> None:
    assert gated_id("s/batch-1/1-1/3/impl-2") == gated_id("s/batch-1/1-1/3/plan-1") == "s/batch-1/1-1/3"
    assert gated_id("s/batch-1/1-1/3") == "s/batch-1/1-1/3"


def test_plan_section_carries_acs_scope_and_feedback() -> None:
    feedback = {"validation": {"issues": [{"type": "ac_not_mapped", "message": "AC-2 is not mapped", "ac_id": "AC-2"}]}}
    a = _a({"phase": "plan", "attempt": 2, "ac_ids": ["AC-1", "AC-2"], "scope": ["src/**"], "feedback": feedback})
    text = render_po_section((BUILTIN_PROMPTS_DIR / "po-plan.md").read_text(), a, "/r/result.json", AT.isoformat())
    assert "PLAN phase (attempt 2)" in text and "- AC-1\n- AC-2" in text and "- `src/**`" in text
    assert "[ac_not_mapped] AC-2 is not mapped" in text and "/r/result.json" in text and "$" not in text
    assert render_po_section("x", _a({}), "/r", AT.isoformat()) == ""


def test_completion_section_carries_authorized_files_and_anti_patterns() -> None:
    a = _a({"phase": "fix", "attempt": 3, "ac_ids": ["AC-1"], "authorized_files": ["src/a.py"], "fresh_context": True,
            "anti_patterns": ["attempt 1: 1 test(s) failed"], "fix": None})
    text = render_po_section((BUILTIN_PROMPTS_DIR / "po-complete.md").read_text(), a, "/r", AT.isoformat())
    assert "COMPLETION phase (fix, attempt 3)" in text and "- `src/a.py`" in text
    assert "fresh context" in text and "- attempt 1: 1 test(s) failed" in text and "COMPLETION_REPORT" in text


def test_answers_valid_wrong_type_invalid_and_blocked() -> None:
    a = _a({"phase": "plan"})
    plan = {"message_type": "PLAN_SUBMISSION", "agent_id": "dev-runner", "task_id": "1-1-x",
            "plan": {"approach": "x", "ac_mapping": [], "files_to_modify": [], "test_approach": {}}}
    ok = parse_po_answer(plan, "plan", AT)  # no timestamp: the time BSO read it
    assert ok.kind == "valid" and ok.payload["plan"]["approach"] == "x"
    assert po_complete(a, ok, "s").po_message == ok.payload
    wrong = parse_po_answer({**plan, "message_type": "COMPLETION_REPORT"}, "plan", AT)
    assert wrong.kind == "invalid" and wrong.failure.errors[0].field == "message_type"
    assert wrong.error_message["error"]["code"] == "INVALID_MESSAGE"
    bad = parse_po_answer({**plan, "plan": {"approach": ""}}, "plan", AT)
    assert bad.kind == "invalid" and {e.field for e in bad.failure.errors} >= {"plan.approach", "plan.ac_mapping"}
    done = po_complete(a, bad, "s")
    assert done.status is AgentStatus.SUCCESS and done.po_message is None and done.error.startswith("validation_failed: ")
    blocked = parse_po_answer(
        {"message_type": "BLOCKED_NOTIFICATION", "agent_id": "d", "task_id": "t", "reason": "no API key",
         "details": {"issue": "env missing"}}, "plan", AT,
    )
    assert blocked.kind == "blocked"
    failed = po_complete(a, blocked, "s")
    assert failed.status is AgentStatus.FAILURE and failed.error == "agent BLOCKED: no API key: env missing"


def test_name_status_and_real_diff() -> None:
    out = "A\x00src/new.py\x00M\x00src/old.py\x00R087\x00a.py\x00b.py\x00D\x00gone.py\x00"
    assert [(f.path, f.action) for f in parse_name_status(out)] == [
        ("src/new.py", "added"), ("src/old.py", "modified"), ("b.py", "renamed"), ("gone.py", "deleted"),
    ]
    assert parse_name_status("") == []
    report = {"files_changed": [{"path": "src/new.py", "action": "added", "lines_added": 5}, {"path": "x.py", "action": "modified"}]}
    real = [FileChanged(path="src/new.py", action="added"), FileChanged(path="docs/n.md", action="added")]
    merged, unclaimed, unchanged = with_real_diff(report, real)
    assert [f["path"] for f in merged["files_changed"]] == ["src/new.py", "docs/n.md"]
    assert merged["files_changed"][0]["lines_added"] == 5
    assert unclaimed == ["docs/n.md"] and unchanged == ["x.py"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_keys = st.sampled_from(["agent_id", "task_id", "plan", "revision", "summary", "ac_verification", "test_results",
                         "files_changed", "timestamp", "reason"])


@settings(max_examples=150)
@given(
    st.sampled_from(["PLAN_SUBMISSION", "COMPLETION_REPORT", "BLOCKED_NOTIFICATION"]),
    st.dictionaries(_keys, _json, max_size=6),
    st.sampled_from(["plan", "implement", "fix"]),
)
def test_any_result_file_content_is_answered_never_raised(message_type, body, phase) -> None:
    """Whatever an agent writes, the answer is a valid message, a blocker, or validation_failed naming fields."""
    raw = {"message_type": message_type, **body}
    got = parse_po_answer(raw, phase, AT)
    assert got.kind in ("valid", "blocked", "invalid")
    if got.kind == "invalid":
        assert got.failure.errors and all(e.field for e in got.failure.errors)
        assert got.error_message["error"]["code"] == "INVALID_MESSAGE"
    done = po_complete(_a({"phase": phase}), got, "s")
    assert (done.po_message is not None) == (got.kind == "valid")
