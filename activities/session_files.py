"""Where a sprint keeps its scratch files in the project: `.sprint-session/` (never in history)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# One atomic JSON write, defined in the launcher: it runs standalone (stdlib only, isolated mode).
from activities.agent_launcher import write_json_atomic
from bso.dispatch import written_by_this_run

SESSION_DIR = ".sprint-session"


def safe_name(identifier: str) -> str:
    """A filesystem-safe, collision-free name for an id such as `sprint-1/batch-2/1-3/4`."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", identifier).strip("._")[:80]
    digest = hashlib.sha1(identifier.encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def session_path(project_root: str, *parts: str) -> Path:
    path = Path(project_root, SESSION_DIR, *parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def dispatch_answer_path(project_root: str, dispatch_id: str) -> Path:
    """Where the agent activity records the AGENT_COMPLETE of one dispatch (re-delivered on a retry)."""
    return session_path(project_root, "dispatches", f"{safe_name(dispatch_id)}.json")


def file_written_at(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)


def record_dispatch_answer(path: Path, answer: dict[str, Any], run_id: str) -> None:
    """Record a dispatch's AGENT_COMPLETE with the workflow run it answers (see recorded_dispatch_answer)."""
    write_json_atomic(path, {"workflow_run_id": run_id, "answer": answer})


def recorded_dispatch_answer(path: Path, run_id: str, first_scheduled_at: datetime) -> dict[str, Any] | None:
    """The AGENT_COMPLETE recorded for this dispatch by this workflow run; None when there is none, or when
    another run of a workflow with the same id (a sprint started again under its id) recorded it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        written_at = file_written_at(path)
    except FileNotFoundError:
        return None
    if isinstance(data, dict) and "answer" in data and "workflow_run_id" in data:
        recorded_run_id, answer = data["workflow_run_id"], data["answer"]
    else:  # written before answers named their run: the AGENT_COMPLETE alone
        recorded_run_id, answer = None, data
    if not written_by_this_run(recorded_run_id, run_id, written_at=written_at, first_scheduled_at=first_scheduled_at):
        return None
    return answer


def dispatch_lock_path(project_root: str, dispatch_id: str) -> Path:
    """The lock an attempt of one dispatch holds while it runs (activities.agents.one_attempt_at_a_time)."""
    return session_path(project_root, "dispatches", f"{safe_name(dispatch_id)}.lock")
