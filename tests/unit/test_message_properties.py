"""Property-based tests of the messages that cross a Temporal boundary: any JSON either validates or
raises pydantic's ValidationError (which the handlers catch), valid messages round-trip through the
data converter, and the length caps hold."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload

from bso.data_converter import data_converter
from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS, AgentComplete, describe_validation_error
from bso.models import ResumeRequest, SprintInput, StoryUpdate
from bso.states import AgentMode, AgentStatus, AgentType, Severity, Verdict

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["dispatch_id", "story_key", "agent_type", "mode", "status", "verdict", "findings", "tokens_used",
          "summary", "error", "batch_id", "view", "token_limit", "reason", "project_root"]
near_miss = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)

findings = st.lists(
    st.fixed_dictionaries(
        {"severity": st.sampled_from([s.value for s in Severity] + [s.value.lower() for s in Severity]),
         "summary": st.text(max_size=50)},
        optional={"file": st.text(max_size=20) | st.none(), "line": st.integers(0, 10_000) | st.none()},
    ),
    max_size=5,
)
valid_complete = st.fixed_dictionaries(
    {
        "dispatch_id": st.text(min_size=1, max_size=200),
        "story_key": st.text(min_size=1, max_size=200),
        "agent_type": st.sampled_from([a.value for a in AgentType]),
        "mode": st.sampled_from([m.value for m in AgentMode]),
        "status": st.sampled_from([s.value for s in AgentStatus]),
    },
    optional={
        "verdict": st.sampled_from([v.value for v in Verdict]) | st.none(),
        "findings": findings,
        "tokens_used": st.integers(0, 10**9),
        "summary": st.text(max_size=MAX_SUMMARY_CHARS),
        "unknown_extra_field": json_values,  # ignored, never an error
    },
)


@settings(max_examples=150)
@given(st.one_of(json_values, near_miss))
def test_any_json_validates_or_raises_validation_error(payload: Any):
    for model in (AgentComplete, StoryUpdate, ResumeRequest, SprintInput):
        try:
            model.model_validate(payload)
        except ValidationError as err:
            assert describe_validation_error(err)  # the handlers' error text is never empty


@settings(max_examples=100)
@given(valid_complete)
def test_valid_agent_complete_round_trips_through_the_data_converter(payload: dict[str, Any]):
    message = AgentComplete.model_validate(payload)
    (encoded,) = data_converter.payload_converter.to_payloads([message])
    (decoded,) = data_converter.payload_converter.from_payloads([encoded], [AgentComplete])
    assert decoded == message
    assert AgentComplete.model_validate(message.model_dump(mode="json")) == message


@given(valid_complete, st.integers(MAX_SUMMARY_CHARS + 1, MAX_SUMMARY_CHARS * 3))
def test_summary_over_the_cap_is_rejected(payload: dict[str, Any], length: int):
    payload = {**payload, "summary": "s" * length}
    try:
        AgentComplete.model_validate(payload)
    except ValidationError as err:
        assert "summary" in describe_validation_error(err)
    else:
        raise AssertionError("an oversized summary was accepted")


def test_too_many_findings_are_rejected():
    payload = {"dispatch_id": "d", "story_key": "1-1", "agent_type": "review-runner", "mode": "review",
               "status": "success", "findings": [{"severity": "LOW", "summary": "x"}] * (MAX_FINDINGS + 1)}
    try:
        AgentComplete.model_validate(payload)
    except ValidationError as err:
        assert "findings" in describe_validation_error(err)
    else:
        raise AssertionError("too many findings were accepted")


@given(valid_complete, st.sampled_from([b'"\\ud800"', b'"\\udfff tail"', '"\ud83d cut"'.encode("utf-8", "surrogatepass")]))
def test_a_lone_surrogate_in_a_payload_is_read_not_refused(payload: dict[str, Any], broken: bytes):
    """JSON with half an emoji (a JS agent cutting a string): pydantic's parser refused the whole payload, and the
    SDK dropped the signal carrying it. It is read, the half replaced by U+FFFD."""
    text = AgentComplete.model_validate(payload).model_dump_json(exclude={"summary"})
    data = text[:-1].encode() + b', "summary": ' + broken + b"}"
    (decoded,) = data_converter.payload_converter.from_payloads(
        [Payload(metadata={"encoding": b"json/plain"}, data=data)], [AgentComplete]
    )
    assert "\ufffd" in decoded.summary and decoded.dispatch_id == payload["dispatch_id"]


def test_json_refused_for_other_reasons_is_still_refused():
    for data in (b'{"token_limit": NaN}', b'{"token_limit": ', b'{"token_limit": 1e400}'):
        try:
            data_converter.payload_converter.from_payloads([Payload(metadata={"encoding": b"json/plain"}, data=data)], [ResumeRequest])
        except ValidationError:
            continue
        raise AssertionError(f"{data!r} was taken")
