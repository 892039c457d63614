"""Agent-PO's PROGRESS_UPDATE as the agent activity's heartbeat detail (pure).

Every heartbeat of an agent activity (simulated and command backends) carries a PROGRESS_UPDATE in
Agent-PO's flat shape, validated with the message model: `message_type`, `timestamp`, `agent_id` (the agent
type), `task_id` (the story key), `status`, `progress_percent`, `current_activity`, `eta_minutes`, plus the
backend's own keys (dispatch id, pid, elapsed seconds, last output line; payloads ignore unknown keys).
`bso status`-style tools and the Temporal UI show it as the pending activity's heartbeat details.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from bso.messages import ProgressUpdatePayload, parse_message

MAX_ACTIVITY_CHARS = 300


def percent_of(done: float, total: float) -> int:
    """A share of the agent's time, 0..99 while it runs (100 is for the answer, not a heartbeat)."""
    if total <= 0:
        return 0
    return max(0, min(99, int(done / total * 100)))


def progress_update(
    *,
    agent_id: str,
    task_id: str,
    at: datetime,
    percent: int,
    current_activity: str = "",
    status: str = "in_progress",
    eta_seconds: float | None = None,
    files_modified: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One heartbeat detail: a PROGRESS_UPDATE (validated; raises ValueError on a bad one)."""
    message: dict[str, Any] = {
        "message_type": "PROGRESS_UPDATE",
        "timestamp": at.isoformat(),
        "agent_id": agent_id or "agent",
        "task_id": task_id or "task",
        "status": status,
        "progress_percent": max(0, min(100, int(percent))),
        "current_activity": current_activity[:MAX_ACTIVITY_CHARS],
        "files_modified": list(files_modified or []),
        "eta_minutes": None if eta_seconds is None else max(0, math.ceil(eta_seconds / 60)),
        **extra,
    }
    parsed = parse_message(message)  # ValidationError is a ValueError
    assert isinstance(parsed.payload, ProgressUpdatePayload)  # type: ignore[attr-defined]
    return message
