"""message-schemas' delivery and query rules inside workflows (the rules: bso/delivery.py).

`deliver` sends a signal to another workflow (a resident, or a requester), retrying a failed delivery up to
the schema's bound with durable timers between tries, and returns the `delivery_failed` error when it gives
up. `await_answer` waits for an answer within the query's `timeout_ms` and returns `response_timeout`
when it passes. Neither raises for a missing peer; no command is added when delivery succeeds at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import CancelledError

with workflow.unsafe.imports_passed_through():
    from bso.delivery import MAX_DELIVERY_RETRIES, delivery_backoff, delivery_failed, response_timeout
    from bso.messages import DeliveryFailed, ResponseTimeout

_NO_ARG = object()

# A send that the sender's cancel cancelled before it went out was taken for a failed delivery and sent again a
# second later: a cancelled batch's DEBUG_REQUEST still started an analysis.
PATCH_CANCELLED_SEND_IS_A_CANCEL = "delivery-cancelled-send-is-a-cancel"


async def deliver(
    workflow_id: str, signal: str, arg: Any = _NO_ARG, *, max_retries: int = MAX_DELIVERY_RETRIES,
    cancellable: bool = False, patched: Callable[[str], bool] = workflow.patched,
) -> DeliveryFailed | None:
    """Signal `workflow_id`; None once delivered, the delivery_failed error after `max_retries` retries.

    `cancellable`: a request the sender has no use for once cancelled. A cancel of the sending task that cancels
    the signal before it goes out is raised (asyncio.CancelledError) instead of retried. (One that comes after it
    went out is swallowed by the SDK, the signal delivered, and the caller runs on: the Slave's `_debug` checks
    `workflow.cancellation_reason()` then; the Master's sprint task is ended by its wind-down.) `patched`: how the
    sender asks a patch (a Slave through its rollups)."""
    retries = 0
    while True:
        try:
            handle = workflow.get_external_workflow_handle(workflow_id)
            if arg is _NO_ARG:
                await handle.signal(signal)
            else:
                await handle.signal(signal, arg)
            return None
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the peer is gone or unreachable: retried, then reported
            if cancellable and isinstance(err, CancelledError) and patched(PATCH_CANCELLED_SEND_IS_A_CANCEL):
                raise asyncio.CancelledError from err
            if retries >= max_retries:
                message = {"signal": signal, "to": workflow_id, "arg": None if arg is _NO_ARG else arg}
                failed = delivery_failed(message, err, retry_count=retries, max_retries=max_retries)
                workflow.logger.warning("signal %s to %s: %s", signal, workflow_id, failed.reason)
                return failed
            retries += 1
            await workflow.sleep(delivery_backoff(retries))


async def await_answer(
    answered: Callable[[], bool], timeout: timedelta, *, request: Any, recipient: str,
    timeout_summary: str | None = None,
) -> ResponseTimeout | None:
    """Wait until `answered()`; the response_timeout error when `timeout` passes first. (`timeout_summary`: the
    timer's, so a history reader can tell this wait's timeout from other timers.)"""
    try:
        await workflow.wait_condition(answered, timeout=timeout, timeout_summary=timeout_summary)
    except asyncio.TimeoutError:
        return response_timeout(request, timeout, recipient)
    return None


async def hold(
    duration: timedelta, timers: list[asyncio.Task[None]], over: Callable[[], bool], summary: str | None = None
) -> None:
    """Wait `duration` on a timer, or until `over()`. The timer is left to fire, never cancelled (kept in
    `timers`, which drops those that have fired): a hold cut short adds no command, so no order of events on
    replay can make it differ."""
    timer = asyncio.create_task(workflow.sleep(duration, summary=summary))
    timers[:] = [*(t for t in timers if not t.done()), timer]
    await workflow.wait_condition(lambda: over() or timer.done())
