"""Inputs, results and durable state of the workflows and activities (one model per boundary)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool
from pydantic_core import PydanticCustomError

from bso.config import SprintConfig
from bso.improvements import ImprovementRecord
from bso.messages import BatchPlanReady, BatchSpec, FeedbackItem, Finding, RejectedMessage, cut_text
from bso.roster import Roster
from bso.states import (
    AgentMode,
    AgentType,
    BatchStatus,
    SprintPhase,
    SprintStatus,
    StoryState,
)

DEFAULT_STATUS_FILE = "_bmad-output/implementation-artifacts/sprint-status.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- the sprint's input -------------------------------------------------------------------------

# `null` for an object field means "none given", as it does for every other optional field of the input
# (a hand-written `temporal workflow start --input` spells the defaults out as nulls).
_NullAsEmpty = BeforeValidator(lambda value: {} if value is None else value)


def _epic_of_a_kind(value: Any) -> Any:
    """An `epic` neither a number nor a key (2.5, [1], {}) refused in one message saying what it takes: the
    union's three (`epic.bool: Input should be a valid boolean; epic.int: ...`) offered a boolean first."""
    if value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and value.is_integer()):
        return value
    try:
        given = json.dumps(value)
    except (TypeError, ValueError):
        given = type(value).__name__
    raise PydanticCustomError(
        "epic_type", "epic must be a whole number (2) or an epic's key (\"2\", \"epic-2\"), not {given}", {"given": given}
    )


class SprintInput(_Model):
    """SprintMasterWorkflow's one input (JSON from the temporal CLI or `bso`)."""

    project_root: str = Field(min_length=1)
    status_file: str | None = None
    session_id: str | None = None
    # A bool kept as such (lax, `"epic": true` became epic 1): the Master refuses it (EPIC_NOT_A_BOOL).
    epic: Annotated[StrictBool | int | str | None, BeforeValidator(_epic_of_a_kind)] = None
    story_keys: list[str] | None = None
    agent_backend: str = "simulated"
    config_overrides: Annotated[dict[str, Any], _NullAsEmpty] = Field(default_factory=dict)
    simulation: Annotated[dict[str, Any], _NullAsEmpty] = Field(default_factory=dict)
    # Internal: the state a Master carries across continue-as-new. Never set it by hand.
    carried_state: MasterState | None = None


# --- the status file ----------------------------------------------------------------------------


class StoryMeta(_Model):
    """What the sprint knows of a story from the status file and its story file (if any)."""

    key: str
    epic: str
    short_key: str
    state: str  # the raw value in the file; may be unknown or a BMAD legacy value
    title: str = ""
    story_path: str  # relative to project_root
    depends_on: list[str] = Field(default_factory=list)  # full keys
    tags: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)  # files the story touches (story file `Files:` line, P29)


class LoadStatusInput(_Model):
    project_root: str
    status_file: str | None = None
    # When set, the snapshot lists only these stories: a Slave needs only its batch, and a snapshot of
    # the whole sprint in every Slave's history grew with the sprint (200 KB per Slave at 1,000 stories).
    only_stories: list[str] | None = None
    # The Master's first load: the calling sprint claims the project (refused while another one runs on it).
    claim_project: bool = False
    # From this attempt on, a file that does not parse fails the load for good (the Slave waits for it then).
    wait_when_unreadable_after: int | None = None


MAX_DEPENDENCY_PROBLEMS = 20


class StatusSnapshot(_Model):
    status_file: str  # absolute, resolved
    story_location: str  # relative to project_root
    project: str = ""
    stories: list[StoryMeta]
    epics: dict[str, str] = Field(default_factory=dict)
    # When the load was done, by the worker's clock (None in results recorded before it was kept): the moment
    # the batch's stories are ready, as the benchmark measures it.
    read_at: datetime | None = None
    # Story files' `Depends on:` items naming no story of the file (or several), by story: ignored, and said so at
    # the start (the sprint's errors). Stories past MAX_DEPENDENCY_PROBLEMS (and items past 3 a story) not listed.
    dependency_problems: dict[str, list[str]] = Field(default_factory=dict)


