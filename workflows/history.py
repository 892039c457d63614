"""The Master's and the Slaves' check of their history length (the residents add their stopping rule, bso/resident_state.py)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bso.resident_state import history_is_long


def history_is_long_now(limit: int | None) -> bool:
    """This run's history is long: Temporal suggests continuing as new, or it reached `limit` events."""
    info = workflow.info()
    return history_is_long(info.get_current_history_length(), info.is_continue_as_new_suggested(), limit)
