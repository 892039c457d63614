"""The external backend: the activity only publishes the assignment; the agent, wherever it runs,
answers with `temporal workflow signal --workflow-id <report_to> --name agent_complete --input ...`."""

from __future__ import annotations

from temporalio import activity

from activities.session_files import safe_name, session_path, write_json_atomic
from bso.messages import AgentComplete, TaskAssignment


async def run(assignment: TaskAssignment) -> AgentComplete | None:
    path = session_path(assignment.project_root, "assignments", f"{safe_name(assignment.dispatch_id)}.json")
    write_json_atomic(path, assignment.model_dump(mode="json"))
    activity.logger.info(
        "assignment published for an external agent",
        extra={"dispatch_id": assignment.dispatch_id, "path": str(path), "report_to": assignment.report_to},
    )
    return None
