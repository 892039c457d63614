"""SprintMasterWorkflow: one sprint session. Reads the status file, plans batches, runs one
SprintSlaveWorkflow child per batch and reports.

Started from the temporal CLI:
  temporal workflow start --type SprintMasterWorkflow --task-queue bso-sprint --input '{"project_root": "..."}'
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

    from activities.status_file import load_sprint_status
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
    from bso.messages import BatchPlanReady, BatchSpec, describe_validation_error
    from bso.models import (
        LoadStatusInput,
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
        self._session_id = inp.session_id or workflow.info().workflow_id
        self._phase = SprintPhase.STARTING
        self._views: dict[str, StoryView] = {}
        self._plan: BatchPlanReady | None = None
        self._results: list[SlaveResult] = []
        self._running_batches: dict[int, str] = {}  # batch id -> Slave workflow id
        self._tokens_used = 0
        self._token_limit = 0
        self._paused_reason: str | None = None
        self._shutdown = False
        self._errors: list[str] = []

    # --- operator messages ---------------------------------------------------------------------

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> SprintStatusView:
        return SprintStatusView(
            session_id=self._session_id,
            phase=self._phase,
            current_batch=min(self._running_batches) if self._running_batches else None,
            batches_total=len(self._plan.batches) if self._plan else 0,
            batches_done=len(self._results),
            stories=dict(self._views),
            tokens_used=self._tokens_used + self._tokens_in_flight(),
            token_limit=self._token_limit,
            pause_reason=self._paused_reason,
            errors=list(self._errors),
        )

    @workflow.signal(name=SIGNAL_STORY_UPDATE)
    def story_update(self, payload: Any) -> None:
        try:
            update = StoryUpdate.model_validate(payload)
        except ValidationError as err:
            workflow.logger.warning("story_update ignored: %s", describe_validation_error(err))
            return
        if update.story_key in self._views:
            self._views[update.story_key] = update.view
            self._show()

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self, reason: str | None = None) -> None:
        """No new batch starts while paused; batches in flight finish their stories."""
        self._pause(reason or "paused by operator")

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self, request: Any = None) -> None:
        try:
            parsed = ResumeRequest.model_validate(request or {})
        except ValidationError as err:
            workflow.logger.warning("resume ignored: %s", describe_validation_error(err))
            return
        if parsed.token_limit is not None:
            self._token_limit = max(self._token_limit, parsed.token_limit)
        self._paused_reason = None
        if self._phase is SprintPhase.PAUSED:
            self._set_phase(SprintPhase.RUNNING)

    @workflow.signal(name=SIGNAL_SHUTDOWN)
    async def shutdown_request(self) -> None:
        """Stop the sprint gracefully: running Slaves finish the story in hand; no new batch starts."""
        self._shutdown = True
        for slave_id in list(self._running_batches.values()):
            await workflow.get_external_workflow_handle(slave_id).signal(SIGNAL_SHUTDOWN)

    def _pause(self, reason: str) -> None:
        self._paused_reason = reason
        self._set_phase(SprintPhase.PAUSED)

    # --- the sprint ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SprintInput) -> SprintReport:
        self._set_phase(SprintPhase.STARTING)
        config, simulation = self._validate(inp)
        self._token_limit = config.token_budget.limit

        self._set_phase(SprintPhase.PLANNING)
        snapshot = await self._load(inp)
        stories = self._select(inp, snapshot)
        try:
            self._plan = plan_batches(self._session_id, stories, config.batch_size)
        except PlanningError as err:
            raise _invalid_input(str(err)) from None
        workflow.logger.info(
            "BATCH_PLAN_READY: %d stories in %d batches", self._plan.total_stories, len(self._plan.batches)
        )
        by_key = {s.key: s for s in stories}
        for spec in self._plan.batches:
            for key in spec.stories:
                self._views[key] = StoryView(state=by_key[key].state, batch_id=spec.batch_id)

        self._set_phase(SprintPhase.RUNNING)
        stopped_early = await self._run_batches(inp, config, simulation, snapshot, by_key)

        await workflow.wait_condition(workflow.all_handlers_finished)
        final = {key: view.state for key, view in self._views.items()}
        report = SprintReport(
            session_id=self._session_id,
            status=sprint_status(final, stopped_early),
            batch_plan=self._plan,
            batches=sorted(self._results, key=lambda r: r.batch_id),
            stories=final,
            tokens_used=self._tokens_used,
        )
        self._set_phase(SprintPhase.COMPLETED)
        return report

    def _validate(self, inp: SprintInput) -> tuple[SprintConfig, SimulationScript]:
        try:
            config = resolve_config(inp.config_overrides)
        except ConfigError as err:
            raise _invalid_input(str(err)) from None
        try:
            simulation = SimulationScript.model_validate(inp.simulation)
        except ValidationError as err:
            raise _invalid_input(f"invalid simulation script: {describe_validation_error(err)}") from None
        if inp.agent_backend not in {b.value for b in AgentBackend}:
            raise _invalid_input(
                f"agent_backend {inp.agent_backend!r} is not available; use one of: "
                + ", ".join(b.value for b in AgentBackend)
            )
        return config, simulation

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

    async def _run_batches(
        self,
        inp: SprintInput,
        config: SprintConfig,
        simulation: SimulationScript,
        snapshot: StatusSnapshot,
        by_key: dict[str, StoryMeta],
    ) -> bool:
        """Run the plan's batches, at most max_concurrent_slaves at once; True when stopped early."""
        assert self._plan is not None
        queue: list[BatchSpec] = list(self._plan.batches)
        running: dict[int, asyncio.Task[SlaveResult]] = {}
        next_batch_id = len(queue) + 1
        stopped_early = False
        while queue or running:
            startable = not self._shutdown and self._paused_reason is None and not stopped_early
            while startable and queue and len(running) < config.max_concurrent_slaves:
                spec = queue.pop(0)
                running[spec.batch_id] = asyncio.create_task(
                    self._run_slave(inp, config, simulation, snapshot, spec, by_key)
                )
            if not running:
                if self._shutdown or stopped_early:
                    break
                await workflow.wait_condition(lambda: self._paused_reason is None or self._shutdown)
                continue
            await workflow.wait_condition(lambda: any(t.done() for t in running.values()))
            for batch_id in [b for b, t in running.items() if t.done()]:
                result = running.pop(batch_id).result()
                self._results.append(result)
                self._tokens_used += result.tokens_used
                if not result.budget_exhausted and budget_level(self._tokens_used, self._budget(config)) is not BudgetLevel.EXHAUSTED:
                    continue
                leftover = [r.story_key for r in result.results.story_results if r.final_state not in TERMINAL_STATES and r.agents_dispatched == 0]
                if config.token_budget.action == "stop":
                    self._errors.append(f"token budget exhausted ({self._tokens_used}/{self._token_limit}): sprint stopped")
                    stopped_early = True
                    continue
                self._pause(f"token budget exhausted ({self._tokens_used}/{self._token_limit}); resume to go on")
                if leftover:
                    queue.insert(0, BatchSpec(batch_id=next_batch_id, stories=leftover))
                    next_batch_id += 1
            if self._shutdown:
                stopped_early = True
        return stopped_early or self._shutdown

    def _budget(self, config: SprintConfig) -> SprintConfig:
        """The config with the token limit as it stands now (an operator may have raised it)."""
        budget = config.token_budget.model_copy(update={"limit": self._token_limit})
        return config.model_copy(update={"token_budget": budget})

    async def _run_slave(
        self,
        inp: SprintInput,
        config: SprintConfig,
        simulation: SimulationScript,
        snapshot: StatusSnapshot,
        spec: BatchSpec,
        by_key: dict[str, StoryMeta],
    ) -> SlaveResult:
        slave_id = slave_workflow_id(self._session_id, spec.batch_id)
        stories = [by_key[k] for k in spec.stories]
        slave_input = SlaveInput(
            batch_id=spec.batch_id,
            session_id=self._session_id,
            project_root=inp.project_root,
            status_file=snapshot.status_file,
            stories=stories,
            config=self._budget(config),
            config_overrides=inp.config_overrides,
            agent_backend=inp.agent_backend,
            simulation=simulation.model_dump(mode="json") if inp.agent_backend == "simulated" else {},
            resident_contacts=RESIDENT_CONTACTS,
            tokens_used_before=self._tokens_used,
            report_progress_to=workflow.info().workflow_id,
        )
        self._running_batches[spec.batch_id] = slave_id
        self._show()
        try:
            result = await workflow.execute_child_workflow(
                SprintSlaveWorkflow.run,
                slave_input,
                id=slave_id,
                execution_timeout=timedelta(seconds=config.slave_timeout_seconds),
                static_summary=f"Batch {spec.batch_id} of sprint {self._session_id}: {', '.join(spec.stories)}",
                search_attributes=TypedSearchAttributes(
                    [
                        SA_SESSION_ID.value_set(self._session_id),
                        SA_BATCH_ID.value_set(spec.batch_id),
                        SA_PHASE.value_set(SprintPhase.RUNNING.value),
                    ]
                ),
            )
        except ChildWorkflowError as err:
            result = self._abnormal_result(spec, by_key, f"batch {spec.batch_id} Slave ended abnormally: {err.cause or err}")
        # Not in a `finally`: workflow calls are not allowed while an evicted workflow is torn down.
        self._running_batches.pop(spec.batch_id, None)
        self._show()
        return result

    def _abnormal_result(self, spec: BatchSpec, by_key: dict[str, StoryMeta], reason: str) -> SlaveResult:
        """The batch's result as the Master last saw it, when its Slave failed or timed out."""
        self._errors.append(reason)
        workflow.logger.error(reason)
        progress = [
            _progress_from_view(k, self._views.get(k, StoryView(state=by_key[k].state))) for k in spec.stories
        ]
        return build_slave_result(
            batch_id=spec.batch_id,
            session_id=self._session_id,
            progress=progress,
            agents_created=sum(p.agents_dispatched for p in progress),
            agents_destroyed=sum(p.agents_dispatched for p in progress),
            errors=[reason],
            budget_exhausted=False,
        )

    def _tokens_in_flight(self) -> int:
        running = set(self._running_batches)
        return sum(v.tokens_used for v in self._views.values() if v.batch_id in running)

    # --- visibility ----------------------------------------------------------------------------

    def _set_phase(self, phase: SprintPhase) -> None:
        self._phase = phase
        workflow.upsert_search_attributes(
            [SA_SESSION_ID.value_set(self._session_id), SA_PHASE.value_set(phase.value)]
        )
        self._show()

    def _show(self) -> None:
        done = sum(v.state == StoryState.DONE for v in self._views.values())
        rows = "\n".join(
            f"| {k} | {v.batch_id} | {v.state} | {v.review_round} | {v.agent_in_flight or ''} |"
            for k, v in self._views.items()
        )
        pause = f"\n\nPaused: {self._paused_reason}" if self._paused_reason else ""
        workflow.set_current_details(
            f"**Sprint `{self._session_id}`**: {self._phase.value}, {done}/{len(self._views)} stories done, "
            f"tokens {self._tokens_used + self._tokens_in_flight()}/{self._token_limit}{pause}\n\n"
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