class StatusWriteInput(_Model):
    """U4: compare-and-swap one story's value."""

    project_root: str
    status_file: str
    story_key: str
    expected: str
    new: str
    # Stories of the batch not started yet, with the state the Slave holds for each: the result says which of
    # them the file holds otherwise (set by hand since), so the Slave takes them before it dispatches for them.
    watch: dict[str, str] = Field(default_factory=dict)
    # From this attempt on, a file that does not parse fails the write for good (the Slave waits for it then).
    wait_when_unreadable_after: int | None = None
    # A write undoing an earlier one (a refused course correction's): the epic lines that write rolled, put back
    # with the story's value where they still hold what it set (bso.sprint_status.set_epics_back). Epic entry ->
    # (the value it rolled the epic to, the value the epic held before: its result's epic_changes, epics_before).
    epics_back: dict[str, tuple[str, str]] = Field(default_factory=dict)


class StatusWriteResult(_Model):
    outcome: str  # written | already-applied | cas-mismatch
    story_key: str
    previous: str
    current: str
    epic_changes: dict[str, str] = Field(default_factory=dict)
    # The values the epics of epic_changes held before this write (empty in results recorded before it was kept).
    epics_before: dict[str, str] = Field(default_factory=dict)
    # The write asked for (expected -> new): a local activity's marker does not keep its input.
    expected: str | None = None
    new: str | None = None
    # When the file held the result (after fsync and read-back), by the worker's clock (None in results recorded
    # before it was kept). A local activity's marker reaches history only when its workflow task ends.
    done_at: datetime | None = None
    # The watched stories (StatusWriteInput.watch) whose value in the file differs: key -> value (None: the
    # story is no longer in the file).
    watched_changes: dict[str, str | None] = Field(default_factory=dict)


# --- the Slave ----------------------------------------------------------------------------------


class SlaveInput(_Model):
    """Dispatch parameters of one batch (the spec's 'Dispatch Parameters')."""

    batch_id: int
    session_id: str
    project_root: str
    status_file: str
    stories: list[StoryMeta]
    config: SprintConfig
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    agent_backend: str = "simulated"
    simulation: dict[str, Any] = Field(default_factory=dict)
    resident_contacts: dict[str, str] = Field(default_factory=dict)
    tokens_used_before: int = 0
    report_progress_to: str | None = None  # the Master's workflow id
    # first_story_checkpoint: pause and no story of the sprint has ended yet: the Slave pauses itself
    # after its first finished story (no dispatch may slip in before the Master's pause arrives).
    checkpoint_pending: bool = False
    # Planned stories of other batches this batch's stories depend on -> their state as the Master knows it;
    # updated by the `dependency_update` signal. A story waits until its dependencies are done.
    dependency_states: dict[str, str] = Field(default_factory=dict)


class StoryProgress(_Model):
    """One story's durable state inside a Slave: the review-fix round counters live here."""

    key: str
    state: str
    story_review_rounds: int = 0
    review_rounds: int = 0
    fix_rounds: int = 0
    e2e_rounds: int = 0
    agents_dispatched: int = 0
    tokens_used: int = 0
    fix_pending: bool = False
    fix_findings: list[Finding] = Field(default_factory=list)
    fix_feedback: list[FeedbackItem] = Field(default_factory=list)  # scored reviews: feedback for the fix
    review_scores: list[int] = Field(default_factory=list)  # each scored code-review round's score, in order
    error: str | None = None
    started: bool = False
    pending_dispatch_id: str | None = None
    pending_agent: AgentType | None = None
    pending_mode: AgentMode | None = None
    pending_debug_id: str | None = None  # the DEBUG_REQUEST the story waits on (bso.debugging)
    awaiting_decision: str | None = None  # the question a human must answer (bso.decisions)
    debug_attempts: int = 0  # DEBUG_REQUESTs sent for this story (bso.debugging)
    # Why the story's next state waits: sprint-status.yaml does not parse (the agent's result is kept meanwhile)
    status_file_problem: str | None = None
    # command backend: done, but its branch did not merge back (bso.git_rules.MergeOutcome); None: not said (no
    # merge, or recorded before the flag: bso.report reads the story's error then)
    work_left_out: bool | None = None
    # needs-intervention because a human set the status file so, not because an agent failed: no repeated failure
    set_by_hand: bool = False


class StoryResult(_Model):
    story_key: str
    final_state: str
    agents_dispatched: int
    error: str | None = None
    review_scores: list[int] = Field(default_factory=list)  # the story's score per scored review round
    tokens_used: int = 0


class SlaveResults(_Model):
    stories_total: int
    stories_completed: int
    stories_failed: int
    stories_skipped: int
    story_results: list[StoryResult]
    total_agents_created: int
    total_agents_destroyed: int
    review_fix_rounds: dict[str, int]


