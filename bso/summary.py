"""The execution summary (`.sprint-session/execution-summary-<session>.md`): a Markdown rendering of a
sprint's report, its agents' performance (from the message flow) and the configuration used.

Pure: the `write_execution_summary` activity writes it into the project; `bso sprint report` prints it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowHistory

from bso.config import ConfigError, SprintConfig, resolve_config
from bso.constants import MASTER_TYPE
from bso.course_correction import dropped_stories
from bso.git_rules import GitRuleError, error_says_work_left_out, story_branch
from bso.message_flow import AgentStats, agent_performance, decode, file_safe_unique, message_flow
from bso.models import SlaveResult, SprintInput, SprintReport
from bso.report import planned_batches, work_per_story
from bso.states import TERMINAL_STATES, StoryState
from bso.terminal_text import printable

SECTIONS = ("Results Overview", "Story Details", "Failures", "Agent Performance", "Configuration Used")


def summary_filename(session_id: str) -> str:
    return f"execution-summary-{file_safe_unique(session_id)}.md"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, inner, out)
    else:
        out[prefix] = value


def _cell(value: Any) -> str:
    """Text others wrote (an agent's error, an operator's note) on one line of the summary, and in one table cell:
    line breaks as spaces (a carriage return split a table row too), other control characters escaped
    (`printable`: a NUL made the file binary to grep and git), `|` escaped."""
    one_line = " ".join(str(value).replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return printable(one_line).replace("|", "\\|")


def _branch(session_id: str, key: str) -> str:
    try:
        return story_branch(session_id, key)
    except GitRuleError:
        return f"bso/{session_id}/{key}"


def _by_outcome(batches: list[SlaveResult]) -> str:
    """` (complete 1, failed 1)`: a cancelled sprint's batch counted among the sprint's batches read as run."""
    counts = Counter(b.status.value.removeprefix("batch-") for b in batches)
    return f" ({', '.join(f'{outcome} {n}' for outcome, n in counts.items())})" if counts else ""


def render_summary(
    report: SprintReport,
    config: SprintConfig | None = None,
    agents: Sequence[AgentStats] = (),
    *,
    overrides: dict[str, Any] | None = None,
    started: str | None = None,
    finished: str | None = None,
) -> str:
    config = config or SprintConfig()
    stories = report.stories
    count = {state: sum(v == state for v in stories.values()) for state in StoryState}
    rounds: dict[str, int] = {}
    errors: dict[str, str] = {}
    batch_of: dict[str, int] = {}
    scores: dict[str, list[int]] = {}  # scored reviews (Gear 2): each story's score per round
    dispatched = {key: work.agents_dispatched for key, work in work_per_story(report.batches).items()}
    for batch in report.batches:
        rounds.update(batch.results.review_fix_rounds)
        for r in batch.results.story_results:
            if r.review_scores:
                scores[r.story_key] = list(r.review_scores)
            batch_of[r.story_key] = batch.batch_id
            if r.error:
                errors[r.story_key] = r.error
    rearmed_not_run: set[str] = set()
    for key, batch_id in planned_batches(report).items():  # stories that never ran: where they wait(ed)
        if batch_id > batch_of.get(key, batch_id):  # rearmed into a batch that never started: that failure is behind it
            errors.pop(key, None)
            rearmed_not_run.add(key)
            batch_of[key] = batch_id
        batch_of.setdefault(key, batch_id)
    # A story a course correction dropped is skipped for that correction's reason and note (it ran in no batch).
    for key, why in dropped_stories(report.course_corrections).items():
        if stories.get(key) == StoryState.SKIPPED:
            errors.setdefault(key, why)

    lines = [f"# Execution summary: sprint `{report.session_id}`", ""]
    lines += ["## Results Overview", ""]
    lines += [
        "| item | value |",
        "|---|---|",
        f"| status | {report.status.value} |",
        f"| stories | {len(stories)} |",
        f"| done | {count[StoryState.DONE]} |",
        f"| needs intervention | {count[StoryState.NEEDS_INTERVENTION]} |",
        f"| skipped | {count[StoryState.SKIPPED]} |",
        f"| other (not finished) | {len(stories) - count[StoryState.DONE] - count[StoryState.NEEDS_INTERVENTION] - count[StoryState.SKIPPED]} |",
        f"| batches | {len(report.batches)}{_by_outcome(report.batches)} |",
        *(
            # Left for a new batch: a sprint stopped meanwhile (fail_fast, a budget stop) starts none.
            [f"| batches handed over | {handed} (their history grew long: they left the stories they had not started "
             "to a new batch) |"]
            if (handed := sum(b.handed_over for b in report.batches))
            else []
        ),
        # With the budget off no limit holds the sprint (its limit knob is still set: a default).
        f"| tokens used | {report.tokens_used} / {report.token_limit or config.token_budget.limit} |"
        if config.token_budget.enabled
        else f"| tokens used | {report.tokens_used} (no budget: token_budget.enabled is false) |",
    ]
    g = report.po_gates
    if g.go_issued or g.feedback_issued or g.blocked:  # Agent-PO gates ran
        lines.append(
            f"| PO gates | GO {g.go_issued}, NEXT {g.next_issued}, FEEDBACK {g.feedback_issued}, "
            f"FIX {g.fix_issued}, BLOCKED {g.blocked} |"
        )
    if started:
        lines.append(f"| started | {started} |")
    if finished:
        lines.append(f"| finished | {finished} |")
    lines.append("")

    lines += ["## Story Details", ""]
    if stories and scores:
        lines += [
            "| story | batch | final state | review-fix rounds | agents dispatched | review scores |",
            "|---|---|---|---|---|---|",
        ]
        for key, state in stories.items():
            lines.append(
                f"| {key} | {batch_of.get(key, '')} | {state} | {rounds.get(key, 0)} | {dispatched.get(key, 0)} "
                f"| {' -> '.join(str(x) for x in scores.get(key, []))} |"
            )
    elif stories:
        lines += ["| story | batch | final state | review-fix rounds | agents dispatched |", "|---|---|---|---|---|"]
        for key, state in stories.items():
            lines.append(
                f"| {key} | {batch_of.get(key, '')} | {state} | {rounds.get(key, 0)} | {dispatched.get(key, 0)} |"
            )
    else:
        lines.append("No story was in scope.")
    lines.append("")

    if report.improvements:
        lines += ["## Improvements", "", "| improvement | story | priority score | description |", "|---|---|---|---|"]
        lines += [
            f"| {i.improvement_id} | {i.story_key} | {i.priority_score:g} | {_cell(i.description)} |"
            for i in report.improvements
        ]
        lines.append("")

    if report.course_corrections:
        lines += ["## Course Corrections", "", "| # | reason: note | added | dropped | impact |", "|---|---|---|---|---|"]
        lines += [
            f"| {n} | {_cell(cc.reason + (f': {cc.text}' if cc.text.strip() else ''))} | {_cell(', '.join(cc.added))} "
            f"| {_cell(', '.join(cc.dropped))} | {_cell(cc.impact)} |"
            for n, cc in enumerate(report.course_corrections, 1)
        ]
        lines.append("")

    lines += ["## Failures", ""]
    failures: list[str] = []
    not_run: list[str] = []
    for key, state in stories.items():
        if state == StoryState.DONE:
            # Done, but its work may not be in the project (its merge back failed or was cut short): the one thing
            # the user must act on, and why the sprint is partial.
            if error_says_work_left_out(why := errors.get(key)):
                failures.append(f"- `{key}`: done, its work not merged back (branch `{_branch(report.session_id, key)}`): "
                                f"{_cell(why)}")
            continue
        if state not in TERMINAL_STATES and (not dispatched.get(key) or key in rearmed_not_run) and key not in errors:
            # a shutdown, a stop or a cancel came first: nothing failed
            not_run.append(f"`{key}` ({state}{', rearmed' if key in rearmed_not_run else ''})")
            continue
        why = errors.get(key, "")
        if not why and state not in TERMINAL_STATES:  # its step finished, or was stopped, as the sprint ended
            why = "the sprint ended with the story at this state (a shutdown, a cancel or a stop); it keeps it for the next sprint"
        failures.append(f"- `{key}`: {state}" + (f": {_cell(why)}" if why else ""))
    for batch in report.batches:
        failures += [f"- batch {batch.batch_id}: {_cell(e)}" for e in batch.errors]
    # The reason a batch ended abnormally is the Master's too (among the sprint's errors): said once, as the batch's.
    said = {e for batch in report.batches for e in batch.errors}
    failures += [f"- sprint: {_cell(e)}" for e in dict.fromkeys(report.errors) if e != report.error and e not in said]
    if report.error and report.error not in said:
        failures.append(f"- sprint: {_cell(report.error)}")
    lines += failures or ["None."]
    if not_run:
        lines += ["", f"Not run (the sprint ended before them; they keep their state for the next sprint): {', '.join(not_run)}."]
    lines.append("")

    lines += ["## Agent Performance", ""]
    if agents:
        lines += [
            "| agent | dispatches | answered | failures | no answer | tokens | avg time to answer (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for a in agents:
            lines.append(
                f"| {a.agent} | {a.dispatches} | {a.answered} | {a.failures} | {a.unanswered} | {a.tokens} "
                f"| {a.average_seconds:.1f} |"
            )
    else:
        lines.append("No agent was dispatched.")
    lines.append("")

    lines += ["## Configuration Used", ""]
    flat: dict[str, Any] = {}
    _flatten("", config.model_dump(mode="json"), flat)
    overridden = set()
    if overrides:
        _o: dict[str, Any] = {}
        _flatten("", overrides, _o)
        overridden = set(_o)
    lines += ["| knob | value |", "|---|---|"]
    for key in sorted(flat):
        mark = " (override)" if key in overridden else ""
        lines.append(f"| {key} | {_cell(json.dumps(flat[key]))}{mark} |")
    lines.append("")
    return "\n".join(lines)




def sprint_input(histories: Sequence[WorkflowHistory]) -> SprintInput | None:
    """The latest Master run's input (its carried state holds the config in force)."""
    for history in reversed(histories):
        if not history.events:
            continue
        start = history.events[0].workflow_execution_started_event_attributes
        if start.workflow_type.name != MASTER_TYPE:
            continue
        try:
            return SprintInput.model_validate(decode(start.input))
        except ValidationError:
            return None
    return None


