"""Sprint configuration: every knob of the BSO module's config.yaml, with its default.

`resolve_config(overrides)` merges a user's `config_overrides` (nested dicts, or dotted keys such as
`"token_budget.limit": 5000`) over the defaults and validates the result. Unknown knobs are an error:
a typo must not silently fall back to a default.
"""

from __future__ import annotations

import copy

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bso.states import AgentType, Strictness


# Upper bounds of the knobs the workflows turn into durations, dates or Temporal's 32-bit counts: a value past
# them (1e20 seconds) passed validation and then failed the Slave's workflow task on every retry (Python's
# timedelta and datetime overflow), leaving the sprint stuck. A year is beyond any sprint. Checked apart from the
# model (limits_error), which also decodes the config of sprints started before the bounds.
MAX_SECONDS = 366 * 24 * 3600
MAX_DAYS = 10 * 366
MAX_ATTEMPTS = 1000


class _Knobs(BaseModel):
    # strict: JSON `true` must not pass as the number 1, nor "3" as 3.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class AgentTimeouts(_Knobs):
    story_creation: int = Field(900, gt=0)
    story_review: int = Field(900, gt=0)
    dev_execution: int = Field(1800, gt=0)
    code_review: int = Field(900, gt=0)
    e2e_inspection: int = Field(900, gt=0)
    knowledge_research: int = Field(600, gt=0)

    def for_agent(self, agent_type: AgentType) -> int:
        return {
            AgentType.STORY_CREATOR: self.story_creation,
            AgentType.STORY_REVIEWER: self.story_review,
            AgentType.DEV_RUNNER: self.dev_execution,
            AgentType.REVIEW_RUNNER: self.code_review,
            AgentType.E2E_INSPECTOR: self.e2e_inspection,
        }[agent_type]


class ReviewDegradation(_Knobs):
    """P22: the longer a review-fix loop runs, the less a review may ask for."""

    enabled: bool = True
    downgrade_from_round: int = Field(3, ge=1)
    high_only_from_round: int = Field(5, ge=1)
    force_intervention_at_round: int = Field(8, ge=1)


class TokenBudget(_Knobs):
    """P26: checked after every story."""

    enabled: bool = True
    limit: int = Field(2_000_000, gt=0)
    warning_threshold: float = Field(0.7, gt=0, le=1, allow_inf_nan=False)  # NaN was "less than or equal to 1"
    action: Literal["pause_and_report", "stop"] = "pause_and_report"


class AgentRetry(_Knobs):
    """Retries of an agent activity after an infrastructure fault (lost worker, crash)."""

    maximum_attempts: int = Field(5, ge=1)
    initial_interval_seconds: float = Field(1.0, gt=0)
    heartbeat_timeout_seconds: int = Field(60, gt=0)


class ResidentSlots(_Knobs):
    scrum_master: bool = True
    knowledge_researcher: bool = True
    debugger: bool = True
    e2e_live: bool = False


class KnowledgeResearch(_Knobs):
    cache_ttl_days: int = Field(30, gt=0)
    max_calls_per_story: int = Field(3, ge=0)
    call_timeout_seconds: int = Field(600, gt=0)
    max_cache_entries: int = Field(200, gt=0)


