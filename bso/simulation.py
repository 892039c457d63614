"""The simulation script: what the simulated agents answer, story by story, call by call.

Pure: the simulated backend asks `scripted_answer` for the answer to one dispatch; the answer depends
only on the script and on which call of that step this is (`mode_round`), so a retried activity or a
replayed workflow always gets the same answer.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bso.messages import (
    MAX_SUMMARY_CHARS,
    MAX_TOKENS_PER_ANSWER,
    FeedbackItem,
    Finding,
    ImprovementRequestedPayload,
    describe_validation_error,
)
from bso.models import short_key
from bso.states import AgentStatus, Severity, Verdict

ScriptKey = Literal["create", "revise", "story_review", "dev", "fix", "review", "e2e"]


class _Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoScript(_Script):
    """The simulated dev-runner's PLAN_SUBMISSIONs and COMPLETION_REPORTs, one per attempt (then: good)."""

    plan: list[Literal["good", "missing_ac", "out_of_scope", "no_tests"]] = Field(default_factory=list)
    report: list[Literal["good", "missing_ac", "out_of_scope", "failing_tests"]] = Field(default_factory=list)


class StoryScript(_Script):
    story_review: list[Literal["passed", "needs-improve"]] = Field(default_factory=list)
    review: list[Literal["LOW", "MEDIUM", "HIGH", "CRITICAL", "none"]] = Field(default_factory=list)
    e2e: list[Literal["success", "failure"]] = Field(default_factory=list)
    # Scored reviews (Gear 2): the review-runner's score per review round (e.g. [72, 88]), and a
    # blocking issue per round ("" or null: none). Rounds past the end: no score, no blocking issue.
    review_scores: list[Annotated[int, Field(ge=0, le=100)]] = Field(default_factory=list)
    blocking: list[str | None] = Field(default_factory=list)
    # Message priority of this story's agent activities (see PRIORITY_KEYS in bso.dispatch).
    priority: Literal["critical", "high", "normal", "low"] | None = None
    fail: dict[ScriptKey, Literal["error", "timeout", "fatal"]] = Field(default_factory=dict)
    flaky: dict[ScriptKey, int] = Field(default_factory=dict)
    tokens: int | None = Field(default=None, ge=0)
    duration_ms: int | None = Field(default=None, ge=0)
    # The text of this story's scripted failures (default: "simulated <mode> agent error in <story key>").
    # Stories given the same text fail the same way, as the debugger's journal sees it (a known pattern).
    error: str | None = Field(default=None, min_length=1, max_length=2000)
    # The simulated debugger's successive analyses of this story's failures; after the list: unfixable.
    debug: list[Literal["fixable", "unfixable"]] = Field(default_factory=list)
    # Agent-PO gates (when on): what the dev-runner submits per plan revision / per implementation attempt.
    po: PoScript = PoScript()


MAX_SIMULATION_BYTES = 256_000


class ScriptDefaults(_Script):
    tokens: int = Field(1000, ge=0)
    duration_ms: int = Field(0, ge=0)


