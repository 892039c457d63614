"""SprintSlaveWorkflow: one batch of stories driven through the State-to-Agent Dispatch Table.

Deterministic orchestration only (bso-sprint-slave-spec.md): for each story in batch order, look its
state up (bso.dispatch), dispatch one agent activity, wait for AGENT_COMPLETE (a signal), write the new
state through U4, loop through review-fix and story-doc-improve cycles until the story is done or needs
intervention. The rules live in `bso`; files, agents and clocks live in activities.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows.history import history_is_long_now
    from workflows.inputs import RawInput, required_input
    from workflows.patches import PatchRollup

    from activities.agents import run_agent
    from activities.git_ops import FINISH_GIT_HEARTBEAT, finish_story_git
    from activities.deadlines import LatenessInput, deadline_lateness
    from activities.po_gates import GateRecordInput, StoryScopeInput, load_story_scope, record_gate
    from activities.status_file import UNREADABLE_ERROR_TYPE, load_sprint_status, wait_for_status_file, write_story_status
    from bso.answer_size import fit_for_history
    from bso.constants import (
        QUERY_STATUS,
        SIGNAL_AGENT_COMPLETE,
        SIGNAL_DEBUG_REQUEST,
        SIGNAL_DEBUG_RESULT,
        SIGNAL_DECISION,
        SIGNAL_DEPENDENCY_UPDATE,
        SIGNAL_PAUSE,
        SIGNAL_RESUME,
        SIGNAL_SHUTDOWN,
        SIGNAL_STORY_UPDATES,
        UPDATE_DECIDE,
        agent_task_queue,
        agents_task_queue_for,
    )
    from bso.debugging import (
        DebugResult,
        after_debug,
        awaiting_debug,
        debug_id_for,
        debug_request_for,
        is_setup_error,
        wants_debug,
    )
    from bso.delivery import describe as describe_delivery, keep_error, query_timeout
    from bso.messages import DeliveryFailed, ResponseTimeout
    from workflows.delivery import await_answer, deliver, hold
    from bso.dependencies import (
        PATCH_DEPENDENCY_UPDATE_CHECKED,
        check_dependencies,
        checked_dependency_update,
        skipped_for_dependency,
    )
    from bso.decisions import (
        DecisionError,
        DecisionRequest,
        apply_decision,
        check_waiting_decision,
        decision_timed_out,
    )
    from bso.dispatch import (
        AGENT_CONFIG_ERROR,
        DispatchStep,
        Transition,
        apply_agent_result,
        agent_error_to_complete,
        PATCH_ANSWER_MATCHES_DISPATCH,
        PATCH_TOKENS_BOUNDED,
        SLAVE_PATCH_ROLLUP,
        SLAVE_PATCH_ROLLUP_2,
        answer_mismatch,
        check_agent_complete,
        check_agent_error,
        implausible_tokens,
        is_agent_error,
        apply_no_answer,
        fatal_error,
        BudgetLevel,
        MAX_WAKES_PER_DISPATCH,
        budget_level,
        slept_through,
        changed_by_hand,
        taken_from_file,
        intervention,
        is_terminal,
        mode_round,
        next_dispatch,
        priority_key,
        record_dispatch,
        setup_failure,
        story_priority,
    )
    from bso.messages import (
        AgentComplete,
        MessagePriority,
        RejectedMessage,
        TaskAssignment,
        describe_validation_error,
        keep_rejected,
        rejected_invalid,
    )
    from bso.models import (
        LoadStatusInput,
        ResumeRequest,
        SlaveInput,
        SlaveResult,
        SlaveStatus,
        StatusWriteInput,
        StoryMeta,
        StoryProgress,
        StoryUpdate,
        StoryUpdates,
        StoryView,
        describe_in_flight,
        short_key,
    )
    from bso.po_gates import (
        StoryScope,
        anti_patterns,
        gates_active,
        go_gate,
        next_gate,
        plan_sha256,
    )
    from bso.messages import CompletionReportPayload, GateIssue, PlanSubmissionPayload
    from bso.states import AgentStatus, AgentType
    from bso.report import build_slave_result
    from bso.config import SprintConfig, limits_error
    from bso.git_rules import FinishStoryInput, FinishStoryResult, MergeOutcome
    from bso.simulation import SimulationScript

PATCH_LOCAL_STATUS_LOAD = "slave-status-load-local"
PATCH_FINAL_UPDATES_IN_RESULT = "slave-final-updates-in-result"
PATCH_SHOW_DEBUG_WAIT = "slave-shows-debug-wait"  # a story waiting on the debugger is shown so, not its agent
PATCH_CANCEL_TERMINATES_AGENT = "slave-cancel-terminates-agent"  # a cancelled batch cancels its agent in flight
PATCH_UPDATES_ON_CANCEL = "slave-updates-on-cancel"  # a cancelled batch sends the story updates it still held
# A story whose state in the file is not the plan's when its batch starts (set by hand meanwhile) is told to
# the Master: its view kept the planned state, and a story set to done showed as not run.
PATCH_PUBLISH_FILE_STATES = "slave-publishes-file-states"
# A cancel during the command backend's squash-and-merge (or the batch's first status read) ends the batch: it
# was taken for a merge failure, and the Slave dispatched the next story's agent after the cancel.
PATCH_CANCEL_STOPS_GIT = "slave-cancel-stops-git"
# A story found done (or skipped) in the file when the Slave writes its next state was set so by hand while
# its agent worked: taken as it is (it was needs-intervention, against the file).
PATCH_SETTLED_BY_HAND = "slave-takes-settled-by-hand"
# The held story updates go to the Master on a cancel that arrives as an activity's cancellation too.
PATCH_UPDATES_ON_ANY_CANCEL = "slave-updates-on-any-cancel"
# The hold's timer is left to fire instead of being cancelled when the hold ends on another workflow task: a
# cancel racing the timer's firing is refused by the time-skipping test server, which then never hands the
# Slave another task (temporalio/sdk-java#3088, #2606). A real server handles both; a fired timer costs the
# Slave at most one short workflow task per hold.
PATCH_HOLD_TIMER_NOT_CANCELLED = "slave-hold-timer-not-cancelled"
# Before a story's first agent, the file is read again when time has passed since the batch last read it (a wait
# for a dependency, a pause, a merge): a story set done by hand meanwhile had its agent run all the same.
PATCH_REREAD_BEFORE_FIRST_AGENT = "slave-rereads-before-first-agent"
# command backend: a done story shows `merging` until its branch is merged back, then the Master hears it again;
# a batch held for a file it touches started once it was done, and its worktree missed the merge still running.
PATCH_REPORTS_MERGES = "slave-reports-merges"
# The batch's working time is bounded by slave_timeout_seconds, counted here: time paused or with a story
# waiting for a human's decision does not count, and a batch out of time ends after the agent in flight. (The
# Master set it as the Slave's execution timeout, which ran on through pauses, overnight decisions and sleep, and
# killed the batch with its agent in flight.)
PATCH_WORKING_TIME_LIMIT = "slave-working-time-limit"
WORKING_TIME_SUMMARY = "batch working-time limit (slave_timeout_seconds)"
# The time is up when the working-time timer fires, not when the clock says so: a workflow task that sdk-core
# joins on replay with the one before it (tests/collapsed_history.py) reads that one's earlier clock, and the sum
# of clock readings fell short of the limit on replay where it had reached it live (a second timer: a
# nondeterminism error). The clock now only sets the next timer's length after an idle stretch, and a timer
# that an idle stretch interrupts is cancelled, so a timer that fires always means the whole limit was worked.
PATCH_WORKING_TIME_BY_TIMER = "slave-working-time-by-timer"
# A dev-runner that could not start at all (agent_config_error: a missing CLI, a broken profile) is not sent to
# the debugger: the story goes to needs-intervention with "agent setup: ..." at once, as for the other agents.
PATCH_NO_DEBUG_FOR_SETUP = "slave-no-debug-for-agent-setup"
# Nor is any failure its agent marked `recoverable: false` (Gear 2): its story ends needs-intervention naming the
# unrecoverable error, where a debugger round and a fix were tried first.
PATCH_NO_DEBUG_FOR_UNRECOVERABLE = "slave-no-debug-for-unrecoverable"
# A pause whose reason is not a string (sent by hand) pauses the batch: the SDK dropped it, unseen.
PATCH_PAUSE_ANY_REASON = "slave-pause-any-reason"
# A file that does not parse (StatusFileUnreadable: an editor saving it, a line typed half-way) is retried for
# ~25 s before the story gives up; a story missing from the file, or a file outside the project, at once.
STATUS_FILE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=10,
    non_retryable_error_types=["StatusFileError"],
)
STATUS_WRITE_OPTIONS: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=30), "retry_policy": STATUS_FILE_RETRY}
# A file that still does not parse after a few quick tries (someone left it broken) is waited for: the story's
# change (its agent's result) and the batch's first read are kept and land once it parses, where the story
# gave up after ~25 s (its agent's work lost) and the batch ended with its stories unrun. The wait is one
# heartbeating activity, so it costs no history however long it lasts, and (a human's wait) no working time.
PATCH_WAITS_FOR_STATUS_FILE = "slave-waits-for-status-file"
STATUS_FILE_WAIT_AFTER_ATTEMPTS = 4  # ~1.4 s of STATUS_FILE_RETRY; other retryable failures keep all of it
STATUS_FILE_WAIT_OPTIONS: dict[str, Any] = {
    "start_to_close_timeout": timedelta(days=365),  # bounded by the human who fixes the file, or a cancel
    "heartbeat_timeout": timedelta(seconds=30),  # a lost worker's wait is taken over by another
    "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=["StatusFileError"]),
    "summary": "wait for sprint-status.yaml to parse again",
}
# A later re-read of the status file (stories not started yet) that fails for good (the file replaced by a
# directory, made unreadable) goes on with the states the batch has, as one that does not parse does: the local
# activity's non-retryable failure (an ApplicationError, not wrapped) failed the whole Slave.
PATCH_REREAD_SURVIVES_ANY_FAILURE = "slave-reread-survives-any-failure"
# Every story_updates signal is followed by its hold, on a timer, with no clock read. Before, whether an update
# was held depended on workflow.now(): a task that completed with no command (the acknowledgement of the last
# signal), joined on replay with the task after it (sdk-core does so), lent that task its clock, up to the hold
# earlier than it ran live: the update went out at once live and was held on replay (a nondeterminism error).
PATCH_UPDATES_HELD_WITHOUT_CLOCK = "slave-updates-held-without-clock"
# ...also once the Slave closes, its close cutting the hold short. Before, a signal whose delivery was acknowledged
# after the close went on without a hold, one acknowledged before started its timer: the two orders of one
# activation on replay, where sdk-core joins a task that completed with no command with the one after it.
PATCH_UPDATES_HELD_AFTER_CLOSE = "slave-updates-held-after-close"
# A cancel that came while the DEBUG_REQUEST was on its way, whose delivery the SDK let decide the await, is
# raised once it is delivered: the batch ran on (the debugger's answer, the fix) until the Master closed.
PATCH_CANCEL_AFTER_DEBUG_REQUEST = "slave-cancel-after-debug-request"
# Every patch above, and the two of bso.dispatch, folded into one marker per Slave (workflows/patches.py).
SLAVE_PATCHES_OF_2026_11_27 = PatchRollup(
    SLAVE_PATCH_ROLLUP,
    frozenset({
        PATCH_LOCAL_STATUS_LOAD,
        PATCH_FINAL_UPDATES_IN_RESULT,
        PATCH_SHOW_DEBUG_WAIT,
        PATCH_CANCEL_TERMINATES_AGENT,
        PATCH_UPDATES_ON_CANCEL,
        PATCH_PUBLISH_FILE_STATES,
        PATCH_CANCEL_STOPS_GIT,
        PATCH_SETTLED_BY_HAND,
        PATCH_UPDATES_ON_ANY_CANCEL,
        PATCH_HOLD_TIMER_NOT_CANCELLED,
        PATCH_REREAD_BEFORE_FIRST_AGENT,
        PATCH_REPORTS_MERGES,
        PATCH_WORKING_TIME_LIMIT,
        PATCH_WORKING_TIME_BY_TIMER,
        PATCH_NO_DEBUG_FOR_SETUP,
        PATCH_NO_DEBUG_FOR_UNRECOVERABLE,
        PATCH_PAUSE_ANY_REASON,
        PATCH_WAITS_FOR_STATUS_FILE,
        PATCH_REREAD_SURVIVES_ANY_FAILURE,
        PATCH_UPDATES_HELD_WITHOUT_CLOCK,
        PATCH_UPDATES_HELD_AFTER_CLOSE,
        PATCH_CANCEL_AFTER_DEBUG_REQUEST,
        PATCH_ANSWER_MATCHES_DISPATCH,
        PATCH_TOKENS_BOUNDED,
    }),
)
# A cancel no longer cuts a story's state change short. It cancelled the U4 write it met (the file written or not,
# the Slave taking it as not), and one that came in the workflow task that brought the agent's answer was raised
# first and the answer lost (the story kept its state, its finished agent ran again in the next sprint). Now the
# answer's state is written, the write finished, then the batch ends cancelled. It also makes a Slave replay the
# same either way: sdk-core joins a local activity's heartbeat task with the next on replay (the history of
# tests/histories/heartbeat-2026-11-27), which can bring the answer and a later cancel together.
PATCH_WRITE_SURVIVES_CANCEL = "slave-write-survives-cancel"
# A Slave started since this patch records this rollup alone; one recorded with the first keeps its patches.
SLAVE_PATCHES = PatchRollup(
    SLAVE_PATCH_ROLLUP_2,
    SLAVE_PATCHES_OF_2026_11_27.folded | {PATCH_WRITE_SURVIVES_CANCEL},
    previous=SLAVE_PATCHES_OF_2026_11_27,
)
# Since the second rollup, patches are asked one by one, each only where it applies (a Slave that never meets
# one records no marker for it): a cancelled batch answers the `decide` updates it still holds before it ends.
PATCH_DECIDE_ANSWERED_ON_CANCEL = "slave-decide-answered-on-cancel"
# An answer goes into the batch's state as bso.answer_size fits it: the fix's input no longer carries megabytes of
# findings again (the agent activity fits what it returns itself; this is for answers sent by signal), and an empty
# or over-long blocking issue no longer fails the batch (the fix's feedback could not carry it).
PATCH_ANSWER_FITS_HISTORY = "slave-answer-fits-history"
# A batch whose history grows long ends after the story in hand; the Master gives the rest to a new batch. Asked
# only once the history is long: a batch recorded before ran all its stories.
PATCH_HANDS_OVER_WHEN_LONG = "slave-hands-over-when-long"
# An agent activity no worker started before the agent's deadline (the server's SCHEDULE_TO_START, which defaults
# to the deadline) is out of time like one still running then: it was reported "agent activity failed: Timeout".
# Asked only when that timeout comes.
PATCH_UNSTARTED_AGENT_OUT_OF_TIME = "slave-unstarted-agent-out-of-time"
# An agent's deadline the server's history shows fired long past its moment (bso.dispatch.slept_through: a closed
# laptop, a server down) starts the agent again with its whole time, and a working stretch through which the timer
# of the batch's working time fired so late does not count: both ended the story, or the batch, for time nobody
# worked. Asked at such a deadline only.
PATCH_AGENT_WAKES_AFTER_SLEEP = "slave-agent-wakes-after-sleep"
PATCH_WORKING_TIME_WAKES_AFTER_SLEEP = "slave-working-time-wakes-after-sleep"
# The same for an external agent's deadline, kept by the batch's own timer (the agent activity only publishes the
# assignment): the timer is named for its dispatch so that its lateness can be read. Asked at such a deadline only.
PATCH_EXTERNAL_AGENT_WAKES_AFTER_SLEEP = "slave-external-agent-wakes-after-sleep"
# An agent activity the server gave up after a worker stopped on purpose (Ctrl-C, SIGTERM) handed its attempt back
# (sdk-core's WorkerShutdown failure): its retry did not fit before the deadline, or such stops used up its
# attempts. No fault of the agent's: it starts again with its whole time, as after a kill -9 past its deadline; it
# ended the story "agent activity failed: Worker is shutting down". Asked at such a failure only.
PATCH_AGENT_WAKES_AFTER_WORKER_STOP = "slave-agent-wakes-after-worker-stop"
WORKER_SHUTDOWN = "WorkerShutdown"  # the type of sdk-core's failure of an activity its stopped worker handed back
# A step that keeps the story's state compares the file's value with it (a write of the same value: "already
# applied", or another value a human set, taken as any hand edit): a story set skipped or done by hand during its
# review-fix rounds went on being reviewed and fixed. Asked at each such step.
PATCH_SAME_STATE_COMPARED = "slave-same-state-compared"

# Between the agent's deadline and the activity's: the activity must be allowed to report a timeout.
AGENT_ACTIVITY_GRACE = timedelta(seconds=60)
# The command backend enforces the agent's deadline itself, then checks the work (fix snapshot before, BSO's
# verification after: agents.toml's verification timeout_seconds, 900 s by default, each), heartbeating all
# along; the server's deadline leaves room for both, and a lost worker is still seen by the heartbeat timeout.
COMMAND_CHECKS_ALLOWANCE = timedelta(seconds=2 * 900)
# Story updates go to the Master at most once per this hold, together (a signal costs both workflows history
# events and a workflow task; with quick agents a Slave made one per story). The Master's view lags by ~1 s at
# most; a Slave that finishes sends at once.
STORY_UPDATES_HOLD = timedelta(seconds=1)
STORY_UPDATES_HOLD_SUMMARY = "story updates hold"  # the timer's name in the UI
# Backends whose agents answer in-process: their AGENT_COMPLETE comes back as the activity's result.
ANSWER_IN_RESULT_BACKENDS = ("simulated", "command")


def story_view(progress: StoryProgress, batch_id: int, merging: bool = False) -> StoryView:
    waits = progress.status_file_problem is not None
    return StoryView(
        state=progress.state,
        batch_id=batch_id,
        review_round=progress.review_rounds,
        fix_rounds=progress.fix_rounds,
        story_review_rounds=progress.story_review_rounds,
        agents_dispatched=progress.agents_dispatched,
        tokens_used=progress.tokens_used,
        # (A story whose state change waits for the status file has its agent's answer: none is in flight.)
        agent_in_flight=progress.pending_agent.value if progress.pending_agent and not waits else None,
        mode_in_flight=progress.pending_mode.value if progress.pending_mode and not waits else None,
        debug_in_flight=progress.pending_debug_id,
        dispatch_id=progress.pending_dispatch_id,
        error=progress.error,
        awaiting_decision=progress.awaiting_decision,
        merging=merging,
        status_file_problem=progress.status_file_problem,
        work_left_out=progress.work_left_out,
        set_by_hand=progress.set_by_hand,
    )


@workflow.defn(failure_exception_types=[ValidationError])  # a wrongly shaped input fails the workflow
class SprintSlaveWorkflow:
    @workflow.init
    def __init__(self, inp: SlaveInput | RawInput | None = None) -> None:
        inp = self._input = required_input(inp, SlaveInput)
        self._progress: dict[str, StoryProgress] = {
            s.key: StoryProgress(key=s.key, state=s.state) for s in inp.stories
        }
        self._open_dispatches: dict[str, str] = {}  # dispatch id -> story key
        self._answers: dict[str, AgentComplete] = {}
        self._rejected: list[RejectedMessage] = []
        self._rejected_total = 0
        self._shutdown = False
        self._handed_over = False  # its history grew long: the stories not started yet go to a new batch
        self._paused = False
        self._closing = False
        self._updates_in_result = False  # set when closing: the last updates go with the result
        self._dep_states: dict[str, str] = dict(inp.dependency_states)
        self._waiting_for: tuple[str, ...] = ()
        self._open_debug: dict[str, str] = {}  # debug id -> story key
        self._debug_results: dict[str, DebugResult] = {}
        self._decisions: dict[str, DecisionRequest] = {}  # story key -> the decision not yet applied
        self._current: str | None = None
        self._agents_created = 0
        self._agents_destroyed = 0
        self._outbox: list[StoryUpdate] = []  # story updates not yet sent to the Master
        self._sender: asyncio.Task[None] | None = None
        self._hold_timers: list[asyncio.Task[None]] = []  # left to fire (PATCH_HOLD_TIMER_NOT_CANCELLED)
        self._updates_sent_at: datetime | None = None
        self._updates_held_without_clock = False  # PATCH_UPDATES_HELD_WITHOUT_CLOCK, decided at the run's start
        self._updates_held_after_close = False  # PATCH_UPDATES_HELD_AFTER_CLOSE, likewise
        self._script = SimulationScript.model_validate(inp.simulation)
        self._fatal: str | None = None  # fail_fast: an unrecoverable agent error stops the batch
        self._cancel_pending = False  # a cancel came during a state change: raised once it is written
        self._out_of_time: str | None = None  # slave_timeout_seconds of work are up: why no new dispatch
        self._working_time_watch: asyncio.Task[None] | None = None  # held: the loop keeps tasks weakly
        self._states_read_at: datetime | None = None  # workflow time of the last read of the stories' states
        self._reports_merges = False  # PATCH_REPORTS_MERGES (command backend): done stories show `merging`
        self._merged: list[str] = []  # done stories whose branch merge has ended (merged or not)
        # Agent-PO gates on the dev-runner's work (po_gates_enabled; None: on for the command backend).
        self._po_gates = gates_active(inp.config.po_gates_enabled, inp.agent_backend)
        self._gates_go = 0
        self._gates_next = 0
        self._gates_other = {"FEEDBACK": 0, "FIX": 0, "BLOCKED": 0}
        self._message_errors: list[dict[str, Any]] = []  # delivery_failed / response_timeout (seed shape)

    # --- messages ------------------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_AGENT_COMPLETE)
    def agent_complete(self, payload: Any) -> None:
        """AGENT_COMPLETE. Malformed, unknown or repeated answers are recorded and ignored."""
        self._receive_answer(payload)

    def _receive_answer(self, payload: Any, came_as: str = "the AGENT_COMPLETE signal") -> None:
        """An AGENT_COMPLETE, by signal or as the agent activity's result: validated, matched to its open
        dispatch and deduplicated the same way either way (check_agent_complete, which `bso messages` shares)."""
        if is_agent_error(payload):
            self._agent_error(payload)
            return
        checked = check_agent_complete(payload, self._open_dispatches, self._answers)
        if not isinstance(checked, RejectedMessage):
            progress = self._progress.get(self._open_dispatches[checked.dispatch_id])
            mismatch = (
                answer_mismatch(checked, progress.pending_agent, progress.pending_mode)
                if progress is not None and progress.pending_agent is not None and progress.pending_mode is not None
                else None
            )
            # Patched where it refuses: an answer accepted before replays as it ran.
            if mismatch is not None and SLAVE_PATCHES.patched(PATCH_ANSWER_MATCHES_DISPATCH):
                checked = mismatch
            elif (too_many := implausible_tokens(checked)) is not None and SLAVE_PATCHES.patched(PATCH_TOKENS_BOUNDED):
                checked = too_many
        if isinstance(checked, RejectedMessage):
            self.record_rejected(checked)  # recorded, never acted on
            return
        del self._open_dispatches[checked.dispatch_id]
        fitted = fit_for_history(checked, f"{came_as} in the history of {workflow.info().workflow_id}")
        if fitted is not checked and SLAVE_PATCHES.patched(PATCH_ANSWER_FITS_HISTORY):
            checked = fitted
        self._answers[checked.dispatch_id] = checked

    def _agent_error(self, payload: dict[str, Any]) -> None:
        """Gear 2's agent_error on the same signal: its task_id is the dispatch id it ends (as a failure)."""
        error = check_agent_error(payload, self._open_dispatches)
        if isinstance(error, RejectedMessage):
            self.record_rejected(error)
            return
        dispatch_id = error.task_id
        story_key = self._open_dispatches[dispatch_id]
        progress = self._progress.get(story_key)
        if progress is None or progress.pending_agent is None or progress.pending_mode is None:
            self._reject("agent_error", "task_id names no open dispatch", dispatch_id)
            return
        del self._open_dispatches[dispatch_id]
        self._answers[dispatch_id] = agent_error_to_complete(
            error, dispatch_id, story_key, progress.pending_agent, progress.pending_mode  # type: ignore[arg-type]
        )

    @workflow.signal(name=SIGNAL_SHUTDOWN)
    def shutdown_request(self) -> None:
        """Finish the story in hand, then report SLAVE_BATCH_COMPLETE (the spec's shutdown protocol)."""
        self._shutdown = True

    @workflow.signal(name=SIGNAL_DEBUG_RESULT)
    def debug_result(self, payload: Any) -> None:
        """DEBUG_RESULT from the debugger resident, for a DEBUG_REQUEST this Slave sent."""
        try:
            result = DebugResult.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("DEBUG_RESULT", payload, err))
            return
        if self._open_debug.pop(result.debug_id, None) is None:
            self._reject("DEBUG_RESULT", f"unknown or answered debug id {result.debug_id!r}", None)
            return
        self._debug_results[result.debug_id] = result

    @workflow.signal(name=SIGNAL_DEPENDENCY_UPDATE)
    def dependency_update(self, states: Any) -> None:
        """The Master tells the state of stories of other batches this batch depends on."""
        if not isinstance(states, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in states.items()):
            self._reject("DEPENDENCY_UPDATE", "expected an object of story key: state", None)
            return
        # Asked only for a bad one: a marker of its own where it applies, none in a run that never gets one.
        taken, ignored = checked_dependency_update(states, self._input.stories)
        if ignored is not None and SLAVE_PATCHES.patched(PATCH_DEPENDENCY_UPDATE_CHECKED):
            self._reject("DEPENDENCY_UPDATE", ignored, None)
            states = taken
        self._dep_states.update(states)

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self, reason: Any = None) -> None:
        """No new dispatch while paused; the agent in flight finishes. (`reason` is Any, as the Master's: with
        `str | None` the SDK dropped a pause whose reason was not a string, unseen.)"""
        if not isinstance(reason, str | None) and not SLAVE_PATCHES.patched(PATCH_PAUSE_ANY_REASON):
            return  # a Slave from before: the SDK dropped it, and its history replays so
        self._paused = True
        self._show()

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self, request: Any = None) -> None:
        """Go on; a higher token_limit (a resume after a budget pause, forwarded by the Master) counts here too:
        with the limit the batch started with, it stopped again after its next story."""
        self._paused = False
        try:
            limit = ResumeRequest.model_validate(request or {}).token_limit
        except ValidationError:
            limit = None  # resumed all the same: the Master validated what the operator sent
        config = self._input.config
        if limit is not None and limit > config.token_budget.limit:
            budget = config.token_budget.model_copy(update={"limit": limit})
            self._input = self._input.model_copy(update={"config": config.model_copy(update={"token_budget": budget})})
        self._show()

    def _decision(self, request: Any) -> DecisionRequest:
        """The decision with its story key made full (`1-2` -> `1-2-login-form`) when it is unambiguous, as the
        Master's: an update sent to the batch with a short key was refused as an unknown story. (Only the update:
        it was refused by its validator, so no history holds one; the Master's forwarded signal has the full key.)"""
        parsed = DecisionRequest.model_validate(request)
        if parsed.story_key in self._progress:
            return parsed
        matches = [k for k in self._progress if short_key(k) == parsed.story_key]
        return parsed.model_copy(update={"story_key": matches[0]}) if len(matches) == 1 else parsed

    @workflow.update(name=UPDATE_DECIDE)
    async def decide(self, request: Any) -> StoryView:
        """A human's answer to a story waiting for a decision; returns the story once it is applied."""
        parsed = self._decision(request)
        self._decisions[parsed.story_key] = parsed
        await workflow.wait_condition(lambda: parsed.story_key not in self._decisions or self._closing)
        return self._view(parsed.story_key)

    @decide.validator
    def _validate_decide(self, request: Any) -> None:
        try:
            parsed = self._decision(request)
        except ValidationError as err:
            raise invalid_decision(f"invalid decision: {describe_validation_error(err)}")
        try:
            check_waiting_decision(parsed, self._progress.get(parsed.story_key))
        except DecisionError as err:
            raise invalid_decision(str(err)) from None
        if parsed.story_key in self._decisions:
            raise invalid_decision(f"story {parsed.story_key!r} already has a decision")

    @workflow.signal(name=SIGNAL_DECISION)
    def decision(self, request: Any) -> None:
        """The same decision, forwarded by the Master (which validated it against its own view)."""
        try:
            parsed = DecisionRequest.model_validate(request)
            check_waiting_decision(parsed, self._progress.get(parsed.story_key))
        except (ValidationError, DecisionError) as err:
            reason = describe_validation_error(err) if isinstance(err, ValidationError) else str(err)
            self._reject("DECISION", reason, None)
            return
        self._decisions.setdefault(parsed.story_key, parsed)

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> SlaveStatus:
        return SlaveStatus(
            batch_id=self._input.batch_id,
            session_id=self._input.session_id,
            stories={k: self._view(k) for k in self._progress},
            current_story=self._current,
            tokens_used=self._tokens_used(),
            shutdown_requested=self._shutdown,
            paused=self._paused,
            rejected_messages=list(self._rejected),
            rejected_total=self._rejected_total,
            message_errors=list(self._message_errors),
        )

    def _reject(self, msg_type: str, reason: str, dispatch_id: str | None) -> None:
        self.record_rejected(RejectedMessage(msg_type=msg_type, reason=reason, dispatch_id=dispatch_id))

    def record_rejected(self, message: RejectedMessage) -> None:
        """A message the Slave cannot act on: recorded (status, batch result), logged, never raised."""
        self._rejected_total += 1
        self._rejected = keep_rejected(self._rejected, message)
        workflow.logger.warning("%s ignored (%s): dispatch %s", message.msg_type, message.reason, message.dispatch_id)

    # --- the batch -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SlaveInput | RawInput | None = None) -> SlaveResult:
        if workflow.info().parent is None and (error := limits_error(self._input.config)) is not None:
            # A batch started by hand: the Master refuses such knobs at its sprint's start, and its batches' are
            # checked; this one's failed the workflow task in a loop. (No batch recorded before this check met it.)
            raise ApplicationError(error, type="InvalidSlaveInput", non_retryable=True)
        SLAVE_PATCHES.decide()
        self._updates_held_without_clock = SLAVE_PATCHES.patched(PATCH_UPDATES_HELD_WITHOUT_CLOCK)  # the same on replay
        self._updates_held_after_close = self._updates_held_without_clock and SLAVE_PATCHES.patched(PATCH_UPDATES_HELD_AFTER_CLOSE)
        try:
            return await self._run_batch()
        except BaseException as err:
            # A cancel reaches here as asyncio's CancelledError, or as the ActivityError of the activity it
            # cancelled (re-raised by the steps that must not take it for a failure).
            cancelled = isinstance(err, asyncio.CancelledError) or (
                is_cancelled_exception(err) and SLAVE_PATCHES.patched(PATCH_UPDATES_ON_ANY_CANCEL)
            )
            if not cancelled:
                raise
            # Cancelled with its sprint: the story updates still held (STORY_UPDATES_HOLD) go to the Master
            # now, or its status would show the stories as they were up to a second before.
            parent = workflow.info().parent
            if self._outbox and parent is not None and SLAVE_PATCHES.patched(PATCH_UPDATES_ON_CANCEL):
                await self._send_outbox(workflow.get_external_workflow_handle(parent.workflow_id))
            # A `decide` update sent to the Slave itself is answered with the story as it stands (its decision's
            # write finished, or not taken yet): left waiting, its caller was told the batch had ended.
            if not workflow.all_handlers_finished() and SLAVE_PATCHES.patched(PATCH_DECIDE_ANSWERED_ON_CANCEL):
                self._closing = True
                await workflow.wait_condition(workflow.all_handlers_finished)
            raise

    async def _run_batch(self) -> SlaveResult:
        inp = self._input  # as __init__ validated it
        errors: list[str] = []
        budget_exhausted = False
        self._reports_merges = inp.agent_backend == "command" and SLAVE_PATCHES.patched(PATCH_REPORTS_MERGES)
        if SLAVE_PATCHES.patched(PATCH_WORKING_TIME_LIMIT):
            limit = timedelta(seconds=inp.config.slave_timeout_seconds)
            watch = (
                self._watch_working_time_by_timer
                if SLAVE_PATCHES.patched(PATCH_WORKING_TIME_BY_TIMER)
                else self._watch_working_time
            )
            self._working_time_watch = asyncio.create_task(watch(limit))
        while True:
            try:
                await self._refresh_states()
                break
            except (ActivityError, ApplicationError) as err:  # a local activity's failure may come unwrapped
                if is_cancelled_exception(err) and SLAVE_PATCHES.patched(PATCH_CANCEL_STOPS_GIT):
                    raise  # cancelled while reading: the batch ends cancelled, not "unreadable"
                if not isinstance(err, ActivityError) and not self._waits_for_status_file():
                    raise  # as it did: the batch failed
                problem: str | None = _cause(err)
                if _error_type(err) == UNREADABLE_ERROR_TYPE and self._waits_for_status_file():
                    problem, _ = await self._wait_for_status_file(list(self._progress), _cause(err), on_shutdown=True)
                    if problem is None:
                        continue  # it parses again: read it
                errors.append(f"sprint-status.yaml unreadable: {problem}")
                return self._result(errors, budget_exhausted)

        for position, meta in enumerate(inp.stories):
            if self._shutdown:
                workflow.logger.info("[Slave] shutdown requested: %s not started", meta.key)
                continue
            if budget_exhausted:
                continue
            if self._fatal is not None:
                workflow.logger.warning("[Slave] fail_fast: %s not started", meta.key)
                continue
            if self._out_of_time is not None:
                workflow.logger.warning("[Slave] out of time: %s not started", meta.key)
                continue
            if self._handed_over:
                workflow.logger.info("[Slave] history long: %s left to a new batch", meta.key)
                continue
            self._current = meta.key
            if is_terminal(self._progress[meta.key]) or await self._await_dependencies(meta):
                await self._drive_story(meta)
            if self._merges_back(self._progress[meta.key]):
                await self._finish_story_git(meta)
            self._current = None
            if self._input.checkpoint_pending and is_terminal(self._progress[meta.key]):
                self._input = self._input.model_copy(update={"checkpoint_pending": False})
                self._paused = True  # the Master pauses the sprint on this story's update; resume goes on
                self._show()
            # self._input: a resume may have raised the limit since the batch started
            if budget_level(inp.tokens_used_before + self._tokens_used(), self._input.config) is BudgetLevel.EXHAUSTED:
                budget_exhausted = True
                workflow.logger.warning("[Slave] token budget exhausted after %s: batch stops", meta.key)
            if self._hands_over(inp.stories[position + 1:], budget_exhausted):
                self._handed_over = True
                workflow.logger.info(
                    "[Slave] history at %d events after %s: the stories not started go to a new batch",
                    workflow.info().get_current_history_length(), meta.key,
                )

        if self._out_of_time is not None:
            errors.append(self._out_of_time)
        self._closing = True  # a decision that came too late (shutdown) is answered as it stands
        # Only where the agents answer in their activity's result: an external agent's activity may still be
        # starting or ending when its answer (a signal) ends the batch, and a Slave completing in that workflow
        # task would have its completion refused (unhandled command) and retried.
        self._updates_in_result = (
            inp.agent_backend in ANSWER_IN_RESULT_BACKENDS and SLAVE_PATCHES.patched(PATCH_FINAL_UPDATES_IN_RESULT)
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._sender is not None:
            await self._sender  # a signal already on its way arrives before the result
        self._show()
        result = self._result(errors, budget_exhausted)
        if self._outbox:
            result = result.model_copy(update={"final_updates": self._outbox})
            self._outbox = []
        return result

    def _result(self, errors: list[str], budget_exhausted: bool) -> SlaveResult:
        result = self._built_result(errors, budget_exhausted)
        if self._message_errors:
            result = result.model_copy(update={"message_errors": list(self._message_errors)})
        if not self._po_gates:
            return result
        return result.model_copy(
            update={
                "gates_go_issued": self._gates_go,
                "gates_next_issued": self._gates_next,
                "gates_feedback_issued": self._gates_other["FEEDBACK"],
                "gates_fix_issued": self._gates_other["FIX"],
                "gates_blocked": self._gates_other["BLOCKED"],
            }
        )

    def _built_result(self, errors: list[str], budget_exhausted: bool) -> SlaveResult:
        return build_slave_result(
            batch_id=self._input.batch_id,
            session_id=self._input.session_id,
            progress=list(self._progress.values()),
            agents_created=self._agents_created,
            agents_destroyed=self._agents_destroyed,
            errors=errors if self._fatal is None else [*errors, self._fatal],
            budget_exhausted=budget_exhausted,
            fatal_error=self._fatal,
            handed_over=self._handed_over,
        )

    def _tokens_used(self) -> int:
        return sum(p.tokens_used for p in self._progress.values())

    def _hands_over(self, later: list[StoryMeta], budget_exhausted: bool) -> bool:
        """Whether the batch leaves `later` to a new batch, its history long: only stories the batch would still
        start (not after a shutdown, a budget stop, fail_fast or its working time, which leave them as they are)."""
        return (
            not (self._shutdown or budget_exhausted or self._fatal is not None or self._out_of_time is not None)
            and any(not is_terminal(self._progress[m.key]) for m in later)
            and self._history_is_long()
            and SLAVE_PATCHES.patched(PATCH_HANDS_OVER_WHEN_LONG)
        )

    def _history_is_long(self) -> bool:
        return history_is_long_now(self._input.config.batch_hand_over_after_events)

    async def _refresh_states(self, keys: list[str] | None = None) -> None:
        """Step 2 of the spec: the status file, not the plan, says where each story stands now (`keys`: only
        these, the stories not started yet when the file is read again)."""
        load = LoadStatusInput(
            project_root=self._input.project_root,
            status_file=self._input.status_file,
            only_stories=keys if keys is not None else [s.key for s in self._input.stories],
            # The batch's first read waits for a broken file; a later one (stories not started yet) goes on
            # without it.
            wait_when_unreadable_after=STATUS_FILE_WAIT_AFTER_ATTEMPTS
            if keys is None and self._waits_for_status_file()
            else None,
        )
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=60),
            "retry_policy": STATUS_FILE_RETRY,
            "summary": "read sprint-status.yaml",
        }
        if keys is not None or SLAVE_PATCHES.patched(PATCH_LOCAL_STATUS_LOAD):
            # In the Slave's first workflow task, like U4's writes: no activity round trip before the first agent.
            snapshot = await workflow.execute_local_activity(load_sprint_status, load, **options)
        else:  # Slaves started before the patch replay their (remote) load activity
            snapshot = await workflow.execute_activity(load_sprint_status, load, **options)
        self._states_read_at = workflow.now()
        current = {s.key: s.state for s in snapshot.stories}
        changed = self._take_file_states({key: current.get(key) for key in (self._progress if keys is None else keys)})
        if changed and SLAVE_PATCHES.patched(PATCH_PUBLISH_FILE_STATES):
            self._publish_file_states(changed)
        self._show()

    def _take_file_states(self, states: dict[str, str | None]) -> list[str]:
        """Stories not started yet take the state the file holds (None: gone from it); returns those changed."""
        changed: list[str] = []
        for key, state in states.items():
            progress = self._progress[key]
            self._progress[key] = taken_from_file(progress, state)
            if self._progress[key].state != progress.state:
                changed.append(key)
        return changed

    def _publish_file_states(self, keys: list[str]) -> None:
        for key in keys:
            workflow.logger.info("[Slave] %s is %s in sprint-status.yaml", key, self._progress[key].state)
            self._publish(key)

    async def _drive_story(self, meta: StoryMeta) -> None:
        while not is_terminal(progress := self._progress[meta.key]):
            if progress.awaiting_decision:  # even out of time: the wait is the human's, the decision lands
                if not await self._await_decision(progress):
                    return  # shutdown while waiting: the story stays where it is
                continue
            if self._out_of_time is not None:
                workflow.logger.warning("[Slave] out of time: %s stays %s", meta.key, progress.state)
                return
            if self._paused:
                await workflow.wait_condition(lambda: not self._paused or self._shutdown)
                if self._shutdown:
                    workflow.logger.info("[Slave] shutdown while paused: %s stays %s", meta.key, progress.state)
                    return
            if not progress.started and self._states_stale():
                await self._reread_states()
                continue  # the story may be settled now, or start from another state
            step = next_dispatch(progress)
            if step is None:
                await self._commit(
                    progress, intervention(progress, f"state {progress.state!r} has no dispatch-table row")
                )
                return
            dispatch_id = f"{workflow.info().workflow_id}/{meta.short_key}/{progress.agents_dispatched + 1}"
            progress = record_dispatch(progress, step, dispatch_id)
            self._progress[meta.key] = progress
            self._agents_created += 1
            self._publish(meta.key)
            if self._po_gates and step.agent_type is AgentType.DEV_RUNNER:
                answer = await self._po_gated(meta, progress, step, dispatch_id)
            else:
                answer = await self._dispatch(meta, progress, step, dispatch_id)
            self._agents_destroyed += 1
            fatal = isinstance(answer, AgentComplete) and fatal_error(answer, self._input.config)
            if isinstance(answer, Transition):
                transition = answer
            elif isinstance(answer, AgentComplete) and not fatal and wants_debug(
                step, answer, progress, self._input.config,
                setup_errors=is_setup_error(answer) and not SLAVE_PATCHES.patched(PATCH_NO_DEBUG_FOR_SETUP),
                unrecoverable_errors=not answer.recoverable
                and not is_setup_error(answer)
                and not SLAVE_PATCHES.patched(PATCH_NO_DEBUG_FOR_UNRECOVERABLE),
            ):
                transition = await self._debug(meta, progress, step, answer)
            elif isinstance(answer, AgentComplete):
                # fail_fast: an unrecoverable agent error stops the sprint; no debug round first.
                transition = apply_agent_result(progress, step, answer, self._input.config, meta.tags)
                self._fatal = self._fatal or fatal
            else:
                transition = apply_no_answer(progress, step, answer)
            await self._commit(progress, transition)

    def _states_stale(self) -> bool:
        """Time has passed since the batch last read its stories' states (not within this workflow task)."""
        read_at = self._states_read_at
        return read_at is not None and workflow.now() > read_at and SLAVE_PATCHES.patched(PATCH_REREAD_BEFORE_FIRST_AGENT)

    async def _reread_states(self) -> None:
        """The stories not started yet, read again; a file that cannot be read now leaves them as they were (the
        next write's compare-and-swap still guards the story)."""
        try:
            await self._refresh_states(list(self._not_started(besides="")))
        except (ActivityError, ApplicationError) as err:
            if is_cancelled_exception(err):
                raise
            if not isinstance(err, ActivityError) and not SLAVE_PATCHES.patched(PATCH_REREAD_SURVIVES_ANY_FAILURE):
                raise  # as it did: the Slave failed
            self._states_read_at = workflow.now()  # not again for every story of the batch
            workflow.logger.warning("[Slave] sprint-status.yaml not read again: %s", _cause(err))

    def _dependency_states(self, meta: StoryMeta) -> dict[str, str]:
        states = dict(self._dep_states)
        states.update({k: p.state for k, p in self._progress.items() if k != meta.key})
        return states

    async def _await_dependencies(self, meta: StoryMeta) -> bool:
        """A story starts only once the stories it depends on are done (waiting, not failing); when one of
        them will never be done, the story is skipped (U4) with that reason. False: do not drive it."""
        check = check_dependencies(meta.depends_on, self._dependency_states(meta))
        if not check.ready and check.blocked_by is None:
            self._waiting_for = check.waiting_for
            workflow.logger.info("[Slave] %s waits for %s", meta.key, ", ".join(check.waiting_for))
            self._show()
            await workflow.wait_condition(
                lambda: self._shutdown
                or self._out_of_time is not None
                or (c := check_dependencies(meta.depends_on, self._dependency_states(meta))).ready
                or c.blocked_by is not None
            )
            self._waiting_for = ()
            check = check_dependencies(meta.depends_on, self._dependency_states(meta))
        if check.blocked_by is not None:
            dep, state = check.blocked_by
            await self._commit(self._progress[meta.key], skipped_for_dependency(self._progress[meta.key], dep, state))
            return False
        if not check.ready:  # shutdown (or out of time) while waiting: the story was never started
            workflow.logger.info("[Slave] %s: %s not started", "shutdown requested" if self._shutdown else "out of time", meta.key)
            return False
        return True

    async def _debug(
        self, meta: StoryMeta, progress: StoryProgress, step: DispatchStep, answer: AgentComplete
    ) -> Transition:
        """A dev-runner failed with an error: DEBUG_REQUEST to the debugger resident, wait for its DEBUG_RESULT."""
        debug_id = debug_id_for(self._input.batch_id, meta.short_key, progress.debug_attempts + 1)
        debugger = self._input.resident_contacts.get("debugger")
        if debugger is None:
            unavailable = DebugResult(
                debug_id=debug_id, story_key=meta.key, status="unavailable", error="no debugger resident in this sprint"
            )
            return after_debug(progress, step, answer, unavailable, config=self._input.config)
        if workflow.cancellation_reason() is not None and SLAVE_PATCHES.patched(PATCH_WRITE_SURVIVES_CANCEL):
            # The batch's cancel came with this failing answer (_dispatch re-delivered it): no analysis starts for
            # a cancelled batch (the DEBUG_REQUEST's delivery took the cancel for a failure and went out a second
            # later). The story keeps its state; its agent runs again in the next sprint.
            await asyncio.sleep(0)  # where the re-delivered cancel is raised
            raise asyncio.CancelledError
        priority = self._story_priority(meta)  # the analysis runs at the story's priority
        request = debug_request_for(
            progress, step, answer, debug_id, workflow.info().workflow_id, self._input.session_id
        ).model_copy(
            update={
                "timeout_ms": self._input.config.resident_query_timeout_ms,
                "priority": priority.value if priority else None,
            }
        )
        self._open_debug[debug_id] = meta.key
        if SLAVE_PATCHES.patched(PATCH_SHOW_DEBUG_WAIT):  # Slaves started before it replay without the update
            self._progress[meta.key] = awaiting_debug(progress, debug_id)
            self._publish(meta.key)
        workflow.logger.info("[Slave] %s: DEBUG_REQUEST %s to %s", meta.key, debug_id, debugger)
        sent = request.model_dump(mode="json", exclude_none=True)
        failed = await deliver(  # retried, then delivery_failed
            debugger, SIGNAL_DEBUG_REQUEST, sent, cancellable=True, patched=SLAVE_PATCHES.patched
        )
        if workflow.cancellation_reason() is not None and SLAVE_PATCHES.patched(PATCH_CANCEL_AFTER_DEBUG_REQUEST):
            raise asyncio.CancelledError
        if failed is not None:  # the debugger is gone
            self._open_debug.pop(debug_id, None)
            self._message_error(failed)
            unavailable = DebugResult(
                debug_id=debug_id, story_key=meta.key, status="unavailable", error=describe_delivery(failed)
            )
            return after_debug(progress, step, answer, unavailable, config=self._input.config)
        default = timedelta(seconds=self._input.config.agent_timeout_seconds.dev_execution)
        timeout = query_timeout(request.timeout_ms, default)  # the query's timeout_ms, when it has one
        late = await await_answer(lambda: debug_id in self._debug_results, timeout, request=sent, recipient=debugger)
        if late is not None:
            self._open_debug.pop(debug_id, None)
            self._message_error(late)
            return after_debug(
                progress, step, answer, None,
                f"no DEBUG_RESULT within {int(timeout.total_seconds())}s: {describe_delivery(late)}",
                config=self._input.config,
            )
        return after_debug(progress, step, answer, self._debug_results.pop(debug_id), config=self._input.config)

    def _message_error(self, error: DeliveryFailed | ResponseTimeout) -> None:
        """message-schemas' delivery_failed / response_timeout: recorded (status query, batch result), logged."""
        self._message_errors = keep_error(self._message_errors, error)
        workflow.logger.warning("[Slave] %s", describe_delivery(error))

    def _story_priority(self, meta: StoryMeta) -> MessagePriority | None:
        scripted = self._script.for_story(meta.key).priority if self._input.agent_backend == "simulated" else None
        return story_priority(meta.key, self._input.config, scripted)

    async def _await_decision(self, progress: StoryProgress) -> bool:
        """Wait for the human decision on a story (no timeout unless decision_timeout_seconds); apply it.

        False when a shutdown ended the wait first."""
        key = progress.key
        timeout_s = self._input.config.decision_timeout_seconds
        workflow.logger.info("[Slave] %s awaits a human decision: %s", key, progress.awaiting_decision)
        try:
            await workflow.wait_condition(
                lambda: key in self._decisions or self._shutdown,
                timeout=timedelta(seconds=timeout_s) if timeout_s else None,
            )
        except asyncio.TimeoutError:
            await self._commit(progress, decision_timed_out(progress, timeout_s or 0))
            return True
        if key not in self._decisions:
            return False
        await self._commit(progress, apply_decision(progress, self._decisions[key]))
        del self._decisions[key]  # answers the update: the decision is applied and written
        return True

    async def _po_gated(
        self, meta: StoryMeta, progress: StoryProgress, step: DispatchStep, dispatch_id: str
    ) -> AgentComplete | str | Transition:
        """The dev-runner's work under the Agent-PO gates: plan -> GO gate (FEEDBACK revisions) ->
        implementation -> NEXT gate (FIX retries). The implementation's AGENT_COMPLETE after NEXT, a
        failure as it came, or needs-intervention (BLOCKED, or no valid PO message)."""
        config = self._input.config
        try:
            scope: StoryScope = await workflow.execute_activity(
                load_story_scope,
                StoryScopeInput(project_root=self._input.project_root, story_path=meta.story_path),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"PO gates: scope of story {meta.key}",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):  # the batch is cancelled: not this story's failure
                raise
            return intervention(progress, f"PO gates: the story's scope could not be read ({_cause(err)})")
        base = {"ac_ids": list(scope.ac_ids), "scope": list(scope.files)}
        timeout_minutes = max(1, config.agent_timeout_seconds.dev_execution // 60)
        go_records: list[dict[str, Any]] = []
        feedback: dict[str, Any] | None = None
        revision = 1
        spent = 0  # tokens of the earlier dispatches of this gated step (plans, rejected attempts): they count too
        while True:  # GO gate
            answer = await self._dispatch(
                meta, progress, step, f"{dispatch_id}/plan-{revision}",
                po={**base, "phase": "plan", "attempt": revision, "feedback": feedback},
            )
            if not isinstance(answer, AgentComplete) or answer.status is not AgentStatus.SUCCESS:
                return _with_spent(progress, step, answer, spent)
            try:
                plan = PlanSubmissionPayload.model_validate(answer.po_message or {})
            except ValidationError as err:
                why = answer.error or _no_po_message(answer, "PLAN_SUBMISSION", "plan") or (
                    f"validation_failed: {describe_validation_error(err)}"
                )
                self._reject("PLAN_SUBMISSION", why, answer.dispatch_id)  # recorded, never acted on
                return intervention(
                    progress, f"PO gate: no valid PLAN_SUBMISSION ({why})",
                    spent + answer.tokens_used,
                )
            spent += answer.tokens_used
            decision = go_gate(
                plan, scope, revision=revision, max_revisions=config.po_max_revisions,
                timeout_minutes=timeout_minutes, task_id=meta.key,
            )
            go_records.append(
                {
                    "revision": revision,
                    "outcome": decision.outcome,
                    "plan_sha256": plan_sha256(plan),
                    "issues": [i.model_dump(mode="json") for i in decision.issues],
                    "directive": (decision.go or decision.feedback or decision.blocked).model_dump(mode="json"),  # type: ignore[union-attr]
                }
            )
            await self._record_gate(meta.key, "go", go_records)
            if decision.outcome == "GO":
                self._gates_go += 1
                break
            self._gates_other[decision.outcome] += 1  # FEEDBACK or BLOCKED
            if decision.outcome == "BLOCKED":
                assert decision.blocked is not None
                return intervention(
                    progress, f"PO gate BLOCKED: {decision.blocked.reason}: {decision.blocked.details.issue}", spent
                )
            feedback = decision.feedback.model_dump(mode="json") if decision.feedback else None
            revision += 1
        assert decision.go is not None
        authorized = list(decision.go.authorization.authorized_files)
        go_directive = decision.go.model_dump(mode="json")
        next_records: list[dict[str, Any]] = []
        earlier: list[list[GateIssue]] = []
        fix: dict[str, Any] | None = None
        attempt = 1
        while True:  # NEXT gate
            fresh = attempt >= 3  # the second retry starts with fresh context and the earlier anti-patterns
            answer = await self._dispatch(
                meta, progress, step, f"{dispatch_id}/impl-{attempt}",
                po={
                    **base,
                    "phase": "implement" if attempt == 1 else "fix",
                    "attempt": attempt,
                    "go": go_directive,
                    "authorized_files": authorized,
                    "fix": fix,
                    "fresh_context": fresh,
                    "anti_patterns": anti_patterns(earlier) if fresh else [],
                },
            )
            if not isinstance(answer, AgentComplete) or answer.status is not AgentStatus.SUCCESS:
                return _with_spent(progress, step, answer, spent)
            try:
                report = CompletionReportPayload.model_validate(answer.po_message or {})
            except ValidationError as err:
                why = answer.error or _no_po_message(answer, "COMPLETION_REPORT", "implementation") or (
                    f"validation_failed: {describe_validation_error(err)}"
                )
                self._reject("COMPLETION_REPORT", why, answer.dispatch_id)  # recorded, never acted on
                return intervention(
                    progress, f"PO gate: no valid COMPLETION_REPORT ({why})",
                    spent + answer.tokens_used,
                )
            outcome = next_gate(
                report, scope, authorized, retries_used=attempt - 1, max_retries=config.po_max_retries,
                task_id=meta.key,
            )
            next_records.append(
                {
                    "attempt": attempt,
                    "outcome": outcome.outcome,
                    "issues": [i.model_dump(mode="json") for i in outcome.issues],
                    "directive": (outcome.next or outcome.fix or outcome.blocked).model_dump(mode="json"),  # type: ignore[union-attr]
                }
            )
            await self._record_gate(meta.key, "next", next_records)
            if outcome.outcome == "NEXT":
                self._gates_next += 1
                return _with_spent(progress, step, answer, spent)
            self._gates_other[outcome.outcome] += 1  # FIX or BLOCKED
            if outcome.outcome == "BLOCKED":
                assert outcome.blocked is not None
                return intervention(
                    progress, f"PO gate BLOCKED: {outcome.blocked.reason}: {outcome.blocked.details.issue}",
                    spent + answer.tokens_used,
                )
            spent += answer.tokens_used
            earlier.append(list(outcome.issues))
            fix = outcome.fix.model_dump(mode="json") if outcome.fix else None
            attempt += 1

    async def _record_gate(self, story_key: str, gate: str, decisions: list[dict[str, Any]]) -> None:
        try:
            await self._write_gate_record(story_key, gate, decisions)
        except ActivityError as err:  # the record is the gates' audit trail: its loss must not stop the story
            if is_cancelled_exception(err):  # the batch is cancelled
                raise
            workflow.logger.error("[Slave] %s: PO gate %s not recorded: %s", story_key, gate, _cause(err))

    async def _write_gate_record(self, story_key: str, gate: str, decisions: list[dict[str, Any]]) -> None:
        await workflow.execute_activity(
            record_gate,
            GateRecordInput(
                project_root=self._input.project_root,
                session_id=self._input.session_id,
                story_key=story_key,
                gate=gate,  # type: ignore[arg-type]
                decisions=decisions,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary=f"PO gate {gate} of story {story_key}",
        )

    async def _dispatch(
        self,
        meta: StoryMeta,
        progress: StoryProgress,
        step: DispatchStep,
        dispatch_id: str,
        po: dict[str, Any] | None = None,
    ) -> AgentComplete | str:
        """Run one agent; its AGENT_COMPLETE, or why there is none."""
        config = self._input.config
        timeout = timedelta(seconds=config.agent_timeout_seconds.for_agent(step.agent_type))
        script = self._script.for_story(meta.key)
        priority = self._story_priority(meta)
        assignment = TaskAssignment(
            dispatch_id=dispatch_id,
            agent_type=step.agent_type,
            mode=step.mode,
            story_key=meta.key,
            story_path=meta.story_path,
            story_title=meta.title,
            session_id=self._input.session_id,
            batch_id=self._input.batch_id,
            report_to=workflow.info().workflow_id,
            project_root=self._input.project_root,
            resident_contacts=self._input.resident_contacts,
            config_overrides=self._input.config_overrides,
            status_file=self._input.status_file,
            mode_round=mode_round(progress, step),
            # A review after a failed e2e verification is given what failed (bso.dispatch.e2e_failure_findings).
            fix_findings=list(progress.fix_findings) if step.mode.value in ("fix", "review") else [],
            fix_feedback=list(progress.fix_feedback) if step.mode.value == "fix" else [],
            priority=priority.value if priority else None,
            backend=self._input.agent_backend,
            simulation=script.model_dump(mode="json")
            if self._input.agent_backend == "simulated"
            else {},
            po=po or {},
            answer_in_result=self._input.agent_backend in ANSWER_IN_RESULT_BACKENDS,
        )
        self._open_dispatches[dispatch_id] = meta.key
        retry = config.agent_retry
        # Only a story with a priority sets one: otherwise the activity inherits (and history is unchanged).
        key = priority_key(priority)
        extra: dict[str, Any] = {"priority": Priority(priority_key=key)} if key is not None else {}
        activity_deadline = timeout
        if self._input.agent_backend == "command":
            activity_deadline += AGENT_ACTIVITY_GRACE + COMMAND_CHECKS_ALLOWANCE
        agent_queue = agent_task_queue(self._input.agent_backend, workflow.info().task_queue)

        def start_agent() -> workflow.ActivityHandle[Any]:
            started = workflow.start_activity(
                run_agent,
                assignment,
                task_queue=agent_queue,
                activity_id=dispatch_id,
                # The agent's deadline, kept by the server (no workflow timer per dispatch): an activity still
                # running then is timed out and answered as "no AGENT_COMPLETE". The command backend enforces the
                # deadline itself and has the time to report it and to check the agent's work.
                schedule_to_close_timeout=activity_deadline,
                start_to_close_timeout=activity_deadline + AGENT_ACTIVITY_GRACE,
                heartbeat_timeout=timedelta(seconds=retry.heartbeat_timeout_seconds),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=retry.initial_interval_seconds),
                    maximum_attempts=retry.maximum_attempts,
                    non_retryable_error_types=["UnknownBackend", "StatusFileError", "AgentConfigError"],
                ),
                summary=f"{step.agent_type.value} ({step.mode.value}) for story {meta.key}",
                **extra,
            )
            started.add_done_callback(_consume_outcome)
            return started

        handle = start_agent()
        deadline = workflow.now() + timeout
        no_answer = f"no AGENT_COMPLETE within {int(timeout.total_seconds())}s"
        wakes = 0
        try:
            while True:
                await workflow.wait_condition(lambda: dispatch_id in self._answers or handle.done())
                if dispatch_id in self._answers:
                    break
                failure = handle.exception() if not handle.cancelled() else None
                if (
                    failure is not None
                    and _deadline_passed(failure)
                    and wakes < MAX_WAKES_PER_DISPATCH
                    and SLAVE_PATCHES.patched(PATCH_AGENT_WAKES_AFTER_SLEEP)  # (asked at a deadline only)
                    and await self._slept_through(LatenessInput(activity_id=dispatch_id, **self._own_run()))
                ):
                    # Slept through (a closed laptop, a server down, a worker down or frozen): the agent gets its
                    # whole time again, its dispatch id the same (a command agent still running is taken over).
                    wakes += 1
                    workflow.logger.warning("[Slave] %s: its deadline was slept through; started again", dispatch_id)
                    handle, deadline = start_agent(), workflow.now() + timeout
                    continue
                if (
                    failure is not None
                    and _error_type(failure) == WORKER_SHUTDOWN
                    and wakes < MAX_WAKES_PER_DISPATCH
                    and SLAVE_PATCHES.patched(PATCH_AGENT_WAKES_AFTER_WORKER_STOP)  # (asked at such a failure only)
                ):
                    wakes += 1
                    workflow.logger.warning("[Slave] %s: handed back by a worker stopped on purpose; started again", dispatch_id)
                    handle, deadline = start_agent(), workflow.now() + timeout
                    continue
                if failure is not None:
                    self._open_dispatches.pop(dispatch_id, None)
                    if _error_type(failure) == AGENT_CONFIG_ERROR:  # the agent cannot start at all
                        return setup_failure(dispatch_id, step, meta.key, f"agent setup: {_cause(failure)}")
                    if not _deadline_passed(failure):
                        return f"agent activity failed: {_cause(failure)}"
                    if _timeout_type(failure) is TimeoutType.SCHEDULE_TO_START:
                        return f"{no_answer} (no worker of {agent_queue} started it)"
                    return no_answer
                receipt = handle.result()
                if receipt.answer is not None:  # answered in-process: AGENT_COMPLETE is the result
                    self._receive_answer(receipt.answer, came_as="the agent activity's result")
                break
            while dispatch_id not in self._answers:
                # The agent answers by itself (external backend) within what is left of its time.
                left = deadline - workflow.now()
                if left <= timedelta(0):
                    break
                summary = external_deadline_summary(dispatch_id)
                try:
                    await workflow.wait_condition(
                        lambda: dispatch_id in self._answers, timeout=left, timeout_summary=summary
                    )
                except asyncio.TimeoutError:
                    if (
                        dispatch_id in self._answers
                        or wakes >= MAX_WAKES_PER_DISPATCH
                        or not SLAVE_PATCHES.patched(PATCH_EXTERNAL_AGENT_WAKES_AFTER_SLEEP)  # (at a deadline only)
                        or not await self._slept_through(LatenessInput(timer_summary=summary, **self._own_run()))
                    ):
                        raise
                    # Slept through: the agent, wherever it runs, has its whole time again to answer.
                    wakes += 1
                    workflow.logger.warning("[Slave] %s: its deadline was slept through; waiting again", dispatch_id)
                    deadline = workflow.now() + timeout
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            if not self._answered_with_cancel(dispatch_id, handle):
                # The batch is cancelled (with its sprint): the agent in flight gets its TERMINATE_DIRECTIVE too.
                # The activity is only started, not awaited, so the workflow's cancel would not reach it.
                if not handle.done() and SLAVE_PATCHES.patched(PATCH_CANCEL_TERMINATES_AGENT):
                    handle.cancel()
                raise
            # The answer came in this workflow task too: taken as if it had come a task before the cancel (which
            # is what the Slave does when its tasks are joined on replay), the cancel raised again in the next
            # await (a U4 write finishes first).
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
        self._open_dispatches.pop(dispatch_id, None)
        if dispatch_id in self._answers:
            return self._answers[dispatch_id]
        if not handle.done():
            handle.cancel()  # TERMINATE_DIRECTIVE: the agent's time is up
        return no_answer

    def _own_run(self) -> dict[str, str]:
        return {"workflow_id": workflow.info().workflow_id, "run_id": workflow.info().run_id}

    async def _slept_through(self, inp: LatenessInput) -> bool:
        """Whether the deadline the server just fired was slept through (bso.dispatch.slept_through), by how late
        the server's history shows it fired (activities/deadlines.py): not by this task's clock, which a replay
        may take from an earlier task. Not said (the activity failed): not slept through."""
        try:
            late = await workflow.execute_activity(
                deadline_lateness, inp, start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3), summary="was the deadline slept through?",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            workflow.logger.warning("[Slave] deadline lateness not read: %s", _cause(err))
            return False
        return slept_through(late, self._input.config)

    def _answered_with_cancel(self, dispatch_id: str, handle: workflow.ActivityHandle[Any]) -> bool:
        """Whether the agent's answer came in the workflow task whose cancel was raised first (asyncio raises a
        cancel into an await whose condition the same task met), and is taken (PATCH_WRITE_SURVIVES_CANCEL)."""
        receipt = handle.result() if handle.done() and not handle.cancelled() and handle.exception() is None else None
        in_result = receipt is not None and receipt.answer is not None
        if not (dispatch_id in self._answers or in_result) or not SLAVE_PATCHES.patched(PATCH_WRITE_SURVIVES_CANCEL):
            return False
        if dispatch_id not in self._answers and receipt is not None:
            self._receive_answer(receipt.answer, came_as="the agent activity's result")
        return dispatch_id in self._answers

    async def _finish_story_git(self, meta: StoryMeta) -> None:
        """command backend only: squash the done story's branch (P28) and merge it back locally."""
        try:
            result = await merge_story_back(self._input.project_root, self._input.session_id, meta, self._input.config)
            outcome = MergeOutcome.of(result)
        except ActivityError as err:
            # The batch is cancelled (its sprint too): not a merge failure after which the next story starts.
            if is_cancelled_exception(err) and SLAVE_PATCHES.patched(PATCH_CANCEL_STOPS_GIT):
                raise
            outcome = MergeOutcome.failed(_cause(err))
        self._merged.append(meta.key)
        if outcome.note is not None:
            workflow.logger.warning("[Slave] %s %s", meta.key, outcome.note)
            self._progress[meta.key] = self._progress[meta.key].model_copy(
                update={"error": outcome.note, "work_left_out": outcome.work_left_out}
            )
        if outcome.note is not None or self._reports_merges:
            self._publish(meta.key)  # the Master holds a batch touching its files until it hears this

    async def _commit(self, before: StoryProgress, transition: Transition) -> None:
        """U4: the new state reaches sprint-status.yaml before anything else happens; a cancel that came meanwhile
        (or with the agent's answer) is raised once it has (PATCH_WRITE_SURVIVES_CANCEL)."""
        await self._change_state(before, transition)
        if self._cancel_pending:
            raise asyncio.CancelledError

    async def _change_state(self, before: StoryProgress, transition: Transition) -> None:
        after = transition.progress
        # A step that keeps the state (a review asking a fix, the fix answered) writes nothing: it compares, so a
        # story set by hand meanwhile is taken, not reviewed and fixed on and on (PATCH_SAME_STATE_COMPARED).
        compares = (
            after.state == before.state
            and not is_terminal(after)
            and SLAVE_PATCHES.patched(PATCH_SAME_STATE_COMPARED)
        )
        if after.state != before.state or compares:
            # A local activity: the write runs in this worker within the workflow task (one marker event,
            # no activity task round trip through the server); same timeout, retries and idempotency.
            write = StatusWriteInput(
                project_root=self._input.project_root,
                status_file=self._input.status_file,
                story_key=before.key,
                expected=before.state,
                new=after.state,
                watch=self._not_started(besides=before.key),
                wait_when_unreadable_after=STATUS_FILE_WAIT_AFTER_ATTEMPTS if self._waits_for_status_file() else None,
            )
            found_parsing = 0  # waits that found the file parsing at once: the write fails for another reason
            while True:
                try:
                    summary = f"U4 {before.key}: {before.state} -> {after.state}"
                    if SLAVE_PATCHES.patched(PATCH_WRITE_SURVIVES_CANCEL):
                        writing = workflow.start_local_activity(write_story_status, write, summary=summary, **STATUS_WRITE_OPTIONS)
                        self._cancel_pending = await _finished_through_cancel(writing) or self._cancel_pending
                        written = writing.result()
                    else:
                        written = await workflow.execute_local_activity(
                            write_story_status, write, summary=summary, **STATUS_WRITE_OPTIONS
                        )
                    break
                except (ActivityError, ApplicationError) as err:  # a local activity's failure may come unwrapped
                    if is_cancelled_exception(err):  # the batch is cancelled: the story keeps its state
                        raise
                    problem: str | None = _cause(err)
                    if _error_type(err) == UNREADABLE_ERROR_TYPE and self._waits_for_status_file() and found_parsing < 2:
                        # Its agent's tokens count meanwhile (and if the batch is cancelled while it waits).
                        self._progress[before.key] = self._progress[before.key].model_copy(
                            update={"tokens_used": after.tokens_used}
                        )
                        problem, was_broken = await self._wait_for_status_file([before.key], _cause(err))
                        found_parsing = 0 if was_broken else found_parsing + 1
                        if problem is None:
                            continue  # it parses again: the same write, once more
                # The file cannot take the write (the story renamed or removed, the file moved out of the
                # project): this story stops here, the batch's other stories go on.
                after = intervention(
                    before,
                    f"sprint-status.yaml could not be written ({problem}); "
                    f"{before.state} -> {after.state} not recorded",
                    after.tokens_used - before.tokens_used,
                ).progress
                self._progress[before.key] = after
                workflow.logger.error("[Slave] %s: %s", before.key, after.error)
                self._publish(before.key)
                return
            if written.outcome == "cas-mismatch":
                # Someone else changed the story: the Slave must not overwrite it, nor go on with it.
                if SLAVE_PATCHES.patched(PATCH_SETTLED_BY_HAND):  # set done (or skipped) by hand: taken as it is
                    tokens = after.tokens_used - before.tokens_used
                    after = changed_by_hand(before, before.state, written.current, tokens).progress
                else:
                    after = intervention(
                        before,
                        f"sprint-status.yaml changed under the Slave (expected {before.state!r}, "
                        f"found {written.current!r}); nothing written",
                    ).progress
            # Stories of the batch set by hand since the last read: taken before any agent works on them.
            self._publish_file_states(self._take_file_states(written.watched_changes))
            self._states_read_at = workflow.now()
        self._progress[before.key] = after
        workflow.logger.info("[Slave] %s: %s", before.key, transition.note)
        self._publish(before.key)

    def _waits_for_status_file(self) -> bool:
        return not self._cancel_pending and SLAVE_PATCHES.patched(PATCH_WAITS_FOR_STATUS_FILE)

    async def _wait_for_status_file(
        self, keys: list[str], problem: str, on_shutdown: bool = False
    ) -> tuple[str | None, bool]:
        """sprint-status.yaml does not parse: `keys` wait, shown so, until it does (None), or until a problem no
        wait mends comes up, or (`on_shutdown`: nothing of theirs started yet) the batch is shut down (that
        problem). Also whether the wait found the file broken at all."""
        workflow.logger.warning(
            "[Slave] sprint-status.yaml does not parse; %s wait%s for it: %s",
            ", ".join(keys), "s" if len(keys) == 1 else "", problem,
        )
        self._mark_status_file_problem(keys, problem)
        wait = workflow.start_activity(
            wait_for_status_file,
            LoadStatusInput(project_root=self._input.project_root, status_file=self._input.status_file),
            **STATUS_FILE_WAIT_OPTIONS,
        )
        outcome: str | None = None
        was_broken = True
        if on_shutdown:
            try:
                await workflow.wait_condition(lambda: wait.done() or self._shutdown)
            except asyncio.CancelledError:
                wait.cancel()  # the batch is cancelled: so is its wait
                raise
            if not wait.done():
                wait.cancel()
                outcome = f"{problem} (the batch was shut down while it waited)"
        try:
            was_broken = await wait
        except ActivityError as err:
            if is_cancelled_exception(err) and outcome is None:
                raise
            outcome = outcome or _cause(err)
        self._mark_status_file_problem(keys, None)
        workflow.logger.info("[Slave] sprint-status.yaml %s", "parses again" if outcome is None else outcome)
        return outcome, was_broken

    def _mark_status_file_problem(self, keys: list[str], problem: str | None) -> None:
        """`keys` wait for the status file (shown so), or no longer do (None)."""
        for key in keys:
            self._progress[key] = self._progress[key].model_copy(update={"status_file_problem": problem})
            self._publish(key)

    def _not_started(self, besides: str) -> dict[str, str]:
        return {
            key: progress.state
            for key, progress in self._progress.items()
            if key != besides and not progress.started and not is_terminal(progress)
        }

    # --- working time ----------------------------------------------------------------------------

    def _idle(self) -> bool:
        """Time that does not count against the batch's working time: paused, or a story waits for a human (a
        decision, or a status file to mend)."""
        return self._paused or any(p.awaiting_decision or p.status_file_problem for p in self._progress.values())

    async def _watch_working_time_by_timer(self, limit: timedelta) -> None:
        """Sets `_out_of_time` once the batch has worked `limit` (slave_timeout_seconds), idle time not counted
        (PATCH_WORKING_TIME_BY_TIMER). Each working stretch runs a timer for the time left: it fires only when
        the limit is worked; an idle stretch cancels it, and the clock says how much of it was worked. A batch
        that ends within its limit leaves its timer to fire after it (no cancel command)."""
        worked = timedelta(0)
        while not self._closing:
            if self._idle():
                await workflow.wait_condition(lambda: not self._idle() or self._closing)
                continue
            since = workflow.now()
            # At least a second: the clock may put `worked` at the limit a moment before the timer would fire.
            length = max(limit - worked, timedelta(seconds=1))
            timer = asyncio.create_task(workflow.sleep(length, summary=WORKING_TIME_SUMMARY))
            await workflow.wait_condition(lambda: timer.done() or self._idle() or self._closing)
            if timer.done():
                if SLAVE_PATCHES.patched(PATCH_WORKING_TIME_WAKES_AFTER_SLEEP) and await self._slept_through(
                    LatenessInput(timer_summary=WORKING_TIME_SUMMARY, worker_down_counts=True, **self._own_run())
                ):
                    # Fired when the server ran again, or taken up when a worker did: the stretch was slept
                    # through, and is not counted.
                    workflow.logger.warning("[Slave] working time: the stretch was slept through; not counted")
                    continue
                self._run_out_of_time(limit)
                return
            if self._closing:
                return
            timer.cancel()
            worked += workflow.now() - since  # the clock sets only the next timer's length, never a decision

    async def _watch_working_time(self, limit: timedelta) -> None:
        """Before PATCH_WORKING_TIME_BY_TIMER: sets `_out_of_time` once the batch has worked `limit`, idle time
        not counted, by the sum of the clock's readings. One timer at a time, left to fire."""
        worked = timedelta(0)
        timer: asyncio.Task[None] | None = None
        while not self._closing:
            if self._idle():
                await workflow.wait_condition(lambda: not self._idle() or self._closing)
                continue
            since = workflow.now()
            if timer is None or timer.done():
                timer = asyncio.create_task(workflow.sleep(limit - worked, summary=WORKING_TIME_SUMMARY))
            pending = timer
            await workflow.wait_condition(lambda: pending.done() or self._idle() or self._closing)
            worked += workflow.now() - since
            if worked >= limit and not self._closing:
                self._run_out_of_time(limit)
                return

    def _run_out_of_time(self, limit: timedelta) -> None:
        self._out_of_time = (
            f"batch {self._input.batch_id} out of time: it worked {int(limit.total_seconds())} s "
            "(slave_timeout_seconds; time paused or waiting for a decision not counted); the step in "
            "flight finished, no step was started after it, and the stories not finished keep their state"
        )
        workflow.logger.warning("[Slave] %s", self._out_of_time)
        self._show()

    # --- visibility ----------------------------------------------------------------------------

    def _merges_back(self, progress: StoryProgress) -> bool:
        """command backend: a story this batch worked on and brought to done has its branch merged back."""
        return self._input.agent_backend == "command" and progress.started and progress.state == "done"

    def _view(self, story_key: str) -> StoryView:
        progress = self._progress[story_key]
        merging = self._reports_merges and self._merges_back(progress) and story_key not in self._merged
        return story_view(progress, self._input.batch_id, merging)

    def _publish(self, story_key: str) -> None:
        self._show()
        parent = workflow.info().parent
        if parent is None:
            return
        self._outbox.append(
            StoryUpdate(
                batch_id=self._input.batch_id,
                story_key=story_key,
                view=self._view(story_key),
            )
        )
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_updates(parent.workflow_id))

    async def _send_updates(self, master_id: str) -> None:
        """One story_updates signal at a time, with every update made since the previous one, in order: the
        first goes out with the workflow task that made it; later ones at most once per STORY_UPDATES_HOLD."""
        handle = workflow.get_external_workflow_handle(master_id)
        if self._updates_held_without_clock:
            return await self._send_updates_held(handle)
        while self._outbox:
            sent_at = self._updates_sent_at
            since = workflow.now() - sent_at if sent_at is not None else STORY_UPDATES_HOLD
            if sent_at is not None and since < STORY_UPDATES_HOLD and not self._closing:
                # At most one signal per hold: it ends on the first workflow task after it (most often an agent's
                # answer), or on its timer when the Slave is idle.
                await self._hold(sent_at, STORY_UPDATES_HOLD - since)
            if self._closing and self._updates_in_result:
                return  # what is left goes with the Slave's result (run)
            self._updates_sent_at = workflow.now()
            await self._send_outbox(handle)

    async def _send_outbox(self, handle: workflow.ExternalWorkflowHandle[Any]) -> None:
        """One story_updates signal with every update in the outbox, in order."""
        updates, self._outbox = self._outbox, []
        try:
            await handle.signal(SIGNAL_STORY_UPDATES, StoryUpdates(updates=updates))
        except Exception as err:  # noqa: BLE001 - the Master is gone: nobody to tell
            workflow.logger.warning("[Slave] story updates not delivered: %s", err)

    async def _send_updates_held(self, handle: workflow.ExternalWorkflowHandle[Any]) -> None:
        """Each signal is followed by a hold of STORY_UPDATES_HOLD on a timer (cut short when the Slave closes);
        what came meanwhile goes out when it ends, at once, as from a new sender: the same whichever order a
        task's events are taken in on replay, with no clock read."""
        while self._outbox:
            if self._closing and self._updates_in_result:
                return  # what is left goes with the Slave's result (run)
            await self._send_outbox(handle)
            if self._closing and not self._updates_held_after_close:
                continue
            await hold(STORY_UPDATES_HOLD, self._hold_timers, lambda: self._closing, STORY_UPDATES_HOLD_SUMMARY)

    async def _hold(self, sent_at: datetime, remaining: timedelta) -> None:
        def hold_over() -> bool:
            return self._closing or workflow.now() - sent_at >= STORY_UPDATES_HOLD

        if not SLAVE_PATCHES.patched(PATCH_HOLD_TIMER_NOT_CANCELLED):
            try:  # sprints started before the patch: the timer is cancelled when the hold ends otherwise
                await workflow.wait_condition(hold_over, timeout=remaining, timeout_summary=STORY_UPDATES_HOLD_SUMMARY)
            except asyncio.TimeoutError:
                pass
            return
        await hold(remaining, self._hold_timers, hold_over, STORY_UPDATES_HOLD_SUMMARY)

    def _show(self) -> None:
        rows = [
            f"| `{k}` | {p.state} | {p.review_rounds} | {p.fix_rounds} | "
            f"{describe_in_flight(p.pending_agent, p.pending_mode, p.pending_debug_id)}"
            f"{' awaiting decision: ' + p.awaiting_decision if p.awaiting_decision else ''}"
            f"{' waits for sprint-status.yaml to parse: ' + p.status_file_problem if p.status_file_problem else ''} |"
            for k, p in self._progress.items()
        ]
        workflow.set_current_details(
            f"**Batch {self._input.batch_id}** of `{self._input.session_id}`"
            + (" (shutting down)" if self._shutdown else "")
            + (" (paused: no new dispatch)" if self._paused else "")
            + (" (out of time: no new dispatch)" if self._out_of_time else "")
            + (f" ({self._current} waits for {', '.join(self._waiting_for)})" if self._waiting_for else "")
            + "\n\n| story | state | review round | fixes | agent in flight |\n|---|---|:-:|:-:|---|\n"
            + "\n".join(rows)
        )