class SprintConfig(_Knobs):
    batch_size: int = Field(3, ge=1)
    max_concurrent_slaves: int = Field(1, ge=1)
    max_review_rounds: int = Field(10, ge=0)
    max_story_review_rounds: int = Field(3, ge=1)
    story_review_fallback: Literal["ask_user", "force_pass", "skip_story"] = "ask_user"
    story_review_enabled: bool = True
    # ask_user: how long a story waits for a human decision before needs-intervention (None: for ever).
    decision_timeout_seconds: int | None = Field(None, gt=0)
    # Debug rounds (DEBUG_REQUEST to the debugger resident) per story after a dev-runner failure.
    max_debug_attempts: int = Field(1, ge=0)
    # message-schemas: the `timeout_ms` of the Master's and Slaves' queries to residents (PLAN_REQUEST to the
    # scrum-master, DEBUG_REQUEST to the debugger; the query schema's bounds 1000-30000). Past it the requester
    # records response_timeout and goes on without the answer. None: no message timeout (the requester's own
    # wait: 5 minutes for a plan, agent_timeout_seconds.dev_execution for a debug analysis).
    resident_query_timeout_ms: int | None = Field(None, ge=1000, le=30000)
    # repeated_failures course correction after this many needs-intervention stories in a row.
    consecutive_failure_threshold: int = Field(3, ge=1)
    # The app the e2e-live resident's browser works against (a relative BROWSER_REQUEST url joins it).
    e2e_live_base_url: str | None = None
    review_strictness: Literal["strict", "normal", "lenient"] = "normal"
    review_degradation: ReviewDegradation = ReviewDegradation()
    # Scored reviews (Gear 2): a review that carries a score passes only from this score up.
    approval_score: int = Field(80, ge=0, le=100)
    # Gear 2's AGENT_ERROR: an agent failure marked `recoverable: false` stops the sprint when set
    # (no further story, no further batch); otherwise it only marks its story needs-intervention.
    fail_fast: bool = False
    # Gear 2's improvement cycle: once every story is done, the top `max_improvements` proposals (by
    # priority_score) become stories of the sprint's last epic and run through the same pipeline.
    improvement_cycle: bool = False
    max_improvements: int = Field(1, ge=0)
    # Message priority per story (full or short key): the Temporal task priority of its agent activities.
    story_priorities: dict[str, Literal["critical", "high", "normal", "low"]] = Field(default_factory=dict)
    # Agent-PO gates on the dev-runner's work (bso/po_gates.py): a plan (GO gate) before the
    # implementation, a completion report (NEXT gate) after it. None: resolved per backend by the Slave
    # (bso.po_gates.gates_active: on for the command backend, off for simulated / external; README "PO gates").
    po_gates_enabled: bool | None = None
    po_max_revisions: int = Field(2, ge=0)  # FEEDBACK rounds on a plan before BLOCKED (alias max_revisions)
    po_max_retries: int = Field(2, ge=0)  # FIX_DIRECTIVEs on a completion report before BLOCKED (alias max_retries)
    e2e_enabled: bool = False
    e2e_trigger_tags: list[str] = Field(default_factory=lambda: ["frontend", "ui", "web", "page"])
    agent_timeout_seconds: AgentTimeouts = AgentTimeouts()
    agent_timeout_action: Literal["mark_needs_intervention"] = "mark_needs_intervention"
    agent_retry: AgentRetry = AgentRetry()
    token_budget: TokenBudget = TokenBudget()
    first_story_checkpoint: Literal["pause", "report", "skip"] = "report"
    git_squash_strategy: Literal["per_story", "per_phase", "none"] = "per_story"
    auto_clear_git_track: bool = True
    slave_timeout_seconds: int = Field(5400, gt=0)
    # A deadline (an agent's, a batch's working time) whose timer fires this long past its moment was slept
    # through: the machine or the Temporal server was not running then (a closed laptop, a server down), and the
    # time was not the agent's. The agent starts again with its whole time; that working stretch does not count.
    asleep_after_seconds: int = Field(30, gt=0)
    # The Master continues as new between batches when Temporal suggests it, or after this many
    # history events (a lower bound for tests and very long sprints; None: only when suggested).
    continue_as_new_after_events: int | None = Field(None, ge=100)
    # The same for each resident (bso/resident_state.py); None: continue_as_new_after_events, else
    # only when Temporal suggests it. Low values (tests) force hand-overs mid-sprint.
    resident_continue_as_new_after_events: int | None = Field(None, ge=20)
    # A batch whose history grows long (Temporal suggests continuing as new, or this many events) ends after the
    # story in hand, and the Master gives its stories not started to a new batch: a batch_size of hundreds of
    # stories never takes one workflow's history to Temporal's limit. None: only when Temporal suggests it.
    batch_hand_over_after_events: int | None = Field(None, ge=50)
    resident_slots: ResidentSlots = ResidentSlots()
    # Agents made by AGENT_CREATE_REQUEST and not destroyed yet: each is on the roster every broadcast carries, and a
    # client that never destroys its agents would grow it (and the Master's carried state) without end.
    max_external_agents: int = Field(100, ge=1)
    knowledge_research: KnowledgeResearch = KnowledgeResearch()

    @field_validator("git_squash_strategy")
    @classmethod
    def _squash_supported(cls, value: str) -> str:
        if value == "per_phase":
            raise ValueError("per_phase squashing is not implemented yet; use per_story or none")
        return value

    @property
    def strictness(self) -> Strictness:
        return Strictness(self.review_strictness)

    def research_limits(self) -> KnowledgeResearch:
        """The researcher's limits: a call is held to the lower of `knowledge_research.call_timeout_seconds` and
        the module's `agent_timeout_seconds.knowledge_research` (set either, the call keeps to it)."""
        timeout = min(self.knowledge_research.call_timeout_seconds, self.agent_timeout_seconds.knowledge_research)
        return self.knowledge_research.model_copy(update={"call_timeout_seconds": timeout})


