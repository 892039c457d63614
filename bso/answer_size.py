"""An agent's answer as it goes into a workflow's history: bounded, with nothing the Slave decides on lost.

An AGENT_COMPLETE may carry 200 findings, 200 blocking issues and 200 feedback items of thousands of characters
each: megabytes. The Slave's history holds each review's answer, and the next fix's input its findings again, so a
few such review-fix rounds took a batch past Temporal's history limit, where the server terminates the workflow.
`fit_for_history` keeps what a decision reads (status, verdict, score, the most severe finding, a blocking issue)
and as much more as fits `MAX_ANSWER_HISTORY_BYTES`, most severe first; what it leaves out, it names in one more
item of the same list, pointing at the whole answer. It also makes every blocking issue one the fix's feedback can
carry (bso.dispatch turns each into a FeedbackItem): an empty one named as such, long ones cut.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS, AgentComplete, FeedbackItem, Finding
from bso.po_agent import po_message_refused

MAX_ANSWER_HISTORY_BYTES = 64_000
# An Agent-PO plan or completion report (`po_message`) is checked whole by its gate, so it is not cut: one over
# this (a plan of ~20,000 words; a report whose real diff lists thousands of files) is refused, as an invalid one
# is. Each revision's and attempt's message stays in the batch's history, and one past Temporal's 2 MB payload
# limit failed the agent activity's every attempt.
MAX_PO_MESSAGE_BYTES = 128_000
MAX_PATH_CHARS = 1_000  # a finding's or feedback item's `file`
# An empty blocking issue still blocks (one of spaces did, as a valid feedback item): it is named, not dropped.
EMPTY_BLOCKING_ISSUE = "(the review named a blocking issue without text)"

Item = TypeVar("Item")


def _size(value: Any) -> int:
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def _file_cut(item: Finding | FeedbackItem) -> Finding | FeedbackItem:
    if item.file is None or len(item.file) <= MAX_PATH_CHARS:
        return item
    return item.model_copy(update={"file": item.file[: MAX_PATH_CHARS - 3] + "..."})


def _cleaned(answer: AgentComplete) -> AgentComplete:
    issues = [i[:MAX_SUMMARY_CHARS] if i else EMPTY_BLOCKING_ISSUE for i in answer.blocking_issues]
    findings = [_file_cut(f) for f in answer.findings]
    feedback = [_file_cut(f) for f in answer.feedback]
    if (
        issues == answer.blocking_issues
        and all(a is b for a, b in zip(findings, answer.findings))
        and all(a is b for a, b in zip(feedback, answer.feedback))
    ):
        return answer
    return answer.model_copy(update={"blocking_issues": issues, "findings": findings, "feedback": feedback})


def _prefix(items: Sequence[Item], room: int, at_least_one: bool) -> list[Item]:
    """The longest prefix of `items` that fits `room` bytes (the first item always, when asked)."""
    kept: list[Item] = []
    used = 0
    for item in items:
        size = _size(item) + 1
        if used + size > room and (kept or not at_least_one):
            break
        kept.append(item)
        used += size
    return kept


def _note(left_out: int, total: int, what: str, whole_answer_at: str) -> str:
    return (
        f"{left_out} more {what} of this answer ({total} in all) are left out of the workflow's history; "
        f"the whole answer: {whole_answer_at[:MAX_PATH_CHARS]}"
    )[:MAX_SUMMARY_CHARS]


def without_oversized_po_message(answer: AgentComplete, whole_answer_at: str) -> AgentComplete:
    """`answer`, or when its `po_message` is over MAX_PO_MESSAGE_BYTES, a copy without it; a successful answer's
    error then says why (bso.po_agent.po_message_refused), a failed one keeps its own."""
    if answer.po_message is None or (size := _size(answer.po_message)) <= MAX_PO_MESSAGE_BYTES:
        return answer
    return po_message_refused(
        answer,
        f"po_message: {size:,} bytes, over the {MAX_PO_MESSAGE_BYTES:,} a workflow's history takes; "
        f"the whole answer: {whole_answer_at[:MAX_PATH_CHARS]}",
    )


def fit_for_history(answer: AgentComplete, whole_answer_at: str) -> AgentComplete:
    """The answer to put in history: `answer` itself when it fits and is clean, else a copy that does (when the
    rest of the answer leaves room: its other fields are bounded by their models, but for `po_message`, which
    `without_oversized_po_message` bounds).

    Kept, in this order, while they fit: the blocking issues, the blocking feedback items, the findings most severe
    first (the answer's order within a severity), the other feedback items; the first of each blocking kind and the
    most severe finding always. A note item stands for the rest of a list: a finding of the most severe level left
    out, a blocking issue, a feedback item (blocking if a blocking one was left out). So the verdict, whether
    anything blocks, the most severe finding, and which findings a strictness asks to fix (the note among them
    exactly when one it left out is) are the same as the whole answer's.
    """
    if not (answer.findings or answer.blocking_issues or answer.feedback):
        return answer  # the rest of an answer is bounded by its model
    cleaned = _cleaned(answer)
    if _size(cleaned) <= MAX_ANSWER_HISTORY_BYTES:
        return cleaned
    bare = cleaned.model_copy(update={"findings": [], "blocking_issues": [], "feedback": []})
    blocking_feedback = [f for f in cleaned.feedback if f.severity == "blocking"]
    suggestions = [f for f in cleaned.feedback if f.severity != "blocking"]
    by_severity = sorted(cleaned.findings, key=lambda f: -f.severity.rank)
    always = [items[0] for items in (cleaned.blocking_issues, blocking_feedback, by_severity) if items]
    # The notes' room (three at most, each with its JSON around it) and the items always kept are paid first.
    note_bytes = len(_note(MAX_FINDINGS, MAX_FINDINGS, "blocking issues", whole_answer_at).encode()) + 200
    room = MAX_ANSWER_HISTORY_BYTES - _size(bare) - 3 * note_bytes - sum(_size(item) + 1 for item in always)

    def kept_of(items: Sequence[Item], always_kept: bool) -> list[Item]:
        nonlocal room
        paid = _size(items[0]) + 1 if always_kept and items else 0
        kept = _prefix(items, room + paid, at_least_one=always_kept)
        room -= sum(_size(item) + 1 for item in kept) - paid
        return kept

    issues = kept_of(cleaned.blocking_issues, always_kept=True)
    kept_blocking_feedback = kept_of(blocking_feedback, always_kept=True)
    findings = kept_of(by_severity, always_kept=True)
    kept_suggestions = kept_of(suggestions, always_kept=False)

    if len(issues) < len(cleaned.blocking_issues):
        left = len(cleaned.blocking_issues) - len(issues)
        issues.append(_note(left, len(cleaned.blocking_issues), "blocking issues", whole_answer_at))
    if len(findings) < len(by_severity):
        dropped = by_severity[len(findings):]
        findings.append(
            Finding(
                severity=dropped[0].severity,  # the most severe left out: no more than any kept
                summary=_note(len(dropped), len(by_severity), "findings", whole_answer_at),
            )
        )
    feedback = [*kept_blocking_feedback, *kept_suggestions]
    if len(feedback) < len(cleaned.feedback):
        blocking_dropped = len(kept_blocking_feedback) < len(blocking_feedback)
        feedback.append(
            FeedbackItem(
                severity="blocking" if blocking_dropped else "suggestion",
                category="bso",
                issue=_note(len(cleaned.feedback) - len(feedback), len(cleaned.feedback), "feedback items",
                            whole_answer_at),
            )
        )
    return cleaned.model_copy(update={"findings": findings, "blocking_issues": issues, "feedback": feedback})
