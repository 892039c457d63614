"""A resident's state, carried whole from one run to the next when it continues as new.

A resident (workflows/residents.py) lives as long as the sprint's Master run, and every roster change,
request and answer adds to its history. Like the Master (MasterState), it hands over to a new run of
itself before its history grows large: when Temporal suggests it, or at an event count the sprint's
config sets (`resident_continue_as_new_after_events`, else `continue_as_new_after_events`). Everything
it knows travels in one typed model, `ResidentState`: the broadcasts it keeps, its counters and the
requests it has received but not answered yet. Its files (debug journal, knowledge cache and budget)
are on disk and need no carrying.

Pure models and rules, importable inside workflows.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bso.browser import BrowserRequest
from bso.config import MAX_SECONDS, SprintConfig
from bso.debugging import DebugRequest
from bso.messages import RejectedMessage
from bso.research import ResearchRequest
from bso.roster import ResidentInput, RosterBroadcast
from bso.scrum_master import PlanRequest


class ResidentState(BaseModel):
    """What a resident knows, handed from one run to the next."""

    model_config = ConfigDict(extra="forbid")

    run: int = Field(1, ge=1)  # 1 for the run the Master started, +1 per hand-over
    broadcasts: list[RosterBroadcast] = Field(default_factory=list)  # the last MAX_BROADCASTS_KEPT
    broadcasts_received: int = Field(0, ge=0)
    requests_served: int = Field(0, ge=0)
    stopping: bool = False
    # Received, not answered yet: served first, in arrival order, by the next run.
    plan_requests: list[PlanRequest] = Field(default_factory=list)
    browser_requests: list[BrowserRequest] = Field(default_factory=list)
    research_requests: list[ResearchRequest] = Field(default_factory=list)
    debug_requests: list[DebugRequest] = Field(default_factory=list)
    # Messages it could not act on (the last MAX_REJECTED_KEPT) and how many in all.
    rejected_messages: list[RejectedMessage] = Field(default_factory=list)
    rejected_total: int = Field(0, ge=0)

    @property
    def pending(self) -> int:
        return (
            len(self.plan_requests) + len(self.browser_requests) + len(self.research_requests) + len(self.debug_requests)
        )


class ResidentRunInput(ResidentInput):
    """ResidentInput plus what a run needs to hand over: the threshold, and the state a previous run carried."""

    continue_as_new_after_events: int | None = Field(None, ge=1)
    carried_state: ResidentState | None = None
    start_delay_seconds: int = Field(0, ge=0, le=MAX_SECONDS)  # simulation: the resident is this slow to report ready


def resident_handover_limit(config: SprintConfig) -> int | None:
    """The history length at which a resident continues as new (None: only when Temporal suggests it)."""
    if config.resident_continue_as_new_after_events is not None:
        return config.resident_continue_as_new_after_events
    return config.continue_as_new_after_events


def history_is_long(length: int, suggested: bool, limit: int | None) -> bool:
    """Time to continue as new: Temporal suggests it, or the history reached the configured length."""
    return suggested or (limit is not None and length >= limit)


def handover_due(length: int, suggested: bool, limit: int | None, stopping: bool) -> bool:
    """A resident hands over when its history is long, unless it is stopping (it ends soon anyway)."""
    return not stopping and history_is_long(length, suggested, limit)
