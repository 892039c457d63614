"""The simulation script: what the simulated agents answer, story by story, call by call.

Pure: the simulated backend asks `scripted_answer` for the answer to one dispatch; the answer depends
only on the script and on which call of that step this is (`mode_round`), so a retried activity or a
replayed workflow always gets the same answer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.messages import Finding
from bso.models import short_key
from bso.states import AgentStatus, Severity, Verdict

ScriptKey = Literal["create", "revise", "story_review", "dev", "fix", "review", "e2e"]


class _Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoryScript(_Script):
    story_review: list[Literal["passed", "needs-improve"]] = Field(default_factory=list)
    review: list[Literal["LOW", "MEDIUM", "HIGH", "CRITICAL", "none"]] = Field(default_factory=list)
    e2e: list[Literal["success", "failure"]] = Field(default_factory=list)
    fail: dict[ScriptKey, Literal["error", "timeout"]] = Field(default_factory=dict)
    flaky: dict[ScriptKey, int] = Field(default_factory=dict)
    tokens: int | None = Field(default=None, ge=0)
    duration_ms: int | None = Field(default=None, ge=0)
    # The simulated debugger's successive analyses of this story's failures; after the list: unfixable.
    debug: list[Literal["fixable", "unfixable"]] = Field(default_factory=list)


class ScriptDefaults(_Script):
    tokens: int = Field(1000, ge=0)
    duration_ms: int = Field(0, ge=0)


class SimulationScript(_Script):
    default: ScriptDefaults = ScriptDefaults()
    stories: dict[str, StoryScript] = Field(default_factory=dict)
    # Residents that fail while starting (the sprint degrades; the scrum-master's failure fails it).
    residents_fail_start: list[Literal["scrum-master", "knowledge-researcher", "debugger", "e2e-live"]] = Field(
        default_factory=list
    )

    def for_story(self, full_key: str) -> StoryScript:
        """The story's script (by full or short key) with the defaults filled in."""
        script = self.stories.get(full_key) or self.stories.get(short_key(full_key)) or StoryScript()
        return script.model_copy(
            update={
                "tokens": self.default.tokens if script.tokens is None else script.tokens,
                "duration_ms": self.default.duration_ms if script.duration_ms is None else script.duration_ms,
            }
        )


class ScriptedAnswer(_Script):
    """One simulated agent's behaviour for one dispatch."""

    never_answers: bool = False  # scripted "timeout": the agent never sends AGENT_COMPLETE
    status: AgentStatus = AgentStatus.SUCCESS
    verdict: Verdict | None = None
    findings: list[Finding] = Field(default_factory=list)
    tokens: int = 0
    duration_ms: int = 0
    error: str | None = None
    flaky_attempts: int = 0  # the activity raises a retryable fault on attempts 1..N


def _nth(values: list[str], round_: int, after: str) -> str:
    return values[round_ - 1] if 0 < round_ <= len(values) else after


def scripted_answer(script: StoryScript, key: ScriptKey, mode_round: int) -> ScriptedAnswer:
    tokens = script.tokens or 0
    duration = script.duration_ms or 0
    common = {"tokens": tokens, "duration_ms": duration, "flaky_attempts": script.flaky.get(key, 0)}
    failure = script.fail.get(key)
    if failure == "timeout":
        return ScriptedAnswer(never_answers=True, **common)
    if failure == "error":
        return ScriptedAnswer(
            status=AgentStatus.FAILURE, error=f"simulated {key} agent error", **common
        )
    if key == "story_review":
        return ScriptedAnswer(verdict=Verdict(_nth(list(script.story_review), mode_round, "passed")), **common)
    if key == "e2e":
        return ScriptedAnswer(verdict=Verdict(_nth(list(script.e2e), mode_round, "success")), **common)
    if key == "review":
        worst = _nth(list(script.review), mode_round, "none")
        findings = (
            []
            if worst == "none"
            else [Finding(severity=Severity(worst), summary=f"simulated {worst} finding (review round {mode_round})")]
        )
        return ScriptedAnswer(findings=findings, **common)
    return ScriptedAnswer(**common)
