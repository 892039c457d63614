"""Batch and sprint results, computed from the stories' durable progress."""

from __future__ import annotations

from bso.git_rules import error_says_work_left_out
from bso.models import (
    TERMINAL_VALUES,
    SlaveResult,
    SlaveResults,
    SprintReport,
    StoryProgress,
    StoryResult,
    StoryView,
    StoryWork,
)
from bso.states import BatchStatus, SprintStatus, StoryState


def story_results(progress: list[StoryProgress]) -> list[StoryResult]:
    return [
        StoryResult(
            story_key=p.key,
            final_state=p.state,
            agents_dispatched=p.agents_dispatched,
            error=p.error,
            review_scores=list(p.review_scores),
            tokens_used=p.tokens_used,
        )
        for p in progress
    ]


def work_per_story(batches: list[SlaveResult]) -> dict[str, StoryWork]:
    """Each story's agents and tokens over every batch it ran in (a rearmed story ran in several)."""
    work: dict[str, StoryWork] = {}
    for batch in batches:
        for r in batch.results.story_results:
            work[r.story_key] = work.get(r.story_key, StoryWork()).plus(r)
    return work


def batch_status(progress: list[StoryProgress], errors: list[str]) -> BatchStatus:
    done = sum(p.state == StoryState.DONE for p in progress)
    if progress and done == len(progress) and not errors:
        return BatchStatus.COMPLETE
    if done == 0:
        return BatchStatus.FAILED
    return BatchStatus.PARTIAL


def build_slave_result(
    *,
    batch_id: int,
    session_id: str,
    progress: list[StoryProgress],
    agents_created: int,
    agents_destroyed: int,
    errors: list[str],
    budget_exhausted: bool,
    fatal_error: str | None = None,
    handed_over: bool = False,
) -> SlaveResult:
    completed = sum(p.state == StoryState.DONE for p in progress)
    failed = sum(p.state == StoryState.NEEDS_INTERVENTION for p in progress)
    skipped = sum(
        # not started: left for later (shutdown, budget, fail_fast), unless the file already had it settled
        p.state == StoryState.SKIPPED or (not p.started and p.state not in (StoryState.NEEDS_INTERVENTION, StoryState.DONE))
        for p in progress
    )
    return SlaveResult(
        status=batch_status(progress, errors),
        batch_id=batch_id,
        session_id=session_id,
        results=SlaveResults(
            stories_total=len(progress),
            stories_completed=completed,
            stories_failed=failed,
            stories_skipped=skipped,
            story_results=story_results(progress),
            total_agents_created=agents_created,
            total_agents_destroyed=agents_destroyed,
            review_fix_rounds={p.key: p.fix_rounds for p in progress},
        ),
        errors=errors,
        tokens_used=sum(p.tokens_used for p in progress),
        budget_exhausted=budget_exhausted,
        fatal_error=fatal_error,
        handed_over=handed_over,
    )


def sprint_status(final_states: dict[str, str], stopped_early: bool, undelivered: int = 0) -> SprintStatus:
    """`undelivered`: done stories whose work may not be in the project (not merged back): the sprint is not
    complete while the user still has work to bring in. A `skipped` story (by hand, a `skip_story` decision, a
    course correction's drop, a dependency that will not be done) is not done, but it is no failure either: a
    sprint whose stories were all skipped is partial, not failed."""
    done = sum(v == StoryState.DONE for v in final_states.values())
    if not final_states:
        return SprintStatus.COMPLETE  # nothing left to do
    if done == len(final_states) and not stopped_early and not undelivered:
        return SprintStatus.COMPLETE
    all_skipped = all(v == StoryState.SKIPPED for v in final_states.values())
    if done == 0 and not stopped_early and not all_skipped:
        return SprintStatus.FAILED
    return SprintStatus.PARTIAL


def undelivered_stories(views: dict[str, StoryView]) -> list[str]:
    """Done stories whose branch did not merge back (or whose merge was cut short): their work may not be in
    the project."""
    return [key for key, view in views.items() if view.state == StoryState.DONE and _work_left_out(view)]


def _work_left_out(view: StoryView) -> bool:
    return view.work_left_out if view.work_left_out is not None else error_says_work_left_out(view.error)


def batch_errors(results: list[SlaveResult], sprint_errors: list[str]) -> dict[int, list[str]]:
    """The finished batches' own errors (out of time, fail_fast's fatal error ...), by batch id: those the
    sprint's errors do not hold already (the reason a batch ended abnormally is the Master's)."""
    known = set(sprint_errors)
    found = {r.batch_id: [e for e in r.errors if e not in known] for r in sorted(results, key=lambda r: r.batch_id)}
    return {batch_id: errors for batch_id, errors in found.items() if errors}


def planned_batches(report: SprintReport) -> dict[str, int]:
    """The batch each story that never ran was planned in last (its result names the batch of one that ran): the
    batches left unstarted, or in a report made before they were kept, the first plan's. A story a course
    correction dropped is in none."""
    if report.unstarted_batches is not None:
        specs = report.unstarted_batches
    else:
        specs = report.batch_plan.batches if report.batch_plan else []
    return {key: spec.batch_id for spec in specs for key in spec.stories}


def batches_total(report: SprintReport) -> int:
    """The sprint's batches: those that ran and those left unstarted (in a report made before these were kept, the
    first plan's count, which a course correction, a rearm or the improvement cycle changed since)."""
    if report.unstarted_batches is not None:
        return len(report.batches) + len(report.unstarted_batches)
    return len(report.batch_plan.batches) if report.batch_plan else len(report.batches)


def settled_of(result: SlaveResult, views: dict[str, StoryView]) -> tuple[int, int]:
    """A finished batch's bar: its stories that reached a final state, of all. Not its `stories_skipped`, which
    also counts the stories a shutdown or a cancel left unstarted (the report lists them as not run). A story it
    left unstarted that a later batch took on (a budget stop queues them again) is that batch's: the bar stayed
    short for good (`1/3` beside every story done)."""
    counts = result.results
    moved = sum(
        r.final_state not in TERMINAL_VALUES and (view := views.get(r.story_key)) is not None
        and view.batch_id != result.batch_id
        for r in counts.story_results
    )  # fmt: skip
    return sum(r.final_state in TERMINAL_VALUES for r in counts.story_results), counts.stories_total - moved
