"""SprintMasterWorkflow: one sprint session. Reads the status file, plans batches, runs one
SprintSlaveWorkflow child per batch and reports.

Started from the temporal CLI:
  temporal workflow start --type SprintMasterWorkflow --task-queue bso-sprint --input '{"project_root": "..."}'

All of the Master's knowledge is one typed model (`MasterState`), so a long sprint can continue as new
between batches, before its history grows large, and pick up exactly where it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows.history import history_is_long_now
    from workflows.inputs import RawInput, required_input

    from activities.improvements import add_improvement_stories, propose_improvements
    from activities.status_file import (
        FILE_WORK_HEARTBEAT,
        PROJECT_BUSY_ERROR,
        UNREADABLE_ERROR_TYPE,
        load_sprint_status,
        write_story_status,
    )
    from activities.backends.command import stop_sprint_agents
    from activities.summary import SummaryInput, write_execution_summary
    from bso.config import ConfigError, SprintConfig, limits_error, resolve_config
    from bso.constants import (
        CHILD_WORKFLOW_TASK_TIMEOUT,
        HANDING_OVER,
        QUERY_REPORT,
        QUERY_STATUS,
        SA_BATCH_ID,
        SA_PHASE,
        SA_SESSION_ID,
        SIGNAL_DECISION,
        SIGNAL_DEPENDENCY_UPDATE,
        SIGNAL_PAUSE,
        SIGNAL_RESUME,
        SIGNAL_SHUTDOWN,
        SIGNAL_STORY_UPDATE,
        SIGNAL_STORY_UPDATES,
        SLAVE_CANCEL_WAIT,
        UPDATE_DECIDE,
        agents_task_queue_for,
        session_id_error,
        slave_workflow_id,
        sprint_id_characters_error,
        sprint_id_collision,
        sprint_id_length_error,
    )
    from bso.dependencies import (
        UNFINISHED,
        dependencies_waited_for,
        never_done,
        skipped_for,
        state_for_dependants,
    )
    from bso.decisions import (
        Decision,
        DecisionError,
        DecisionRequest,
        check_rearm,
        dependants_brought_back,
        rearm_hint,
        rearm_position,
        skipped_for_stories_pending_again,
    )
    from bso.dispatch import BudgetLevel, StopAgentsInput, budget_level, budget_still_exhausted, budget_warning
    from bso.messages import (
        PATCH_STORY_UPDATE_FROM_ITS_BATCH,
        BatchSpec,
        RejectedMessage,
        describe_validation_error,
        keep_rejected,
        rejected_invalid,
        story_key_too_long,
        story_update_not_from_its_batch,
        unknown_signal_to_sprint,
    )
    from bso.models import (
        LoadStatusInput,
        MasterState,
        ResumeRequest,
        SlaveInput,
        SlaveResult,
        SprintInput,
        SprintReport,
        SprintStatusView,
        StatusSnapshot,
        StatusWriteInput,
        StatusWriteResult,
        StoryMeta,
        StoryProgress,
        StoryUpdate,
        StoryView,
        StoryWork,
        TERMINAL_VALUES,
        pause_reason,
        short_key,
    )
    from bso.story_tally import StoryTally
    from bso.improvements import (
        AddStoriesInput,
        ImprovementRecord,
        NewStory,
        ProposeInput,
        improvement_story_keys,
        last_epic,
        select_improvements,
    )
    from bso.po_gates import gate_totals
    from bso.delivery import sprint_message_errors
    from bso.report import batch_errors, build_slave_result, settled_of, sprint_status, undelivered_stories
    from bso.simulation import SimulationScript
    from bso.sprint_status import (
        EPIC_NOT_A_BOOL,
        NO_STORIES,
        EMPTY_STORY_SELECTION,
        NOTHING_TO_RUN,
        SETTLED_AT_START,
        UnknownEpicError,
        epic_as_given,
        epic_numbered,
        project_root_error,
        resolve_epic,
        named_keys_error,
        resolve_story_keys,
        stories_outside_epic_error,
        shared_numbers,
        too_large_to_carry,
    )
    from bso.planning import SHUTTING_DOWN, history_hold, startable_batch, still_on_its_files
    from bso.states import ENDED_PHASES, TERMINAL_STATES, AgentBackend, SprintPhase, SprintStatus, StoryState
    from bso.roster import slave_name, temp_name
    from workflows.course_corrector import CourseCorrector
    from workflows.planner import ScrumMasterPlanning
    from workflows.residents import PATCH_ROSTER_ALWAYS_HELD, PATCH_ROSTER_HELD_AFTER_FLUSH, RosterKeeper
    from workflows.sprint_slave import SprintSlaveWorkflow, invalid_decision, merge_story_back
    from bso.git_rules import MergeOutcome

# The Master's file activities: a worker killed in the middle of one is noticed within it (they heartbeat).
FILE_ACTIVITY_HEARTBEAT = timedelta(seconds=FILE_WORK_HEARTBEAT)
# A Slave still starting when the sprint was shut down is told once it has started.
PATCH_SHUTDOWN_AFTER_START = "master-shutdown-after-start"
# An update that came while the sprint settled its course corrections finishes before the sprint ends.
PATCH_ENDING = "master-updates-before-end"
# A decide update answers (refused) when its batch ends first, and two for one story cannot both wait.
PATCH_DECIDE_ENDS = "master-decide-ends-with-batch"
# A new sprint leaves out needs-intervention and skipped stories (it counted them as its own failures).
PATCH_SETTLED_LEFT_OUT = "master-settled-stories-left-out"
# One rearm of a story at a time: a second one sent together (a retry, two operators) saw needs-intervention too,
# its status write answered already-applied, and the story was queued (and run) twice.
PATCH_ONE_REARM = "master-one-rearm-at-a-time"
# A rearmed story runs before the queued batches of stories that depend on it: queued behind them, the first
# such batch waited for it, and the rearm's batch could not start until that one ended (a deadlock until the
# Slave's timeout with one Slave at a time).
PATCH_REARM_BEFORE_DEPENDANTS = "master-rearm-before-dependants"
PATCH_FAILURE_STOPS_RESIDENTS = "master-failure-stops-residents"
# A rearm brings back, in its batch, the stories skipped because the rearmed one would never be done (no rearm
# took a skipped story: they stayed skipped, their state overwritten, and the next sprint had nothing to run).
# Patched only where it brings one back.
PATCH_REARM_BRINGS_BACK_DEPENDANTS = "master-rearm-brings-back-dependants"
# ... and the stories a batch still running at the rearm skipped after it (one sat behind a slow story, or its skip
# was on its way), once that batch ends: they stayed skipped. Patched only where a batch skipped one for a story.
PATCH_BRINGS_BACK_SKIPPED_AFTER_REARM = "master-brings-back-skipped-after-rearm"
# A skipped story a rearm would bring back, found set to done by hand, is taken as done (it stayed skipped in the
# report, and the stories skipped for it stayed skipped). Patched only where one is.
PATCH_BRING_BACK_TAKES_DONE_BY_HAND = "master-bring-back-takes-done-by-hand"
# A rearm and a course correction exclude each other: the correction replaces the queue (the rearm's batch was
# lost) and plans with batch ids the rearm could take too.
REARM_DURING_REPLAN = "a course correction is being applied: send the rearm again once it is done"
# Improvement stories are numbered after every story of their epic in the file, not only the sprint's: `1-3-imp-`
# next to a `1-3-...` outside the sprint made the short key 1-3 ambiguous.
PATCH_IMPROVEMENTS_AFTER_ALL = "master-improvements-numbered-after-all"
# Proposals that cannot be read (the activity failed for good) leave the sprint's done stories done, with an error
# saying so: the sprint failed.
PATCH_IMPROVEMENT_PROPOSALS_MAY_FAIL = "master-improvement-proposals-may-fail"
# A cancel that comes while the improvement stories are being added ends the sprint cancelled. The cancelled
# activity was taken for a failure to add them: the sprint ran on and reported complete, its cancel lost.
PATCH_IMPROVEMENTS_ADD_CANCELLED = "master-improvements-add-cancelled"
# A batch waits while a running batch's unfinished story touches a file one of its stories touches (their agents
# edited it at once, and with the command backend the second squash conflicted: its story was not merged).
PATCH_HOLD_SHARED_FILES = "master-holds-batches-sharing-files"
# A sprint whose status file has stories but none to run fails at its start, as `bso sprint start` refuses it (one
# started with the temporal CLI ended sprint-complete with 0 stories, which told the user nothing).
PATCH_NOTHING_TO_RUN = "master-nothing-to-run"
# `"story_keys": []` selects no story and fails the sprint at its start: it was taken for no selection and the
# sprint ran every open story of the file. Patched only where the list is empty: such a sprint replays as it ran.
PATCH_EMPTY_SELECTION_REFUSED = "master-empty-story-selection-refused"
# A knob past what a workflow can hold (bso.config.limits_error: 1e20 seconds) is refused at the start; it failed
# the Slave's workflow task on every retry. Patched only where it refuses: a sprint started before with a large
# but workable value (400 days) replays as it ran.
PATCH_CONFIG_LIMITS = "master-config-limits"
# The same for a status file that lists no story at all (it ended sprint-complete with 0 batches).
PATCH_NO_STORIES = "master-no-stories"
# A story whose key is too long for an agent's answer to name it is left out, saying so: its agents ran and
# their answers were refused, until each step's deadline ended the story needs-intervention.
PATCH_LONG_KEYS_LEFT_OUT = "master-long-story-keys-left-out"
# A cancelled sprint stops its residents at once (SIGNAL_STOP_NOW): told to stop as at a sprint's end, a resident
# first served what it held, and an analysis no worker picked up held the cancelled sprint for ever.
PATCH_CANCEL_STOPS_RESIDENTS_NOW = "master-cancel-stops-residents-now"
# A batch that ended abnormally (timed out, terminated) while its done story was being merged back: the Master
# finishes the merge itself before the story's dependants go on (they went on with the merge unconfirmed).
PATCH_FINISH_CUT_MERGES = "master-finishes-cut-merges"
# A cancelled sprint writes its execution summary too (with the report the `report` query then answers).
PATCH_CANCEL_WRITES_SUMMARY = "master-cancel-writes-summary"
# A batch that ended abnormally has the stories rearmed out of it while it ran in its result (their agents and
# tokens were lost from the report and the sprint's total).
PATCH_ABNORMAL_COUNTS_REARMED = "master-abnormal-batch-counts-rearmed-tokens"
# A Slave counts its own working time against slave_timeout_seconds (PATCH_WORKING_TIME_LIMIT): no execution
# timeout, which ran on while the batch was paused or waited for a human and killed it with its agent in flight.
PATCH_SLAVE_WITHOUT_EXECUTION_TIMEOUT = "master-slave-without-execution-timeout"
# A cancelled sprint (command backend) stops its agents still running: those whose worker was down when the cancel
# came (stopped gracefully, or killed) heard nothing of it and ran on until their launcher's backstop.
PATCH_CANCEL_STOPS_AGENTS = "master-cancel-stops-agents"
STOP_AGENTS_PATIENCE = timedelta(minutes=2)
# A sprint id that another sprint gives its batch or resident (`zz/batch-1`) is refused at the start: sprint `zz`
# then failed to start that child, with "Workflow execution already started" and no word of which.
PATCH_SPRINT_ID_CHECKED = "master-sprint-id-not-a-childs"
# A sprint id too long for its agents' dispatch ids (bso.constants.MAX_SPRINT_ID_CHARS) is refused at the start:
# every story of the sprint failed, on a validation error of its agent's answer.
PATCH_SPRINT_ID_LENGTH = "master-sprint-id-length"
# A session_id other than the workflow id is refused at the start: a sprint given another running sprint's id
# talked to that sprint's residents and, failing, stopped them.
PATCH_SESSION_ID_IS_WORKFLOW_ID = "master-session-id-is-workflow-id"
# A simulation script with a token count the Slave refuses (bso.dispatch.implausible_tokens) is refused at the
# start: each such story waited out its agent's time.
PATCH_SIMULATION_TOKENS_BOUNDED = "master-simulation-tokens-bounded"
# A simulation script too large to copy into each resident's and batch's start is refused at the start: its copies
# made the history long before the first batch, and the Master continued as new for ever.
PATCH_SIMULATION_SIZE_BOUNDED = "master-simulation-size-bounded"
# A simulation script's values that only converted fit (`"tokens": true` read as 1) are refused at the start.
PATCH_SIMULATION_UNCONVERTED = "master-simulation-unconverted"
# An epic and stories outside it, both given (the temporal CLI), are refused at the start as `bso sprint start`
# refuses them: the sprint ran the epic's and dropped the others in silence.
PATCH_STORIES_OUTSIDE_EPIC_REFUSED = "master-stories-outside-epic-refused"
# A cancel cancels the Slaves that have started; one still starting is cancelled once it has. The server refuses a
# workflow task that starts a child and requests its cancel together: a cancel that came in the task that started
# a batch failed the Master's task on every retry (the sprint never ended).
PATCH_CANCEL_STARTED_SLAVES = "master-cancel-started-slaves"
# A sprint that runs on after its cancel (a cancel the SDK let a delivered signal swallow: the fail_fast SHUTDOWN,
# a plan request) ends cancelled before its normal end, and a wait for a resume or a re-plan ends with the cancel.
# It reported complete (partial), or a paused one held the cancel's wind-down for its full 30 s.
PATCH_SWALLOWED_CANCEL_ENDS_SPRINT = "master-swallowed-cancel-ends-sprint"
# The workflow task in which a batch's end is taken in always sends a command (the memo `last_batch_ended`, which
# the Web UI shows). Without one, sdk-core replays it joined with the next task, whose signals it applies first:
# a resume (or a cancel) that came after the batch's end live came before it on replay, and went to that batch
# too (a nondeterminism error: the SDK runs a task's signals to the end before it takes in its other events).
PATCH_BATCH_END_SENDS_A_COMMAND = "master-batch-end-sends-a-command"
# A cancelled sprint lets the updates it accepted before the cancel finish (a rearm's write, a course correction's
# plan and writes) before it reports and stops its residents: it ended with them unanswered, and a rearm's write
# landed after the sprint had ended, the file saying ready-for-dev where the report said needs-intervention.
# Asked only where a handler is still running (an update, or the shutdown signal's forwarding); the wait is bounded
# (a decision whose batch did not end waits no more).
PATCH_UPDATES_ANSWERED_ON_CANCEL = "master-updates-answered-on-cancel"
HANDLERS_CANCEL_WAIT = timedelta(minutes=2)
# Stories that share a number (`1-2-login`, `1-2-logout`) are refused at the start: in one batch the second took
# the first one's answers for its own (their dispatch ids are named by the number) and ended done with no agent
# of its own run. Patched only where it refuses.
PATCH_SHARED_NUMBERS_REFUSED = "master-shared-story-numbers-refused"
# A sprint id too long or with control characters is refused before any command carries it (_start). Patched
# only where it refuses.
PATCH_SPRINT_ID_REFUSED_FIRST = "master-sprint-id-refused-first"
# A pause's reason is cut at MAX_PAUSE_REASON_CHARS: it is kept, shown and forwarded to every running batch, and
# one of 1.5 MB forwarded to three made the workflow task's reply too large: the server terminated the sprint.
# Patched only where it cuts.
PATCH_PAUSE_REASON_CUT = "master-pause-reason-cut"
MAX_PAUSE_REASON_CHARS = 2000  # as a decision's note
# A sprint whose stories would make its carried state too large for one payload is refused at the start
# (bso.sprint_status.too_large_to_carry): 6,000 stories ran until the first hand-over, whose workflow task then
# failed on every retry. Patched only where it refuses.
PATCH_SPRINT_SIZE_BOUNDED = "master-sprint-size-bounded"
# `"epic": true` is refused (it ran epic 1) and `"epic": "01"` names epic 1 (it named none).
PATCH_EPIC_SPELLINGS = "master-epic-spellings"

# The sprint's token budget over all its running batches (_mind_the_budget): past the limit they finish the story
# in hand and start no other. Asked only then.
PATCH_BUDGET_OVER_ALL_BATCHES = "master-budget-over-all-batches"
# A resume that leaves the budget used up keeps the sprint paused, saying so: with no batch running, the Master's
# loop spun (the pause cleared, no batch allowed to start), a deadlock failing its task on every retry.
PATCH_RESUME_OVER_BUDGET_STAYS_PAUSED = "master-resume-over-budget-stays-paused"
# A story_priorities key naming no story of the status file is refused, as `bso sprint start` refuses it. Asked
# only then.
PATCH_NAMED_KEYS_CHECKED = "master-named-keys-checked"
# A story set to needs-intervention in the status file by hand (StoryView.set_by_hand) is not counted towards
# consecutive_failure_threshold. Asked only for such a story.
PATCH_HAND_SET_IS_NO_FAILURE = "master-hand-set-is-no-failure"
# A `carried_state` in the input of a sprint started by hand (it is the sprint's own hand-over to its next run):
# it skipped the start's checks and its claim, and a queue naming a story it did not hold failed the workflow task
# in a loop. Asked only then.
PATCH_CARRIED_STATE_ONLY_HANDED_OVER = "master-carried-state-only-handed-over"
CARRIED_STATE_BY_HAND = (
    "carried_state: it is what a sprint hands over to its next run (continue-as-new), not an input of a new "
    "sprint; leave it out"
)


def _invalid_input(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidSprintInput", non_retryable=True)


@workflow.defn(failure_exception_types=[ValidationError])
class SprintMasterWorkflow(RosterKeeper, CourseCorrector, ScrumMasterPlanning):
    @workflow.init
    def __init__(self, inp: SprintInput | RawInput | None = None) -> None:
        inp = self._input = required_input(inp, SprintInput)
        self._state = inp.carried_state or MasterState(session_id=inp.session_id or workflow.info().workflow_id)
        self._tally = StoryTally.of(self._state.views)  # kept by _put_view: the details count without a walk
        self._running_batches: dict[int, str] = {}  # batch id -> Slave workflow id
        self._told_over_budget: set[int] = set()  # running batches sent a shutdown for the sprint's budget
        self._cancelling = False  # a cancel request came: no batch starts any more
        self._cancel_slaves_once_started = False  # PATCH_CANCEL_STARTED_SLAVES, decided at the cancel
        self._batch_end_sends_a_command = False  # PATCH_BATCH_END_SENDS_A_COMMAND, decided at the run's start
        self._cancel_ends_sprint = False  # PATCH_SWALLOWED_CANCEL_ENDS_SPRINT, decided at the cancel
        # The first view of a story after its decision was applied (a Slave's updates arrive batched: later
        # ones of the same signal may already show the story moved on).
        self._decided_views: dict[str, StoryView] = {}
        # story key -> the decision on its way (a decide update waiting for the Slave, or a rearm being written)
        self._deciding: dict[str, Decision] = {}
        self._ending = False  # the sprint will start no batch any more: it is closing
        self._handing_over = False  # continuing as new: the next run takes rearms and course corrections
        self._init_roster()
        self._init_course_correction()
        self._init_planning()
        self._project_root = inp.project_root
        self._started_batches: set[int] = set()  # running batches whose Slave has started (signalable)
        self._running_specs: dict[int, BatchSpec] = {}  # the batches _run_batches started, until they end
        self._hold_shared_files = False  # PATCH_HOLD_SHARED_FILES
        self._forwards: list[asyncio.Task[None]] = []  # signals forwarded to Slaves
        self._batch_tasks: dict[int, asyncio.Task[SlaveResult]] = {}  # running batch id -> its _run_slave task
        self._ended_report: SprintReport | None = None  # the `report` query's answer once the sprint has ended
        # (batch id, story key, its last view there) of each story rearmed out of a batch still running (none runs
        # at a continue-as-new)
        self._left_running_batches: list[tuple[int, str, StoryView]] = []

    # --- operator messages ---------------------------------------------------------------------

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> SprintStatusView:
        s = self._state
        return SprintStatusView(
            session_id=s.session_id,
            phase=s.phase,
            current_batch=min(self._running_batches) if self._running_batches else None,
            running_batches=sorted(self._running_batches),
            finished_batches={r.batch_id: settled_of(r, s.views) for r in s.results},
            batch_held=self._why_no_batch_starts(),
            shutting_down=s.shutdown and s.phase not in ENDED_PHASES,
            batches_total=len(s.results) + len(s.queue) + len(self._running_batches),
            batches_done=len(s.results),
            stories={k: s.earlier_work[k].added_to(v) if k in s.earlier_work else v for k, v in s.views.items()},
            tokens_used=s.tokens_used + self._tokens_in_flight(),
            token_limit=s.token_limit if s.config.token_budget.enabled else 0,  # 0: no budget holds the sprint
            pause_reason=s.paused_reason if s.phase not in ENDED_PHASES else None,  # an ended sprint is not paused
            errors=list(s.errors),
            batch_errors=batch_errors(s.results, s.errors),
            agent_backend=self._input.agent_backend,
            runs=s.runs,
            checkpoint=s.checkpoint,
            waiting_for=dependencies_waited_for(self._running_views(), s.views, s.stories),
            awaiting_decision={  # an ended sprint takes no decision
                k: v.awaiting_decision for k, v in s.views.items() if v.awaiting_decision and s.phase not in ENDED_PHASES
            },
            roster=s.roster,
            unavailable_residents=dict(s.unavailable_residents),
            total_agents_created=s.agents_created,
            total_agents_destroyed=s.agents_destroyed,
            course_corrections=list(s.course_corrections),
            po_gates=gate_totals(s.results),
            message_errors=sprint_message_errors(
                s.message_errors, [r.message_errors for r in sorted(s.results, key=lambda r: r.batch_id)]
            ),
            rejected_messages=list(s.rejected_messages),
            rejected_total=s.rejected_total,
        )

    def record_rejected(self, message: RejectedMessage) -> None:
        """A signal the Master cannot act on: recorded (status query, carried), logged, never raised."""
        s = self._state
        s.rejected_total += 1
        s.rejected_messages = keep_rejected(s.rejected_messages, message)
        workflow.logger.warning("%s ignored: %s", message.msg_type, message.reason)

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal the sprint has no handler for (an agent's answer sent to the sprint instead of its batch, a
        typo): recorded as rejected, saying where it belongs. Without this handler it was dropped unseen."""
        try:
            payload = workflow.payload_converter().from_payload(args[0].payload) if args else None
        except Exception:  # noqa: BLE001 - an undecodable payload is still recorded, by its name
            payload = None
        self.record_rejected(unknown_signal_to_sprint(name, payload))

    @workflow.signal(name=SIGNAL_STORY_UPDATES)
    def story_updates(self, payload: Any) -> None:
        """Several story_update payloads in one signal (a Slave batches what it has to tell), in order."""
        updates = payload.get("updates") if isinstance(payload, dict) else None
        if not isinstance(updates, list):
            self.record_rejected(RejectedMessage(msg_type="STORY_UPDATES", reason="expected an object with a list of updates"))
            return
        applied = [self._apply_story_update(update) for update in updates]
        if any(applied):
            self._show()  # once per signal, not per update

    @workflow.signal(name=SIGNAL_STORY_UPDATE)
    def story_update(self, payload: Any) -> None:
        if self._apply_story_update(payload):
            self._show()

    def _apply_story_update(self, payload: Any) -> bool:
        """One story's new view (validated); False when it was ignored."""
        try:
            update = StoryUpdate.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("STORY_UPDATE", payload, err))
            return False
        s = self._state
        if not self._holds(update.batch_id, update.story_key) and workflow.patched(PATCH_STORY_UPDATE_FROM_ITS_BATCH):
            reason = story_update_not_from_its_batch(update.story_key, update.batch_id)
            self.record_rejected(RejectedMessage(msg_type="STORY_UPDATE", reason=reason))
            return False
        if update.story_key in s.views:
            if s.views[update.story_key].awaiting_decision and not update.view.awaiting_decision:
                self._decided_views.setdefault(update.story_key, update.view)
            spent = update.view.tokens_used != s.views[update.story_key].tokens_used
            self._put_view(update.story_key, update.view)
            if spent:
                self._mind_the_budget()
            agent = update.view.agent_in_flight
            self._temp_seen(
                update.story_key,
                temp_name(agent, short_key(update.story_key), update.view.agents_dispatched) if agent else None,
            )
            # A story still merging (command backend) has finished for none of these yet: its next update says so.
            if update.view.state in TERMINAL_VALUES and not update.view.merging:
                # (A human's needs-intervention is no agent's failure: three stories parked by hand paused an
                # unattended sprint for "repeated failures".)
                if not (update.view.set_by_hand and workflow.patched(PATCH_HAND_SET_IS_NO_FAILURE)):
                    self._count_failure(update.view.state)
                self._tell_dependants({update.story_key: update.view.state}, update.batch_id)
                if self._first_story_checkpoint(update.story_key, update.view) and s.paused_reason is None:
                    # Another story was first: this Slave paused itself for nothing.
                    self._forward(SIGNAL_RESUME, {}, only=update.batch_id)
            return True
        return False

    def _holds(self, batch_id: int, key: str) -> bool:
        """Is `key` a story of running batch `batch_id`, still its own (not rearmed into another batch since)?"""
        view = self._state.views.get(key)
        return key in self._running_stories(batch_id) and (view is None or view.batch_id == batch_id)

    def _first_story_checkpoint(self, key: str, view: StoryView) -> bool:
        """first_story_checkpoint: `report` logs and shows the first finished story; `pause` also pauses.

        True when the checkpoint had already been taken (this is not the first story)."""
        s = self._state
        if s.config.first_story_checkpoint == "skip":
            return False
        if s.checkpoint is not None:
            return s.config.first_story_checkpoint == "pause"
        s.checkpoint = (
            f"first story {key} ended {view.state} after {view.agents_dispatched} agent(s), "
            f"{view.review_round} review round(s), {view.tokens_used} tokens"
            + (f" ({view.error})" if view.error else "")
        )
        workflow.logger.info("first story checkpoint: %s", s.checkpoint)
        if s.config.first_story_checkpoint == "pause":
            reason = f"first story checkpoint: {s.checkpoint}; resume to go on"
            self._pause(reason)
            self._forward(SIGNAL_PAUSE, reason)
        return False

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self, reason: Any = None) -> None:
        """No new batch starts and no running Slave dispatches while paused; agents in flight finish.

        `reason` is Any: with `str | None` the SDK dropped a pause whose reason was not a string."""
        reason = pause_reason(reason)
        if len(reason) > MAX_PAUSE_REASON_CHARS and workflow.patched(PATCH_PAUSE_REASON_CUT):
            reason = f"{reason[:MAX_PAUSE_REASON_CHARS]}... (cut: {len(reason)} characters)"
        self._pause(reason)
        self._forward(SIGNAL_PAUSE, reason)

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self, request: Any = None) -> None:
        try:
            parsed = ResumeRequest.model_validate(request or {})
        except ValidationError as err:
            self.record_rejected(rejected_invalid("RESUME", request, err))
            return
        if parsed.token_limit is not None:
            self._state.token_limit = max(self._state.token_limit, parsed.token_limit)
        if self._state.over_budget and budget_level(self._state.tokens_used, self._config_now()) is not BudgetLevel.EXHAUSTED:
            self._state.over_budget = False  # a higher limit: the batches go on (and its warning line is said)
            self._state.budget_warned = False
        if (
            self._state.over_budget
            and self._state.paused_reason is not None
            and workflow.patched(PATCH_RESUME_OVER_BUDGET_STAYS_PAUSED)  # (asked there only)
        ):
            # The budget still used up: no batch may start, and a plain resume set the Master's loop spinning.
            self._pause(budget_still_exhausted(self._state.tokens_used, self._state.token_limit))
            workflow.logger.warning(self._state.paused_reason)
            return
        self._state.paused_reason = None
        if self._state.phase is SprintPhase.PAUSED:
            self._set_phase(SprintPhase.RUNNING)
        # A raised limit reaches the running batches too (each checks the budget after every story).
        self._forward(SIGNAL_RESUME, {} if parsed.token_limit is None else {"token_limit": self._state.token_limit})

    @workflow.update(name=UPDATE_DECIDE)
    async def decide(self, request: Any) -> StoryView:
        """A human decision: answer a story awaiting one (forwarded to its Slave), or re-arm a
        needs-intervention story (written to the status file, then run in a new batch)."""
        parsed = self._decision(request)
        s = self._state
        key = parsed.story_key
        if parsed.decision is not Decision.REARM:
            batch_id = s.views[key].batch_id
            if not workflow.patched(PATCH_DECIDE_ENDS):  # updates accepted before: they wait as they did
                self._decided_views.pop(key, None)
                self._forward(SIGNAL_DECISION, parsed.model_dump(mode="json"), only=batch_id)
                await workflow.wait_condition(lambda: key in self._decided_views)
                return self._decided_views.pop(key)
            if key in self._deciding:  # two updates accepted in one workflow task: the validator saw neither
                raise invalid_decision(f"story {key!r}: a decision is already on its way")
            self._deciding[key] = parsed.decision
            try:
                self._decided_views.pop(key, None)
                self._forward(SIGNAL_DECISION, parsed.model_dump(mode="json"), only=batch_id)
                # The batch may end before its Slave applies the decision (a shutdown came first): then the
                # decision is lost with it, and the update says so instead of waiting forever.
                await workflow.wait_condition(
                    lambda: key in self._decided_views or batch_id not in self._running_batches
                )
            finally:
                self._deciding.pop(key, None)
            if key not in self._decided_views:
                raise invalid_decision(
                    f"story {key!r}: batch {batch_id} ended before the decision reached it "
                    f"(the story stays {s.views[key].state})"
                )
            return self._decided_views.pop(key)
        target = parsed.rearm_state().value
        if (left_out := skipped_for(s.views[key])) is not None and left_out not in s.views:
            s.waived_dependencies.append(left_out)  # (skipped for a dependency left out of the sprint)
        one_at_a_time = workflow.patched(PATCH_ONE_REARM)
        if one_at_a_time:
            if key in self._deciding:  # two rearms accepted in one workflow task: the validator saw neither
                raise invalid_decision(f"story {key!r}: a decision is already on its way")
            if self._replanning:  # the course correction would replace the queue, and this batch with it
                raise invalid_decision(REARM_DURING_REPLAN)
            self._deciding[key] = parsed.decision
        brought_back: list[str] = []
        try:
            written = await self._write_rearm(key, s.views[key].state, target)
            if (
                written.outcome != "cas-mismatch"
                and (dependants := dependants_brought_back(key, s.views, s.stories))
                and workflow.patched(PATCH_REARM_BRINGS_BACK_DEPENDANTS)
            ):
                brought_back = await self._bring_back((key,), dependants)
        finally:
            if one_at_a_time:
                self._deciding.pop(key, None)
        if written.outcome == "cas-mismatch":
            raise invalid_decision(f"sprint-status.yaml shows {key} as {written.current!r}; nothing rearmed")
        s.stories[key] = s.stories[key].model_copy(update={"state": target})
        batch_id = self._queue_again([(key, target), *((k, s.stories[k].state) for k in brought_back)])
        workflow.logger.info(
            "rearmed %s to %s in batch %d%s%s", key, target, batch_id,
            f", with the stories skipped for it: {', '.join(brought_back)}" if brought_back else "",
            f": {parsed.note}" if parsed.note else "",
        )
        self._show()
        return s.views[key]

    async def _write_rearm(self, key: str, expected: str, target: str) -> StatusWriteResult:
        return await workflow.execute_activity(
            write_story_status,
            StatusWriteInput(
                project_root=self._project_root,
                status_file=self._state.status_file,
                story_key=key,
                expected=expected,
                new=target,
            ),
            summary=f"rearm {key}: {expected} -> {target}",
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["StatusFileError"]),
        )

    def _queue_again(self, stories: list[tuple[str, str]]) -> int:
        """`stories` (key, the state it starts at) in a new batch, queued before the batches of their dependants;
        its id."""
        s = self._state
        batch_id = s.next_batch_id
        s.next_batch_id += 1
        for story, state in stories:
            # The story's batches so far: its new batch's Slave counts from zero (a status count, no command).
            s.earlier_work[story] = s.earlier_work.get(story, StoryWork()).plus(s.views[story])
            if s.views[story].batch_id in self._running_batches:  # its tokens reach s.tokens_used when it ends
                self._left_running_batches.append((s.views[story].batch_id, story, s.views[story]))
            self._put_view(story, StoryView(state=state, batch_id=batch_id))
        spec = BatchSpec(batch_id=batch_id, stories=[key for key, _ in stories])
        if workflow.patched(PATCH_REARM_BEFORE_DEPENDANTS):
            s.queue.insert(rearm_position(s.queue, spec.stories, s.stories), spec)
        else:
            s.queue.append(spec)
        return batch_id

    async def _bring_back_skipped_after_rearm(self, result: SlaveResult) -> None:
        """The stories an ended batch skipped for a dependency a rearm made pending again while the batch ran,
        with those skipped for them in turn: back to their state before the skip, in a new batch."""
        s = self._state
        skipped = [
            r.story_key for r in result.results.story_results
            if (view := s.views.get(r.story_key)) is not None
            and view.batch_id == result.batch_id
            and skipped_for(view) is not None
        ]
        if not skipped or not workflow.patched(PATCH_BRINGS_BACK_SKIPPED_AFTER_REARM):
            return
        if self._rearm_in_flight() or self._replanning:
            # A rearm's views are not in yet (what it rearms would still look failed); a course correction would
            # replace the queue. Neither waits for this loop.
            await workflow.wait_condition(lambda: not (self._rearm_in_flight() or self._replanning))
        stories = skipped_for_stories_pending_again(
            skipped, s.views, s.stories, lambda dependency: never_done(self._dependency_state(dependency))
        )
        if not stories:
            return
        if (why := self._not_replannable()) is not None:
            workflow.logger.warning("%s stay skipped: %s", ", ".join(stories), why)
            return
        causes = tuple(dict.fromkeys(d for k in stories if (d := skipped_for(s.views[k])) not in stories))
        for key in stories:  # a course correction waits for these writes, as for a rearm's
            self._deciding[key] = Decision.REARM
        try:
            back = await self._bring_back(causes, stories)
        finally:
            for key in stories:
                self._deciding.pop(key, None)
        if back:
            batch_id = self._queue_again([(k, s.stories[k].state) for k in back])
            workflow.logger.info(
                "%s skipped by batch %d for %s, rearmed since: back in batch %d",
                ", ".join(back), result.batch_id, ", ".join(causes), batch_id,
            )
            self._show()

    async def _bring_back(self, causes: tuple[str, ...], dependants: list[str]) -> list[str]:
        """Each story skipped for one of `causes` (or for one brought back before it) back to its state before
        the skip, in the status file: those whose line says otherwise now (edited by hand) or cannot be written
        stay; one set to done by hand is taken as done, and its own dependants come back."""
        back: list[str] = []
        done_by_hand: list[str] = []
        for story in dependants:
            if skipped_for(self._state.views[story]) not in (*causes, *back, *done_by_hand):
                continue  # what it was skipped for stays as it is
            try:
                written = await self._write_rearm(story, StoryState.SKIPPED.value, self._state.stories[story].state)
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                workflow.logger.warning("%s stays skipped: %s", story, err.cause or err)
                continue
            if written.outcome == "cas-mismatch":
                if written.current == StoryState.DONE.value and workflow.patched(PATCH_BRING_BACK_TAKES_DONE_BY_HAND):
                    # As a Slave takes a story set done by hand: the report said skipped, the file done, and the
                    # stories skipped for it stayed skipped.
                    view = self._state.views[story]
                    self._put_view(story, view.model_copy(update={"state": written.current, "error": None}))
                    done_by_hand.append(story)
                    workflow.logger.info("%s: set to done in sprint-status.yaml by hand; taken as it is", story)
                    continue
                workflow.logger.warning("%s stays as sprint-status.yaml shows it (%s)", story, written.current)
                continue
            back.append(story)
        return back

    def _decision(self, request: Any) -> DecisionRequest:
        """The decision with its story key made full (`1-2` -> `1-2-login-form`) when it is unambiguous."""
        parsed = DecisionRequest.model_validate(request)
        if parsed.story_key in self._state.views:
            return parsed
        matches = [k for k in self._state.views if short_key(k) == parsed.story_key]
        return parsed.model_copy(update={"story_key": matches[0]}) if len(matches) == 1 else parsed

    @decide.validator
    def _validate_decide(self, request: Any) -> None:
        try:
            parsed = self._decision(request)
        except ValidationError as err:
            raise invalid_decision(f"invalid decision: {describe_validation_error(err)}")
        s = self._state
        view = s.views.get(parsed.story_key)
        try:
            if parsed.decision is Decision.REARM:
                if (why := self._not_replannable()) is not None:
                    raise DecisionError(f"{why}: nothing can be rearmed now")
                if parsed.story_key in self._deciding:
                    raise DecisionError(f"story {parsed.story_key!r}: a decision is already on its way")
                if self._replanning:
                    raise DecisionError(REARM_DURING_REPLAN)
                # (A dependency left out of the sprint is not the sprint's to rearm: the human's rearm waives it.)
                check_rearm(
                    parsed, view, lambda dep: dep in s.views and never_done(self._dependency_state(dep))
                )
            elif view is None:
                raise DecisionError(f"unknown story {parsed.story_key!r}")
            elif parsed.story_key in self._deciding:
                raise DecisionError(f"story {parsed.story_key!r}: a decision is already on its way")
            elif not view.awaiting_decision:
                raise DecisionError(
                    f"story {parsed.story_key!r} is not awaiting a decision (state {view.state})"
                    + rearm_hint(s.session_id, parsed.story_key, view.state)
                )
            elif view.batch_id not in self._started_batches:
                raise DecisionError(f"story {parsed.story_key!r}: its batch is not running")
        except DecisionError as err:
            raise invalid_decision(str(err)) from None

    def _rearm_in_flight(self) -> bool:
        """A rearm is being written: a course correction, which replaces the queue, waits for it."""
        return Decision.REARM in self._deciding.values()

    def _not_replannable(self) -> str | None:
        """Why no batch can be queued now, or None: a rearm or a course correction accepted then would be lost."""
        s = self._state
        if self._cancelling:
            return "the sprint is being cancelled"
        if self._ending or s.shutdown or s.stopped_early or s.phase in (SprintPhase.COMPLETED, SprintPhase.FAILED):
            return "the sprint is ending"
        if self._handing_over:
            return f"{HANDING_OVER}; send it again in a few seconds"
        return None

    def _tell_dependants(self, states: dict[str, str], from_batch: int | None) -> None:
        """DEPENDENCY_UPDATE to each running Slave with a story depending on one of `states`."""
        for batch_id in sorted(self._running_batches):
            if batch_id == from_batch:
                continue
            deps = {d for k in self._running_stories(batch_id) for d in self._state.stories[k].depends_on}
            relevant = {k: v for k, v in states.items() if k in deps}
            if relevant:
                self._forward(SIGNAL_DEPENDENCY_UPDATE, relevant, only=batch_id)

    def _dependency_state(self, key: str) -> str:
        """A planned story's state for its dependants; `unfinished:<state>` once no batch will finish it. One left
        out of the sprint: its state when the sprint started."""
        s = self._state
        view = s.views.get(key)
        if view is None:
            return s.outside_stories.get(key, StoryState.BACKLOG.value)
        pending = view.batch_id in self._running_batches or any(b.batch_id == view.batch_id for b in s.queue)
        return state_for_dependants(view, pending)

    def _forward(self, signal: str, arg: Any, only: int | None = None) -> None:
        """Send a signal to the running Slaves (or to one batch's Slave), without blocking the caller."""
        for batch_id, slave_id in sorted(self._running_batches.items()):
            if batch_id in self._started_batches and (only is None or batch_id == only):
                self._forwards.append(asyncio.create_task(_signal_quietly(slave_id, signal, arg)))

    @workflow.signal(name=SIGNAL_SHUTDOWN)
    async def shutdown_request(self) -> None:
        """Stop the sprint gracefully: running Slaves finish the story in hand; no new batch starts."""
        self._state.shutdown = True
        self._show()
        for slave_id in list(self._running_batches.values()):
            try:
                await workflow.get_external_workflow_handle(slave_id).signal(SIGNAL_SHUTDOWN)
            except Exception as err:  # noqa: BLE001 - it has just ended (nothing to stop) or is starting (below)
                workflow.logger.info("shutdown: %s not signalled (%s)", slave_id, err)

    def _pause(self, reason: str) -> None:
        self._state.paused_reason = reason
        self._set_phase(SprintPhase.PAUSED)

    # --- the sprint ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SprintInput | RawInput | None = None) -> SprintReport:
        # The sprint runs as a task of its own and run() only waits for it: a cancel request reaches run() at
        # this condition whatever the sprint awaits at that moment. (Awaiting an activity, a signal or a child,
        # the sprint itself would see it as an ActivityError some code handles, or not at all.)
        if workflow.patched(PATCH_ROSTER_ALWAYS_HELD):  # decided at the run's start: the same on replay
            self._roster_held_after_flush = workflow.patched(PATCH_ROSTER_HELD_AFTER_FLUSH)
            self._start_roster_sender()
        self._batch_end_sends_a_command = workflow.patched(PATCH_BATCH_END_SENDS_A_COMMAND)
        sprint = asyncio.create_task(self._sprint(self._input))  # the input as __init__ validated it
        try:
            await workflow.wait_condition(sprint.done)
        except asyncio.CancelledError:
            sprint.cancel()  # what the sprint awaits is cancelled, as when run() awaited it directly
            if not workflow.patched("master-cancel-winds-down"):
                return await sprint
            return await self._wind_down_cancelled(sprint)
        failure = None if sprint.cancelled() else sprint.exception()
        if (
            # Only what fails the workflow: a bug (any other exception) fails the workflow task instead, and
            # the sprint, residents and all, waits for a fixed worker. Not a continue-as-new either: the next
            # run keeps the residents.
            isinstance(failure, (FailureError, ValidationError))
            and workflow.patched(PATCH_FAILURE_STOPS_RESIDENTS)
        ):
            # The sprint fails: its residents outlive it by design (ABANDON), so it stops them, or they would
            # run for ever. (A failure while planning stopped them already: stopping is idempotent.)
            await self._cancel_starting_resident()
            await self._stop_residents()
        return sprint.result()

    async def _wind_down_cancelled(self, sprint: asyncio.Task[SprintReport]) -> SprintReport:
        """The sprint was cancelled (`bso sprint cancel`, `temporal workflow cancel`): no batch starts any more,
        the running ones are cancelled with it (their agents in flight too) rather than terminated when the
        Master closes, and the residents are stopped (they outlive the Master by design, see
        workflows/residents.py). The status file keeps each story's last state. A sprint that had finished
        its work when the cancel came (it was stopping its residents) ends with its report."""
        self._cancelling = True
        self._cancel_slaves_once_started = workflow.patched(PATCH_CANCEL_STARTED_SLAVES)
        self._cancel_ends_sprint = workflow.patched(PATCH_SWALLOWED_CANCEL_ENDS_SPRINT)
        batches_ran = bool(self._running_batches)
        # Those still starting (perhaps in this very task) are cancelled once they have started (_run_slave).
        started = [
            slave_id
            for batch_id, slave_id in sorted(self._running_batches.items(), key=lambda batch: batch[1])  # as before
            if batch_id in self._started_batches or not self._cancel_slaves_once_started
        ]
        for slave_id in started:
            await _cancel_quietly(slave_id)
        try:
            await workflow.wait_condition(lambda: sprint.done() and not self._running_batches, timeout=SLAVE_CANCEL_WAIT)
        except asyncio.TimeoutError:
            workflow.logger.warning("after the cancel, batches still running: %s", sorted(self._running_batches))
        if sprint.done() and not sprint.cancelled() and sprint.exception() is None:
            return sprint.result()
        # The batches that ended with the cancel: their results, which the cancelled sprint no longer takes in
        # (the status's batches and tokens count them).
        for _, task in sorted(self._batch_tasks.items()):
            if task.done() and not task.cancelled() and task.exception() is None:
                self._state.results.append(task.result())
                self._state.tokens_used += task.result().tokens_used
        self._batch_tasks.clear()
        if not workflow.all_handlers_finished() and workflow.patched(PATCH_UPDATES_ANSWERED_ON_CANCEL):
            try:  # before the residents stop: a course correction may wait for the scrum-master's plan
                await workflow.wait_condition(workflow.all_handlers_finished, timeout=HANDLERS_CANCEL_WAIT)
            except asyncio.TimeoutError:
                workflow.logger.warning("the cancelled sprint ends with updates still running")
        if batches_ran and self._input.agent_backend == "command" and workflow.patched(PATCH_CANCEL_STOPS_AGENTS):
            await self._stop_agents()
        await self._cancel_starting_resident()
        await self._stop_residents(now=workflow.patched(PATCH_CANCEL_STOPS_RESIDENTS_NOW))
        cancelled = f"sprint cancelled: {workflow.cancellation_reason() or 'no reason given'}"
        self._state.errors.append(cancelled)
        ended = self._ended_report = self._report(SprintStatus.CANCELLED, error=cancelled)
        self._set_phase(SprintPhase.CANCELED)  # before the summary: the status says so while it is written
        if workflow.patched(PATCH_CANCEL_WRITES_SUMMARY):  # the execution summary, as at the end of any sprint
            await self._write_summary(self._input, ended)
        raise asyncio.CancelledError

    async def _stop_agents(self) -> None:
        """The cancelled sprint's agents still running stop. The Master winds down on a worker that is back, and
        the agents queue's is as a rule the same process: the cancel waits for it a little, not for ever (an
        agent missed is still stopped by its launcher, past its timeout)."""
        try:
            stopped = await workflow.execute_activity(
                stop_sprint_agents,
                StopAgentsInput(project_root=self._project_root, session_id=self._state.session_id),
                task_queue=agents_task_queue_for(workflow.info().task_queue),
                schedule_to_close_timeout=STOP_AGENTS_PATIENCE,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="stop the cancelled sprint's agents",
            )
        except ActivityError as err:
            workflow.logger.warning("the cancelled sprint's agents not stopped: %s", err.cause or err)
            return
        if stopped:
            workflow.logger.info("the cancelled sprint's agents stopped: %s", ", ".join(stopped))

    async def _sprint(self, inp: SprintInput) -> SprintReport:
        if (
            inp.carried_state is not None
            and workflow.info().continued_run_id is None
            and workflow.patched(PATCH_CARRIED_STATE_ONLY_HANDED_OVER)
        ):
            raise _invalid_input(CARRIED_STATE_BY_HAND)
        if inp.carried_state is None:
            stories = await self._start(inp)  # validates the input (the simulation script too)
            simulation = SimulationScript.model_validate(inp.simulation)
            await self._start_residents(inp.project_root, simulation, inp.agent_backend)
            await self._plan(stories)  # by the scrum-master resident (BATCH_PLAN_READY)
        else:
            self._set_phase(self._state.phase)  # search attributes and details of the new run
            simulation = SimulationScript.model_validate(inp.simulation)
            await self._start_residents(inp.project_root, simulation, inp.agent_backend)  # this run's children
        s = self._state
        while True:
            hand_over = await self._run_batches(inp, simulation)
            if self._cancel_ends_sprint:
                break
            if hand_over:
                return await self._continue_as_new(inp)
            if self._improvement_cycle_due():  # runs once: it queues the improvement stories' batch
                await self._improvement_cycle(inp, simulation)
                continue
            await workflow.wait_condition(workflow.all_handlers_finished)
            await self._course_corrections_settled()
            if not workflow.all_handlers_finished() and workflow.patched(PATCH_ENDING):
                continue  # an update came meanwhile (a rearm queues a batch): it finishes first
            if s.shutdown or s.stopped_early:
                break
            if s.queue:  # a rearm decision queued a batch while the last one ended
                continue
            if s.paused_reason is None:
                break
            # Paused with nothing left to run: the sprint holds (a rearm may still queue a batch) until
            # resumed or shut down.
            await workflow.wait_condition(
                lambda: s.paused_reason is None or s.shutdown or bool(s.queue) or self._cancel_ends_sprint
            )
            if self._cancel_ends_sprint:
                break
        if self._cancel_ends_sprint:  # cancelled, yet run on (PATCH_SWALLOWED_CANCEL_ENDS_SPRINT)
            raise asyncio.CancelledError
        self._ending = True  # from here on a rearm or a course correction is refused, not lost
        if self._forwards:
            await asyncio.gather(*self._forwards)
        await self._stop_residents()
        await self._roster_flushed()
        final = {key: view.state for key, view in s.views.items()}
        # A done story not merged back leaves the sprint partial (only the result differs: no patch needed).
        undelivered = len(undelivered_stories(s.views))
        report = self._ended_report = self._report(sprint_status(final, s.stopped_early or s.shutdown, undelivered))
        if workflow.patched("execution-summary"):
            await self._write_summary(inp, report)
        self._set_phase(SprintPhase.COMPLETED)
        return report

    def _report(self, status: SprintStatus, error: str | None = None) -> SprintReport:
        """The sprint's report as it stands: at its end (its result), or when it was cancelled."""
        s = self._state
        batches = sorted(s.results, key=lambda r: r.batch_id)
        return SprintReport(
            session_id=s.session_id,
            status=status,
            batch_plan=s.plan,
            batches=batches,
            stories={key: view.state for key, view in s.views.items()},
            tokens_used=s.tokens_used,
            token_limit=s.token_limit,
            error=error,
            errors=list(s.errors),
            improvements=list(s.improvements),
            total_agents_created=s.agents_created,
            total_agents_destroyed=s.agents_destroyed,
            unavailable_residents=dict(s.unavailable_residents),
            planner=s.planner,
            po_gates=gate_totals(s.results),
            message_errors=sprint_message_errors(s.message_errors, [r.message_errors for r in batches]),
            course_corrections=list(s.corrections),
            unstarted_batches=list(s.queue),
        )

    @workflow.query(name=QUERY_REPORT)
    def report(self) -> SprintReport | None:
        """The report of an ended sprint: its result, or for a cancelled one (which has none) the report its
        summary was written from. None while it runs."""
        return self._ended_report

    # --- the improvement cycle (Gear 2) ---------------------------------------------------------

    def _improvement_cycle_due(self) -> bool:
        s = self._state
        return (
            s.config.improvement_cycle
            and not s.improvement_cycle_done
            and not (s.shutdown or s.stopped_early or s.paused_reason)
            and bool(s.views)
            and all(v.state == StoryState.DONE for v in s.views.values())
        )

    async def _improvement_cycle(self, inp: SprintInput, simulation: SimulationScript) -> None:
        """The scrum-master proposes; the top max_improvements become stories, queued as one more batch."""
        s = self._state
        s.improvement_cycle_done = True
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=60),
            "heartbeat_timeout": FILE_ACTIVITY_HEARTBEAT,
            "retry_policy": RetryPolicy(maximum_attempts=3, non_retryable_error_types=["StatusFileError"]),
        }
        try:
            proposed = await workflow.execute_activity(
                propose_improvements,
                ProposeInput(
                    project_root=inp.project_root,
                    session_id=s.session_id,
                    backend=inp.agent_backend,
                    done_stories=list(s.views),
                    simulated=list(simulation.improvements),
                ),
                summary="improvement cycle: scrum-master proposals",
                **options,
            )
        except ActivityError as err:
            if is_cancelled_exception(err) or not workflow.patched(PATCH_IMPROVEMENT_PROPOSALS_MAY_FAIL):
                raise
            s.errors.append(f"improvement cycle: proposals not read ({err.cause or err})")
            return
        s.errors.extend(f"improvement proposal rejected: {r}" for r in proposed.rejected)
        chosen = select_improvements(proposed.proposals, s.config.max_improvements)
        if not chosen:
            workflow.logger.info("improvement cycle: nothing proposed")
            return
        epic = last_epic(list(s.stories))
        numbered_after = list(s.stories)
        if workflow.patched(PATCH_IMPROVEMENTS_AFTER_ALL):  # the epic's stories outside the sprint count too
            numbered_after += list(s.outside_stories)
        keys = improvement_story_keys(chosen, numbered_after, epic)
        some_story = next(iter(s.stories.values()))
        try:
            metas = await workflow.execute_activity(
                add_improvement_stories,
                AddStoriesInput(
                    project_root=inp.project_root,
                    status_file=s.status_file,
                    story_location=some_story.story_path.rsplit("/", 1)[0] if "/" in some_story.story_path else ".",
                    epic=epic,
                    stories=[NewStory(key=k, proposal=p) for k, p in zip(keys, chosen, strict=True)],
                ),
                summary=f"improvement cycle: add {', '.join(keys)}",
                **options,
            )
        except ActivityError as err:
            if is_cancelled_exception(err) and workflow.patched(PATCH_IMPROVEMENTS_ADD_CANCELLED):
                raise
            s.errors.append(f"improvement cycle: stories not added ({err.cause or err})")
            return
        spec = BatchSpec(batch_id=s.next_batch_id, stories=[m.key for m in metas])
        s.next_batch_id += 1
        for meta, proposal in zip(metas, chosen, strict=True):
            s.stories[meta.key] = meta
            self._put_view(meta.key, StoryView(state=meta.state, batch_id=spec.batch_id))
            s.improvements.append(
                ImprovementRecord(
                    improvement_id=proposal.improvement_id,
                    story_key=meta.key,
                    description=proposal.description,
                    priority_score=proposal.priority_score,
                    category=proposal.category,
                    acceptance_criteria=list(proposal.acceptance_criteria),
                )
            )
        s.queue.append(spec)
        workflow.logger.info("IMPROVEMENT_REQUESTED: %s as batch %d", ", ".join(spec.stories), spec.batch_id)
        self._show()

    async def _write_summary(self, inp: SprintInput, report: SprintReport) -> None:
        """`.sprint-session/execution-summary-<session>.md`; a failure to write it never fails the sprint."""
        try:
            await workflow.execute_activity(
                write_execution_summary,
                SummaryInput(project_root=inp.project_root, workflow_id=workflow.info().workflow_id, report=report),
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=FILE_ACTIVITY_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="write the execution summary",
            )
        except ActivityError as err:
            workflow.logger.warning("execution summary not written: %s", err.cause or err)

    async def _start(self, inp: SprintInput) -> list[StoryMeta]:
        """Validate the input, read the status file: the sprint's stories, to plan once the residents run."""
        s = self._state
        # Before any command carries the id: one of 1,500 characters failed the first workflow task on every retry
        # (its residents' ids, told to stop, too long for the server), one of 5,000 had the sprint terminated (its
        # search attribute), and one with a line break was taken.
        id_error = sprint_id_length_error(s.session_id) or sprint_id_characters_error(s.session_id)
        if id_error is not None and workflow.patched(PATCH_SPRINT_ID_REFUSED_FIRST):
            self._no_residents_under_this_id = True
            raise _invalid_input(id_error)
        if (id_error := session_id_error(s.session_id, workflow.info().workflow_id)) is not None and workflow.patched(
            PATCH_SESSION_ID_IS_WORKFLOW_ID
        ):
            self._no_residents_under_this_id = True  # the residents under that id are another sprint's
            raise _invalid_input(id_error)
        self._set_phase(SprintPhase.STARTING)
        s.config = self._validate(inp)
        s.token_limit = s.config.token_budget.limit

        self._set_phase(SprintPhase.PLANNING)
        snapshot = await self._load(inp)
        s.status_file = snapshot.status_file
        stories = self._select(inp, snapshot)
        if (error := self._named_keys_error(snapshot)) is not None and workflow.patched(PATCH_NAMED_KEYS_CHECKED):
            raise _invalid_input(error)
        selected = {story.key for story in stories}
        s.outside_stories = {m.key: m.state for m in snapshot.stories if m.key not in selected}
        # A `Depends on:` item naming no story of the file is ignored: said where the user looks, not in a log.
        s.errors += [problem for story in stories for problem in snapshot.dependency_problems.get(story.key, [])]
        return stories

    def _named_keys_error(self, snapshot: StatusSnapshot) -> str | None:
        """A story_priorities key naming no story of the file (`bso sprint start` refuses it; the temporal CLI's
        input was taken, the priority silently not applied). A simulation script may name stories to come (the
        improvement cycle's, lines added to the file later)."""
        named = {"story_priorities": list(self._state.config.story_priorities)}
        return named_keys_error(named, [m.key for m in snapshot.stories], snapshot.status_file.rsplit("/", 1)[-1])

    async def _plan(self, stories: list[StoryMeta]) -> None:
        """BATCH_PLAN_READY: asked of the scrum-master resident (the Master's fallback plan without one)."""
        s = self._state
        answer = await self._ask_planner(stories)
        if answer.plan is None:
            await self._stop_residents()
            self._set_phase(SprintPhase.FAILED)
            raise _invalid_input(answer.error or "no batch plan")
        s.plan = answer.plan
        s.planner = answer.planner
        workflow.logger.info(
            "BATCH_PLAN_READY by %s: %d stories in %d batches", s.planner, s.plan.total_stories, len(s.plan.batches)
        )
        s.stories = {story.key: story for story in stories}
        for spec in s.plan.batches:
            for key in spec.stories:
                self._put_view(key, StoryView(state=s.stories[key].state, batch_id=spec.batch_id))
        s.queue = list(s.plan.batches)
        s.next_batch_id = len(s.plan.batches) + 1
        # A pause that came while planning holds: the phase must say so (resume sets running).
        self._set_phase(SprintPhase.PAUSED if s.paused_reason is not None else SprintPhase.RUNNING)

    def _validate(self, inp: SprintInput) -> SprintConfig:
        # Patched: a sprint started with a relative root before this check replays as it ran.
        if (error := project_root_error(inp.project_root)) is not None and workflow.patched("master-root-absolute"):
            raise _invalid_input(error)
        sprint_id = self._state.session_id
        if (error := sprint_id_collision(sprint_id)) is not None and workflow.patched(PATCH_SPRINT_ID_CHECKED):
            raise _invalid_input(error)
        # (A run since PATCH_SPRINT_ID_REFUSED_FIRST refused such an id in _start: this one is its recorded runs'.)
        if (error := sprint_id_length_error(sprint_id)) is not None and workflow.patched(PATCH_SPRINT_ID_LENGTH):
            raise _invalid_input(error)
        try:
            config = resolve_config(inp.config_overrides)
        except ConfigError as err:
            raise _invalid_input(str(err)) from None
        if (error := limits_error(config)) is not None and workflow.patched(PATCH_CONFIG_LIMITS):
            raise _invalid_input(error)
        try:
            script = SimulationScript.model_validate(inp.simulation)
        except ValidationError as err:
            raise _invalid_input(f"invalid simulation script: {describe_validation_error(err)}") from None
        if (error := script.converted_values_error(inp.simulation)) is not None and workflow.patched(
            PATCH_SIMULATION_UNCONVERTED
        ):
            raise _invalid_input(f"invalid simulation script: {error}")
        if (error := script.tokens_error()) is not None and workflow.patched(PATCH_SIMULATION_TOKENS_BOUNDED):
            raise _invalid_input(f"invalid simulation script: {error}")
        if (error := script.size_error()) is not None and workflow.patched(PATCH_SIMULATION_SIZE_BOUNDED):
            raise _invalid_input(f"invalid simulation script: {error}")
        if inp.agent_backend not in {b.value for b in AgentBackend}:
            raise _invalid_input(
                f"agent_backend {inp.agent_backend!r} is not available; use one of: "
                + ", ".join(b.value for b in AgentBackend)
            )
        return config

    async def _load(self, inp: SprintInput) -> StatusSnapshot:
        try:
            return await workflow.execute_activity(
                load_sprint_status,
                LoadStatusInput(project_root=inp.project_root, status_file=inp.status_file, claim_project=True),
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=FILE_ACTIVITY_HEARTBEAT,
                retry_policy=RetryPolicy(
                    maximum_attempts=3, non_retryable_error_types=["StatusFileError", UNREADABLE_ERROR_TYPE]
                ),
                summary="read and validate sprint-status.yaml",
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            busy = isinstance(cause, ApplicationError) and cause.type == PROJECT_BUSY_ERROR
            kind = PROJECT_BUSY_ERROR if busy else "StatusFileError"
            self._set_phase(SprintPhase.FAILED)
            raise ApplicationError(message, type=kind, non_retryable=True) from None

    def _select(self, inp: SprintInput, snapshot: StatusSnapshot) -> list[StoryMeta]:
        if workflow.patched(PATCH_SETTLED_LEFT_OUT):  # needs-intervention and skipped too: a human acts first
            stories = [s for s in snapshot.stories if s.state not in SETTLED_AT_START]
            for story in snapshot.stories:
                if story.state in (StoryState.NEEDS_INTERVENTION, StoryState.SKIPPED):
                    workflow.logger.info("left out: %s is %s", story.key, story.state)
        else:
            stories = [s for s in snapshot.stories if s.state != StoryState.DONE]
        if inp.epic is not None:
            if isinstance(inp.epic, bool) and workflow.patched(PATCH_EPIC_SPELLINGS):
                raise _invalid_input(EPIC_NOT_A_BOOL)
            requested = int(inp.epic) if isinstance(inp.epic, bool) else inp.epic  # before the patch: true was 1
            # `01` names epic 1; before the patch it named no epic (asked only where the two differ)
            numbered = epic_numbered(requested) == epic_as_given(requested) or workflow.patched(PATCH_EPIC_SPELLINGS)
            try:
                epic = resolve_epic(requested, [s.key for s in snapshot.stories], numbered=numbered)
            except UnknownEpicError as err:
                if workflow.patched("master-unknown-epic"):
                    raise _invalid_input(str(err)) from None
                epic = epic_as_given(requested)  # before the patch: it selected nothing
            stories = [s for s in stories if s.epic == epic]
        if inp.story_keys == [] and workflow.patched(PATCH_EMPTY_SELECTION_REFUSED):
            raise _invalid_input(EMPTY_STORY_SELECTION)
        if inp.story_keys:
            try:
                wanted = resolve_story_keys(inp.story_keys, [s.key for s in snapshot.stories])
            except ValueError as err:
                raise _invalid_input(str(err)) from None
            if (
                inp.epic is not None
                and (outside := stories_outside_epic_error(epic, wanted)) is not None
                and workflow.patched(PATCH_STORIES_OUTSIDE_EPIC_REFUSED)
            ):
                raise _invalid_input(outside)
            stories = [s for s in stories if s.key in wanted]
        too_long = [(s.key, why) for s in stories if (why := story_key_too_long(s.key)) is not None]
        if too_long and workflow.patched(PATCH_LONG_KEYS_LEFT_OUT):  # patched only where it leaves one out
            for _, why in too_long:
                workflow.logger.error("left out: %s", why)
                self._state.errors.append(why)
            left_out = {key for key, _ in too_long}
            stories = [s for s in stories if s.key not in left_out]
            if not stories:  # said with the reasons, not as an empty sprint
                raise _invalid_input("; ".join(why for _, why in too_long))
        # Patched only where it refuses: a sprint that ran empty before replays as it ran.
        if not snapshot.stories and workflow.patched(PATCH_NO_STORIES):
            raise _invalid_input(NO_STORIES)
        if snapshot.stories and not stories and workflow.patched(PATCH_NOTHING_TO_RUN):
            raise _invalid_input(NOTHING_TO_RUN)
        shared = shared_numbers(s.key for s in stories)
        if shared is not None and workflow.patched(PATCH_SHARED_NUMBERS_REFUSED):
            raise _invalid_input(shared)
        too_large = too_large_to_carry(stories)
        if too_large is not None and workflow.patched(PATCH_SPRINT_SIZE_BOUNDED):
            raise _invalid_input(too_large)
        return stories

    async def _run_batches(self, inp: SprintInput, simulation: SimulationScript) -> bool:
        """Run queued batches, at most max_concurrent_slaves at once.

        Returns True when the Master should continue as new (between batches, nothing running)."""
        s = self._state
        running = self._batch_tasks
        # Sprints that started their batches before it ran batches sharing files at once.
        self._hold_shared_files = workflow.patched(PATCH_HOLD_SHARED_FILES)
        while s.queue or running:
            if not running and self._history_is_long():
                return True
            while (
                self._may_start_batch()
                and s.queue
                and len(running) < s.config.max_concurrent_slaves
                and (index := self._next_batch()[0]) is not None
            ):
                spec = s.queue.pop(index)
                self._running_specs[spec.batch_id] = spec
                self._running_batches[spec.batch_id] = slave_workflow_id(s.session_id, spec.batch_id)
                running[spec.batch_id] = asyncio.create_task(self._run_slave(inp, simulation, spec))
            if not running:
                if s.shutdown or s.stopped_early:
                    break
                await workflow.wait_condition(
                    lambda: (s.paused_reason is None and not self._replanning)
                    or s.shutdown
                    or s.stopped_early
                    or self._cancel_ends_sprint
                )
                if self._cancel_ends_sprint:  # cancelled, yet run on (PATCH_SWALLOWED_CANCEL_ENDS_SPRINT)
                    raise asyncio.CancelledError
                if self._cancelling and s.queue and not (s.shutdown or s.stopped_early or self._history_is_long()):
                    # The sprint was cancelled, yet runs on: the SDK lets a signal already sent when the cancel
                    # came (a plan request, a SHUTDOWN) decide the await's outcome. No batch may start any more,
                    # so this loop would spin without yielding (a deadlock failing the workflow task on every
                    # retry). Every history that came here spun: no patch.
                    raise asyncio.CancelledError
                continue
            await workflow.wait_condition(
                lambda: any(t.done() for t in running.values())
                or (
                    bool(s.queue)
                    and len(running) < s.config.max_concurrent_slaves
                    and self._may_start_batch()
                    and self._next_batch()[0] is not None
                )
            )
            for batch_id in [b for b, t in running.items() if t.done()]:
                result = running.pop(batch_id).result()
                self._running_specs.pop(batch_id, None)
                self._settle(result)
                if result.fatal_error is not None:
                    await self._stop_running(list(running))
                # Stories this batch did not finish and no batch will: their dependants must not wait.
                unfinished = {
                    r.story_key: self._dependency_state(r.story_key)
                    for r in result.results.story_results
                    if r.story_key in s.views and self._dependency_state(r.story_key).startswith(UNFINISHED)
                }
                if unfinished:
                    self._tell_dependants(unfinished, batch_id)
                await self._bring_back_skipped_after_rearm(result)
                self._show()  # its result and tokens counted (the details showed the batch gone, its result not in)
        return False

    def _next_batch(self) -> tuple[int | None, str | None]:
        """The queued batch to start next (its index, None: none may start yet) and why the first one waits:
        two agents editing one file at once would conflict (P29 across batches), so a batch waits while a
        running one still works on a file it touches (bso.planning.startable_batch)."""
        s = self._state
        if not s.queue:
            return None, None
        if not (self._hold_shared_files and self._running_specs):
            return 0, None
        if s.config.max_concurrent_slaves <= 1 or not self._may_start_batch():
            return 0, None  # one batch at a time, or none may start: nothing is held for a file

        def stories(keys: list[str]) -> list[StoryMeta]:
            return [s.stories[k] for k in keys if k in s.stories]

        running = {
            batch_id: [meta for meta in stories(spec.stories) if still_on_its_files(s.views.get(meta.key), batch_id)]
            for batch_id, spec in self._running_specs.items()
        }
        if not any(meta.files for metas in running.values() for meta in metas):
            # No running story touches a file, so no batch waits for one: startable_batch's answer without its walk
            # over the queue (this runs on every story update; the running batches' stories are few).
            return 0, None
        index, waits = startable_batch((stories(spec.stories) for spec in s.queue), running)
        return index, "; ".join(f"batch {s.queue[i].batch_id} waits: {why}" for i, why in waits) or None

    def _may_start_batch(self) -> bool:
        """Whether a queued batch may start now. A long history stops new batches too: with
        max_concurrent_slaves > 1 the running set would otherwise never empty, and the Master would
        never reach a point where it may continue as new."""
        return self._batches_go_on() and not self._history_is_long()

    def _batches_go_on(self) -> bool:
        """No shutdown, pause, early stop, course correction or cancel holds the queued batches."""
        s = self._state
        return not (
            s.shutdown or s.paused_reason is not None or s.stopped_early or self._replanning or self._cancelling
            or s.over_budget  # (until a batch's end applies the budget's action)
        )

    def _settle(self, result: SlaveResult) -> None:
        """A batch ended: count its tokens, apply the budget rule (P26), and queue again what it did not start
        (a batch whose history grew long, or the sprint paused on its budget)."""
        s = self._state
        s.results.append(result)
        s.tokens_used += result.tokens_used
        self._mind_the_budget()
        if result.fatal_error is not None:
            s.errors.append(f"{result.fatal_error}: sprint stopped (fail_fast)")
            s.stopped_early = True
            return
        exhausted = (
            result.budget_exhausted
            or budget_level(s.tokens_used, self._config_now()) is BudgetLevel.EXHAUSTED
            or s.over_budget  # the running batches' tokens with the ended ones' (_mind_the_budget)
        )
        budget_note = f"token budget exhausted ({s.tokens_used}/{s.token_limit})"
        if exhausted and s.config.token_budget.action == "stop":
            if not s.stopped_early:  # (each parallel batch's end said it again)
                s.errors.append(f"{budget_note}: sprint stopped")
            s.stopped_early = True
            return
        if exhausted:
            self._pause(f"{budget_note}; resume with a higher token_limit to go on")
        if not (exhausted or result.handed_over):
            return
        never_started = [
            r.story_key
            for r in result.results.story_results
            if r.final_state not in TERMINAL_STATES and r.agents_dispatched == 0
        ]
        if never_started:
            s.queue.insert(0, BatchSpec(batch_id=s.next_batch_id, stories=never_started))
            for key in never_started:
                self._put_view(key, s.views[key].model_copy(update={"batch_id": s.next_batch_id}))
            s.next_batch_id += 1

    def _mind_the_budget(self) -> None:
        """P26 over the whole sprint, with its batches running: a Slave counts its own tokens and those of the
        batches ended before it started, so parallel batches ran on past the budget (2.4 times it with 2). The
        Master adds up all of them: past the warning line it says so, once; past the limit the running batches
        finish the story in hand and start no other (as a Slave does on its own count), and their ends apply the
        budget's action."""
        s = self._state
        used = s.tokens_used + sum(view.tokens_used for _, view in self._running_views())
        config = self._config_now()
        level = budget_level(used, config)
        if level is BudgetLevel.OK:
            return
        if not s.budget_warned:
            s.budget_warned = True
            if level is BudgetLevel.WARNING:
                s.errors.append(budget_warning(used, config))
                workflow.logger.warning(s.errors[-1])
        if level is BudgetLevel.EXHAUSTED and not s.over_budget and workflow.patched(PATCH_BUDGET_OVER_ALL_BATCHES):
            s.over_budget = True  # no batch starts; those running are told (_stop_over_budget), or once started
        self._stop_over_budget()

    def _stop_over_budget(self) -> None:
        """Past the sprint's budget: each running batch that has started is told once to finish the story in hand
        (a batch starting meanwhile is told when it has started: whether it had, when a story update came, is
        not the same on replay, where sdk-core may take the update first)."""
        if not self._state.over_budget:
            return
        for batch_id in sorted(self._running_batches):
            if batch_id in self._started_batches and batch_id not in self._told_over_budget:
                self._told_over_budget.add(batch_id)
                self._forwards.append(asyncio.create_task(_signal_quietly(self._running_batches[batch_id], SIGNAL_SHUTDOWN)))

    async def _stop_running(self, batch_ids: list[int]) -> None:
        """fail_fast: the other running Slaves finish the story in hand and stop (the shutdown protocol)."""
        for batch_id in batch_ids:
            slave_id = self._running_batches.get(batch_id)
            if slave_id is None:
                continue
            try:
                await workflow.get_external_workflow_handle(slave_id).signal(SIGNAL_SHUTDOWN)
            except Exception as err:  # the Slave may have just ended: nothing left to stop
                workflow.logger.info("fail_fast: %s not signalled (%s)", slave_id, err)

    def _why_no_batch_starts(self) -> str | None:
        """Why queued batches wait though a Slave may be free (status and the Web UI say it), or None."""
        s = self._state
        if s.queue and self._running_batches and self._batches_go_on() and self._history_is_long():
            running = sorted(self._running_batches)
            deciding = sorted({s.views[k].batch_id for k in self._tally.awaiting if k in s.views} & set(running))
            return history_hold(running, deciding)
        return self._next_batch()[1]

    def _history_is_long(self) -> bool:
        return history_is_long_now(self._state.config.continue_as_new_after_events)

    async def _continue_as_new(self, inp: SprintInput) -> SprintReport:
        self._handing_over = True  # an update accepted now could be dropped with this run
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._course_corrections_settled()
        await self._stop_residents()  # each run owns its residents; the new run starts them again
        await self._roster_flushed()
        if self._forwards:
            await asyncio.gather(*self._forwards)
        self._state.runs += 1
        workflow.logger.info("continuing as new (run %d) with %d batches left", self._state.runs, len(self._state.queue))
        workflow.continue_as_new(inp.model_copy(update={"carried_state": self._state}))

    def _config_now(self) -> SprintConfig:
        """The config with the token limit as it stands now (an operator may have raised it)."""
        config = self._state.config
        budget = config.token_budget.model_copy(update={"limit": self._state.token_limit})
        return config.model_copy(update={"token_budget": budget})

    async def _run_slave(self, inp: SprintInput, simulation: SimulationScript, spec: BatchSpec) -> SlaveResult:
        s = self._state
        slave_id = slave_workflow_id(s.session_id, spec.batch_id)
        slave_input = SlaveInput(
            batch_id=spec.batch_id,
            session_id=s.session_id,
            project_root=inp.project_root,
            status_file=s.status_file,
            stories=[s.stories[k] for k in spec.stories],
            config=self._config_now(),
            config_overrides=inp.config_overrides,
            agent_backend=inp.agent_backend,
            simulation=simulation.model_dump(mode="json") if inp.agent_backend == "simulated" else {},
            resident_contacts=self._resident_contacts(),
            tokens_used_before=s.tokens_used,
            report_progress_to=workflow.info().workflow_id,
            checkpoint_pending=s.checkpoint is None and s.config.first_story_checkpoint == "pause",
            dependency_states={
                # One left out of the sprint that will not be done (needs-intervention, skipped): its dependants
                # are skipped, as for a planned one; they ran, on a dependency never finished.
                **{
                    dep: state
                    for key in spec.stories
                    for dep in s.stories[key].depends_on
                    if (state := s.outside_stories.get(dep)) is not None and never_done(state)
                    and dep not in s.waived_dependencies
                },
                **{
                    dep: self._dependency_state(dep)
                    for key in spec.stories
                    for dep in s.stories[key].depends_on
                    if dep in s.views and dep not in spec.stories
                },
            },
        )
        self._running_batches[spec.batch_id] = slave_id
        self._show()
        try:
            child = await workflow.start_child_workflow(
                SprintSlaveWorkflow.run,
                slave_input,
                id=slave_id,
                execution_timeout=None
                if workflow.patched(PATCH_SLAVE_WITHOUT_EXECUTION_TIMEOUT)
                else timedelta(seconds=s.config.slave_timeout_seconds),
                task_timeout=CHILD_WORKFLOW_TASK_TIMEOUT,
                static_summary=f"Batch {spec.batch_id} of sprint {s.session_id}: {', '.join(spec.stories)}",
                search_attributes=TypedSearchAttributes(
                    [
                        SA_SESSION_ID.value_set(s.session_id),
                        SA_BATCH_ID.value_set(spec.batch_id),
                        SA_PHASE.value_set(SprintPhase.RUNNING.value),
                    ]
                ),
            )
            self._started_batches.add(spec.batch_id)
            self._stop_over_budget()  # (past the budget while it was starting)
            self._slave_started(slave_name(spec.batch_id))
            if self._cancelling and self._cancel_slaves_once_started:  # the sprint was cancelled while it started
                await _cancel_quietly(slave_id)
            # Dependencies that ended while the Slave was starting (their updates could not reach it yet).
            settled = {
                dep: state
                for dep, state in ((d, self._dependency_state(d)) for d in slave_input.dependency_states)
                if state != slave_input.dependency_states[dep]
            }
            if settled:
                self._forward(SIGNAL_DEPENDENCY_UPDATE, settled, only=spec.batch_id)
            if s.paused_reason is not None:  # paused while the Slave was starting
                self._forward(SIGNAL_PAUSE, s.paused_reason, only=spec.batch_id)
            if s.shutdown and workflow.patched(PATCH_SHUTDOWN_AFTER_START):  # shut down while it was starting
                self._forwards.append(asyncio.create_task(_signal_quietly(slave_id, SIGNAL_SHUTDOWN)))
            result = await child
            # The updates the Slave made after its last story_updates signal, in order, before anything else.
            for update in result.final_updates:
                self._apply_story_update(update)
            result = result.model_copy(update={"final_updates": []})  # not kept in the sprint's state
            self._no_longer_waiting_for_the_status_file(spec)
        except ChildWorkflowError as err:
            why = (
                "cancelled with the sprint"
                if self._cancelling and is_cancelled_exception(err)
                else f"Slave ended abnormally: {err.cause or err}"
            )
            result = self._abnormal_result(spec, f"batch {spec.batch_id} {why}", await self._finish_cut_merges(spec))
        # Not in a `finally`: workflow calls are not allowed while an evicted workflow is torn down.
        self._running_batches.pop(spec.batch_id, None)
        if self._batch_end_sends_a_command:
            workflow.upsert_memo({"last_batch_ended": spec.batch_id})
        if spec.batch_id in self._started_batches:
            for key in self._still_in(spec):  # agents the Slave did not report finished (it ended abnormally)
                self._temp_seen(key, None)
            self._slave_finished(slave_name(spec.batch_id))
        self._started_batches.discard(spec.batch_id)
        self._show()
        return result

    def _no_longer_waiting_for_the_status_file(self, spec: BatchSpec) -> None:
        """A batch that ended is not waiting for the status file: its last update saying so (a batch shut down
        while its first read waited) may come after its result, which the Master no longer takes from it."""
        s = self._state
        for key in self._still_in(spec):
            if s.views[key].status_file_problem:
                self._put_view(key, s.views[key].model_copy(update={"status_file_problem": None}))

    def _still_in(self, spec: BatchSpec) -> list[str]:
        """The batch's stories that are still its own: a story rearmed while its batch ran belongs to the
        rearm's batch from then on."""
        return [key for key in spec.stories if self._state.views[key].batch_id == spec.batch_id]

    async def _finish_cut_merges(self, spec: BatchSpec) -> dict[str, MergeOutcome]:
        """The merges a batch that ended abnormally left under way, finished by the Master (not when the sprint
        is being cancelled): story key -> how each ended. Until then the batch still shows as
        running and the story as merging, so nothing that waits for the merge goes on."""
        s = self._state
        cut = [key for key in self._still_in(spec) if s.views[key].merging]
        # Patched only where it acts: a batch cut short mid-merge before replays as it ran.
        if not cut or self._cancelling or not workflow.patched(PATCH_FINISH_CUT_MERGES):
            return {}
        outcomes: dict[str, MergeOutcome] = {}
        for key in cut:
            try:
                merged = await merge_story_back(self._project_root, s.session_id, s.stories[key], s.config)
                outcomes[key] = MergeOutcome.of(merged)
            except ActivityError as err:
                outcomes[key] = MergeOutcome.failed(str(err.cause or err))
            workflow.logger.info("batch %d ended during the merge of %s; the Master finished it: %s",
                                 spec.batch_id, key, outcomes[key].note or "merged")
        return outcomes

    def _abnormal_result(self, spec: BatchSpec, reason: str, merges: dict[str, MergeOutcome]) -> SlaveResult:
        """The batch's result as the Master last saw it, when its Slave failed or timed out. `merges`: the
        outcome of each merge it left under way that the Master finished."""
        s = self._state
        s.errors.append(reason)
        (workflow.logger.warning if self._cancelling else workflow.logger.error)(reason)
        merge_cut: dict[str, str] = {}
        for key in self._still_in(spec):  # nothing of the batch is in flight any more
            view = s.views[key]
            # Nothing of it waits for anyone either: a decision for it is refused (its batch is not running).
            update: dict[str, Any] = {
                "agent_in_flight": None, "mode_in_flight": None, "debug_in_flight": None, "awaiting_decision": None,
                "status_file_problem": None,
            }
            if view.status_file_problem and view.agents_dispatched:  # its agent's answer waited: it is lost
                update["error"] = view.error or (
                    f"the batch ended while sprint-status.yaml did not parse ({view.status_file_problem}): the story "
                    f"kept {view.state}, its last agent's result was not recorded"
                )
            if view.merging:  # done: its merge finished by the Master, or (cancelled) maybe landed, told so
                outcome = merges.get(key) or MergeOutcome.cut_short()
                update |= {
                    "merging": False,
                    "error": view.error or outcome.note,
                    "work_left_out": bool(view.work_left_out) or outcome.work_left_out,
                }
                merge_cut[key] = view.state
            self._put_view(key, view.model_copy(update=update))
        if merge_cut:
            self._tell_dependants(merge_cut, spec.batch_id)
        progress = [_progress_from_view(k, s.views[k]) for k in self._still_in(spec)]
        # The stories rearmed out of the batch while it ran are part of its result as they ended there, as in a
        # Slave's own (their agents and tokens were lost). Patched where there are any: the tokens feed the budget.
        left = [_progress_from_view(key, view) for batch_id, key, view in self._left_running_batches
                if batch_id == spec.batch_id]
        if left and workflow.patched(PATCH_ABNORMAL_COUNTS_REARMED):
            progress += left
        dispatched = sum(p.agents_dispatched for p in progress)
        return build_slave_result(
            batch_id=spec.batch_id,
            session_id=s.session_id,
            progress=progress,
            agents_created=dispatched,
            agents_destroyed=dispatched,
            errors=[reason],
            budget_exhausted=False,
        )

    def _tokens_in_flight(self) -> int:
        """The running batches' tokens: their stories', and those of stories rearmed out of them meanwhile."""
        running = self._running_batches
        return sum(v.tokens_used for _, v in self._running_views()) + sum(
            view.tokens_used for batch_id, _, view in self._left_running_batches if batch_id in running
        )

    # --- the story views -----------------------------------------------------------------------

    def _put_view(self, key: str, view: StoryView) -> None:
        """Every change of a story's view goes through here (or _drop_view), which keeps the tally."""
        self._tally.change(key, self._state.views.get(key), view)
        self._state.views[key] = view

    def _drop_view(self, key: str) -> None:
        self._tally.change(key, self._state.views.pop(key, None), None)

    def _running_stories(self, batch_id: int) -> list[str]:
        """The stories of `batch_id` while its Slave runs (its spec outlives it until the batch's end is taken in)."""
        return self._running_specs[batch_id].stories if batch_id in self._running_batches else []

    def _running_views(self) -> Iterator[tuple[str, StoryView]]:
        """The views of the running batches' stories, less those rearmed out of them since: a walk over those
        batches, not over every story of the sprint (a view names a batch only if it is among its stories)."""
        views = self._state.views
        for batch_id in self._running_batches:
            for key in self._running_stories(batch_id):
                if (view := views.get(key)) is not None and view.batch_id == batch_id:
                    yield key, view

    # --- visibility ----------------------------------------------------------------------------

    def _set_phase(self, phase: SprintPhase) -> None:
        self._state.phase = phase
        workflow.upsert_search_attributes(
            [SA_SESSION_ID.value_set(self._state.session_id), SA_PHASE.value_set(phase.value)]
        )
        self._show()

    def _show(self) -> None:
        s = self._state
        # This runs on every story_updates signal: no walk over every story (the tally counts them), and only
        # the stories of running batches get a row, so the details stay small on a sprint of any size.
        rows = "\n".join(
            # (the key as code, numbers centred: the Web UI pads no cell, and `1-10-x` ran into its batch `3`)
            f"| `{k}` | {v.batch_id} | {v.state} | {v.review_round} | {v.in_flight} |" for k, v in self._running_views()
        )
        going_on = s.phase not in ENDED_PHASES
        waiting = [f"{k} ({why})" for k, why in self._tally.awaiting.items()] if going_on else []
        pause = f"\n\nPaused: {s.paused_reason}" if s.paused_reason and going_on else ""
        if s.shutdown and going_on:
            pause += f"\n\n{SHUTTING_DOWN}"
        if s.checkpoint:
            pause += f"\n\nFirst story checkpoint: {s.checkpoint}"
        if waiting:
            pause += "\n\nAwaiting a human decision (`decide` update): " + "; ".join(waiting)
        if held := self._why_no_batch_starts():
            pause += f"\n\n{held}"
        ended = self._ended_report if not going_on else None
        outcome = f" ({ended.status.value})" if ended is not None else ""
        workflow.set_current_details(
            f"**Sprint `{s.session_id}`**: {s.phase.value}{outcome}, {self._tally.done}/{len(s.views)} stories done, "
            f"batches {len(s.results)} done / {len(s.results) + len(s.queue) + len(self._running_batches)}, "
            f"tokens {s.tokens_used + self._tokens_in_flight()}"
            f"{f'/{s.token_limit}' if s.config.token_budget.enabled else ' (no budget)'}{pause}"
            # (no table once no batch runs: a header alone read as an empty sprint)
            + ("\n\n| story | batch | state | review round | agent in flight |\n|---|:-:|---|:-:|---|\n" + rows if rows else "")
        )


def _progress_from_view(key: str, view: StoryView) -> StoryProgress:
    return StoryProgress(
        key=key,
        state=view.state,
        agents_dispatched=view.agents_dispatched,
        review_rounds=view.review_round,
        fix_rounds=view.fix_rounds,
        tokens_used=view.tokens_used,
        started=view.agents_dispatched > 0,
        error=view.error,
    )


async def _signal_quietly(workflow_id: str, signal: str, *args: Any) -> None:
    """A forwarded signal; a Slave that has just ended cannot take it, which is not an error."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(signal, args=args)
    except Exception as err:  # noqa: BLE001 - the target is gone; nothing to do
        workflow.logger.warning("signal %s to %s not delivered: %s", signal, workflow_id, err)


async def _cancel_quietly(slave_id: str) -> None:
    """A cancelled sprint's Slave cancelled; one that has just ended cannot be, which is not an error."""
    try:
        await workflow.get_external_workflow_handle(slave_id).cancel()
    except Exception as err:  # noqa: BLE001 - ended meanwhile
        workflow.logger.warning("cancelling %s: %s", slave_id, err)
