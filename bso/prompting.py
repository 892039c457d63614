"""Rendering an agent's prompt from its template (pure; the activity reads the template files).

Templates are plain Markdown files with `string.Template` placeholders (`$story_key`, `${title}`):
`bso/prompts/<agent-type>.md` in BSO, overridable per project by `<project>/.bso/prompts/<agent-type>.md`.
`$common` expands to `_common.md` (the assignment, the acceptance criteria, fix findings, resident
contacts and the AGENT_COMPLETE instructions). Unknown `$names` are left as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from bso.messages import Finding, TaskAssignment
from bso.states import AgentMode, AgentType

BUILTIN_PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
COMMON_TEMPLATE = "_common"


@dataclass(frozen=True)
class PromptContext:
    assignment: TaskAssignment
    story_file: str
    workdir: str
    result_file: str
    acceptance_criteria: list[str] = field(default_factory=list)
    file_scope: list[str] = field(default_factory=list)
    branch: str = ""
    base_commit: str = ""
    verification_output: str = ""  # the last failed verification of this story: for a fix
    approval_score: int = 80  # scored reviews: the score a review must reach (config approval_score)


def result_shape(assignment: TaskAssignment) -> str:
    example = {
        "msg_type": "AGENT_COMPLETE",
        "dispatch_id": assignment.dispatch_id,
        "story_key": assignment.story_key,
        "agent_type": assignment.agent_type.value,
        "mode": assignment.mode.value,
        "status": "success",
        "verdict": None,
        "findings": [{"severity": "MEDIUM", "summary": "what is wrong", "file": "src/x.py", "line": 12}],
        "summary": "one paragraph: what you did",
        "error": None,
    }
    if assignment.agent_type is AgentType.REVIEW_RUNNER:  # a scored review (Gear 2's PR_FEEDBACK)
        example.update(
            verdict="failure",
            criteria_scores={"code_quality": 24, "test_coverage": 15, "security": 18, "documentation": 10,
                             "acceptance_criteria": 8},
            score=75,
            blocking_issues=["greet() is untested for an empty name"],
            feedback=[{"severity": "blocking", "category": "test_coverage", "file": "src/x.py", "line": 12,
                       "issue": "what is wrong", "suggestion": "how to fix it"}],
        )
    return json.dumps(example, indent=2)


def _findings_text(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        where = f" ({f.file}{':' + str(f.line) if f.line else ''})" if f.file else ""
        lines.append(f"- [{f.severity.value}] {f.summary}{where}")
    return "\n".join(lines)


def render_prompt(template: str, common: str, ctx: PromptContext) -> str:
    a = ctx.assignment
    fix_parts = []
    if a.fix_findings and a.mode is AgentMode.REVIEW:  # the e2e verification failed after the last review
        fix_parts.append(
            "## The e2e verification failed after the last review\n\nCheck whether the code causes these; one "
            "it does is a blocking issue:\n\n" + _findings_text(list(a.fix_findings)) + "\n"
        )
    elif a.fix_findings:
        fix_parts.append("## Findings to fix\n\n" + _findings_text(list(a.fix_findings)) + "\n")
    if a.fix_feedback:  # scored reviews (Gear 2): the review's feedback items, blocking ones first
        items = sorted(a.fix_feedback, key=lambda f: f.severity != "blocking")
        fix_parts.append(
            "## Review feedback\n\n"
            + "\n".join(
                f"- [{f.severity}/{f.category}] {f.issue}"
                + (f" ({f.file}{':' + str(f.line) if f.line else ''})" if f.file else "")
                + (f"; suggestion: {f.suggestion}" if f.suggestion else "")
                for f in items
            )
            + "\n"
        )
    if ctx.verification_output:
        fix_parts.append(
            "## Debug suggestion: the last verification run failed\n\n```\n" + ctx.verification_output + "\n```\n"
        )
    contacts = ""
    if a.resident_contacts:
        contacts = "## Resident contacts\n\n" + "\n".join(
            f"- {role}: `{who}`" for role, who in sorted(a.resident_contacts.items())
        ) + "\n"
    values = {
        "dispatch_id": a.dispatch_id,
        "agent_type": a.agent_type.value,
        "mode": a.mode.value,
        "mode_round": str(a.mode_round),
        "story_key": a.story_key,
        "story_title": a.story_title or a.story_key,
        "story_path": a.story_path,
        "story_file": ctx.story_file,
        "session_id": a.session_id,
        "workdir": ctx.workdir,
        "branch": ctx.branch or "(none)",
        "base_commit": ctx.base_commit or "HEAD",
        "result_file": ctx.result_file,
        "result_shape": result_shape(a),
        "acceptance_criteria": "\n".join(f"{i}. {ac}" for i, ac in enumerate(ctx.acceptance_criteria, 1))
        or "(none parsed: read the story file)",
        "file_scope": ", ".join(ctx.file_scope),
        "file_scope_line": f"- File scope: {', '.join(ctx.file_scope)}" if ctx.file_scope else "",
        "fix_section": "\n".join(fix_parts),
        "fix_findings": _findings_text(list(a.fix_findings)),
        "verification_output": ctx.verification_output,
        "resident_contacts_section": contacts,
        "approval_score": str(ctx.approval_score),
    }
    values["common"] = Template(common).safe_substitute(values)
    return Template(template).safe_substitute(values)