class SlaveResult(_Model):
    status: BatchStatus
    batch_id: int
    session_id: str
    results: SlaveResults
    errors: list[str] = Field(default_factory=list)
    tokens_used: int = 0
    budget_exhausted: bool = False
    fatal_error: str | None = None  # fail_fast: an unrecoverable agent error stopped the batch
    # Its history grew long (bso.config batch_hand_over_after_events): the stories it did not start go to a new batch.
    handed_over: bool = False
    # Agent-PO gates: GO_DIRECTIVEs and NEXT_DIRECTIVEs issued in this batch (GO >= NEXT).
    gates_go_issued: int = 0
    gates_next_issued: int = 0
    gates_feedback_issued: int = 0  # FEEDBACK on plans
    gates_fix_issued: int = 0  # FIX_DIRECTIVEs on completion reports
    gates_blocked: int = 0  # BLOCKED by either gate
    # message-schemas' delivery_failed / response_timeout errors of this batch's messages (seed shape)
    message_errors: list[dict[str, Any]] = Field(default_factory=list)
    # The story updates made since the Slave's last story_updates signal: they come with the result instead
    # of a last signal the Slave would have to wait for before it could end (the Master applies them first).
    final_updates: list[StoryUpdate] = Field(default_factory=list)


class StoryView(_Model):
    """A story as the status queries show it."""

    state: str
    batch_id: int | None = None
    review_round: int = 0
    fix_rounds: int = 0
    story_review_rounds: int = 0
    agents_dispatched: int = 0
    tokens_used: int = 0
    agent_in_flight: str | None = None
    mode_in_flight: str | None = None
    dispatch_id: str | None = None
    error: str | None = None
    awaiting_decision: str | None = None  # set while the story waits for a human `decide`
    debug_in_flight: str | None = None  # the debug id while the story waits on the debugger's analysis
    merging: bool = False  # command backend: done, its branch being merged back into the project
    status_file_problem: str | None = None  # set while the story waits for sprint-status.yaml to parse again
    # command backend: done, but its branch did not merge back (bso.git_rules.MergeOutcome); None: not said (no
    # merge, or recorded before the flag: bso.report reads the story's error then)
    work_left_out: bool | None = None
    set_by_hand: bool = False  # needs-intervention set in the status file by a human (StoryProgress.set_by_hand)

    @property
    def in_flight(self) -> str:
        return describe_in_flight(self.agent_in_flight, self.mode_in_flight, self.debug_in_flight) or (
            "merging" if self.merging else ""
        )


class StoryWork(_Model):
    """A story's agents and tokens over several batches: a rearmed story runs in more than one, and each batch's
    Slave counts its own only."""

    agents_dispatched: int = 0
    tokens_used: int = 0

    def plus(self, batch: StoryView | StoryResult) -> StoryWork:
        return StoryWork(
            agents_dispatched=self.agents_dispatched + batch.agents_dispatched,
            tokens_used=self.tokens_used + batch.tokens_used,
        )

    def added_to(self, view: StoryView) -> StoryView:
        """The story's view counting every batch it ran in."""
        return view.model_copy(update=self.plus(view).model_dump())


def describe_in_flight(agent: object, mode: object, debug_id: object) -> str:
    """What a story waits on, for status lines: its agent ("dev-runner/dev") or the debugger's analysis.

    Takes plain values: message payloads are shown as they came, whatever their shape."""
    if agent:
        return f"{agent}/{mode or '?'}"
    if debug_id:
        return f"debugger ({debug_id})"
    return ""


class SlaveStatus(_Model):
    batch_id: int
    session_id: str
    stories: dict[str, StoryView]
    current_story: str | None = None
    tokens_used: int = 0
    shutdown_requested: bool = False
    paused: bool = False
    rejected_messages: list[RejectedMessage] = Field(default_factory=list)  # the last ones kept
    rejected_total: int = 0  # all the Slave rejected
    message_errors: list[dict[str, Any]] = Field(default_factory=list)  # delivery_failed / response_timeout


class StoryUpdate(_Model):
    """Slave -> Master progress signal: one story's view after a transition."""

    batch_id: int
    story_key: str
    view: StoryView


SlaveResult.model_rebuild()  # final_updates names StoryUpdate, defined after it


class StoryUpdates(_Model):
    """Slave -> Master: the story updates of a Slave since its last signal, in order (one signal each
    time instead of one per transition)."""

    updates: list[StoryUpdate]


# --- the Master ---------------------------------------------------------------------------------