class SimulationScript(_Script):
    default: ScriptDefaults = ScriptDefaults()
    stories: dict[str, StoryScript] = Field(default_factory=dict)
    # What the simulated scrum-master proposes in the improvement cycle (IMPROVEMENT_REQUESTED payloads).
    improvements: list[ImprovementRequestedPayload] = Field(default_factory=list)

    # Residents that fail while starting (the sprint degrades; the scrum-master's failure fails it).
    residents_fail_start: list[Literal["scrum-master", "knowledge-researcher", "debugger", "e2e-live"]] = Field(
        default_factory=list
    )
    # Residents that take longer than the Master's readiness window to report ready (they are cancelled).
    residents_slow_start: list[Literal["scrum-master", "knowledge-researcher", "debugger", "e2e-live"]] = Field(
        default_factory=list
    )

    def tokens_error(self) -> str | None:
        """Token counts the Slave would refuse (bso.dispatch.implausible_tokens): each such story waited out its
        agent's time instead. Checked at the start (not in the model, which every workflow of a running sprint
        validates again)."""
        over = [("default", self.default.tokens), *((key, s.tokens) for key, s in self.stories.items())]
        named = [key for key, tokens in over if tokens is not None and tokens > MAX_TOKENS_PER_ANSWER]
        if not named:
            return None
        return f"tokens of {', '.join(named)}: at most {MAX_TOKENS_PER_ANSWER:,} (no agent run uses more)"

    def size_error(self) -> str | None:
        """A script too large to copy: the sprint's input carries it, and so does the start of each resident and
        batch. At ~1.4 MB those copies alone made the Master's history long before its first batch: it continued
        as new, started its residents again, and so on for ever. Checked at the start, as tokens_error."""
        size = len(self.model_dump_json().encode())  # as copied: with its defaults filled in
        if size <= MAX_SIMULATION_BYTES:
            return None
        return (f"{size:,} bytes, over the {MAX_SIMULATION_BYTES:,} a script may take (each of the sprint's "
                "residents and batches gets a copy in its history): script fewer stories, or shorter texts")

    @classmethod
    def converted_values_error(cls, raw: object) -> str | None:
        """Values the script takes only converted: `"tokens": true` read as 1 token, `"2"` as 2, `1.5` refused but
        `1.0` read as 1; a mistake of the script's writer more often than not. Checked at the start, as
        tokens_error (not in the model: every workflow of a running sprint validates it again)."""
        try:
            cls.model_validate_json(json.dumps(raw), strict=True)
        except ValidationError as err:
            return describe_validation_error(err)
        return None

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
    score: int | None = None
    blocking_issues: list[str] = Field(default_factory=list)
    feedback: list[FeedbackItem] = Field(default_factory=list)
    recoverable: bool = True
    error_type: str | None = None


def _nth(values: list[str], round_: int, after: str) -> str:
    return values[round_ - 1] if 0 < round_ <= len(values) else after


def scripted_answer(script: StoryScript, key: ScriptKey, mode_round: int, story_key: str = "") -> ScriptedAnswer:
    """The scripted answer of one dispatch. A failure's text names the story: the debugger's journal matches
    errors by their text (digits aside), and one story's scripted analysis must not answer another's."""
    where = f" in {story_key}" if story_key else ""
    if script.error is not None:
        where = f": {script.error}"
    tokens = script.tokens or 0
    duration = script.duration_ms or 0
    common = {"tokens": tokens, "duration_ms": duration, "flaky_attempts": script.flaky.get(key, 0)}
    failure = script.fail.get(key)
    if failure == "timeout":
        return ScriptedAnswer(never_answers=True, **common)
    if failure == "error":
        return ScriptedAnswer(
            status=AgentStatus.FAILURE, error=f"simulated {key} agent error{where}", **common
        )
    if failure == "fatal":  # Gear 2's AGENT_ERROR with recoverable: false
        return ScriptedAnswer(
            status=AgentStatus.FAILURE,
            error=f"simulated {key} backend failure{where}",
            error_type="backend_failure",
            recoverable=False,
            **common,
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
        score = script.review_scores[mode_round - 1] if 0 < mode_round <= len(script.review_scores) else None
        issue = script.blocking[mode_round - 1] if 0 < mode_round <= len(script.blocking) else None
        blocking = [issue] if issue else []
        feedback = [
            FeedbackItem(  # cut as bso.answer_size cuts a blocking issue: the fix's feedback tells them apart
                severity="blocking",
                category="review",
                issue=issue[:MAX_SUMMARY_CHARS],
                suggestion=f"address: {issue}"[:MAX_SUMMARY_CHARS],
            )
            for issue in blocking
        ]
        if score is not None and score < 100:
            feedback.append(
                FeedbackItem(severity="suggestion", category="code_quality", issue=f"simulated score {score}/100")
            )
        return ScriptedAnswer(
            findings=findings, score=score, blocking_issues=blocking, feedback=feedback, **common
        )
    return ScriptedAnswer(**common)


def po_kind(kinds: list[str], attempt: int) -> str:
    """The scripted plan/report kind of this attempt (1-based); past the end of the list: good."""
    return _nth(list(kinds), attempt, "good")