def limits_error(config: SprintConfig) -> str | None:
    """The knobs past what a workflow can hold (MAX_SECONDS, MAX_DAYS, MAX_ATTEMPTS), named, or None: refused at
    a sprint's start by `bso sprint start` and by the Master."""
    timeouts = config.agent_timeout_seconds
    seconds = {
        "slave_timeout_seconds": config.slave_timeout_seconds,
        "asleep_after_seconds": config.asleep_after_seconds,
        "decision_timeout_seconds": config.decision_timeout_seconds,
        "agent_retry.heartbeat_timeout_seconds": config.agent_retry.heartbeat_timeout_seconds,
        "agent_retry.initial_interval_seconds": config.agent_retry.initial_interval_seconds,
        "knowledge_research.call_timeout_seconds": config.knowledge_research.call_timeout_seconds,
        **{f"agent_timeout_seconds.{name}": value for name, value in timeouts.model_dump().items()},
    }
    problems = [
        f"{knob}: at most {MAX_SECONDS} seconds (a year), got {value}"
        for knob, value in seconds.items()
        if value is not None and not value <= MAX_SECONDS  # (NaN is not either)
    ]
    if config.knowledge_research.cache_ttl_days > MAX_DAYS:
        problems.append(f"knowledge_research.cache_ttl_days: at most {MAX_DAYS}, got {config.knowledge_research.cache_ttl_days}")
    if config.agent_retry.maximum_attempts > MAX_ATTEMPTS:
        problems.append(f"agent_retry.maximum_attempts: at most {MAX_ATTEMPTS}, got {config.agent_retry.maximum_attempts}")
    return f"invalid config_overrides: {'; '.join(problems)}" if problems else None


class ConfigError(ValueError):
    """A config override that cannot be honoured; the message names every bad knob."""


def _expand_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    expanded: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ConfigError(f"config_overrides: key {key!r} is not a string")
        target = expanded
        parts = key.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"config_overrides: {key!r} conflicts with another override")
        leaf = parts[-1]
        # Only the top level's keys are dotted paths: inside a value, a key is the knob's own (a story key of
        # story_priorities, split at its dots, was refused as `story_priorities.: ...`).
        if isinstance(value, dict) and isinstance(target.get(leaf), dict):
            target[leaf] = _deep_merge(target[leaf], value)
        else:
            target[leaf] = copy.deepcopy(value)  # a later dotted key may write into it: never the caller's
    return expanded


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Other names a knob is known by (Agent-PO's own names for the PO gate limits).
KNOB_ALIASES = {"max_revisions": "po_max_revisions", "max_retries": "po_max_retries"}


def _with_knob_names(overrides: dict[str, Any]) -> dict[str, Any]:
    both = [alias for alias, name in KNOB_ALIASES.items() if alias in overrides and name in overrides]
    if both:
        raise ConfigError(f"invalid config_overrides: {both[0]} and {KNOB_ALIASES[both[0]]} name the same knob")
    return {KNOB_ALIASES.get(k, k): v for k, v in overrides.items()}


def resolve_config(overrides: dict[str, Any] | None = None) -> SprintConfig:
    """Defaults with `overrides` applied; raises ConfigError naming each invalid knob."""
    if overrides is None:
        return SprintConfig()
    if not isinstance(overrides, dict):
        raise ConfigError("config_overrides must be an object of knob: value")
    merged = _deep_merge(SprintConfig().model_dump(), _with_knob_names(_expand_dotted(overrides)))
    try:
        return SprintConfig.model_validate(merged)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"invalid config_overrides: {problems}") from None
