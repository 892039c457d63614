"""Worker logging: JSON lines with the activity's context bound (workers/telemetry.py)."""

from __future__ import annotations

import json
import logging

import structlog
from temporalio import activity, workflow
from temporalio.testing import ActivityEnvironment

from bso.messages import TaskAssignment
from workers.telemetry import activity_context, configure_logging


def _assignment() -> TaskAssignment:
    return TaskAssignment(
        dispatch_id="s/batch-2/1-3/4",
        agent_type="dev-runner",
        mode="fix",
        story_key="1-3-add-and-list-items-api",
        story_path="x.md",
        session_id="s",
        batch_id=2,
        report_to="s/batch-2",
        project_root="/p",
    )


def test_activity_context_binds_the_dispatch():
    context = ActivityEnvironment().run(lambda: activity_context((_assignment(),)))
    assert context["session"] == "s" and context["batch"] == "2"
    assert context["story"] == "1-3-add-and-list-items-api"
    assert context["agent"] == "dev-runner" and context["mode"] == "fix"
    assert context["dispatch_id"] == "s/batch-2/1-3/4"
    assert context["attempt"] == 1 and "activity" in context
    plain = ActivityEnvironment().run(lambda: activity_context(()))
    assert "agent" not in plain and "session" not in plain


def test_log_lines_are_json_with_bound_context(capsys):
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    flags = (workflow.logger.workflow_info_on_message, activity.logger.activity_info_on_message)
    try:
        configure_logging()
        with structlog.contextvars.bound_contextvars(session="s", dispatch_id="d/1"):
            structlog.get_logger("bso.test").info("hello", tokens=3)
            logging.getLogger("plain.stdlib").warning("from stdlib %s", "logging")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    finally:
        root.handlers, _ = saved[0], root.setLevel(saved[1])
        workflow.logger.workflow_info_on_message, activity.logger.activity_info_on_message = flags
    assert {"event": "hello", "tokens": 3, "session": "s", "dispatch_id": "d/1", "level": "info"}.items() <= lines[0].items()
    assert lines[1]["event"] == "from stdlib logging" and lines[1]["session"] == "s" and lines[1]["level"] == "warning"
