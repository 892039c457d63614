"""message-schemas' delivery rules for the messages BSO's workflows send each other (pure).

- Delivery: a message (a signal to a resident, or a resident's answer to its requester) that cannot be
  delivered is retried up to MAX_DELIVERY_RETRIES times (the schema's bound: `max_retries: 3`) with a growing
  backoff, then reported as a `delivery_failed` error (`reason`, `retry_count`, `max_retries`).
- Queries: a request to a resident (PLAN_REQUEST to the scrum-master, DEBUG_REQUEST to the debugger) may carry
  `timeout_ms` (1000-30000, the query schema's bounds); when it passes without an answer the requester records
  a `response_timeout` error (`waited_ms`, `recipient`) and goes on without the answer.

The workflow side (timers, signals) is workflows/delivery.py; the errors are the models of bso/messages.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from bso.messages import DeliveryFailed, ResponseTimeout, derived_message_id

MAX_DELIVERY_RETRIES = 3  # message-schemas' delivery error: "max_retries": 3
FIRST_BACKOFF = timedelta(seconds=1)
MAX_BACKOFF = timedelta(seconds=10)
QUERY_TIMEOUT_MS_MIN = 1000
QUERY_TIMEOUT_MS_MAX = 30000
MAX_MESSAGE_ERRORS_KEPT = 50


def delivery_backoff(retry: int) -> timedelta:
    """The wait before retry number `retry` (1-based): 1 s, 2 s, 4 s, ... at most 10 s."""
    return min(FIRST_BACKOFF * (2 ** max(0, retry - 1)), MAX_BACKOFF)


def message_id(message: Any) -> str:
    """The id the errors name: the message's own `msg-` id, else one derived from its content."""
    if isinstance(message, dict) and isinstance(message.get("id"), str) and message["id"].startswith("msg-"):
        return message["id"]
    return derived_message_id(message)


def delivery_reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if "not found" in text.lower():
        return f"agent_unavailable: {text}"[:300]
    return text[:300]


def delivery_failed(
    message: Any, error: BaseException, *, retry_count: int, max_retries: int, next_retry_at: datetime | None = None
) -> DeliveryFailed:
    return DeliveryFailed(
        original_message_id=message_id(message),
        reason=delivery_reason(error),
        retry_count=retry_count,
        max_retries=max_retries,
        next_retry_at=next_retry_at,
    )


def query_timeout(timeout_ms: int | None, default: timedelta) -> timedelta:
    """How long a requester waits for a resident's answer: the query's `timeout_ms` (clamped to the schema's
    bounds) when it has one, else the requester's own default."""
    if timeout_ms is None:
        return default
    return timedelta(milliseconds=max(QUERY_TIMEOUT_MS_MIN, min(QUERY_TIMEOUT_MS_MAX, int(timeout_ms))))


def response_timeout(message: Any, waited: timedelta, recipient: str) -> ResponseTimeout:
    return ResponseTimeout(
        original_message_id=message_id(message), waited_ms=int(waited.total_seconds() * 1000), recipient=recipient
    )


def keep_error(errors: list[dict[str, Any]], error: DeliveryFailed | ResponseTimeout) -> list[dict[str, Any]]:
    """The error list with `error` (seed shape) appended; the newest MAX_MESSAGE_ERRORS_KEPT kept."""
    return [*errors, error.to_seed()][-MAX_MESSAGE_ERRORS_KEPT:]


def sprint_message_errors(own: list[dict[str, Any]], batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The Master's view: its own message errors, then each batch's (in batch order)."""
    return [*own, *(e for errors in batches for e in errors)]


def describe(error: DeliveryFailed | ResponseTimeout) -> str:
    if isinstance(error, DeliveryFailed):
        return f"delivery_failed: {error.reason} (after {error.retry_count} of {error.max_retries} retries)"
    return f"response_timeout: no answer from {error.recipient} within {error.waited_ms} ms"
