"""The vocabulary of a sprint: story states, agent types, modes, severities.

Pure and import-safe: workflows, activities and the CLI all share these enums.
"""

from __future__ import annotations

from enum import StrEnum


class StoryState(StrEnum):
    BACKLOG = "backlog"
    STORY_DOC_REVIEW = "story-doc-review"
    STORY_DOC_IMPROVED = "story-doc-improved"
    READY_FOR_DEV = "ready-for-dev"
    REVIEW = "review"
    E2E_VERIFY = "e2e-verify"
    DONE = "done"
    NEEDS_FIX = "needs-fix"
    NEEDS_INTERVENTION = "needs-intervention"
    SKIPPED = "skipped"


# BMAD's own story values, which a user's file may carry. Read, never written.
LEGACY_STORY_VALUES: dict[str, StoryState] = {
    "drafted": StoryState.READY_FOR_DEV,
    "contexted": StoryState.READY_FOR_DEV,
    "in-progress": StoryState.READY_FOR_DEV,
}

# The values BMAD's own agent workflows give their story in sprint-status.yaml (create-story: ready-for-dev;
# dev-story: in-progress, review). An agent that does so under BSO, which alone writes the file, has its story's
# value set back. Any other change is a person's: `done` or `skipped` settles the story by hand (its agent's
# answer is set aside), `backlog` or `blocked` stops it.
BMAD_AGENT_STORY_VALUES: frozenset[str] = frozenset({StoryState.READY_FOR_DEV, StoryState.REVIEW, *LEGACY_STORY_VALUES})

# States a Slave never dispatches from: the story's journey is over for this sprint.
TERMINAL_STATES: frozenset[StoryState] = frozenset(
    {StoryState.DONE, StoryState.NEEDS_INTERVENTION, StoryState.SKIPPED}
)


class EpicState(StrEnum):
    BACKLOG = "backlog"
    IN_PROGRESS = "in-progress"
    DONE = "done"


class AgentType(StrEnum):
    STORY_CREATOR = "story-creator"
    STORY_REVIEWER = "story-reviewer"
    DEV_RUNNER = "dev-runner"
    REVIEW_RUNNER = "review-runner"
    E2E_INSPECTOR = "e2e-inspector"


class AgentMode(StrEnum):
    CREATE = "create"
    REVISE = "revise"
    REVIEW = "review"
    DEV = "dev"
    FIX = "fix"
    E2E = "e2e"


class Severity(StrEnum):
    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"
    CRITICAL = "CRITICAL"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.LOW: 1, Severity.MEDIUM: 2, Severity.HIGH: 3, Severity.CRITICAL: 4}


class Strictness(StrEnum):
    """How severe a code-review finding must be to need a fix."""

    STRICT = "strict"  # >= LOW
    NORMAL = "normal"  # >= MEDIUM
    LENIENT = "lenient"  # >= HIGH
    HIGH_ONLY = "high-only"  # >= HIGH, reached only through degradation (P22)

    @property
    def threshold(self) -> Severity:
        return _STRICTNESS_THRESHOLD[self]

    def one_level_lower(self) -> Strictness:
        order = [Strictness.STRICT, Strictness.NORMAL, Strictness.LENIENT, Strictness.HIGH_ONLY]
        return order[min(order.index(self) + 1, len(order) - 1)]


_STRICTNESS_THRESHOLD = {
    Strictness.STRICT: Severity.LOW,
    Strictness.NORMAL: Severity.MEDIUM,
    Strictness.LENIENT: Severity.HIGH,
    Strictness.HIGH_ONLY: Severity.HIGH,
}


class AgentStatus(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"


class Verdict(StrEnum):
    PASSED = "passed"
    NEEDS_IMPROVE = "needs-improve"
    SUCCESS = "success"
    FAILURE = "failure"


class BatchStatus(StrEnum):
    COMPLETE = "batch-complete"
    PARTIAL = "batch-partial"
    FAILED = "batch-failed"


class SprintStatus(StrEnum):
    COMPLETE = "sprint-complete"
    PARTIAL = "sprint-partial"
    FAILED = "sprint-failed"
    CANCELLED = "sprint-cancelled"  # the report of a cancelled sprint (its summary; it has no result)


class SprintPhase(StrEnum):
    STARTING = "starting"
    PLANNING = "planning"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"  # cancelled by the operator: its batches cancelled, its residents stopped


ENDED_PHASES = frozenset({SprintPhase.COMPLETED, SprintPhase.FAILED, SprintPhase.CANCELED})

class AgentBackend(StrEnum):
    SIMULATED = "simulated"
    EXTERNAL = "external"
    COMMAND = "command"