class GateCounts(_Model):
    """Agent-PO gate decisions of a sprint: the sum over its Slaves' batches (GO >= NEXT always)."""

    go_issued: int = 0
    next_issued: int = 0
    feedback_issued: int = 0
    fix_issued: int = 0
    blocked: int = 0


class CorrectionRecord(_Model):
    """A course correction the sprint applied (its COURSE_CORRECTION), as the report keeps it: the `course_correct`
    update's, with the note given with it (`text`), or the Master's own `repeated_failures` one."""

    reason: str
    text: str = ""  # the note given with the correction (the Master's own: how many stories failed in a row)
    added: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    batches: list[BatchSpec] = Field(default_factory=list)  # the pending stories' new batches
    impact: str = ""
    planner: str = ""


class SprintReport(_Model):
    session_id: str
    status: SprintStatus
    batch_plan: BatchPlanReady | None = None
    batches: list[SlaveResult] = Field(default_factory=list)
    stories: dict[str, str] = Field(default_factory=dict)
    tokens_used: int = 0
    token_limit: int | None = None  # the budget in force at the end (a resume may have raised it); None: older
    error: str | None = None
    # The sprint's own errors and warnings as its status showed them (a budget's warning or stop, a fail_fast, an
    # improvement proposal refused ...): the report had none of them. Empty in reports made before.
    errors: list[str] = Field(default_factory=list)
    improvements: list[ImprovementRecord] = Field(default_factory=list)  # the improvement cycle's stories

    total_agents_created: int = 0  # residents + Slaves + temps (the roster bookkeeping)
    total_agents_destroyed: int = 0
    unavailable_residents: dict[str, str] = Field(default_factory=dict)
    planner: str | None = None  # who planned the batches: "scrum-master" (the resident) or "fallback"
    po_gates: GateCounts = GateCounts()  # Agent-PO gate decisions, summed over the batches
    # message-schemas' delivery_failed / response_timeout errors: the Master's own, then each batch's
    message_errors: list[dict[str, Any]] = Field(default_factory=list)
    course_corrections: list[CorrectionRecord] = Field(default_factory=list)  # in the order they were applied
    # The batches planned and never started (a shutdown or a stop came first: the sprint's queue at its end); None in
    # reports made before it was kept (`batch_plan` is the first plan only: a course correction, a rearm, the
    # improvement cycle plan other batches since)
    unstarted_batches: list[BatchSpec] | None = None


class MasterState(_Model):
    """Everything a Master knows, in one typed model: carried across continue-as-new."""

    session_id: str
    phase: SprintPhase = SprintPhase.STARTING
    config: SprintConfig = SprintConfig()
    status_file: str = ""
    plan: BatchPlanReady | None = None
    stories: dict[str, StoryMeta] = Field(default_factory=dict)
    views: dict[str, StoryView] = Field(default_factory=dict)
    earlier_work: dict[str, StoryWork] = Field(default_factory=dict)  # rearmed stories' work before the rearm
    results: list[SlaveResult] = Field(default_factory=list)
    queue: list[BatchSpec] = Field(default_factory=list)
    next_batch_id: int = 1
    tokens_used: int = 0
    token_limit: int = 0
    paused_reason: str | None = None
    shutdown: bool = False
    stopped_early: bool = False
    errors: list[str] = Field(default_factory=list)
    runs: int = 1  # how many workflow runs this sprint has used (1 + continue-as-new count)
    improvements: list[ImprovementRecord] = Field(default_factory=list)
    improvement_cycle_done: bool = False

    checkpoint: str | None = None  # the first-story checkpoint's report, once the first story ended
    # Residents and the roster (workflows/residents.py).
    roster: Roster = Roster()
    roster_seq: int = 0
    residents: dict[str, str] = Field(default_factory=dict)  # running role -> workflow id, in start order
    unavailable_residents: dict[str, str] = Field(default_factory=dict)  # role -> why
    temps: dict[str, str] = Field(default_factory=dict)  # story key -> its agent in flight (roster name)
    external_temps: list[str] = Field(default_factory=list)  # created by AGENT_CREATE_REQUEST
    agents_created: int = 0  # residents + Slaves + temps, from the roster bookkeeping
    agents_destroyed: int = 0
    # Course correction (workflows/course_corrector.py).
    outside_stories: dict[str, str] = Field(default_factory=dict)  # status-file stories not in the sprint
    # Left-out stories a human rearmed a dependant of: their state when the sprint started no longer skips it.
    waived_dependencies: list[str] = Field(default_factory=list)
    consecutive_failures: int = 0
    budget_warned: bool = False  # the token budget's warning line was passed, and said
    over_budget: bool = False  # the running batches' tokens with the ended ones' passed the budget's limit
    course_corrections: list[str] = Field(default_factory=list)  # each one's impact analysis
    corrections: list[CorrectionRecord] = Field(default_factory=list)  # each one in full, for the report
    # Each story a correction dropped, with the value it had (written back should a later correction add it again).
    dropped_from: dict[str, str] = Field(default_factory=dict)
    # Planning by the scrum-master resident (bso/scrum_master.py).
    planner: str | None = None  # who planned the sprint's batches: "scrum-master" or "fallback"
    plan_requests: int = 0  # plan requests sent to the scrum-master (their ids)
    # message-schemas' delivery_failed / response_timeout errors of the Master's own messages (seed shape)
    message_errors: list[dict[str, Any]] = Field(default_factory=list)
    # Signals the Master could not act on (the last MAX_REJECTED_KEPT; validation_failed naming the field).
    rejected_messages: list[RejectedMessage] = Field(default_factory=list)
    rejected_total: int = 0