async def merge_story_back(project_root: str, session_id: str, meta: StoryMeta, config: SprintConfig) -> FinishStoryResult:
    """command backend: squash the done story's branch (P28) and merge it back into the project's branch. The
    Slave does it for each done story; the Master for a story whose batch ended during it (finish_story_git is
    idempotent: a merge that landed answers from its record)."""
    return await workflow.execute_activity(
        finish_story_git,
        FinishStoryInput(
            project_root=project_root,
            session_id=session_id,
            story_key=meta.key,
            story_title=meta.title,
            story_path=meta.story_path,
            squash=config.git_squash_strategy == "per_story",
            clear_track=config.auto_clear_git_track,
        ),
        task_queue=agents_task_queue_for(workflow.info().task_queue),
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=timedelta(seconds=FINISH_GIT_HEARTBEAT),  # a worker killed mid-merge: retried then
        retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["AgentConfigError"]),
        summary=f"squash and merge story {meta.key}",
    )


def invalid_decision(message: str) -> ApplicationError:
    """A decision (decide update) refused: sent again as it is, it would be refused again."""
    return ApplicationError(message, type="InvalidDecision", non_retryable=True)


def _no_po_message(answer: AgentComplete, wanted: str, phase: str) -> str | None:
    """Why a gated dispatch's successful answer holds no PO message at all: the agent wrote a plain AGENT_COMPLETE
    (a home-made agent that knows nothing of the gates), not a message with fields missing."""
    if answer.po_message is not None:
        return None
    return (
        f"an AGENT_COMPLETE came where the {phase} phase asks for a {wanted}: for an agent that writes only an "
        "AGENT_COMPLETE, turn the PO gates off with --set po_gates_enabled=false"
    )


