"""Signals and updates whose inputs do not fit their handler never reach it.

A signal sent with one input too many (`temporal workflow signal --input A --input B`) made the SDK call its
handler with a surplus argument: a TypeError in the workflow task, which then failed again on every retry, and
left the sprint deaf to queries and cancellation until it was terminated. The guard checks the call first: such
a signal is recorded as rejected by the workflow (`record_rejected`, shown in its status) and dropped; such an
update is refused with the same words (before it is accepted when it has a validator).

It also keeps a signal that bso.data_converter rescued (a lone UTF-16 surrogate in its JSON) out of a workflow
that ran before that converter: the SDK dropped such a signal then, and its history must replay as it ran.

Register it on every worker and replayer of BSO workflows: WORKFLOW_INTERCEPTORS (workers.main.build_workers
and the tests do).
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
    from bso.data_converter import UnreadablePayload, is_rescued
    from bso.messages import RejectedMessage, rejected_inputs

# A signal whose JSON bso.data_converter read past a lone surrogate is handled (the SDK dropped it before).
PATCH_RESCUED_SIGNALS = "signals-with-lone-surrogates-handled"
# A signal whose input no parser could read is recorded as rejected (the SDK dropped it, said only in the log).
PATCH_UNREADABLE_SIGNALS_RECORDED = "signals-unreadable-recorded"


_SIGNATURES: dict[tuple[str, str, str, str], tuple[inspect.Signature, bool] | None] = {}
_SIGNATURES_KEPT = 1024  # names are the sender's to choose (the Master has a dynamic handler): bounded


def _signature(cls: type, kind: str, name: str) -> tuple[inspect.Signature, bool] | None:
    """The handler's own signature (what workflow.get_*_handler returns for an async handler takes *args) and
    whether it is a method; None when the class has no handler for `name` (nor a dynamic one)."""
    # Kept by the class's name, not the class: the sandbox loads the class anew for every run, and holding those
    # would keep each finished run's modules alive.
    key = (cls.__module__, cls.__qualname__, kind, name)
    if key not in _SIGNATURES:
        definition = workflow._Definition.must_from_class(cls)
        handlers = definition.signals if kind == "signals" else definition.updates
        handler = handlers.get(name) or handlers.get(None)
        if len(_SIGNATURES) >= _SIGNATURES_KEPT:
            _SIGNATURES.clear()
        _SIGNATURES[key] = None if handler is None else (inspect.signature(handler.fn), handler.is_method)
    return _SIGNATURES[key]


def _misfit(kind: str, name: str, args: list[Any]) -> str | None:
    """Why the workflow's `kind` ("signals" or "updates") handler for `name` cannot be called with `args`; None
    when it can (or there is no handler to check)."""
    instance = workflow.instance()
    found = _signature(type(instance), kind, name)
    if found is None:
        return None
    signature, is_method = found
    try:
        signature.bind(*([instance] if is_method else []), *args)
    except TypeError as err:
        return str(err)
    return None


def _unreadable(args: Any) -> str | None:
    """Why an input could not be read (bso.data_converter.UnreadablePayload), or None."""
    return next((f"its input could not be read as JSON: {arg.reason}" for arg in args if isinstance(arg, UnreadablePayload)), None)


def _record_rejected(signal: str, reason: str) -> None:
    record = getattr(workflow.instance(), "record_rejected", None)
    if callable(record):
        record(RejectedMessage(msg_type=signal.upper(), reason=reason))
    else:
        workflow.logger.warning(reason)


class _GuardedInbound(WorkflowInboundInterceptor):
    async def handle_signal(self, input: HandleSignalInput) -> None:
        if any(is_rescued(arg) for arg in input.args) and not workflow.patched(PATCH_RESCUED_SIGNALS):
            workflow.logger.warning("signal %s dropped: its JSON has a lone surrogate (a run from before)", input.signal)
            return
        if (unreadable := _unreadable(input.args)) is not None:
            # Asked only for such a signal: before, the SDK dropped it with a line in the worker's log only.
            if workflow.patched(PATCH_UNREADABLE_SIGNALS_RECORDED):
                _record_rejected(input.signal, unreadable)
            return
        problem = _misfit("signals", input.signal, list(input.args))
        if problem is None:
            await self.next.handle_signal(input)
            return
        _record_rejected(input.signal, rejected_inputs("signal", input.signal, len(input.args), problem))

    def handle_update_validator(self, input: HandleUpdateInput) -> None:
        _refuse_misfit(input)  # before the update is accepted (a handler with a validator)
        self.next.handle_update_validator(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        _refuse_misfit(input)  # one without: the update fails, where a TypeError failed the workflow task
        return await self.next.handle_update_handler(input)


def _refuse_misfit(input: HandleUpdateInput) -> None:
    if (unreadable := _unreadable(input.args)) is not None:
        raise ApplicationError(f"update {input.update}: {unreadable}", type="InvalidInputs")
    problem = _misfit("updates", input.update, list(input.args))
    if problem is not None:
        raise ApplicationError(rejected_inputs("update", input.update, len(input.args), problem), type="InvalidInputs")


class InboundGuard(Interceptor):
    """Signals and updates sent with inputs their handler cannot take are refused, not left failing a task."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _GuardedInbound
