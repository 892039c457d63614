"""A workflow's start input, checked before anything else runs.

`temporal workflow start` without `--input` (or with `--input null`) starts a workflow whose argument is
missing: the SDK would raise a TypeError building the workflow object, which fails the workflow task, and
the server retries it forever. Called from each `@workflow.init`, this fails the workflow itself instead,
at once, saying what input it needs. (A wrongly shaped input fails the same way: pydantic's
ValidationError is one of each workflow's failure exception types.)"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ApplicationError

InputT = TypeVar("InputT", bound=BaseModel)


def required_input(inp: InputT | None, model: type[InputT]) -> InputT:
    if inp is None:
        raise ApplicationError(
            f"{workflow.info().workflow_type} needs its input, a {model.__name__} JSON object "
            f"(with the temporal CLI: --input '{{...}}'); it was started without one",
            type="MissingWorkflowInput",
            non_retryable=True,
        )
    return inp
