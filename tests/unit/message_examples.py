"""One valid example of every message type, taken from the seed documents.

Only what violates the documents' own rules is fixed: ids that do not match `msg-` + 8 hex (the seed's
`msg-e5f6g7h8`, `msg-sec-001`...) and the Agent-PO placeholder timestamps ("ISO8601").
"""

from __future__ import annotations

from typing import Any

TS = "2026-02-11T10:00:00Z"

# BSO V2 + Slave spec, in their native (flat, msg_type) shape.
BSO: dict[str, dict[str, Any]] = {
    "AGENT_CREATE_REQUEST": {
        "msg_type": "AGENT_CREATE_REQUEST", "agent_type": "story-creator", "role_hint": "Story creator",
        "requested_by": "slave-batch-1",
    },
    "AGENT_CREATED": {"msg_type": "AGENT_CREATED", "agent_name": "story-creator-3-1", "agent_type": "story-creator"},
    "AGENT_DESTROY_REQUEST": {"msg_type": "AGENT_DESTROY_REQUEST", "agent_name": "story-creator-3-1"},
    "AGENT_DESTROYED": {"msg_type": "AGENT_DESTROYED", "agent_name": "story-creator-3-1"},
    "AGENT_ROSTER_BROADCAST": {
        "msg_type": "AGENT_ROSTER_BROADCAST", "session_id": "sprint-xxx",
        "roster": {"residents": ["scrum-master", "knowledge-researcher", "debugger"], "slaves": ["slave-batch-1"],
                   "temps": ["story-creator-3-1"]},
    },
    "TASK_ASSIGNMENT": {
        "msg_type": "TASK_ASSIGNMENT", "story_key": "3-1", "story_path": "path/to/story-3-1.md", "mode": "create",
        "session_id": "sprint-xxx", "report_to": "slave-batch-1",
        "resident_contacts": {"knowledge-researcher": "knowledge-researcher", "debugger": "debugger",
                              "e2e-live": "e2e-live"},
        "config_overrides": {},
    },
    "AGENT_DISPATCH_REQUEST": {
        "msg_type": "AGENT_DISPATCH_REQUEST", "agent_type": "dev-runner", "story_key": "3-1", "mode": "dev",
        "session_id": "sprint-xxx", "report_to": "slave-batch-1", "resident_contacts": {"debugger": "debugger"},
        "config_overrides": {"max_review_rounds": 10},
    },
    "AGENT_COMPLETE": {
        "msg_type": "AGENT_COMPLETE", "dispatch_id": "slave-batch-1/3-1/1", "story_key": "3-1",
        "agent_type": "review-runner", "mode": "review", "status": "success",
        "findings": [{"severity": "medium", "summary": "missing null check", "file": "a.py", "line": 3}],
        "criteria_scores": {"code_quality": 25, "test_coverage": 20, "security": 18, "documentation": 12,
                            "acceptance_criteria": 10},
    },
    "SLAVE_BATCH_COMPLETE": {
        "msg_type": "SLAVE_BATCH_COMPLETE", "batch_id": 1, "session_id": "sprint-xxx",
        "stories_completed": ["3-1", "3-2"], "stories_failed": ["3-3"], "batch_report": "...",
    },
    "BATCH_PLAN_READY": {
        "msg_type": "BATCH_PLAN_READY", "session_id": "sprint-xxx", "total_stories": 9,
        "batches": [{"batch_id": 1, "stories": ["3-1", "3-2", "3-3"]}, {"batch_id": 2, "stories": ["4-1", "4-2"]}],
        "dependency_graph": {"4-2": {"depends_on": ["3-3"]}},
    },
    "COURSE_CORRECTION": {
        "msg_type": "COURSE_CORRECTION", "session_id": "sprint-xxx",
        "batches": [{"batch_id": 3, "stories": ["4-3", "5-1"]}], "stories_added": ["5-1"],
        "stories_dropped": ["4-4"], "reason": "new_requirements",
    },
    "CC_TRIGGER": {
        "msg_type": "CC_TRIGGER", "session_id": "sprint-xxx", "reason": "new_requirements", "add_stories": ["5-1"],
        "drop_stories": ["4-4"],
    },
    "DEBUG_REQUEST": {
        "msg_type": "DEBUG_REQUEST", "debug_id": "DBG-001", "story_key": "3-1", "agent_type": "dev-runner",
        "error_summary": "Test failure in ProjectServiceTest", "stack_trace": "...", "test_output": "...",
        "severity_hint": "HIGH",
    },
    "DEBUG_RESULT": {
        "msg_type": "DEBUG_RESULT", "debug_id": "DBG-001", "story_key": "3-1",
        "root_cause": "Missing null check in ProjectService.create()",
        "fix_suggestion": "Add null validation for projectName parameter", "severity": "HIGH", "confidence": "high",
        "journal_entry_id": "DBG-001-2026-02-11",
    },
    "BROWSER_REQUEST": {
        "msg_type": "BROWSER_REQUEST", "request_id": "BR-001", "operation": "navigate",
        "url": "http://localhost:3100/project/list", "selector": None, "input_value": None,
        "screenshot_path": ".sprint-session/screenshots/nav-project-list.png",
    },
    "BROWSER_RESULT": {
        "msg_type": "BROWSER_RESULT", "request_id": "BR-001", "status": "success",
        "result_data": {"page_title": "Project List", "url": "http://localhost:3100/project/list"},
        "screenshot_path": ".sprint-session/screenshots/nav-project-list.png", "error": None,
    },
    "RESEARCH_REQUEST": {
        "msg_type": "RESEARCH_REQUEST", "request_id": "KR-001", "story_key": "3-1", "topic": "react-query",
        "question": "How to invalidate a query after a mutation?", "report_to": "slave-batch-1",
    },
    "RESEARCH_RESULT": {
        "msg_type": "RESEARCH_RESULT", "request_id": "KR-001", "status": "success",
        "summary": "Call queryClient.invalidateQueries in onSuccess", "report_path": "knowledge/react-query.md",
        "sources": ["https://tanstack.com/query"], "cached": False,
    },
}

