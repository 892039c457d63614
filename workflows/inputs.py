"""A workflow's start input, checked before anything else runs.

`temporal workflow start` without `--input` (or with `--input null`) starts a workflow whose argument is
missing: the SDK would raise a TypeError building the workflow object, which fails the workflow task, and
the server retries it forever. A wrongly shaped input would fail the workflow with pydantic's multi-line
report, shown raw in the Web UI. Each workflow's parameter is therefore `Model | RawInput | None`: the
converter gives the model when the JSON fits it and the plain JSON value when it does not, and
`required_input`, called from each `@workflow.init`, fails the workflow at once with one readable line."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, JsonValue, ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from bso.constants import FAILURE_INVALID_INPUT, FAILURE_MISSING_INPUT

with workflow.unsafe.imports_passed_through():  # the converter's class, not a sandbox copy of it
    from bso.data_converter import UnreadablePayload
from bso.messages import describe_validation_error

InputT = TypeVar("InputT", bound=BaseModel)

# A start input that does not fit its model, kept as the JSON it was so the error can say why.
RawInput = JsonValue


def required_input(inp: InputT | RawInput | UnreadablePayload | None, model: type[InputT]) -> InputT:
    name = workflow.info().workflow_type
    if inp is None:
        raise ApplicationError(
            f"{name} needs its input, a {model.__name__} JSON object "
            f"(with the temporal CLI: --input '{{...}}'); it was started without one",
            type=FAILURE_MISSING_INPUT,
            non_retryable=True,
        )
    if isinstance(inp, model):
        return inp
    if isinstance(inp, UnreadablePayload):  # nested too deep, a number of thousands of digits
        raise ApplicationError(
            f"{name}: invalid input ({model.__name__}): its JSON could not be read: {inp.reason}",
            type=FAILURE_INVALID_INPUT,
            non_retryable=True,
        )
    try:
        return model.model_validate(inp)
    except ValidationError as err:
        raise ApplicationError(
            f"{name}: invalid input ({model.__name__}): {describe_validation_error(err)}",
            type=FAILURE_INVALID_INPUT,
            non_retryable=True,
        ) from None
