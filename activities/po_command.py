"""The command backend's part of the Agent-PO gates (I/O around the pure rules of bso.po_agent).

- `prompt_section`: the PO phase, rendered from `po-plan.md` / `po-complete.md` (project override in
  `.bso/prompts/`), appended to the agent's prompt; `env`: `BSO_PO_PHASE`, `BSO_PO_ATTEMPT`.
- `read_answer`: the PLAN_SUBMISSION / COMPLETION_REPORT the agent wrote to `$BSO_RESULT_FILE`, validated;
  an invalid one is recorded next to the dispatch (`validation_failed.json`, the seed's error, and
  `po-error.json`, Agent-PO's ERROR / INVALID_MESSAGE) and reaches the Slave as an error, never as a plan.
- `remember_diff_base` / `with_real_diff`: the completion phases' changed files are the real diff of the
  story worktree since the first implementation attempt began (a fix attempt sees the whole implementation).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from activities.agent_config import load_template
from activities.git_ops import git, git_dir
from activities.session_files import UnreadableResultFile, read_result_file, safe_name, write_json_atomic
from bso.agent_progress import percent_of, progress_update
from bso.messages import AgentComplete, Finding, TaskAssignment
from bso.po_agent import (
    PoPhase,
    gated_id,
    is_po_answer,
    parse_name_status,
    parse_po_answer,
    po_complete,
    po_phase,
    render_po_section,
    template_name,
    with_real_diff,
)
from bso.states import AgentStatus, Severity

__all__ = ["po_phase", "is_plan", "is_completion", "env", "prompt_section", "read_answer", "remember_diff_base",
           "with_real_changes", "heartbeat_detail"]


def is_plan(a: TaskAssignment) -> bool:
    return po_phase(a) == "plan"


def is_completion(a: TaskAssignment) -> bool:
    return po_phase(a) in ("implement", "fix")


def env(a: TaskAssignment) -> dict[str, str]:
    phase = po_phase(a)
    if phase is None:
        return {}
    return {"BSO_PO_PHASE": phase, "BSO_PO_ATTEMPT": str(a.po.get("attempt", 1))}


def prompt_section(project_root: str, a: TaskAssignment, result_file: str) -> str:
    phase = po_phase(a)
    if phase is None:
        return ""
    template = load_template(project_root, template_name(phase))
    return render_po_section(template, a, result_file, datetime.now(UTC).isoformat())


def read_answer(a: TaskAssignment, result_file: Path, run_dir: Path, timed_out: bool) -> AgentComplete | None:
    """The PO phase's answer from the result file; None when it holds no PO message (the caller then
    reads it as an AGENT_COMPLETE, e.g. a failure the agent reports)."""
    phase: PoPhase | None = po_phase(a)
    if phase is None or timed_out or not result_file.exists():
        return None
    try:
        raw = read_result_file(result_file)
    except UnreadableResultFile:  # read again as an AGENT_COMPLETE, which says why
        return None
    if not is_po_answer(raw):
        return None
    answer = parse_po_answer(raw, phase, datetime.now(UTC))
    if answer.failure is not None:
        write_json_atomic(run_dir / "validation_failed.json", answer.failure.to_seed())
        write_json_atomic(run_dir / "po-error.json", answer.error_message)
    return po_complete(a, answer, f"{raw.get('message_type')} ({phase}, attempt {a.po.get('attempt', 1)})")


async def remember_diff_base(wt: str, a: TaskAssignment, before: str) -> str:
    """The commit the first implementation attempt of this gated dispatch started from (recorded once)."""
    path = (await git_dir(wt)) / "bso-po" / f"{safe_name(gated_id(a.dispatch_id))}.json"
    if path.exists():
        try:
            return str(json.loads(path.read_text(encoding="utf-8"))["base"])
        except (ValueError, KeyError, TypeError):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"base": before, "dispatch_id": a.dispatch_id})
    return before


async def with_real_changes(complete: AgentComplete, wt: str, base: str, run_dir: Path) -> AgentComplete:
    """A valid COMPLETION_REPORT's files_changed replaced by the worktree's real diff since `base`."""
    if complete.status is not AgentStatus.SUCCESS or not complete.po_message:
        return complete
    real = parse_name_status(await git(wt, "diff", "--name-status", "-z", base, "HEAD"))
    report, unclaimed, unchanged = with_real_diff(dict(complete.po_message), real)
    write_json_atomic(
        run_dir / "po-diff.json",
        {
            "base": base,
            "claimed": [f.get("path") for f in complete.po_message.get("files_changed", []) if isinstance(f, dict)],
            "real": [f.path for f in real],
            "not_claimed": unclaimed,
            "claimed_not_changed": unchanged,
        },
    )
    findings = list(complete.findings)
    if unclaimed:
        findings.append(
            Finding(
                severity=Severity.MEDIUM,
                summary=f"COMPLETION_REPORT left out changed files (the real diff counts): {', '.join(unclaimed[:10])}",
            )
        )
    return complete.model_copy(update={"po_message": report, "findings": findings[:200]})


def heartbeat_detail(
    env: dict[str, str], dispatch_id: str, pid: int, elapsed: float, timeout: float, last_line: str
) -> dict[str, object]:
    """The command backend's heartbeat detail: a PROGRESS_UPDATE (percent = share of the agent's time used,
    current activity = its last output line) plus pid, elapsed seconds and the last line."""
    phase = env.get("BSO_PO_PHASE")
    return progress_update(
        agent_id=env.get("BSO_AGENT_TYPE", "agent"),
        task_id=env.get("BSO_STORY_KEY", dispatch_id),
        at=datetime.now(UTC),
        percent=percent_of(elapsed, timeout),
        current_activity=last_line or (f"PO {phase} phase" if phase else "working"),
        eta_seconds=max(0.0, timeout - elapsed),
        dispatch_id=dispatch_id,
        pid=pid,
        elapsed_s=int(elapsed),
        last_line=last_line,
    )