def _with_spent(
    progress: StoryProgress, step: DispatchStep, answer: AgentComplete | str, spent: int
) -> AgentComplete | str | Transition:
    """A gated step's last answer, carrying the tokens of its earlier dispatches (they count toward the budget)."""
    if spent <= 0:
        return answer
    if isinstance(answer, AgentComplete):
        return answer.model_copy(update={"tokens_used": answer.tokens_used + spent})
    return intervention(progress, f"{step.agent_type.value}/{step.mode.value}: {answer}", spent)


async def _finished_through_cancel(task: asyncio.Task[Any]) -> bool:
    """Awaits `task` to its end (its outcome left in it), a cancel of the awaiting task meanwhile not passed on to
    it: whether one came."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # noqa: BLE001 - the task failed (its result() raises it), or else it is not this wait's
            if not task.done():
                raise
    return cancelled


def _consume_outcome(task: asyncio.Task[Any]) -> None:
    """An agent activity whose answer already arrived may still end later; its outcome is not needed."""
    if not task.cancelled():
        task.exception()


def _timeout_type(err: BaseException) -> TimeoutType | None:
    """The kind of timeout that ended the activity, if a timeout did."""
    cause = err.__cause__
    return cause.type if isinstance(cause, ActivityTimeoutError) else None


def external_deadline_summary(dispatch_id: str) -> str:
    """The name of the timer that keeps an external agent's deadline (its lateness is read by this name)."""
    return f"deadline of external agent {dispatch_id}"


def _deadline_passed(err: BaseException) -> bool:
    """The agent activity ran out of its schedule-to-close time, the agent's deadline, or was not started
    within it (no separate schedule-to-start time is set, so the server's default is the deadline)."""
    kind = _timeout_type(err)
    return kind is TimeoutType.SCHEDULE_TO_CLOSE or (
        kind is TimeoutType.SCHEDULE_TO_START and SLAVE_PATCHES.patched(PATCH_UNSTARTED_AGENT_OUT_OF_TIME)
    )


def _error_type(err: BaseException) -> str | None:
    """The ApplicationError type at the root of an activity failure, if any."""
    while err.__cause__ is not None:
        err = err.__cause__
    return err.type if isinstance(err, ApplicationError) else None


def _cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return err.message if isinstance(err, ApplicationError) else str(err)

