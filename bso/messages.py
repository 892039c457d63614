"""The BSO messages that cross a Temporal boundary, as pydantic models.

Each model is a seed message (bso-message-protocol-v2.md, bso-sprint-slave-spec.md): the dispatch
assignment an agent activity receives, the AGENT_COMPLETE an agent answers with (a signal on the Slave),
the Scrum Master's BATCH_PLAN_READY and the Slave's SLAVE_BATCH_COMPLETE.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bso.states import AgentMode, AgentStatus, AgentType, Severity, Verdict

MAX_SUMMARY_CHARS = 2_000
MAX_FINDINGS = 200


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Finding(_Message):
    severity: Severity
    summary: str = Field(max_length=MAX_SUMMARY_CHARS)
    file: str | None = None
    line: int | None = Field(default=None, ge=0)

    @field_validator("severity", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class AgentComplete(_Message):
    """AGENT_COMPLETE: an agent's answer to one dispatch, sent to the Slave as the `agent_complete` signal."""

    msg_type: Literal["AGENT_COMPLETE"] = "AGENT_COMPLETE"
    dispatch_id: str = Field(min_length=1, max_length=200)
    story_key: str = Field(min_length=1, max_length=200)
    agent_type: AgentType
    mode: AgentMode
    status: AgentStatus
    verdict: Verdict | None = None
    findings: list[Finding] = Field(default_factory=list, max_length=MAX_FINDINGS)
    tokens_used: int = Field(0, ge=0)
    summary: str = Field("", max_length=MAX_SUMMARY_CHARS)
    error: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)


class RejectedMessage(_Message):
    """A message that failed validation or did not match anything pending: recorded, never acted on."""

    msg_type: str
    reason: str
    dispatch_id: str | None = None


def describe_validation_error(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()
    )


class TaskAssignment(_Message):
    """AGENT_DISPATCH_REQUEST + TASK_ASSIGNMENT (P51 unified dispatch): all an agent needs to start."""

    msg_type: Literal["TASK_ASSIGNMENT"] = "TASK_ASSIGNMENT"
    dispatch_id: str
    agent_type: AgentType
    mode: AgentMode
    story_key: str
    story_path: str  # relative to project_root
    session_id: str
    batch_id: int
    report_to: str  # workflow id of the Slave that waits for AGENT_COMPLETE
    project_root: str
    resident_contacts: dict[str, str] = Field(default_factory=dict)
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    # Which call of this mode this is for the story (1-based): the simulated agents' script index.
    mode_round: int = 1
    fix_findings: list[Finding] = Field(default_factory=list)
    story_title: str = ""
    backend: str = "simulated"
    # The part of the simulation script that concerns this story (small by construction).
    simulation: dict[str, Any] = Field(default_factory=dict)


class DispatchReceipt(_Message):
    """What the agent activity returns: whether it delivered AGENT_COMPLETE itself."""

    dispatch_id: str
    delivered: bool
    replayed_from_ledger: bool = False


class BatchSpec(_Message):
    batch_id: int
    stories: list[str]


class BatchPlanReady(_Message):
    msg_type: Literal["BATCH_PLAN_READY"] = "BATCH_PLAN_READY"
    session_id: str
    total_stories: int
    batches: list[BatchSpec]
    dependency_graph: dict[str, dict[str, list[str]]] = Field(default_factory=dict)


class SlaveBatchComplete(_Message):
    msg_type: Literal["SLAVE_BATCH_COMPLETE"] = "SLAVE_BATCH_COMPLETE"
    batch_id: int
    session_id: str
    stories_completed: list[str]
    stories_failed: list[str]
    batch_report: str
