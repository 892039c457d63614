"""The simulated agents: deterministic, scripted, offline. The story-creator writes a real BMAD
story file; the others answer what the simulation script says for this call."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.session_files import (
    append_jsonl,
    dispatch_answer_path,
    record_dispatch_answer,
    session_path,
)
from activities.status_file import read_story_text, story_file_problem
from bso.agent_progress import percent_of, progress_update
from bso.dispatch import SCRIPT_KEYS
from bso.messages import AgentComplete, TaskAssignment
from bso.models import short_key
from bso.po_gates import StoryScope, simulated_plan, simulated_report
from bso.simulation import ScriptedAnswer, StoryScript, po_kind, scripted_answer
from bso.sprint_status import is_story_stub, parse_story_file, render_story_file, resolve_inside, title_from_slug
from bso.states import AgentMode, AgentType

LEDGER = "simulated-agent-ledger.jsonl"
HEARTBEAT_EVERY_SECONDS = 1.0


def _write_story_doc(assignment: TaskAssignment) -> str:
    """What a story-creator does: write (create) or rewrite (revise) the BMAD story file. A story already written
    there (by hand, or by this dispatch's attempt before) is kept by create: it was written over with the
    simulated document. Create writes a missing or empty file, or a stub of the lines the sprint reads (title,
    Status, Depends on, Tags, Files; kept in the document); revise rewrites."""
    target = Path(resolve_inside(assignment.project_root, assignment.story_path))
    if (problem := story_file_problem(str(target), os.path.realpath(assignment.project_root))) is not None:
        raise ApplicationError(f"story-creator: {problem}", type="StoryFileError", non_retryable=True)
    epic_num, story_num = short_key(assignment.story_key).split("-", 1)
    existing_text = read_story_text(str(target)) if target.exists() else None
    if assignment.mode is AgentMode.CREATE and existing_text is not None and not is_story_stub(existing_text):
        return f"kept {assignment.story_path} (a story file is there already)"
    existing = parse_story_file(existing_text) if existing_text is not None else None
    title = assignment.story_title or (existing.title if existing else "") or title_from_slug(assignment.story_key)
    revision = assignment.mode_round if assignment.mode is AgentMode.REVISE else 0
    text = render_story_file(
        story_key=assignment.story_key,
        title=title,
        epic_num=epic_num,
        story_num=story_num,
        status="story-doc-review",
        acceptance_criteria=[
            f"{title} works as described for the user",
            "Errors are reported with a clear message",
            "Automated tests cover the new behaviour",
        ],
        depends_on=list(existing.depends_on) if existing else [],
        tags=list(existing.tags) if existing else [],
        files=list(existing.files) if existing else [],  # the file scope (P29, PO gates) stays the story's
        revision=revision,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return f"wrote {assignment.story_path}" + (f" (revision {revision})" if revision else "")


async def _work_for(duration_ms: int, assignment: TaskAssignment) -> None:
    """Take the scripted time, heartbeating so a lost worker is noticed early."""
    deadline = time.monotonic() + duration_ms / 1000
    while (left := deadline - time.monotonic()) > 0:
        activity.heartbeat(  # Agent-PO's PROGRESS_UPDATE as the heartbeat's detail
            progress_update(
                agent_id=assignment.agent_type.value,
                task_id=assignment.story_key,
                at=datetime.now(UTC),
                percent=percent_of(duration_ms - left * 1000, duration_ms),
                current_activity=f"simulated {assignment.agent_type.value}/{assignment.mode.value}",
                eta_seconds=left,
                dispatch_id=assignment.dispatch_id,
                remaining_ms=int(left * 1000),
            )
        )
        await asyncio.sleep(min(left, HEARTBEAT_EVERY_SECONDS))


def _po_message(script: StoryScript, assignment: TaskAssignment) -> dict | None:
    """With PO gates on: the scripted PLAN_SUBMISSION (plan phase) or COMPLETION_REPORT (implement / fix)."""
    phase = assignment.po.get("phase")
    if not phase:
        return None
    scope = StoryScope(ac_ids=assignment.po.get("ac_ids", []), files=assignment.po.get("scope", []))
    attempt = int(assignment.po.get("attempt", 1))
    if phase == "plan":
        kind = po_kind(list(script.po.plan), attempt)
        plan = simulated_plan(kind, scope, assignment.agent_type.value, assignment.story_key, attempt)
        return {"type": "PLAN_SUBMISSION", **plan.model_dump(mode="json")}
    authorized = assignment.po.get("authorized_files", [])
    kind = po_kind(list(script.po.report), attempt)
    at = datetime.now(UTC).isoformat()
    report = simulated_report(kind, scope, authorized, assignment.agent_type.value, assignment.story_key, at)
    return {"type": "COMPLETION_REPORT", **report.model_dump(mode="json")}


async def run(assignment: TaskAssignment) -> AgentComplete | None:
    script = StoryScript.model_validate(assignment.simulation)
    key = SCRIPT_KEYS[(assignment.agent_type, assignment.mode)]
    answer: ScriptedAnswer = scripted_answer(  # type: ignore[arg-type]
        script, key, assignment.mode_round, assignment.story_key
    )
    attempt = activity.info().attempt
    ledger = session_path(assignment.project_root, LEDGER)
    # File I/O with fsync runs in a thread: on the event loop it would stall every activity and
    # workflow task of the worker (measured: ~8 ms per fsync, three per dispatch).
    await asyncio.to_thread(append_jsonl, ledger, {"dispatch_id": assignment.dispatch_id, "attempt": attempt, "event": "started"})
    if attempt <= answer.flaky_attempts:
        raise ApplicationError(
            f"simulated infrastructure fault (attempt {attempt} of {answer.flaky_attempts} flaky)",
            type="SimulatedInfrastructureFault",
        )
    await _work_for(answer.duration_ms, assignment)
    summary = f"simulated {assignment.agent_type.value}/{assignment.mode.value}"
    if answer.status.value == "success" and assignment.agent_type is AgentType.STORY_CREATOR:
        summary = await asyncio.to_thread(_write_story_doc, assignment)
    if answer.never_answers:
        await asyncio.to_thread(
            append_jsonl, ledger, {"dispatch_id": assignment.dispatch_id, "attempt": attempt, "event": "finished"}
        )
        return None
    complete = AgentComplete(
        dispatch_id=assignment.dispatch_id,
        story_key=assignment.story_key,
        agent_type=assignment.agent_type,
        mode=assignment.mode,
        status=answer.status,
        verdict=answer.verdict,
        findings=answer.findings,
        tokens_used=answer.tokens,
        summary=summary,
        error=answer.error,
        score=answer.score,
        blocking_issues=answer.blocking_issues,
        feedback=answer.feedback,
        recoverable=answer.recoverable,
        error_type=answer.error_type,
        po_message=_po_message(script, assignment) if answer.status.value == "success" else None,
    )
    # The answer is recorded before the work counts as finished: a worker killed between the two
    # re-delivers the recorded answer on the retry instead of doing the work (and finishing) again.
    answer_file = dispatch_answer_path(assignment.project_root, assignment.dispatch_id)
    finished = {"dispatch_id": assignment.dispatch_id, "attempt": attempt, "event": "finished"}
    run_id = activity.info().workflow_run_id
    await asyncio.to_thread(_record_answer, answer_file, complete.model_dump(mode="json"), run_id, ledger, finished)
    return complete


def _record_answer(answer_file: Path, answer: dict, run_id: str, ledger: Path, finished: dict) -> None:
    """The answer, then the ledger's `finished`, in one trip to a thread (each hop costs the event loop)."""
    record_dispatch_answer(answer_file, answer, run_id)
    append_jsonl(ledger, finished)