class SprintStatusView(_Model):
    session_id: str
    phase: SprintPhase
    current_batch: int | None = None  # the lowest of running_batches
    running_batches: list[int] = Field(default_factory=list)
    # Finished batches: batch id -> [stories it settled, stories it had], as it ran (a story rearmed since is
    # counted here too)
    finished_batches: dict[int, tuple[int, int]] = Field(default_factory=dict)
    batch_held: str | None = None  # why the next batch waits for a running one (they touch one file), if it does
    shutting_down: bool = False  # a shutdown was requested: the running batches finish the story in hand
    batches_total: int = 0
    batches_done: int = 0
    stories: dict[str, StoryView] = Field(default_factory=dict)
    tokens_used: int = 0
    token_limit: int = 0
    pause_reason: str | None = None
    errors: list[str] = Field(default_factory=list)
    # A finished batch's own errors (out of time, the status file unreadable, fail_fast's fatal error): batch id ->
    # its errors. (A batch that ended abnormally has its reason among `errors` already.)
    batch_errors: dict[int, list[str]] = Field(default_factory=dict)
    agent_backend: str | None = None  # where its agents run: on the agents queue unless in-process
    runs: int = 1
    checkpoint: str | None = None
    awaiting_decision: dict[str, str] = Field(default_factory=dict)  # story key -> the question
    # story key -> its planned dependencies not done yet, for a running batch's story no agent works on
    waiting_for: dict[str, list[str]] = Field(default_factory=dict)
    roster: Roster | None = None
    unavailable_residents: dict[str, str] = Field(default_factory=dict)
    total_agents_created: int = 0
    total_agents_destroyed: int = 0
    course_corrections: list[str] = Field(default_factory=list)
    po_gates: GateCounts = GateCounts()  # Agent-PO gate decisions of the finished batches
    message_errors: list[dict[str, Any]] = Field(default_factory=list)  # the Master's and finished batches'
    rejected_messages: list[RejectedMessage] = Field(default_factory=list)  # signals the Master ignored
    rejected_total: int = 0


DEFAULT_PAUSE_REASON = "paused by operator"


def pause_reason(raw: Any) -> str:
    """A pause signal's reason: its text, or an object's `reason` (`{"reason": "lunch"}`, as `resume` takes an
    object). Input that is neither still pauses (the safe side), and the reason says what came instead."""
    if isinstance(raw, dict) and isinstance(raw.get("reason"), str):
        raw = raw["reason"]
    if raw is None or raw == "":
        return DEFAULT_PAUSE_REASON
    if isinstance(raw, str):
        return raw
    shown = cut_text(json.dumps(raw, default=str), 80)
    return f"{DEFAULT_PAUSE_REASON} (its input {shown} is no reason text: send a string, or {{\"reason\": ...}})"


class ResumeRequest(_Model):
    """Resume a paused sprint; may raise the token budget (pause_and_report)."""

    token_limit: int | None = Field(default=None, gt=0)
    reason: str = ""


def short_key(full_key: str) -> str:
    """`3-2-chunk-manager` -> `3-2`."""
    parts = full_key.split("-")
    return "-".join(parts[:2])


TERMINAL_VALUES = {StoryState.DONE.value, StoryState.NEEDS_INTERVENTION.value, StoryState.SKIPPED.value}


SprintInput.model_rebuild()
