"""The launcher's check for a cancelled sprint's request to stop its agent (activities/agent_launcher.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.agent_launcher import CANCELLED_FILE, cancel_requested

RECORD = {"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-2", "attempt": 1}


@pytest.mark.parametrize(
    ("content", "requested"),
    [
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-2"}), True),
        # a sprint run earlier under the same id (its dispatch ids repeat): not this agent's
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-1"}), False),
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/2", "run_id": "run-2"}), False),
        (None, False),
        ("{torn", False),
        ("[1, 2]", False),
        ("", False),
    ],
)
def test_only_this_runs_request_stops_the_agent(tmp_path: Path, content: str | None, requested: bool) -> None:
    if content is not None:
        (tmp_path / CANCELLED_FILE).write_text(content, encoding="utf-8")
    assert cancel_requested(tmp_path, RECORD) is requested
