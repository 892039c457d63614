"""A sprint started with an `epic` that is neither a number nor a key was refused with a message that
offers a boolean.

`temporal workflow start ... --input '{"project_root": "/tmp/shelfwise", "epic": 2.5}'` (or `[1]`, `{}`), then
`bso sprint status ID`:

    bso: error: sprint ID is failed: SprintMasterWorkflow: invalid input (SprintInput): epic.bool: Input should
    be a valid boolean; epic.int: Input should be a valid integer, got a number with a fractional part; epic.str:
    Input should be a valid string

The README says `epic` is `2`, `"2"`, `"02"` or `"epic-2"`, "not `true`", and `"epic": true` is refused ("epic
must be a number (2) or an epic's key (epic-2), not true or false"); the first thing this error offers is a
boolean (the model keeps a StrictBool only to refuse it with that message).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bso.messages import describe_validation_error
from bso.models import SprintInput


@pytest.mark.parametrize("epic", [2.5, [1], {"n": 1}])
def test_a_bad_epic_is_refused_without_offering_a_boolean(epic) -> None:
    with pytest.raises(ValidationError) as refused:
        SprintInput.model_validate({"project_root": "/tmp/shelfwise", "epic": epic})
    said = describe_validation_error(refused.value)
    assert "epic" in said
    assert "boolean" not in said, said
    # One message, saying what epic takes.
    assert said.startswith("epic: epic must be a whole number (2) or an epic's key") and ";" not in said, said


@pytest.mark.parametrize("epic, taken", [(2, 2), (2.0, 2), ("02", "02"), ("epic-2", "epic-2"), (None, None), (True, True)])
def test_an_epic_of_a_kind_is_taken_as_before(epic, taken) -> None:
    """(true is taken as such for the Master to refuse it: EPIC_NOT_A_BOOL.)"""
    given = SprintInput.model_validate({"project_root": "/tmp/shelfwise", "epic": epic}).epic
    assert (given, type(given)) == (taken, type(taken))
