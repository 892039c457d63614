"""SprintMasterWorkflow: one sprint session. Reads the status file, plans batches, runs one
SprintSlaveWorkflow child per batch and reports.

Started from the temporal CLI:
  temporal workflow start --type SprintMasterWorkflow --task-queue bso-sprint --input '{"project_root": "..."}'

All of the Master's knowledge is one typed model (`MasterState`), so a long sprint can continue as new
between batches, before its history grows large, and pick up exactly where it was.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.improvements import add_improvement_stories, propose_improvements
    from activities.status_file import load_sprint_status
    from activities.summary import SummaryInput, write_execution_summary
    from bso.config import ConfigError, SprintConfig, resolve_config
    from bso.constants import (
        QUERY_STATUS,
        SA_BATCH_ID,
        SA_PHASE,
        SA_SESSION_ID,
        SIGNAL_PAUSE,
        SIGNAL_RESUME,
        SIGNAL_SHUTDOWN,
        SIGNAL_STORY_UPDATE,
        slave_workflow_id,
    )
    from bso.dispatch import BudgetLevel, budget_level
    from bso.messages import BatchSpec, describe_validation_error
    from bso.models import (
        LoadStatusInput,
        MasterState,
        ResumeRequest,
        SlaveInput,
        SlaveResult,
        SprintInput,
        SprintReport,
        SprintStatusView,
        StatusSnapshot,
        StoryMeta,
        StoryProgress,
        StoryUpdate,
        StoryView,
    )
    from bso.improvements import (
        AddStoriesInput,
        ImprovementRecord,
        NewStory,
        ProposeInput,
        improvement_story_keys,
        last_epic,
        select_improvements,
    )
    from bso.planning import PlanningError, plan_batches
    from bso.report import build_slave_result, sprint_status
    from bso.simulation import SimulationScript
    from bso.sprint_status import resolve_story_keys
    from bso.states import TERMINAL_STATES, AgentBackend, SprintPhase, StoryState
    from workflows.sprint_slave import SprintSlaveWorkflow

RESIDENT_CONTACTS = {
    "knowledge-researcher": "knowledge-researcher",
    "debugger": "debugger",
    "e2e-live": "e2e-live",
}


def _invalid_input(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidSprintInput", non_retryable=True)


@workflow.defn(failure_exception_types=[ValidationError])
class SprintMasterWorkflow:
    @workflow.init
    def __init__(self, inp: SprintInput) -> None:
        self._state = inp.carried_state or MasterState(session_id=inp.session_id or workflow.info().workflow_id)
        self._running_batches: dict[int, str] = {}  # batch id -> Slave workflow id

    # --- operator messages ---------------------------------------------------------------------

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> SprintStatusView:
        s = self._state
        return SprintStatusView(
            session_id=s.session_id,
            phase=s.phase,
            current_batch=min(self._running_batches) if self._running_batches else None,
            batches_total=len(s.results) + len(s.queue) + len(self._running_batches),
            batches_done=len(s.results),
            stories=dict(s.views),
            tokens_used=s.tokens_used + self._tokens_in_flight(),
            token_limit=s.token_limit,
            pause_reason=s.paused_reason,
            errors=list(s.errors),
            runs=s.runs,
        )

    @workflow.signal(name=SIGNAL_STORY_UPDATE)
    def story_update(self, payload: Any) -> None:
        try:
            update = StoryUpdate.model_validate(payload)
        except ValidationError as err:
            workflow.logger.warning("story_update ignored: %s", describe_validation_error(err))
            return
        if update.story_key in self._state.views:
            self._state.views[update.story_key] = update.view
            self._show()

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self, reason: Any = None) -> None:
        """No new batch starts while paused; batches in flight finish their stories.

        `reason` is Any: with `str | None` the SDK dropped a pause whose reason was not a string."""
        self._pause(reason if isinstance(reason, str) and reason else "paused by operator")

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self, request: Any = None) -> None:
        try:
            parsed = ResumeRequest.model_validate(request or {})
        except ValidationError as err:
            workflow.logger.warning("resume ignored: %s", describe_validation_error(err))
            return
        if parsed.token_limit is not None:
            self._state.token_limit = max(self._state.token_limit, parsed.token_limit)
        self._state.paused_reason = None
        if self._state.phase is SprintPhase.PAUSED:
            self._set_phase(SprintPhase.RUNNING)

    @workflow.signal(name=SIGNAL_SHUTDOWN)
    async def shutdown_request(self) -> None:
        """Stop the sprint gracefully: running Slaves finish the story in hand; no new batch starts."""
        self._state.shutdown = True
        for slave_id in list(self._running_batches.values()):
            await workflow.get_external_workflow_handle(slave_id).signal(SIGNAL_SHUTDOWN)

    def _pause(self, reason: str) -> None:
        self._state.paused_reason = reason
        self._set_phase(SprintPhase.PAUSED)

    # --- the sprint ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SprintInput) -> SprintReport:
        if inp.carried_state is None:
            await self._start(inp)
        else:
            self._set_phase(self._state.phase)  # search attributes and details of the new run

        simulation = SimulationScript.model_validate(inp.simulation)
        if await self._run_batches(inp, simulation):
            return await self._continue_as_new(inp)
        if self._improvement_cycle_due():
            await self._improvement_cycle(inp, simulation)
            if await self._run_batches(inp, simulation):
                return await self._continue_as_new(inp)

        await workflow.wait_condition(workflow.all_handlers_finished)
        s = self._state
        final = {key: view.state for key, view in s.views.items()}
        report = SprintReport(
            session_id=s.session_id,
            status=sprint_status(final, s.stopped_early or s.shutdown),
            batch_plan=s.plan,
            batches=sorted(s.results, key=lambda r: r.batch_id),
            stories=final,
            tokens_used=s.tokens_used,
            improvements=list(s.improvements),
        )
        if workflow.patched("execution-summary"):
            await self._write_summary(inp, report)
        self._set_phase(SprintPhase.COMPLETED)
        return report

    # --- the improvement cycle (Gear 2) ---------------------------------------------------------

    def _improvement_cycle_due(self) -> bool:
        s = self._state
        return (
            s.config.improvement_cycle
            and not s.improvement_cycle_done
            and not (s.shutdown or s.stopped_early or s.paused_reason)
            and bool(s.views)
            and all(v.state == StoryState.DONE for v in s.views.values())
        )

    async def _improvement_cycle(self, inp: SprintInput, simulation: SimulationScript) -> None:
        """The scrum-master proposes; the top max_improvements become stories, queued as one more batch."""
        s = self._state
        s.improvement_cycle_done = True
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=60),
            "retry_policy": RetryPolicy(maximum_attempts=3, non_retryable_error_types=["StatusFileError"]),
        }
        proposed = await workflow.execute_activity(
            propose_improvements,
            ProposeInput(
                project_root=inp.project_root,
                session_id=s.session_id,
                backend=inp.agent_backend,
                done_stories=list(s.views),
                simulated=list(simulation.improvements),
            ),
            summary="improvement cycle: scrum-master proposals",
            **options,
        )
        s.errors.extend(f"improvement proposal rejected: {r}" for r in proposed.rejected)
        chosen = select_improvements(proposed.proposals, s.config.max_improvements)
        if not chosen:
            workflow.logger.info("improvement cycle: nothing proposed")
            return
        epic = last_epic(list(s.stories))
        keys = improvement_story_keys(chosen, list(s.stories), epic)
        some_story = next(iter(s.stories.values()))
        try:
            metas = await workflow.execute_activity(
                add_improvement_stories,
                AddStoriesInput(
                    project_root=inp.project_root,
                    status_file=s.status_file,
                    story_location=some_story.story_path.rsplit("/", 1)[0] if "/" in some_story.story_path else ".",
                    epic=epic,
                    stories=[NewStory(key=k, proposal=p) for k, p in zip(keys, chosen, strict=True)],
                ),
                summary=f"improvement cycle: add {', '.join(keys)}",
                **options,
            )
        except ActivityError as err:
            s.errors.append(f"improvement cycle: stories not added ({err.cause or err})")
            return
        spec = BatchSpec(batch_id=s.next_batch_id, stories=[m.key for m in metas])
        s.next_batch_id += 1
        for meta, proposal in zip(metas, chosen, strict=True):
            s.stories[meta.key] = meta
            s.views[meta.key] = StoryView(state=meta.state, batch_id=spec.batch_id)
            s.improvements.append(
                ImprovementRecord(
                    improvement_id=proposal.improvement_id,
                    story_key=meta.key,
                    description=proposal.description,
                    priority_score=proposal.priority_score,
                    category=proposal.category,
                    acceptance_criteria=list(proposal.acceptance_criteria),
                )
            )
        s.queue.append(spec)
        workflow.logger.info("IMPROVEMENT_REQUESTED: %s as batch %d", ", ".join(spec.stories), spec.batch_id)
        self._show()

    async def _write_summary(self, inp: SprintInput, report: SprintReport) -> None:
        """`.sprint-session/execution-summary-<session>.md`; a failure to write it never fails the sprint."""
        try:
            await workflow.execute_activity(
                write_execution_summary,
                SummaryInput(project_root=inp.project_root, workflow_id=workflow.info().workflow_id, report=report),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="write the execution summary",
            )
        except ActivityError as err:
            workflow.logger.warning("execution summary not written: %s", err.cause or err)

    async def _start(self, inp: SprintInput) -> None:
        """Validate the input, read the status file, plan the batches (BATCH_PLAN_READY)."""
        s = self._state
        self._set_phase(SprintPhase.STARTING)
        s.config = self._validate(inp)
        s.token_limit = s.config.token_budget.limit

        self._set_phase(SprintPhase.PLANNING)
        snapshot = await self._load(inp)
        s.status_file = snapshot.status_file
        stories = self._select(inp, snapshot)
        try:
            s.plan = plan_batches(s.session_id, stories, s.config.batch_size)
        except PlanningError as err:
            raise _invalid_input(str(err)) from None
        workflow.logger.info("BATCH_PLAN_READY: %d stories in %d batches", s.plan.total_stories, len(s.plan.batches))
        s.stories = {story.key: story for story in stories}
        for spec in s.plan.batches:
            for key in spec.stories:
                s.views[key] = StoryView(state=s.stories[key].state, batch_id=spec.batch_id)
        s.queue = list(s.plan.batches)
        s.next_batch_id = len(s.plan.batches) + 1
        self._set_phase(SprintPhase.RUNNING)

    def _validate(self, inp: SprintInput) -> SprintConfig:
        try:
            config = resolve_config(inp.config_overrides)
        except ConfigError as err:
            raise _invalid_input(str(err)) from None
        try:
            SimulationScript.model_validate(inp.simulation)
        except ValidationError as err:
            raise _invalid_input(f"invalid simulation script: {describe_validation_error(err)}") from None
        if inp.agent_backend not in {b.value for b in AgentBackend}:
            raise _invalid_input(
                f"agent_backend {inp.agent_backend!r} is not available; use one of: "
                + ", ".join(b.value for b in AgentBackend)
            )
        return config

    async def _load(self, inp: SprintInput) -> StatusSnapshot:
        try:
            return await workflow.execute_activity(
                load_sprint_status,
                LoadStatusInput(project_root=inp.project_root, status_file=inp.status_file),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["StatusFileError"]),
                summary="read and validate sprint-status.yaml",
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            self._set_phase(SprintPhase.FAILED)
            raise ApplicationError(message, type="StatusFileError", non_retryable=True) from None

    def _select(self, inp: SprintInput, snapshot: StatusSnapshot) -> list[StoryMeta]:
        stories = [s for s in snapshot.stories if s.state != StoryState.DONE]
        if inp.epic is not None:
            epic = str(inp.epic).removeprefix("epic-")
            stories = [s for s in stories if s.epic == f"epic-{epic}"]
        if inp.story_keys:
            try:
                wanted = resolve_story_keys(inp.story_keys, [s.key for s in snapshot.stories])
            except ValueError as err:
                raise _invalid_input(str(err)) from None
            stories = [s for s in stories if s.key in wanted]
        return stories

    async def _run_batches(self, inp: SprintInput, simulation: SimulationScript) -> bool:
        """Run queued batches, at most max_concurrent_slaves at once.

        Returns True when the Master should continue as new (between batches, nothing running)."""
        s = self._state
        running: dict[int, asyncio.Task[SlaveResult]] = {}
        while s.queue or running:
            if not running and self._history_is_long():
                return True
            # A long history stops new batches: with max_concurrent_slaves > 1 the running set would
            # otherwise never empty, and the Master would never reach a point where it may continue as new.
            may_start = not s.shutdown and s.paused_reason is None and not s.stopped_early
            may_start = may_start and not self._history_is_long()
            while may_start and s.queue and len(running) < s.config.max_concurrent_slaves:
                spec = s.queue.pop(0)
                running[spec.batch_id] = asyncio.create_task(self._run_slave(inp, simulation, spec))
            if not running:
                if s.shutdown or s.stopped_early:
                    break
                await workflow.wait_condition(lambda: s.paused_reason is None or s.shutdown)
                continue
            await workflow.wait_condition(lambda: any(t.done() for t in running.values()))
            for batch_id in [b for b, t in running.items() if t.done()]:
                result = running.pop(batch_id).result()
                self._settle(result)
                if result.fatal_error is not None:
                    await self._stop_running(list(running))
        return False

    def _settle(self, result: SlaveResult) -> None:
        """A batch ended: count its tokens and apply the budget rule (P26)."""
        s = self._state
        s.results.append(result)
        s.tokens_used += result.tokens_used
        if result.fatal_error is not None:
            s.errors.append(f"{result.fatal_error}: sprint stopped (fail_fast)")
            s.stopped_early = True
            return
        if not result.budget_exhausted and budget_level(s.tokens_used, self._config_now()) is not BudgetLevel.EXHAUSTED:
            return
        budget_note = f"token budget exhausted ({s.tokens_used}/{s.token_limit})"
        if s.config.token_budget.action == "stop":
            s.errors.append(f"{budget_note}: sprint stopped")
            s.stopped_early = True
            return
        self._pause(f"{budget_note}; resume (optionally with a higher token_limit) to go on")
        never_started = [
            r.story_key
            for r in result.results.story_results
            if r.final_state not in TERMINAL_STATES and r.agents_dispatched == 0
        ]
        if never_started:
            s.queue.insert(0, BatchSpec(batch_id=s.next_batch_id, stories=never_started))
            for key in never_started:
                s.views[key] = s.views[key].model_copy(update={"batch_id": s.next_batch_id})
            s.next_batch_id += 1

    async def _stop_running(self, batch_ids: list[int]) -> None:
        """fail_fast: the other running Slaves finish the story in hand and stop (the shutdown protocol)."""
        for batch_id in batch_ids:
            slave_id = self._running_batches.get(batch_id)
            if slave_id is None:
                continue
            try:
                await workflow.get_external_workflow_handle(slave_id).signal(SIGNAL_SHUTDOWN)
            except Exception as err:  # the Slave may have just ended: nothing left to stop
                workflow.logger.info("fail_fast: %s not signalled (%s)", slave_id, err)

    def _history_is_long(self) -> bool:
        info = workflow.info()
        limit = self._state.config.continue_as_new_after_events
        return info.is_continue_as_new_suggested() or (limit is not None and info.get_current_history_length() >= limit)

    async def _continue_as_new(self, inp: SprintInput) -> SprintReport:
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._state.runs += 1
        workflow.logger.info("continuing as new (run %d) with %d batches left", self._state.runs, len(self._state.queue))
        workflow.continue_as_new(inp.model_copy(update={"carried_state": self._state}))

    def _config_now(self) -> SprintConfig:
        """The config with the token limit as it stands now (an operator may have raised it)."""
        config = self._state.config
        budget = config.token_budget.model_copy(update={"limit": self._state.token_limit})
        return config.model_copy(update={"token_budget": budget})

    async def _run_slave(self, inp: SprintInput, simulation: SimulationScript, spec: BatchSpec) -> SlaveResult:
        s = self._state
        slave_id = slave_workflow_id(s.session_id, spec.batch_id)
        slave_input = SlaveInput(
            batch_id=spec.batch_id,
            session_id=s.session_id,
            project_root=inp.project_root,
            status_file=s.status_file,
            stories=[s.stories[k] for k in spec.stories],
            config=self._config_now(),
            config_overrides=inp.config_overrides,
            agent_backend=inp.agent_backend,
            simulation=simulation.model_dump(mode="json") if inp.agent_backend == "simulated" else {},
            resident_contacts=RESIDENT_CONTACTS,
            tokens_used_before=s.tokens_used,
            report_progress_to=workflow.info().workflow_id,
        )
        self._running_batches[spec.batch_id] = slave_id
        self._show()
        try:
            result = await workflow.execute_child_workflow(
                SprintSlaveWorkflow.run,
                slave_input,
                id=slave_id,
                execution_timeout=timedelta(seconds=s.config.slave_timeout_seconds),
                static_summary=f"Batch {spec.batch_id} of sprint {s.session_id}: {', '.join(spec.stories)}",
                search_attributes=TypedSearchAttributes(
                    [
                        SA_SESSION_ID.value_set(s.session_id),
                        SA_BATCH_ID.value_set(spec.batch_id),
                        SA_PHASE.value_set(SprintPhase.RUNNING.value),
                    ]
                ),
            )
        except ChildWorkflowError as err:
            result = self._abnormal_result(spec, f"batch {spec.batch_id} Slave ended abnormally: {err.cause or err}")
        # Not in a `finally`: workflow calls are not allowed while an evicted workflow is torn down.
        self._running_batches.pop(spec.batch_id, None)
        self._show()
        return result

    def _abnormal_result(self, spec: BatchSpec, reason: str) -> SlaveResult:
        """The batch's result as the Master last saw it, when its Slave failed or timed out."""
        s = self._state
        s.errors.append(reason)
        workflow.logger.error(reason)
        progress = [_progress_from_view(k, s.views[k]) for k in spec.stories]
        dispatched = sum(p.agents_dispatched for p in progress)
        return build_slave_result(
            batch_id=spec.batch_id,
            session_id=s.session_id,
            progress=progress,
            agents_created=dispatched,
            agents_destroyed=dispatched,
            errors=[reason],
            budget_exhausted=False,
        )

    def _tokens_in_flight(self) -> int:
        return sum(v.tokens_used for v in self._state.views.values() if v.batch_id in self._running_batches)

    # --- visibility ----------------------------------------------------------------------------

    def _set_phase(self, phase: SprintPhase) -> None:
        self._state.phase = phase
        workflow.upsert_search_attributes(
            [SA_SESSION_ID.value_set(self._state.session_id), SA_PHASE.value_set(phase.value)]
        )
        self._show()

    def _show(self) -> None:
        s = self._state
        done = sum(v.state == StoryState.DONE for v in s.views.values())
        # Only the stories of running batches: the details stay small on a sprint of any size.
        rows = "\n".join(
            f"| {k} | {v.batch_id} | {v.state} | {v.review_round} | {v.agent_in_flight or ''} |"
            for k, v in s.views.items()
            if v.batch_id in self._running_batches
        )
        pause = f"\n\nPaused: {s.paused_reason}" if s.paused_reason else ""
        workflow.set_current_details(
            f"**Sprint `{s.session_id}`**: {s.phase.value}, {done}/{len(s.views)} stories done, "
            f"batches {len(s.results)} done / {len(s.results) + len(s.queue) + len(self._running_batches)}, "
            f"tokens {s.tokens_used + self._tokens_in_flight()}/{s.token_limit}{pause}\n\n"
            "| story | batch | state | review round | agent in flight |\n|---|---|---|---|---|\n" + rows
        )


def _progress_from_view(key: str, view: StoryView) -> StoryProgress:
    return StoryProgress(
        key=key,
        state=view.state,
        agents_dispatched=view.agents_dispatched,
        review_rounds=view.review_round,
        fix_rounds=view.fix_rounds,
        tokens_used=view.tokens_used,
        started=view.agents_dispatched > 0,
        error=view.error,
    )
