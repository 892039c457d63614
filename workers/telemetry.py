"""Logs and metrics of a BSO worker process.

- `configure_logging()`: structlog, configured once per worker process, renders every record as one JSON
  line, the SDK's and the workflows' `workflow.logger` records included (stdlib logging goes through
  structlog's ProcessorFormatter).
- `TelemetryInterceptor`: binds session, batch, story, agent, mode and dispatch id (from `activity.info()`
  and the TaskAssignment) to every log line of an activity, and emits BSO's metrics through the SDK's
  metric meters, so they appear on the worker's Prometheus endpoint next to the SDK's own:
    bso_agent_dispatches{agent_type,mode,outcome}   agent activities run
    bso_agent_dispatch_duration{agent_type,mode}     their duration (ms)
    bso_stories_finished{final_state}                stories at the end of their batch
    bso_review_fix_rounds                            review-fix rounds per finished story
    bso_tokens_used                                  tokens reported by the agents of finished batches
    bso_sprints_finished{status}                     sprints at their end
  Workflow metrics use `workflow.metric_meter()`, which records nothing during replay.
- `worker_runtime(address)`: the SDK Runtime of a worker process: the SDK core's own log records (Rust) go
  through the same JSON lines instead of coloured text on stdout, and, with an address, a Prometheus endpoint.
"""

from __future__ import annotations

import logging
import time
import warnings
from datetime import timedelta
from typing import Any

import structlog
from temporalio import activity, workflow
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

_configured = False


def configure_logging(level: int | str = logging.INFO) -> None:
    """JSON lines on stderr for structlog and stdlib loggers alike; idempotent."""
    global _configured
    if _configured:
        return
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        # filter_by_level first: a record below the level (an activity's "started" at debug) costs nothing.
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # The SDK's loggers pass their context as `extra` (temporal_workflow / temporal_activity), which the
    # JSON lines carry; no need to repeat it inside the message text.
    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False
    # A workflow whose init refused its input (workflows/inputs.py) never awaits its run coroutine: the SDK's
    # doing, and the failure itself is reported; Python's warning would be the one line of the log not JSON.
    warnings.filterwarnings(
        "ignore", message="coroutine '_WorkflowInstanceImpl._apply_initialize_workflow.<locals>.run_workflow'"
    )
    logging.captureWarnings(True)
    _configured = True


def worker_runtime(metrics_address: str | None = None) -> Runtime:
    """The SDK Runtime of a worker process. Its core's log records (connection retries, activities that
    ended meanwhile) are forwarded to the `temporalio.core` logger, so they are JSON lines like the rest;
    with `metrics_address` (host:port) it serves Prometheus metrics there."""
    return Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")),
            ),
            metrics=PrometheusConfig(bind_address=metrics_address) if metrics_address else None,
        )
    )


def activity_context(args: tuple[Any, ...] | list[Any] = ()) -> dict[str, Any]:
    """What to bind to an activity's log lines: its identity and, for an agent dispatch, the assignment."""
    info = activity.info()
    context: dict[str, Any] = {
        "activity": info.activity_type,
        "activity_id": info.activity_id,
        "attempt": info.attempt,
        "workflow_id": info.workflow_id,
    }
    assignment = args[0] if args else None
    for field, key in (
        ("session_id", "session"),
        ("batch_id", "batch"),
        ("story_key", "story"),
        ("agent_type", "agent"),
        ("mode", "mode"),
        ("dispatch_id", "dispatch_id"),
    ):
        value = getattr(assignment, field, None)
        if value is not None:
            context[key] = str(value)
    return context


class _ActivityTelemetry(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        context = activity_context(input.args)
        log = structlog.get_logger("bso.activity")
        started = time.monotonic()
        outcome = "failed"
        with structlog.contextvars.bound_contextvars(**context):
            log.debug("activity started")
            try:
                result = await self.next.execute_activity(input)
                outcome = "completed"
                return result
            finally:
                elapsed = time.monotonic() - started
                log.info("activity ended", outcome=outcome, seconds=round(elapsed, 3))
                if "agent" in context:
                    meter = activity.metric_meter()
                    attrs = {"agent_type": context["agent"], "mode": context.get("mode", "")}
                    meter.create_counter("bso_agent_dispatches", "agent activities run").add(
                        1, {**attrs, "outcome": outcome}
                    )
                    meter.create_histogram_timedelta(
                        "bso_agent_dispatch_duration", "agent activity duration", "ms"
                    ).record(timedelta(seconds=elapsed), attrs)


class _WorkflowTelemetry(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        result = await self.next.execute_workflow(input)
        try:
            _record_workflow_result(workflow.info().workflow_type, result)
        except Exception:  # noqa: BLE001 - metrics must never fail a workflow task
            workflow.logger.warning("bso metrics not recorded", exc_info=True)
        return result


def _record_workflow_result(workflow_type: str, result: Any) -> None:
    meter = workflow.metric_meter()
    if workflow_type == "SprintSlaveWorkflow" and hasattr(result, "results"):
        finished = meter.create_counter("bso_stories_finished", "stories at the end of their batch")
        rounds = meter.create_histogram("bso_review_fix_rounds", "review-fix rounds per story")
        for story in result.results.story_results:
            finished.add(1, {"final_state": story.final_state})
            rounds.record(int(result.results.review_fix_rounds.get(story.story_key, 0)))
        meter.create_counter("bso_tokens_used", "tokens reported by agents").add(int(result.tokens_used))
    elif workflow_type == "SprintMasterWorkflow" and hasattr(result, "status"):
        meter.create_counter("bso_sprints_finished", "sprints at their end").add(1, {"status": str(result.status)})


class TelemetryInterceptor(Interceptor):
    """Register on every BSO worker: `Worker(..., interceptors=[TelemetryInterceptor()])`."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityTelemetry(next)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _WorkflowTelemetry
