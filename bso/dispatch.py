"""The State-to-Agent Dispatch Table and the review-fix rules, as data and pure functions.

The Slave workflow only sequences these: it asks `next_dispatch` what to run, runs it, and hands the
AGENT_COMPLETE to `apply_agent_result`, which returns the story's next durable progress. Every rule of
bso-sprint-slave-spec.md and BSO-REFERENCE.md (review strictness, P22 degradation, the
max_review_rounds cap, story-review fallbacks, E2E triggers) lives here, in one function each.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bso.config import ReviewDegradation, SprintConfig
from bso.messages import (
    CRITERIA_MAX,
    MAX_SUMMARY_CHARS,
    MAX_TOKENS_PER_ANSWER,
    AgentComplete,
    AgentErrorPayload,
    FeedbackItem,
    Finding,
    MessagePriority,
    RejectedMessage,
    parse_message,
    rejected_invalid,
)
from bso.models import StoryProgress, short_key
from bso.states import (
    LEGACY_STORY_VALUES,
    AgentMode,
    AgentStatus,
    AgentType,
    Severity,
    StoryState,
    Strictness,
    Verdict,
)


@dataclass(frozen=True)
class DispatchStep:
    agent_type: AgentType
    mode: AgentMode

    @property
    def script_key(self) -> str:
        """The name of this step in the simulation script and in per-mode counters."""
        return SCRIPT_KEYS[(self.agent_type, self.mode)]


CREATE = DispatchStep(AgentType.STORY_CREATOR, AgentMode.CREATE)
REVISE = DispatchStep(AgentType.STORY_CREATOR, AgentMode.REVISE)
STORY_REVIEW = DispatchStep(AgentType.STORY_REVIEWER, AgentMode.REVIEW)
DEV = DispatchStep(AgentType.DEV_RUNNER, AgentMode.DEV)
FIX = DispatchStep(AgentType.DEV_RUNNER, AgentMode.FIX)
CODE_REVIEW = DispatchStep(AgentType.REVIEW_RUNNER, AgentMode.REVIEW)
E2E = DispatchStep(AgentType.E2E_INSPECTOR, AgentMode.E2E)

SCRIPT_KEYS: dict[tuple[AgentType, AgentMode], str] = {
    (AgentType.STORY_CREATOR, AgentMode.CREATE): "create",
    (AgentType.STORY_CREATOR, AgentMode.REVISE): "revise",
    (AgentType.STORY_REVIEWER, AgentMode.REVIEW): "story_review",
    (AgentType.DEV_RUNNER, AgentMode.DEV): "dev",
    (AgentType.DEV_RUNNER, AgentMode.FIX): "fix",
    (AgentType.REVIEW_RUNNER, AgentMode.REVIEW): "review",
    (AgentType.E2E_INSPECTOR, AgentMode.E2E): "e2e",
}

# The table itself. `review` dispatches FIX instead of CODE_REVIEW while a fix is pending;
# `needs-fix` (a done story reopened by a bug report) starts with a fix as well.
DISPATCH_TABLE: dict[StoryState, DispatchStep] = {
    StoryState.BACKLOG: CREATE,
    StoryState.STORY_DOC_IMPROVED: REVISE,
    StoryState.STORY_DOC_REVIEW: STORY_REVIEW,
    StoryState.READY_FOR_DEV: DEV,
    StoryState.REVIEW: CODE_REVIEW,
    StoryState.E2E_VERIFY: E2E,
    StoryState.NEEDS_FIX: FIX,
}


def normalize_state(raw: str) -> StoryState | None:
    """The dispatch state a status-file value stands for; None for a value BSO does not know."""
    if raw in LEGACY_STORY_VALUES:
        return LEGACY_STORY_VALUES[raw]
    try:
        return StoryState(raw)
    except ValueError:
        return None


def startable_values() -> list[str]:
    """The status-file values a story can start a sprint from: the dispatch table's states and BMAD's legacy
    names for them. Any other value (a typo, `wip`) has no row: the Slave would give the story up."""
    return [state.value for state in DISPATCH_TABLE] + [raw for raw, state in LEGACY_STORY_VALUES.items() if state in DISPATCH_TABLE]


def unknown_values(values: Mapping[str, str], keys: list[str]) -> list[str]:
    """`key: 'value'` for each of `keys` whose status-file value is no state BSO knows (a typo such as `wip`):
    no agent starts from it, and writing a state over it would lose what the user meant."""
    return [f"{key}: {values[key]!r}" for key in keys if key in values and normalize_state(values[key]) is None]


def unknown_values_message(unknown: list[str], then: str) -> str:
    return (
        f"no agent starts from the state of {', '.join(unknown)}; a story starts from one of "
        f"{', '.join(startable_values())} ({then})"
    )


def next_dispatch(progress: StoryProgress) -> DispatchStep | None:
    """The agent to dispatch for a story now, or None when the table has no row for its state."""
    state = normalize_state(progress.state)
    if state is None:
        return None
    if state is StoryState.REVIEW and progress.fix_pending:
        return FIX
    return DISPATCH_TABLE.get(state)


def is_terminal(progress: StoryProgress) -> bool:
    return progress.state in {StoryState.DONE, StoryState.NEEDS_INTERVENTION, StoryState.SKIPPED}


# --- review strictness and degradation (P22) -----------------------------------------------------


def effective_strictness(
    base: Strictness, review_round: int, degradation: ReviewDegradation
) -> Strictness | None:
    """Strictness of code-review round `review_round` (1-based); None once the story must stop."""
    if not degradation.enabled:
        return base
    if review_round >= degradation.force_intervention_at_round:
        return None
    if review_round >= degradation.high_only_from_round:
        return Strictness.HIGH_ONLY
    if review_round >= degradation.downgrade_from_round:
        return base.one_level_lower()
    return base


def findings_needing_fix(findings: list[Finding], strictness: Strictness) -> list[Finding]:
    threshold = strictness.threshold.rank
    return [f for f in findings if f.severity.rank >= threshold]


def e2e_applies(tags: list[str], config: SprintConfig) -> bool:
    wanted = {t.lower() for t in config.e2e_trigger_tags}
    return config.e2e_enabled and any(t.lower() in wanted for t in tags)


class Outcome(StrEnum):
    ADVANCED = "advanced"
    FIX_REQUESTED = "fix-requested"
    INTERVENTION = "needs-intervention"
    SKIPPED = "skipped"
    AWAITING_DECISION = "awaiting-decision"


@dataclass(frozen=True)
class Transition:
    progress: StoryProgress
    outcome: Outcome
    note: str


class StopAgentsInput(BaseModel):
    """The sprint `session_id` was cancelled: stop the agents of its batches still running (command backend)."""

    model_config = ConfigDict(extra="forbid")
    project_root: str
    session_id: str


def written_by_this_run(recorded_run_id: str | None, run_id: str, *, written_at: datetime,
                        first_scheduled_at: datetime) -> bool:
    """Does a record a dispatch left on disk (its answer, the command backend's exit and marker files) belong to
    this workflow run? Dispatch ids repeat when a sprint is started again under its id (once the first run
    closed), so a record names the run that wrote it, and another run's record is not this dispatch's.
    A record without a run id (written by a worker before this rule) counts as this run's only when it was
    written after this activity was first scheduled: a retry after the worker was upgraded mid-run must still
    re-deliver the agent's finished work instead of running it again, and a record an earlier sprint left is
    older than this dispatch."""
    if recorded_run_id is not None:
        return recorded_run_id == run_id
    return written_at >= first_scheduled_at


def record_dispatch(progress: StoryProgress, step: DispatchStep, dispatch_id: str) -> StoryProgress:
    """The story's progress once `step` has been dispatched (one agent created)."""
    return progress.model_copy(
        update={
            "agents_dispatched": progress.agents_dispatched + 1,
            "started": True,
            "pending_dispatch_id": dispatch_id,
            "pending_agent": step.agent_type,
            "pending_mode": step.mode,
        }
    )


def mode_round(progress: StoryProgress, step: DispatchStep) -> int:
    """Which call of this step this is for the story (1-based), from the durable counters."""
    if step == STORY_REVIEW:
        return progress.story_review_rounds + 1
    if step == CODE_REVIEW:
        return progress.review_rounds + 1
    if step == E2E:
        return progress.e2e_rounds + 1
    if step == FIX:
        return max(progress.fix_rounds, 1)
    if step == REVISE:
        return max(progress.story_review_rounds, 1)
    return 1


def _settled(progress: StoryProgress, tokens: int, **update: object) -> StoryProgress:
    base = {
        "tokens_used": progress.tokens_used + tokens,
        "pending_dispatch_id": None,
        "pending_agent": None,
        "pending_mode": None,
        "pending_debug_id": None,
    }
    base.update(update)
    return progress.model_copy(update=base)


def intervention(progress: StoryProgress, reason: str, tokens: int = 0) -> Transition:
    return Transition(
        _settled(
            progress,
            tokens,
            state=StoryState.NEEDS_INTERVENTION.value,
            error=reason,
            fix_pending=False,
        ),
        Outcome.INTERVENTION,
        reason,
    )


def changed_by_hand(progress: StoryProgress, expected: str, found: str, tokens: int = 0) -> Transition:
    """U4 found the story's value changed by someone else (compare-and-swap): the Slave neither overwrites it
    nor goes on with it. Settled by hand (done, skipped), the story is taken as it is; anything else is left
    to that person (needs-intervention)."""
    if found in (StoryState.DONE.value, StoryState.SKIPPED.value):
        note = f"set to {found} in sprint-status.yaml by hand (the Slave expected {expected!r}); taken as it is"
        error = note if found == StoryState.SKIPPED.value else None
        outcome = Outcome.ADVANCED if found == StoryState.DONE.value else Outcome.SKIPPED
        return Transition(_settled(progress, tokens, state=found, error=error, fix_pending=False), outcome, note)
    return by_hand(intervention(
        progress,
        f"sprint-status.yaml changed under the Slave (expected {expected!r}, found {found!r}); nothing written",
        tokens,
    ))


def by_hand(transition: Transition) -> Transition:
    """A needs-intervention a human's edit of the status file made: no agent failed (no repeated failure)."""
    return Transition(transition.progress.model_copy(update={"set_by_hand": True}), transition.outcome, transition.note)


def taken_from_file(progress: StoryProgress, found: str | None) -> StoryProgress:
    """A story no agent has worked on yet takes the status file's value (as at its batch's start): set done or
    skipped by hand, it says so; gone from the file (None), it needs intervention."""
    if found is None:
        return intervention(progress, "story no longer in sprint-status.yaml").progress
    if found != progress.state and found in (StoryState.DONE.value, StoryState.SKIPPED.value):
        return changed_by_hand(progress, progress.state, found).progress
    if found != progress.state and found == StoryState.NEEDS_INTERVENTION.value:  # it ended with no reason said
        return by_hand(intervention(progress, "set to needs-intervention in sprint-status.yaml by hand")).progress
    return progress.model_copy(update={"state": found})


# The agent activity's non-retryable error type when the agent cannot be started at all (a missing or
# non-executable CLI, a broken profile): see activities/agent_config.py.
AGENT_CONFIG_ERROR = "AgentConfigError"
SETUP_ERROR_TYPE = "agent_config_error"  # its AGENT_COMPLETE's error_type (setup_failure)


def setup_failure(dispatch_id: str, step: DispatchStep, story_key: str, error: str) -> AgentComplete:
    """An agent that cannot be started is Gear 2's AGENT_ERROR with `recoverable: false`: no debugger round,
    and with fail_fast the sprint stops instead of failing every story the same way."""
    return AgentComplete(
        dispatch_id=dispatch_id, story_key=story_key, agent_type=step.agent_type, mode=step.mode,
        status=AgentStatus.FAILURE, error=error[:MAX_SUMMARY_CHARS], error_type=SETUP_ERROR_TYPE,
        recoverable=False,
    )


def fatal_error(result: AgentComplete, config: SprintConfig) -> str | None:
    """Why the sprint must stop (fail_fast and an unrecoverable agent error), or None."""
    if not config.fail_fast or result.status is not AgentStatus.FAILURE or result.recoverable:
        return None
    kind = result.error_type or "agent_error"
    return f"unrecoverable {kind} from {result.agent_type.value}/{result.mode.value} on {result.story_key}: " + (
        result.error or result.summary or "no detail"
    )


def is_agent_error(payload: Any) -> bool:
    """Gear 2's agent_error, sent on the agent_complete signal (its task_id is the dispatch id it ends)."""
    return isinstance(payload, dict) and "agent_error" in (payload.get("message_type"), payload.get("type"))


def check_agent_complete(
    payload: Any, open_dispatches: Mapping[str, str], answered: Container[str]
) -> AgentComplete | RejectedMessage:
    """The Slave's rule for an AGENT_COMPLETE (signalled or returned as the agent activity's result): valid,
    for a dispatch still open (dispatch id -> story key), of that dispatch's story. The answer to act on, or
    the rejection the Slave records. Pure: `bso messages` applies it again to a Slave's history."""
    dispatch_id = payload.get("dispatch_id") if isinstance(payload, dict) else None
    try:
        message = AgentComplete.model_validate(payload)
    except ValidationError as err:
        # message-schemas' validation_failed, naming each field.
        return RejectedMessage.model_validate(  # validated again: the sender's dispatch id is cut to size
            {**rejected_invalid("AGENT_COMPLETE", payload, err).model_dump(),
             "dispatch_id": dispatch_id if isinstance(dispatch_id, str) else None}
        )
    story_key = open_dispatches.get(message.dispatch_id)
    if story_key is None:
        if message.dispatch_id in answered:
            reason = "already answered"
        else:  # the answer's author needs the id it should have used
            still_open = sorted(open_dispatches)
            reason = f"unknown dispatch id {message.dispatch_id!r}" + (
                f"; open: {', '.join(still_open[:3])}{' ...' if len(still_open) > 3 else ''}" if still_open else "; none open"
            )
        return RejectedMessage(msg_type="AGENT_COMPLETE", reason=reason, dispatch_id=message.dispatch_id)
    if message.story_key not in (story_key, short_key(story_key)):
        return RejectedMessage(
            msg_type="AGENT_COMPLETE",
            reason=f"story_key {message.story_key!r} does not match dispatch ({story_key})",
            dispatch_id=message.dispatch_id,
        )
    return message


# The Slave's rollups of its patches (workflows/patches.py): a Slave whose history has one of these markers applied
# every patch named before it, the two below included. The second folds one more patch.
SLAVE_PATCH_ROLLUP = "slave-patches-of-2026-11-27"
SLAVE_PATCH_ROLLUP_2 = "slave-patches-of-2026-11-27-2"
SLAVE_PATCH_ROLLUPS = (SLAVE_PATCH_ROLLUP, SLAVE_PATCH_ROLLUP_2)


# The Slave's patch id for answer_mismatch: its histories say by this marker whether it applied the rule.
PATCH_ANSWER_MATCHES_DISPATCH = "slave-answer-matches-dispatch"


def answer_mismatch(message: AgentComplete, agent: object, mode: object) -> RejectedMessage | None:
    """An answer for an open dispatch that names another agent or mode than the dispatch's (an external agent that
    mixed up its assignments): refused, or the dev dispatch was taken as done on a reviewer's word. None when it
    matches. `agent`, `mode`: the dispatch's, as values or their enum members."""
    want = (str(getattr(agent, "value", agent)), str(getattr(mode, "value", mode)))
    got = (message.agent_type.value, message.mode.value)
    if got == want:
        return None
    return RejectedMessage(
        msg_type="AGENT_COMPLETE",
        reason=f"agent_type/mode {got[0]}/{got[1]} does not match dispatch ({want[0]}/{want[1]})",
        dispatch_id=message.dispatch_id,
    )


# The Slave's patch id for implausible_tokens (bso.message_flow reads the rule off histories with this marker).
PATCH_TOKENS_BOUNDED = "slave-answer-tokens-bounded"


def implausible_tokens(message: AgentComplete) -> RejectedMessage | None:
    """An answer claiming more tokens than any agent run uses (a forged or garbled count): refused, or it stopped
    the sprint on its token budget. The dispatch stays open for a corrected answer. None when the count is
    believable."""
    if message.tokens_used <= MAX_TOKENS_PER_ANSWER:
        return None
    return RejectedMessage(
        msg_type="AGENT_COMPLETE",
        reason=f"tokens_used {message.tokens_used} is more than any agent run uses (at most {MAX_TOKENS_PER_ANSWER:,})",
        dispatch_id=message.dispatch_id,
    )


def check_agent_error(payload: Any, open_dispatches: Mapping[str, str]) -> AgentErrorPayload | RejectedMessage:
    """The Slave's rule for an agent_error: a valid one whose task_id names a dispatch still open."""
    try:
        message = parse_message(payload)
    except ValidationError as err:
        return rejected_invalid("agent_error", payload, err)
    error = getattr(message, "payload", None)
    if not isinstance(error, AgentErrorPayload):
        return RejectedMessage(msg_type="agent_error", reason=f"not an agent_error: {message.type}")
    if not error.task_id or error.task_id not in open_dispatches:
        return RejectedMessage(msg_type="agent_error", reason="task_id names no open dispatch", dispatch_id=error.task_id)
    return error


def agent_error_to_complete(
    payload: AgentErrorPayload, dispatch_id: str, story_key: str, agent_type: AgentType, mode: AgentMode
) -> AgentComplete:
    """Gear 2's agent_error, received for an open dispatch, as the failed AGENT_COMPLETE it stands for."""
    return AgentComplete(
        dispatch_id=dispatch_id,
        story_key=story_key,
        agent_type=agent_type,
        mode=mode,
        status=AgentStatus.FAILURE,
        error=payload.error_message[:2000],
        error_type=payload.error_type[:200],
        recoverable=payload.recoverable,
    )


# --- trust-nothing verification (the command backend's own checks after a dev or fix) -------------

# AgentComplete.error_type of a dev/fix dispatch whose work failed BSO's verification commands, whatever
# the agent claimed (or whose fix lowered the passing tests, P20, and was rolled back).
VERIFICATION_FAILED = "verification_failed"


def failed_verification(step: DispatchStep, result: AgentComplete) -> bool:
    """A dev or fix dispatch that failed BSO's verification: routed to the debugger, then to a fix."""
    return (
        step in (DEV, FIX)
        and result.status is AgentStatus.FAILURE
        and result.error_type == VERIFICATION_FAILED
        and result.recoverable
    )


def verification_finding(result: AgentComplete) -> Finding:
    """The failing verification output, as a finding of the next fix assignment."""
    return Finding(
        severity=Severity.HIGH,
        summary=f"BSO's verification failed: {result.error or result.summary or 'no output'}"[:MAX_SUMMARY_CHARS],
    )


def fix_after_failed_verification(
    progress: StoryProgress,
    step: DispatchStep,
    result: AgentComplete,
    config: SprintConfig,
    findings: list[Finding] | None = None,
    note: str = "",
) -> Transition:
    """A failed verification sends the story to a fix (in `review`, fix pending) with the failing output
    (and any debugger finding) among the fix findings; needs-intervention once max_review_rounds fixes
    have been spent."""
    failure = f"{step.agent_type.value}/{step.mode.value} failed verification{note}"
    if progress.fix_rounds + 1 > config.max_review_rounds:
        return intervention(
            progress,
            f"{failure}; max_review_rounds ({config.max_review_rounds}) reached: {result.error or result.summary}",
            result.tokens_used,
        )
    return Transition(
        _settled(
            progress,
            result.tokens_used,
            state=StoryState.REVIEW.value,
            fix_pending=True,
            fix_rounds=progress.fix_rounds + 1,
            fix_findings=[*(findings or []), verification_finding(result)],
            fix_feedback=[],
        ),
        Outcome.FIX_REQUESTED,
        f"{failure} -> fix (round {progress.fix_rounds + 1})",
    )


def apply_no_answer(progress: StoryProgress, step: DispatchStep, reason: str) -> Transition:
    """No AGENT_COMPLETE (timeout) or the agent activity failed for good."""
    return intervention(progress, f"{step.agent_type.value}/{step.mode.value}: {reason}")


def apply_agent_result(
    progress: StoryProgress,
    step: DispatchStep,
    result: AgentComplete,
    config: SprintConfig,
    tags: list[str],
) -> Transition:
    """The dispatch table's success/failure columns, for one AGENT_COMPLETE."""
    tokens = result.tokens_used
    if result.status is AgentStatus.FAILURE:
        if failed_verification(step, result):
            return fix_after_failed_verification(progress, step, result, config)
        reason = result.error or result.summary or "agent reported failure"
        if not result.recoverable:
            reason = f"unrecoverable {result.error_type or 'error'}: {reason}"
        return intervention(progress, f"{step.agent_type.value}/{step.mode.value} failed: {reason}", tokens)

    if step in (CREATE, REVISE):
        nxt = StoryState.STORY_DOC_REVIEW if config.story_review_enabled else StoryState.READY_FOR_DEV
        return Transition(_settled(progress, tokens, state=nxt.value), Outcome.ADVANCED, f"story doc -> {nxt}")

    if step == STORY_REVIEW:
        return _story_review(progress, result, config, tokens)

    if step in (DEV, FIX):
        return Transition(
            _settled(
                progress, tokens, state=StoryState.REVIEW.value, fix_pending=False, fix_findings=[], fix_feedback=[]
            ),
            Outcome.ADVANCED,
            f"{step.mode.value} done -> review",
        )

    if step == CODE_REVIEW:
        return _code_review(progress, result, config, tags, tokens)

    if step == E2E:
        rounds = progress.e2e_rounds + 1
        if result.verdict is Verdict.FAILURE:
            if rounds > config.max_review_rounds:
                # e2e -> review -> e2e must not loop for ever while the code reviews stay clean.
                return intervention(
                    progress.model_copy(update={"e2e_rounds": rounds}),
                    f"e2e still failing after {_rounds(rounds)} (max_review_rounds {config.max_review_rounds})",
                    tokens,
                )
            return Transition(
                # The review that follows is given what failed (its assignment's fix_findings): without it, the
                # review passed the unchanged code again and the e2e failed again, round after round.
                _settled(
                    progress, tokens, state=StoryState.REVIEW.value, e2e_rounds=rounds,
                    fix_findings=e2e_failure_findings(result),
                ),
                Outcome.ADVANCED,
                "e2e failed -> review",
            )
        return Transition(
            _settled(progress, tokens, state=StoryState.DONE.value, e2e_rounds=rounds),
            Outcome.ADVANCED,
            "e2e passed -> done",
        )
    raise AssertionError(f"no rule for {step}")  # the table above covers every step


def e2e_failure_findings(result: AgentComplete) -> list[Finding]:
    """What a failed e2e verification gives the review after it: its findings, or what it said of the failure."""
    if result.findings:
        return list(result.findings)
    said = result.summary or result.error or "no details given"
    return [Finding(severity=Severity.HIGH, summary=f"e2e verification failed: {said}"[:MAX_SUMMARY_CHARS])]


def _story_review(
    progress: StoryProgress, result: AgentComplete, config: SprintConfig, tokens: int
) -> Transition:
    rounds = progress.story_review_rounds + 1
    if result.verdict in (None, Verdict.PASSED, Verdict.SUCCESS):
        return Transition(
            _settled(progress, tokens, state=StoryState.READY_FOR_DEV.value, story_review_rounds=rounds),
            Outcome.ADVANCED,
            "story doc passed -> ready-for-dev",
        )
    if rounds < config.max_story_review_rounds:
        return Transition(
            _settled(progress, tokens, state=StoryState.STORY_DOC_IMPROVED.value, story_review_rounds=rounds),
            Outcome.ADVANCED,
            f"story doc needs improvement (round {rounds})",
        )
    # Story review rounds exhausted: the configured fallback decides.
    progress = progress.model_copy(update={"story_review_rounds": rounds})
    if config.story_review_fallback == "force_pass":
        return Transition(
            _settled(progress, tokens, state=StoryState.READY_FOR_DEV.value),
            Outcome.ADVANCED,
            f"story doc force-passed after {_rounds(rounds)}",
        )
    if config.story_review_fallback == "skip_story":
        return Transition(
            _settled(
                progress,
                tokens,
                state=StoryState.SKIPPED.value,
                error=f"story doc did not pass in {_rounds(rounds)}",
            ),
            Outcome.SKIPPED,
            "story skipped (story_review_fallback: skip_story)",
        )
    # ask_user: the story stays where it is and waits for a human decision (bso.decisions).
    question = (
        f"story doc did not pass in {_rounds(rounds)}; decide force_pass, skip_story or retry "
        "(story_review_fallback: ask_user)"
    )
    return Transition(_settled(progress, tokens, awaiting_decision=question), Outcome.AWAITING_DECISION, question)


def _rounds(count: int) -> str:
    return f"{count} round{'' if count == 1 else 's'}"


def review_shortfalls(result: AgentComplete, config: SprintConfig) -> list[str]:
    """Why a scored review (Gear 2) does not pass, beyond its findings: blocking issues, a low score."""
    reasons = [f"blocking: {issue}" for issue in result.blocking]
    if result.score is not None and result.score < config.approval_score:
        reasons.append(f"score {result.score} < approval_score {config.approval_score}")
    return reasons


def _code_review(
    progress: StoryProgress, result: AgentComplete, config: SprintConfig, tags: list[str], tokens: int
) -> Transition:
    review_round = progress.review_rounds + 1
    scores = [*progress.review_scores, result.score] if result.score is not None else list(progress.review_scores)
    progress = progress.model_copy(update={"review_rounds": review_round, "review_scores": scores})
    strictness = effective_strictness(config.strictness, review_round, config.review_degradation)
    blocking = findings_needing_fix(list(result.findings), strictness or Strictness.HIGH_ONLY)
    shortfalls = review_shortfalls(result, config)
    if not blocking and not shortfalls and result.verdict is not Verdict.FAILURE:
        nxt = StoryState.E2E_VERIFY if e2e_applies(tags, config) else StoryState.DONE
        return Transition(
            _settled(progress, tokens, state=nxt.value, fix_findings=[]),  # (an e2e failure's, now reviewed)
            Outcome.ADVANCED,
            f"review round {review_round} passed -> {nxt}",
        )
    if strictness is None:
        return intervention(
            progress,
            f"review round {review_round} still needs fixes: forced to needs-intervention (P22)",
            tokens,
        )
    if progress.fix_rounds + 1 > config.max_review_rounds:
        return intervention(
            progress,
            f"max_review_rounds ({config.max_review_rounds}) reached with findings left",
            tokens,
        )
    return Transition(
        _settled(
            progress,
            tokens,
            state=StoryState.REVIEW.value,
            fix_pending=True,
            fix_rounds=progress.fix_rounds + 1,
            fix_findings=blocking,
            fix_feedback=_fix_feedback(result, config),
        ),
        Outcome.FIX_REQUESTED,
        f"review round {review_round}: {len(blocking)} finding(s) >= {strictness.threshold.value} "
        f"({strictness.value})" + "".join(f"; {s}" for s in shortfalls) + " -> fix",
    )


def _fix_feedback(result: AgentComplete, config: SprintConfig) -> list[FeedbackItem]:
    """The review's feedback items, plus a blocking item for each blocking issue not already among them, and
    one for a score below approval_score (with the criteria that lost points) or a failed verdict: without
    them, a review that only scored low sent the fix with nothing to go on."""
    items = list(result.feedback)
    described = {f.issue for f in items if f.severity == "blocking"}
    items += [
        FeedbackItem(severity="blocking", category="review", issue=issue)
        for issue in result.blocking_issues
        if issue not in described
    ]
    if result.score is not None and result.score < config.approval_score:
        criteria = result.criteria_scores.model_dump() if result.criteria_scores is not None else {}
        lost = [f"{name} {got}/{CRITERIA_MAX[name]}" for name, got in criteria.items() if got < CRITERIA_MAX[name]]
        items.append(
            FeedbackItem(
                severity="blocking",
                category="score",
                issue=f"review score {result.score} < approval_score {config.approval_score}"
                + (f" (points lost: {', '.join(lost)})" if lost else ""),
                suggestion=result.summary[:MAX_SUMMARY_CHARS],
            )
        )
    elif result.verdict is Verdict.FAILURE and not items:
        items.append(
            FeedbackItem(
                severity="blocking",
                category="review",
                issue=f"the review failed the work: {result.summary or 'no reason given'}"[:MAX_SUMMARY_CHARS],
            )
        )
    return items


# --- message priority -> Temporal task priority (message-schemas' priority routing) ------------

# Temporal's priority_key: 1 is served first; the server's default range is 1..5 and an unset key
# means 3. critical/high go ahead of ordinary work, low behind it; 5 stays free below low.
PRIORITY_KEYS: dict[MessagePriority, int] = {
    MessagePriority.CRITICAL: 1,
    MessagePriority.HIGH: 2,
    MessagePriority.NORMAL: 3,
    MessagePriority.LOW: 4,
}


def priority_key(priority: MessagePriority | str | None) -> int | None:
    """The Temporal priority key for a message priority; None (inherit the default) when there is none."""
    if priority is None:
        return None
    return PRIORITY_KEYS[MessagePriority(priority)]


def story_priority(story_key: str, config: SprintConfig, scripted: str | None = None) -> MessagePriority | None:
    """A story's priority: the simulation script's, else `story_priorities` (full or short key), else none."""
    if scripted is not None:
        return MessagePriority(scripted)
    short = "-".join(story_key.split("-")[:2])
    value = config.story_priorities.get(story_key) or config.story_priorities.get(short)
    return MessagePriority(value) if value else None


# --- deadlines slept through ------------------------------------------------------------------------

# A dispatch whose deadline was slept through starts again at most this often (each sleep is one).
MAX_WAKES_PER_DISPATCH = 10


def slept_through(late_seconds: float, config: SprintConfig) -> bool:
    """Whether a deadline the server fired `late_seconds` past its moment was slept through: the machine or the
    Temporal server was not running then (a closed laptop, a server down), and the agent's time was not spent.
    (The server fires an overdue timer when it runs again; asleep_after_seconds.)"""
    return late_seconds > config.asleep_after_seconds


# --- token budget (P26) --------------------------------------------------------------------------


class BudgetLevel(StrEnum):
    OK = "ok"
    WARNING = "warning"
    EXHAUSTED = "exhausted"


def budget_warning(tokens_used: int, config: SprintConfig) -> str:
    budget = config.token_budget
    return (
        f"token budget warning: {tokens_used:,} of {budget.limit:,} tokens used, past warning_threshold "
        f"{budget.warning_threshold:g} (action at the limit: {budget.action})"
    )


def paused_on_budget(pause_reason: str | None) -> bool:
    """Whether a sprint's pause is its token budget's (the Master's reasons for it, here and in its batch end, say
    so first): only a higher token_limit lets it go on."""
    return (pause_reason or "").startswith("token budget ")


def budget_still_exhausted(tokens_used: int, token_limit: int) -> str:
    """Why a resume leaves a sprint paused on its budget: no batch may start until the limit is above the use."""
    return (
        f"token budget still exhausted ({tokens_used:,}/{token_limit:,} tokens): resume with a token_limit above "
        f"{tokens_used:,} to go on"
    )


def budget_level(tokens_used: int, config: SprintConfig) -> BudgetLevel:
    budget = config.token_budget
    if not budget.enabled:
        return BudgetLevel.OK
    if tokens_used >= budget.limit:
        return BudgetLevel.EXHAUSTED
    try:
        warning_line = budget.warning_threshold * budget.limit
    except OverflowError:  # a limit past what a float holds (10**309): no count of tokens comes near its warning
        return BudgetLevel.OK
    if tokens_used >= warning_line:
        return BudgetLevel.WARNING
    return BudgetLevel.OK