def config_of(inp: SprintInput | None) -> SprintConfig:
    if inp is None:
        return SprintConfig()
    if inp.carried_state is not None:
        return inp.carried_state.config
    try:
        return resolve_config(inp.config_overrides)
    except ConfigError:
        return SprintConfig()


def render_from_histories(report: SprintReport, histories: Sequence[WorkflowHistory]) -> str:
    """The summary of a sprint from its report and its histories (Master runs first, then Slaves):
    what the `write_execution_summary` activity writes and `bso sprint report` prints."""
    master_histories = [
        h for h in histories
        if h.events and h.events[0].workflow_execution_started_event_attributes.workflow_type.name == MASTER_TYPE
    ]  # fmt: skip
    inp = sprint_input(master_histories)
    # Up to the sprint's last batch: the activity that writes the summary runs before the Master's own
    # completion, and `bso sprint report` (after it) must render the same text.
    flow = [m for m in message_flow(histories) if m.type not in ("SPRINT_REPORT", "SPRINT_FAILED")]
    return render_summary(
        report,
        config_of(inp),
        agent_performance(flow),
        overrides=inp.config_overrides if inp else None,
        started=flow[0].time.isoformat(timespec="seconds") if flow else None,
        finished=flow[-1].time.isoformat(timespec="seconds") if flow else None,
    )
