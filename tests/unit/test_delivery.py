"""message-schemas' delivery rules (bso/delivery.py): retry bound and backoff, query timeouts, error shapes."""

from __future__ import annotations

from datetime import timedelta

from bso.delivery import (
    MAX_DELIVERY_RETRIES,
    delivery_backoff,
    delivery_failed,
    describe,
    keep_error,
    message_id,
    query_timeout,
    response_timeout,
    sprint_message_errors,
)
from bso.messages import DeliveryFailed, ResponseTimeout, parse_message


def test_retry_bound_and_backoff() -> None:
    assert MAX_DELIVERY_RETRIES == 3  # the schema's delivery error: "max_retries": 3
    assert [delivery_backoff(n).total_seconds() for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 8, 10, 10]


def test_query_timeout_honours_timeout_ms_within_the_schema_bounds() -> None:
    default = timedelta(minutes=5)
    assert query_timeout(None, default) == default
    assert query_timeout(5000, default) == timedelta(seconds=5)
    assert query_timeout(10, default) == timedelta(seconds=1) and query_timeout(99_999, default) == timedelta(seconds=30)


def test_errors_have_the_seed_shape() -> None:
    request = {"msg_type": "DEBUG_REQUEST", "debug_id": "d1"}
    failed = delivery_failed(request, RuntimeError("workflow not found"), retry_count=3, max_retries=3)
    seed = failed.to_seed()
    assert seed == {
        "type": "error", "error_type": "delivery_failed", "original_message_id": message_id(request),
        "reason": "agent_unavailable: workflow not found", "retry_count": 3, "max_retries": 3,
    }
    assert isinstance(parse_message(seed), DeliveryFailed)
    assert message_id({"id": "msg-0123abcd"}) == "msg-0123abcd" and message_id(request).startswith("msg-")
    late = response_timeout(request, timedelta(milliseconds=5000), "s/resident-debugger")
    assert late.to_seed() == {
        "type": "error", "error_type": "response_timeout", "original_message_id": message_id(request),
        "waited_ms": 5000, "recipient": "s/resident-debugger",
    }
    assert isinstance(parse_message(late.to_seed()), ResponseTimeout)
    assert describe(failed) == "delivery_failed: agent_unavailable: workflow not found (after 3 of 3 retries)"
    assert describe(late) == "response_timeout: no answer from s/resident-debugger within 5000 ms"


def test_errors_are_kept_bounded_and_summed_by_the_master() -> None:
    late = response_timeout({}, timedelta(seconds=1), "x")
    errors: list[dict] = []
    for _ in range(60):
        errors = keep_error(errors, late)
    assert len(errors) == 50
    assert sprint_message_errors([{"a": 1}], [[{"b": 2}], [], [{"c": 3}]]) == [{"a": 1}, {"b": 2}, {"c": 3}]