PO: dict[str, dict[str, Any]] = {
    "PLAN_SUBMISSION": {
        "message_type": "PLAN_SUBMISSION", "agent_id": "agent-xxx", "task_id": "TASK-XXX", "timestamp": TS,
        "plan": {
            "approach": "Description of implementation approach",
            "ac_mapping": [{"ac_id": "AC-001", "implementation": "Add login form component",
                            "file": "src/pages/LoginPage.tsx", "line_estimate": "~50"}],
            "files_to_modify": [{"path": "src/pages/LoginPage.tsx", "changes": "Add form, validation, submit handler"}],
            "test_approach": {"unit_tests": ["Test form validation", "Test submit"],
                              "integration_tests": ["Test login flow"]},
        },
        "questions": [], "revision": 1,
    },
    "PROGRESS_UPDATE": {
        "message_type": "PROGRESS_UPDATE", "agent_id": "agent-xxx", "task_id": "TASK-XXX", "timestamp": TS,
        "status": "implementing", "progress_percent": 50, "current_activity": "Writing login form component",
        "files_modified": ["src/pages/LoginPage.tsx"], "issues": [], "eta_minutes": 15,
    },
    "COMPLETION_REPORT": {
        "message_type": "COMPLETION_REPORT", "agent_id": "agent-xxx", "task_id": "TASK-XXX", "timestamp": TS,
        "summary": {"started_at": TS, "completed_at": "2026-02-11T10:25:00Z", "duration_minutes": 25},
        "ac_verification": [{"ac_id": "AC-001", "status": "PASS", "evidence": "LoginPage.tsx:50 - form component added",
                             "tested": True}],
        "test_results": {"passed": 12, "failed": 0, "skipped": 0,
                         "details": [{"file": "LoginPage.test.tsx", "passed": 8, "failed": 0}]},
        "files_changed": [{"path": "src/pages/LoginPage.tsx", "action": "modified", "lines_added": 50,
                           "lines_removed": 5}],
        "issues": [], "recommendations": [],
    },
    "BLOCKED_NOTIFICATION": {
        "message_type": "BLOCKED_NOTIFICATION", "agent_id": "agent-xxx", "task_id": "TASK-XXX", "timestamp": TS,
        "reason": "Cannot resolve test failure",
        "details": {"issue": "Auth service mock not working",
                    "attempts": ["Tried updating mock", "Tried different mock library"], "blocking_since": TS},
        "suggested_action": "May need different mocking approach",
    },
    "GO_DIRECTIVE": {
        "message_type": "GO_DIRECTIVE", "task_id": "TASK-XXX", "agent_id": "agent-xxx", "timestamp": TS,
        "status": "GO",
        "validation": {"plan_validated": True, "ac_coverage": "complete", "file_scope": "verified",
                       "test_delta": "addressed"},
        "authorization": {"authorized_files": ["src/pages/LoginPage.tsx", "src/services/authService.ts",
                                               "tests/LoginPage.test.tsx"], "timeout_minutes": 30},
        "message": "GO. Plan validated. Begin implementation.",
    },
    "FEEDBACK": {
        "message_type": "FEEDBACK", "task_id": "TASK-XXX", "agent_id": "agent-xxx", "timestamp": TS,
        "status": "NEEDS_REVISION",
        "validation": {"issues": [{"type": "missing_coverage", "ac_id": "AC-003",
                                   "message": "Plan does not address error handling"}]},
        "guidance": "Please add error handling for auth failures to your plan", "revision_required": True,
        "max_revisions": 2, "current_revision": 1,
    },
    "NEXT_DIRECTIVE": {
        "message_type": "NEXT_DIRECTIVE", "task_id": "TASK-XXX", "agent_id": "agent-xxx", "timestamp": TS,
        "status": "NEXT",
        "validation": {"report_validated": True, "ac_verified": "complete", "tests_passed": True,
                       "scope_verified": True},
        "summary": {"criteria_met": 4, "tests_passed": 12, "files_changed": 3},
        "message": "NEXT. Task completed successfully.",
        "cleanup": {"worktree": "ready_for_merge", "branch": "agent/agent-xxx/TASK-XXX"},
    },
    "FIX_DIRECTIVE": {
        "message_type": "FIX_DIRECTIVE", "task_id": "TASK-XXX", "agent_id": "agent-xxx", "timestamp": TS,
        "status": "FIX",
        "validation": {"issues": [{"type": "test_failure", "test": "LoginPage.test.tsx",
                                   "message": "Test 'should show error on failure' failed"}]},
        "retry": {"count": 1, "max": 2, "allowed": True},
        "guidance": "Fix the error display test - ensure error message element exists",
        "message": "FIX required. Address issues and resubmit.",
    },
    "TERMINATE_DIRECTIVE": {
        "message_type": "TERMINATE_DIRECTIVE", "task_id": "TASK-XXX", "agent_id": "agent-xxx", "timestamp": TS,
        "reason": "abort", "cleanup": {"worktree": "remove", "branch": "delete"},
        "message": "Terminate. Phase aborted by DD.",
    },
    "ERROR": {
        "message_type": "ERROR",
        "error": {"code": "INVALID_MESSAGE", "message": "Missing required field: ac_verification",
                  "original_message_type": "COMPLETION_REPORT"},
        "action": "Please resubmit with all required fields",
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "query": {
        "id": "msg-a1b2c3d4", "type": "query", "from": "go-coder-agent", "to": "architect-agent",
        "topic": "architecture",
        "payload": {"question": "What methods should UserRepository interface have?",
                    "context": {"file": "internal/repo/interfaces.go", "line": 10}, "expected_format": "code"},
        "priority": "normal", "timestamp": "2025-12-28T22:00:00Z", "timeout_ms": 5000, "requires_response": True,
    },
    "response": {
        "id": "msg-a1b2c3d5", "type": "response", "from": "architect-agent", "to": "go-coder-agent",
        "in_reply_to": "msg-a1b2c3d4",
        "payload": {"answer": "UserRepository should follow repository pattern with CRUD operations",
                    "code": "type UserRepository interface {}", "reference": "docs/architecture.md:45-60",
                    "confidence": 0.95},
        "status": "success", "timestamp": "2025-12-28T22:00:02Z",
    },
    "notification": {
        "id": "msg-5ec00001", "type": "notification", "from": "security-agent",
        "to": ["go-coder-agent", "reviewer-agent"], "topic": "security",
        "payload": {"event": "vulnerability_found", "severity": "critical",
                    "details": {"type": "SQL Injection", "cwe": "CWE-89", "file": "internal/repo/user_repo.go",
                                "line": 42},
                    "action_required": True},
        "priority": "critical", "timestamp": "2025-12-28T22:10:00Z",
    },
    "collaboration": {
        "id": "msg-c011ab01", "type": "collaboration", "from": "reviewer-agent", "to": "go-coder-agent",
        "topic": "review",
        "payload": {"request": "fix_code", "description": "Error not wrapped with context, making debugging difficult",
                    "target": {"file": "internal/service/user_service.go", "function": "CreateUser",
                               "line_start": 45, "line_end": 48},
                    "acceptance_criteria": ["Wrap error with fmt.Errorf and %w", "Tests still pass after change"],
                    "blocking": True},
        "priority": "high", "timestamp": "2025-12-28T22:20:00Z",
    },
    "broadcast": {
        "id": "msg-b0adca57", "type": "broadcast", "from": "orchestrator", "to": "*", "topic": "workflow",
        "payload": {"event": "phase_change",
                    "context": {"from_phase": "implementation", "to_phase": "testing", "step": 5},
                    "instructions": "Implementation complete. Test Agent should begin test creation."},
        "priority": "normal", "timestamp": "2025-12-28T22:30:00Z",
    },
    "ack": {
        "id": "msg-ac000001", "type": "ack", "from": "go-coder-agent", "to": "orchestrator",
        "in_reply_to": "msg-b0adca57", "payload": {"received": True, "will_act": True},
        "timestamp": "2025-12-28T22:30:01Z",
    },
}

ERRORS: dict[str, dict[str, Any]] = {
    "delivery_failed": {
        "type": "error", "error_type": "delivery_failed", "original_message_id": "msg-xxx",
        "reason": "agent_unavailable", "retry_count": 2, "max_retries": 3, "next_retry_at": "2025-12-28T22:35:00Z",
    },
    "response_timeout": {
        "type": "error", "error_type": "response_timeout", "original_message_id": "msg-xxx", "waited_ms": 5000,
        "recipient": "architect-agent",
    },
    "validation_failed": {
        "type": "error", "error_type": "validation_failed", "original_message_id": "msg-xxx",
        "errors": [{"field": "payload.question", "error": "required field missing"},
                   {"field": "priority", "error": "invalid value: urgent"}],
    },
}


def _gear2(message_id: str, message_type: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"message_id": message_id, "message_type": message_type, "from_agent": extra.get("from_agent", "moderator"),
            "to_agent": extra.get("to_agent", "techlead"), "timestamp": "2024-10-15T10:30:00",
            "correlation_id": "corr_task_003", "requires_response": extra.get("requires_response", True),
            "payload": payload}


GEAR2: dict[str, dict[str, Any]] = {
    "task_assigned": _gear2("msg-abc12300", "task_assigned", {
        "task_id": "task_003", "description": "Implement CLI interface with argparse",
        "acceptance_criteria": ["CLI accepts --add, --list, --complete commands"],
        "dependencies": ["task_001", "task_002"], "estimated_hours": 3}),
    "pr_submitted": _gear2("msg-def45600", "pr_submitted", {
        "task_id": "task_003", "pr_url": "https://github.com/user/repo/pull/42", "pr_number": 42,
        "branch_name": "moderator/task-003-cli-interface", "files_changed": ["src/cli.py", "tests/test_cli.py"],
        "files_added": 2, "files_modified": 1, "lines_added": 145, "lines_deleted": 8, "iteration": 1},
        from_agent="techlead", to_agent="moderator"),
    "pr_feedback": _gear2("msg-0fe78900", "pr_feedback", {
        "task_id": "task_003", "pr_number": 42, "iteration": 1, "score": 72, "approved": False,
        "blocking_issues": ["Missing unit tests for error handling"],
        "suggestions": ["Add docstrings to public functions"],
        "feedback": [{"severity": "blocking", "category": "testing", "file": "src/cli.py", "line": 45,
                      "issue": "No tests for error case when task ID doesn't exist",
                      "suggestion": "Add test_complete_nonexistent_task() in test_cli.py"},
                     {"severity": "suggestion", "category": "documentation", "file": "src/cli.py", "line": 10,
                      "issue": "Function lacks docstring", "suggestion": "Add docstring"}],
        "criteria_scores": {"code_quality": 25, "test_coverage": 10, "security": 15, "documentation": 12,
                            "acceptance_criteria": 10}}),
    "task_completed": _gear2("msg-012aaa00", "task_completed", {
        "task_id": "task_003", "pr_number": 42, "final_score": 88, "total_iterations": 2, "approved": True,
        "completion_time": "2024-10-15T11:00:00", "files_generated": ["src/cli.py", "tests/test_cli.py"]},
        requires_response=False),
    "pr_approved": _gear2("msg-0a000001", "pr_approved", {"task_id": "task_003", "pr_number": 42, "score": 88,
                                                          "iteration": 2}),
    "improvement_requested": _gear2("msg-345bbb00", "improvement_requested", {
        "improvement_id": "imp_001", "description": "Add caching layer to reduce database queries",
        "category": "performance", "priority": "high", "impact": "high", "effort_hours": 2, "priority_score": 8.5,
        "rationale": "Database queries in list_all() called on every CLI invocation.",
        "affected_files": ["src/storage.py", "tests/test_storage.py"],
        "acceptance_criteria": ["Cache implemented with configurable TTL"]}),
    "improvement_completed": _gear2("msg-345bbb01", "improvement_completed", {
        "improvement_id": "imp_001", "pr_number": 43, "final_score": 90, "approved": True}),
    "agent_ready": _gear2("msg-0ead0001", "agent_ready", {"agent_id": "techlead", "role": "techlead"},
                          from_agent="techlead", to_agent="moderator", requires_response=False),
    "agent_error": _gear2("msg-e0000001", "agent_error", {
        "error_type": "backend_failure", "error_message": "Claude CLI execution failed: Timeout after 300 seconds",
        "task_id": "task_003", "task_description": "Implement CLI interface", "stack_trace": "...",
        "recoverable": False, "context": {"backend_type": "claude_code", "cli_path": "claude", "timeout": 300}},
        from_agent="techlead", to_agent="moderator", requires_response=False),
}

ALL: dict[str, dict[str, Any]] = {**BSO, **PO, **SCHEMAS, **GEAR2}
