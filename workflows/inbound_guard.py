"""Signals and updates whose inputs do not fit their handler never reach it.

A signal sent with one input too many (`temporal workflow signal --input A --input B`) made the SDK call its
handler with a surplus argument: a TypeError in the workflow task, which then failed again on every retry, and
left the sprint deaf to queries and cancellation until it was terminated. The guard checks the call first: such
a signal is recorded as rejected by the workflow (`record_rejected`, shown in its status) and dropped; such an
update is refused by its validator step with the same words, before it is accepted.

Register it on every worker that runs BSO workflows: `Worker(..., interceptors=[InboundGuard()])`
(workers.main.build_workers does).
"""

from __future__ import annotations

import inspect
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

with workflow.unsafe.imports_passed_through():
    from bso.messages import RejectedMessage, rejected_inputs


def _misfit(kind: str, name: str, args: list[Any]) -> str | None:
    """Why the workflow's `kind` ("signals" or "updates") handler for `name` cannot be called with `args`; None
    when it can (or there is no handler to check)."""
    # The definition's own function: what workflow.get_*_handler returns for an async handler takes (*args).
    definition = workflow._Definition.must_from_class(type(workflow.instance()))
    handlers = definition.signals if kind == "signals" else definition.updates
    handler = handlers.get(name) or handlers.get(None)
    if handler is None:
        return None
    try:
        inspect.signature(handler.fn).bind(*([workflow.instance()] if handler.is_method else []), *args)
    except TypeError as err:
        return str(err)
    return None


class _GuardedInbound(WorkflowInboundInterceptor):
    async def handle_signal(self, input: HandleSignalInput) -> None:
        problem = _misfit("signals", input.signal, list(input.args))
        if problem is None:
            await self.next.handle_signal(input)
            return
        reason = rejected_inputs("signal", input.signal, len(input.args), problem)
        record = getattr(workflow.instance(), "record_rejected", None)
        if callable(record):
            record(RejectedMessage(msg_type=input.signal.upper(), reason=reason))
        else:
            workflow.logger.warning(reason)

    def handle_update_validator(self, input: HandleUpdateInput) -> None:
        _refuse_misfit(input)  # before the update is accepted (a handler with a validator)
        self.next.handle_update_validator(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        _refuse_misfit(input)  # one without: the update fails, where a TypeError failed the workflow task
        return await self.next.handle_update_handler(input)


def _refuse_misfit(input: HandleUpdateInput) -> None:
    problem = _misfit("updates", input.update, list(input.args))
    if problem is not None:
        raise ApplicationError(rejected_inputs("update", input.update, len(input.args), problem), type="InvalidInputs")


class InboundGuard(Interceptor):
    """Signals and updates sent with inputs their handler cannot take are refused, not left failing a task."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _GuardedInbound
