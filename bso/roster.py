"""The sprint's roster (residents, Slaves, temps) and the messages about it, as pure models and rules.

The Master keeps the roster; every change (a resident up or down, a Slave started or finished, an agent
dispatched or finished) is sent as AGENT_ROSTER_BROADCAST, with the full roster, to each resident and only
to residents (P54). The two-phase AGENT_CREATE_REQUEST / AGENT_CREATED / AGENT_DESTROY_REQUEST /
AGENT_DESTROYED sequence of the protocol document is served by the Master too, for agents that speak it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.config import KnowledgeResearch, ResidentSlots
from bso.messages import RejectedMessage
from bso.states import AgentType

# Slot order = start order; residents stop in the reverse order.
RESIDENT_ROLES = ("scrum-master", "knowledge-researcher", "debugger", "e2e-live")
ESSENTIAL_RESIDENT = "scrum-master"  # a sprint cannot run without it
MAX_BROADCASTS_KEPT = 100


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Roster(_Model):
    residents: list[str] = Field(default_factory=list)
    slaves: list[str] = Field(default_factory=list)
    temps: list[str] = Field(default_factory=list)


class RosterBroadcast(_Model):
    msg_type: Literal["AGENT_ROSTER_BROADCAST"] = "AGENT_ROSTER_BROADCAST"
    session_id: str
    seq: int  # 1, 2, ... : a resident can tell a missed broadcast (the next one is complete anyway)
    change: str  # what changed, e.g. "slave-batch-1 started"
    roster: Roster


class AgentCreateRequest(_Model):
    msg_type: Literal["AGENT_CREATE_REQUEST"] = "AGENT_CREATE_REQUEST"
    agent_type: AgentType
    role_hint: str = ""
    requested_by: str = Field(min_length=1)


class AgentCreated(_Model):
    msg_type: Literal["AGENT_CREATED"] = "AGENT_CREATED"
    agent_name: str
    agent_type: AgentType


class AgentDestroyRequest(_Model):
    msg_type: Literal["AGENT_DESTROY_REQUEST"] = "AGENT_DESTROY_REQUEST"
    agent_name: str = Field(min_length=1)
    requested_by: str = ""


class AgentDestroyed(_Model):
    msg_type: Literal["AGENT_DESTROYED"] = "AGENT_DESTROYED"
    agent_name: str


class ResidentInput(_Model):
    role: str
    session_id: str
    master_id: str
    project_root: str
    simulation: dict[str, Any] = Field(default_factory=dict)  # the sprint's simulation script (debugger)
    agent_backend: str = "simulated"
    fail_start: bool = False  # simulation: the resident fails while starting
    knowledge_research: KnowledgeResearch = KnowledgeResearch()
    e2e_live_base_url: str | None = None


class ResidentStatus(_Model):
    role: str
    roster: Roster | None = None
    broadcasts: list[RosterBroadcast] = Field(default_factory=list)  # the last MAX_BROADCASTS_KEPT
    broadcasts_received: int = 0
    requests_served: int = 0
    stopping: bool = False
    run: int = 1  # which run of this resident answers (it continues as new when its history is long)
    rejected_messages: list[RejectedMessage] = Field(default_factory=list)  # signals it could not act on
    rejected_total: int = 0


class ResidentSummary(_Model):
    role: str
    broadcasts_received: int
    requests_served: int


def enabled_roles(slots: ResidentSlots) -> list[str]:
    """The resident roles the config asks for, in start order."""
    flags = {
        "scrum-master": slots.scrum_master,
        "knowledge-researcher": slots.knowledge_researcher,
        "debugger": slots.debugger,
        "e2e-live": slots.e2e_live,
    }
    return [role for role in RESIDENT_ROLES if flags[role]]


def resident_workflow_id(session_id: str, role: str) -> str:
    return f"{session_id}/resident-{role}"


def slave_name(batch_id: int) -> str:
    return f"slave-batch-{batch_id}"


def temp_name(agent_type: str, story_key: str, number: int) -> str:
    """A temp agent's roster name, like the protocol's `story-creator-3-1` (+ the story's dispatch count)."""
    return f"{agent_type}-{story_key}-{number}"


def with_member(roster: Roster, kind: Literal["residents", "slaves", "temps"], name: str) -> Roster:
    members = getattr(roster, kind)
    return roster if name in members else roster.model_copy(update={kind: [*members, name]})


def without_member(roster: Roster, kind: Literal["residents", "slaves", "temps"], name: str) -> Roster:
    return roster.model_copy(update={kind: [m for m in getattr(roster, kind) if m != name]})
