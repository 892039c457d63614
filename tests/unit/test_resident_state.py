"""The residents' hand-over rules and carried state (bso/resident_state.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bso.config import resolve_config
from bso.debugging import DebugRequest
from bso.resident_state import (
    ResidentRunInput,
    ResidentState,
    handover_due,
    history_is_long,
    resident_handover_limit,
)
from bso.roster import ResidentInput, Roster, RosterBroadcast


def test_history_is_long_when_suggested_or_at_the_limit():
    assert history_is_long(10, True, None)
    assert not history_is_long(10_000, False, None)
    assert not history_is_long(99, False, 100)
    assert history_is_long(100, False, 100)


def test_a_stopping_resident_does_not_hand_over():
    assert handover_due(500, False, 100, stopping=False)
    assert not handover_due(500, True, 100, stopping=True)


def test_the_resident_limit_falls_back_to_the_masters():
    assert resident_handover_limit(resolve_config({})) is None
    assert resident_handover_limit(resolve_config({"continue_as_new_after_events": 500})) == 500
    both = resolve_config({"continue_as_new_after_events": 500, "resident_continue_as_new_after_events": 40})
    assert resident_handover_limit(both) == 40
    with pytest.raises(Exception, match="resident_continue_as_new_after_events"):
        resolve_config({"resident_continue_as_new_after_events": 5})


def test_the_state_round_trips_with_pending_requests():
    state = ResidentState(
        run=3,
        broadcasts=[RosterBroadcast(session_id="s", seq=7, change="x", roster=Roster(residents=["debugger"]))],
        broadcasts_received=7,
        requests_served=2,
        debug_requests=[DebugRequest(debug_id="d-1", story_key="1-1", report_to="s/batch-1")],
    )
    inp = ResidentRunInput(role="debugger", session_id="s", master_id="s", project_root="/p", carried_state=state)
    again = ResidentRunInput.model_validate_json(inp.model_dump_json())
    assert again.carried_state == state and again.carried_state.pending == 1


def test_an_input_recorded_before_hand_overs_still_validates():
    old = ResidentInput(role="debugger", session_id="s", master_id="s", project_root="/p").model_dump(mode="json")
    inp = ResidentRunInput.model_validate(old)
    assert inp.carried_state is None and inp.continue_as_new_after_events is None
    with pytest.raises(ValidationError):
        ResidentState.model_validate({"run": 0})
