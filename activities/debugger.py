"""The debugger resident's analysis activity: known error patterns from the debug journal first, then a
new analysis (the simulated debugger follows the simulation script); every analysis is appended to
`.sprint-session/debug-journal.md` (P49) with its DBG id. Idempotent: a retried activity whose analysis is
already in the journal returns it instead of appending it again. Debug ids repeat when a sprint is started again
under its id: an entry written before this activity was scheduled is an earlier run's, analysed afresh."""

from __future__ import annotations

import fcntl
import os
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from activities.session_files import session_path
from bso.debugging import (
    JOURNAL,
    DebugRequest,
    DebugResult,
    journal_entries,
    journal_entry_id,
    known_result,
    render_entry,
    result_of_entry,
    simulated_analysis,
)

WHEN_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # an entry's `when`, to the second
JOURNAL_HEADER = "# Debug journal\n\nEvery analysis of the debugger resident, newest last (P49).\n\n"


class AnalyzeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project_root: str
    request: DebugRequest
    backend: str = "simulated"
    scripted: Literal["fixable", "unfixable"] = "unfixable"  # the simulated debugger's answer


@activity.defn
async def analyze_failure(inp: AnalyzeInput) -> DebugResult:
    path = session_path(inp.project_root, JOURNAL)
    entry_id = journal_entry_id(inp.request)
    with open(path.with_name(f".{JOURNAL}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # A byte that is not UTF-8 (the file edited by hand) must not disable the debugger for good: it reads as
        # U+FFFD, matches no signature, and the journal goes on.
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        if (journaled := _journaled(text, entry_id, activity.info().scheduled_time)) is not None:
            # a retry: this analysis is journaled already
            return result_of_entry(entry_id, journaled, inp.request, known_pattern=journaled.get("known_pattern") == "yes")
        result = known_result(text, inp.request)
        if result is None:
            if inp.backend != "simulated":
                return DebugResult(
                    debug_id=inp.request.debug_id,
                    story_key=inp.request.story_key,
                    status="unavailable",
                    error=f"no debugger analysis for agent backend {inp.backend!r} (simulated only)",
                )
            result = simulated_analysis(inp.request, inp.scripted)
        result = result.model_copy(update={"journal_entry_id": entry_id})
        when = datetime.now(timezone.utc).strftime(WHEN_FORMAT)
        with open(path, "a", encoding="utf-8") as fh:
            if not text:
                fh.write(JOURNAL_HEADER)
            fh.write(render_entry(entry_id, inp.request, result, when))
            fh.flush()
            os.fsync(fh.fileno())
        return result


def _journaled(text: str, entry_id: str, scheduled: datetime) -> dict[str, str] | None:
    """The fields of the last section under `entry_id` written since `scheduled` (this activity's first attempt),
    or None: none, or only an earlier run's of the same debug id (its `when` is older; a section without one
    counts as this activity's, as before)."""
    fields = next((f for entry, f in reversed(list(journal_entries(text))) if entry == entry_id), None)
    if fields is None:
        return None
    try:
        written = datetime.strptime(fields["when"], WHEN_FORMAT).replace(tzinfo=timezone.utc)
    except (KeyError, ValueError):
        return fields
    return fields if written >= scheduled.replace(microsecond=0) else None
