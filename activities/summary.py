"""The execution summary activity: `.sprint-session/execution-summary-<session>.md` in the project.

Called by the Master once, at the end of a sprint. It reads the sprint's histories through the
worker's client (the Agent Performance section comes from the message flow), renders the summary
with the pure `bso.summary` functions and writes the file atomically: running it twice writes the
same file, so retries are harmless.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import Field
from temporalio import activity

from activities.session_files import session_path
from activities.status_file import file_work_heartbeats
from bso.models import SprintReport, _Model
from bso.summary import render_from_histories, summary_filename
from bso.temporal_client import fetch_sprint_histories


class SummaryInput(_Model):
    project_root: str = Field(min_length=1)
    workflow_id: str  # the Master's workflow id (the sprint id)
    report: SprintReport


@activity.defn
async def write_execution_summary(inp: SummaryInput) -> str:
    """Write the summary; returns its path relative to the project."""
    async with file_work_heartbeats("writing the execution summary"):
        histories = await fetch_sprint_histories(activity.client(), inp.workflow_id)
        text = await asyncio.to_thread(render_from_histories, inp.report, histories)
    path = session_path(inp.project_root, summary_filename(inp.report.session_id))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    activity.logger.info("execution summary written to %s", path)
    return str(Path(path).relative_to(inp.project_root))
