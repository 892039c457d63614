"""Resident agents and the roster.

`ResidentWorkflow` is one resident (scrum-master, knowledge-researcher, debugger, e2e-live): a long-lived
child workflow of the Master, started when the sprint starts and stopped (the `stop` signal), in reverse
order, when it ends. It reports `resident_ready` to the Master once up, keeps the last AGENT_ROSTER_BROADCAST
(`roster_broadcast` signal) and serves its role's requests.

`RosterKeeper` is the Master's side, mixed into SprintMasterWorkflow: it starts and stops the residents,
keeps the roster (residents, Slaves, temps), broadcasts every change to the residents and only to them
(P54), counts the agents created and destroyed, and serves the two-phase AGENT_CREATE_REQUEST /
AGENT_DESTROY_REQUEST sequence as updates.

The residents are started with `parent_close_policy=ABANDON`, on purpose: the Master stops them itself, in
reverse order (also before it continues as new; the new run starts them again), and a Master terminated by
hand must not cancel them in the middle of a request.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows.inputs import RawInput, required_input

    from bso.constants import (
        CHILD_WORKFLOW_TASK_TIMEOUT,
        QUERY_STATUS,
        SA_PHASE,
        SA_SESSION_ID,
        SIGNAL_DEBUG_REQUEST,
        SIGNAL_DEBUG_RESULT,
        SIGNAL_PLAN_REQUEST,
        SIGNAL_PLAN_RESULT,
        SIGNAL_BROWSER_REQUEST,
        SIGNAL_BROWSER_RESULT,
        UPDATE_BROWSE,
        SIGNAL_RESEARCH_REQUEST,
        SIGNAL_RESEARCH_RESULT,
        UPDATE_RESEARCH,
        SIGNAL_RESIDENT_READY,
        SIGNAL_RESIDENT_STOPPED,
        SIGNAL_ROSTER_BROADCAST,
        SIGNAL_STOP,
        SIGNAL_STOP_NOW,
        UPDATE_AGENT_CREATE,
        UPDATE_AGENT_DESTROY,
        agents_task_queue_for,
    )
    from activities.debugger import AnalyzeInput, analyze_failure
    from activities.browser import BrowseInput, browse
    from activities.researcher import ResearchInput, research
    from bso.browser import BrowserRequest, BrowserResult
    from bso.research import ResearchRequest, ResearchResult
    from bso.debugging import DebugRequest, DebugResult
    from bso.dispatch import priority_key
    from bso.messages import RejectedMessage, describe_validation_error, keep_rejected, rejected_invalid
    from bso.roster import (
        ESSENTIAL_RESIDENT,
        MAX_BROADCASTS_KEPT,
        RESIDENT_ROLES,
        AgentCreated,
        AgentCreateRequest,
        AgentDestroyed,
        AgentDestroyRequest,
        ResidentStatus,
        ResidentSummary,
        Roster,
        RosterBroadcast,
        enabled_roles,
        resident_workflow_id,
        with_member,
        without_member,
    )
    from bso.resident_state import (
        ResidentRunInput,
        ResidentState,
        handover_due,
        resident_handover_limit,
    )
    from bso.scrum_master import FALLBACK, SCRUM_MASTER, PlanAnswer, PlanRequest, answer, stories_named_twice
    from bso.simulation import SimulationScript
    from workflows.delivery import deliver, hold

T = TypeVar("T")

RESIDENT_READY_TIMEOUT = timedelta(seconds=60)
# Roster changes that keep coming while a broadcast is on its way (an agent dispatched and one finished per
# story) are held this long after it, then broadcast together: residents hear of a change within ~1 s.
ROSTER_BROADCAST_HOLD = timedelta(seconds=1)

RESIDENT_SLOW_START_SECONDS = 2 * int(RESIDENT_READY_TIMEOUT.total_seconds())  # simulation: residents_slow_start
# A resident of an earlier run of the sprint id still running (that Master was terminated: an ended sprint stops
# its residents, ABANDON keeps them past a termination) is cancelled, and the start tried again this often, this
# far apart, while it ends.
PATCH_REPLACES_LINGERING_RESIDENT = "master-replaces-lingering-resident"
# Every roster broadcast is followed by its hold. Before, the hold came only when changes had come while the
# broadcast was on its way, and a sender that found none ended, the next change going out at once: a task
# whose only events were the broadcast's acknowledgements, joined on replay with the next task (sdk-core joins
# a task that completed with no command with the one after it), saw that next task's change first and held
# it, where it had gone out at once live (a nondeterminism error, the sprint's task failing on every retry).
PATCH_ROSTER_ALWAYS_HELD = "master-roster-always-held"
# Every roster broadcast is followed by its hold's timer also once the run ends (its residents stop), the end
# cutting the hold short. Before, a broadcast whose acknowledgements came after the end went on without a timer,
# one whose acknowledgements came before started one: on replay, where sdk-core joins a task that completed with
# no command with the one after it, the acknowledgements and the end fell in one activation, in the other order
# (a nondeterminism error; found by the suite's replay of a course-corrected sprint in that shape).
PATCH_ROSTER_HELD_AFTER_FLUSH = "master-roster-held-after-flush"
# A cancel that comes while the resident awaits a signal it sent (its ready signal, an answer) or a request's
# activity is taken by that call (the SDK lets a signal already sent decide its outcome; the activity fails
# with it) and then never raised again: the resident served on for ever, as nothing else stops a resident its
# Master cancelled as not ready in time. It now ends cancelled at its next wait.
PATCH_RESIDENT_ENDS_ON_ANY_CANCEL = "resident-ends-on-any-cancel"
LINGERING_RESIDENT_TRIES = 10
LINGERING_RESIDENT_WAIT = timedelta(seconds=1)
# A cancelled sprint starts no resident, and stops those an earlier run left running. A cancel that came while a
# lingering resident's stop_now was on its way (the SDK lets the delivered signal decide the await) was never
# raised: the sprint went on starting its residents during the cancel's wind-down; cancelled before it had
# replaced them all, it left the rest of the earlier run's residents running. Asked where it applies only.
PATCH_CANCEL_STOPS_RESIDENT_STARTS = "master-cancel-stops-resident-starts"
# ...and one cancelled (or failed) before the start of its first resident had its answer, when it could not know of
# them yet (it waited for the project's claim, say): it tells each resident id of the sprint stop_now, blindly.
# Asked where it applies only.
PATCH_STOPS_UNSEEN_LINGERING = "master-stops-unseen-lingering-residents"
# A plan request naming a story twice (sent by hand: the Master names each once) is refused; planned, some such
# requests failed the scrum-master's workflow task on every retry. Patched only where it refuses.
PATCH_PLAN_STORIES_ONCE = "resident-plan-request-stories-once"
# A `carried_state` in the input of a resident started by hand (it is a run's hand-over) fails it at once.
PATCH_CARRIED_STATE_ONLY_HANDED_OVER = "resident-carried-state-only-handed-over"


@workflow.defn(failure_exception_types=[ValidationError])  # a wrongly shaped input fails the workflow
class ResidentWorkflow:
    @workflow.init
    def __init__(self, inp: ResidentRunInput | RawInput | None = None) -> None:
        inp = self._input = required_input(inp, ResidentRunInput)
        # What a previous run handed over (continue-as-new), or a fresh start. `_carry` builds it back.
        carried = inp.carried_state or ResidentState()
        self._run = carried.run
        self._stopping = carried.stopping
        self._broadcasts: list[RosterBroadcast] = list(carried.broadcasts)
        self._received = carried.broadcasts_received
        self._served = carried.requests_served
        self._debug_requests: list[DebugRequest] = list(carried.debug_requests)
        self._research_requests: list[ResearchRequest] = list(carried.research_requests)
        self._browser_requests: list[BrowserRequest] = list(carried.browser_requests)
        self._plan_requests: list[PlanRequest] = list(carried.plan_requests)
        self._rejected: list[RejectedMessage] = list(carried.rejected_messages)
        self._rejected_total = carried.rejected_total
        self._script = SimulationScript.model_validate(inp.simulation)
        self._in_hand: list[workflow.ActivityHandle[Any]] = []  # the requests' activities running (stop_now)
        self._stopped_now = False  # stop_now came: requests are dropped, not answered (never carried: no hand-over)
        self._ends_on_any_cancel = False  # decided at the run's start (PATCH_RESIDENT_ENDS_ON_ANY_CANCEL)

    @workflow.signal(name=SIGNAL_DEBUG_REQUEST)
    def debug_request(self, payload: Any) -> None:
        """DEBUG_REQUEST: served in arrival order; the answer is a `debug_result` signal to `report_to`."""
        try:
            request = DebugRequest.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("DEBUG_REQUEST", payload, err))
            return
        if self._dropped_after_stop_now("DEBUG_REQUEST"):
            return
        self._debug_requests.append(request)

    @workflow.signal(name=SIGNAL_PLAN_REQUEST)
    def plan_request(self, payload: Any) -> None:
        """The Master's plan request (sprint start or course correction): answered by a `plan_result` signal."""
        try:
            request = PlanRequest.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("PLAN_REQUEST", payload, err))
            return
        if (why := stories_named_twice(request)) is not None and workflow.patched(PATCH_PLAN_STORIES_ONCE):
            self.record_rejected(RejectedMessage(msg_type="PLAN_REQUEST", reason=f"{request.request_id}: {why}"))
            return
        if self._dropped_after_stop_now("PLAN_REQUEST"):
            return
        self._plan_requests.append(request)

    @workflow.signal(name=SIGNAL_RESEARCH_REQUEST)
    def research_request(self, payload: Any) -> None:
        """RESEARCH_REQUEST by signal: the answer is a `research_result` signal to `report_to`."""
        try:
            request = ResearchRequest.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("RESEARCH_REQUEST", payload, err))
            return
        if self._dropped_after_stop_now("RESEARCH_REQUEST"):
            return
        if not request.report_to:
            self.record_rejected(RejectedMessage(msg_type="RESEARCH_REQUEST", reason=f"{request.request_id}: no report_to "
                                         "to answer by signal (agents use the `research` update)"))
            return
        self._research_requests.append(request)

    @workflow.update(name=UPDATE_RESEARCH)
    async def research(self, payload: Any) -> ResearchResult:
        """RESEARCH_REQUEST -> RESEARCH_RESULT in one call: what an agent (an activity) uses."""
        result = await self._research(ResearchRequest.model_validate(payload))
        self._served += 1
        return result

    @research.validator
    def _validate_research(self, payload: Any) -> None:
        if self._input.role != "knowledge-researcher":
            raise ApplicationError(f"{self._input.role} is not the knowledge researcher", type="InvalidRequest")
        if self._stopping:
            raise ApplicationError("the knowledge researcher is stopping", type="InvalidRequest")
        try:
            ResearchRequest.model_validate(payload)
        except ValidationError as err:
            raise ApplicationError(f"invalid RESEARCH_REQUEST: {describe_validation_error(err)}", type="InvalidRequest")

    @workflow.signal(name=SIGNAL_BROWSER_REQUEST)
    def browser_request(self, payload: Any) -> None:
        """BROWSER_REQUEST by signal: the answer is a `browser_result` signal to `report_to`."""
        try:
            request = BrowserRequest.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("BROWSER_REQUEST", payload, err))
            return
        if self._dropped_after_stop_now("BROWSER_REQUEST"):
            return
        if not request.report_to:
            self.record_rejected(RejectedMessage(msg_type="BROWSER_REQUEST", reason=f"{request.request_id}: no report_to "
                                         "to answer by signal (agents use the `browse` update)"))
            return
        self._browser_requests.append(request)

    @workflow.update(name=UPDATE_BROWSE)
    async def browse(self, payload: Any) -> BrowserResult:
        """BROWSER_REQUEST -> BROWSER_RESULT in one call: what an agent (an activity) uses."""
        result = await self._browse(BrowserRequest.model_validate(payload))
        self._served += 1
        return result

    @browse.validator
    def _validate_browse(self, payload: Any) -> None:
        if self._input.role != "e2e-live":
            raise ApplicationError(f"{self._input.role} is not the e2e-live resident", type="InvalidRequest")
        if self._stopping:
            raise ApplicationError("the e2e-live resident is stopping", type="InvalidRequest")
        try:
            BrowserRequest.model_validate(payload)
        except ValidationError as err:
            raise ApplicationError(f"invalid BROWSER_REQUEST: {describe_validation_error(err)}", type="InvalidRequest")

    async def _browse(self, request: BrowserRequest) -> BrowserResult:
        if self._input.role != "e2e-live":
            return BrowserResult(
                request_id=request.request_id, status="browser_error", error=f"{self._input.role} is not e2e-live"
            )
        try:
            return await self._in_hand_until_done(workflow.start_activity(
                browse,
                BrowseInput(
                    project_root=self._input.project_root, request=request, base_url=self._input.e2e_live_base_url
                ),
                task_queue=agents_task_queue_for(workflow.info().task_queue),
                start_to_close_timeout=timedelta(milliseconds=request.timeout_ms * 3) + timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=f"browser {request.operation} ({request.request_id})",
                **_priority(request.priority),
            ))
        except ActivityError as err:
            return BrowserResult(request_id=request.request_id, status="browser_error", error=str(err.cause or err))

    @workflow.signal(name=SIGNAL_ROSTER_BROADCAST)
    def roster_broadcast(self, payload: Any) -> None:
        try:
            message = RosterBroadcast.model_validate(payload)
        except ValidationError as err:
            self.record_rejected(rejected_invalid("AGENT_ROSTER_BROADCAST", payload, err))
            return
        self._received += 1
        self._broadcasts = [*self._broadcasts, message][-MAX_BROADCASTS_KEPT:]

    @workflow.signal(name=SIGNAL_STOP)
    def stop(self) -> None:
        self._stopping = True

    @workflow.signal(name=SIGNAL_STOP_NOW)
    def stop_now(self) -> None:
        """The sprint was cancelled: nobody waits for an answer any more. The requests not served yet are dropped
        and the activities of those in hand cancelled (an analysis no worker has picked up would hold the stop,
        and the cancelled sprint with it, for ever)."""
        self._stopping = self._stopped_now = True
        dropped = len(self._debug_requests) + len(self._research_requests) + len(self._browser_requests)
        dropped += len(self._plan_requests)
        for pending in (self._debug_requests, self._research_requests, self._browser_requests, self._plan_requests):
            pending.clear()
        for handle in self._in_hand:  # a list: the cancel commands go out in a fixed order
            handle.cancel()
        workflow.logger.info("stopping now: %d request(s) dropped, %d cancelled", dropped, len(self._in_hand))

    def _dropped_after_stop_now(self, msg_type: str) -> bool:
        """A request that came after stop_now: nobody waits for its answer (recorded as rejected)."""
        if self._stopped_now:
            self.record_rejected(RejectedMessage(msg_type=msg_type, reason="the sprint was cancelled: this resident is stopping"))
        return self._stopped_now

    async def _in_hand_until_done(self, handle: workflow.ActivityHandle[T]) -> T:
        """A request's activity, cancelled by stop_now while it runs."""
        self._in_hand.append(handle)
        try:
            return await handle
        finally:
            self._in_hand.remove(handle)

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> ResidentStatus:
        return ResidentStatus(
            role=self._input.role,
            roster=self._broadcasts[-1].roster if self._broadcasts else None,
            broadcasts=list(self._broadcasts),
            broadcasts_received=self._received,
            requests_served=self._served,
            stopping=self._stopping,
            run=self._run,
            rejected_messages=list(self._rejected),
            rejected_total=self._rejected_total,
        )

    def record_rejected(self, message: RejectedMessage) -> None:
        """A message this resident cannot act on: recorded (status query), logged, never raised."""
        self._rejected_total += 1
        self._rejected = keep_rejected(self._rejected, message)
        workflow.logger.warning("%s ignored: %s", message.msg_type, message.reason)

    @workflow.run
    async def run(self, inp: ResidentRunInput | RawInput | None = None) -> ResidentSummary:
        inp = self._input  # as __init__ validated it
        self._ends_on_any_cancel = workflow.patched(PATCH_RESIDENT_ENDS_ON_ANY_CANCEL)
        if (
            inp.carried_state is not None
            and workflow.info().continued_run_id is None
            and workflow.patched(PATCH_CARRIED_STATE_ONLY_HANDED_OVER)
        ):
            raise ApplicationError(  # (a resident started by hand: one recorded before ran on it)
                "carried_state: it is what a resident hands over to its next run, not an input of a new one; "
                "leave it out", type="InvalidResidentInput", non_retryable=True,
            )
        if inp.carried_state is None:  # a new run after a hand-over is the same resident: ready already
            if inp.fail_start:
                raise ApplicationError(f"{inp.role} resident failed to start (simulated)", type="ResidentStartFailed")
            if inp.start_delay_seconds:
                await workflow.sleep(inp.start_delay_seconds)  # simulation: slower than the readiness window
            await workflow.get_external_workflow_handle(inp.master_id).signal(SIGNAL_RESIDENT_READY, inp.role)
            self._end_if_cancelled()  # the Master gave up on it while the ready signal was on its way
        workflow.set_current_details(
            f"**Resident {inp.role}** of `{inp.session_id}`" + (f" (run {self._run})" if self._run > 1 else "")
        )
        await self.serve()
        # Sent with the completion itself: a Master that cannot wait for this run's result waits for this.
        await _signal_quietly(inp.master_id, SIGNAL_RESIDENT_STOPPED, inp.role)
        return ResidentSummary(role=inp.role, broadcasts_received=self._received, requests_served=self._served)

    async def serve(self) -> None:
        """Serve requests until stopped; requests already received are answered first."""
        while True:
            await workflow.wait_condition(
                lambda: self._stopping
                or bool(self._debug_requests)
                or bool(self._research_requests)
                or bool(self._browser_requests)
                or bool(self._plan_requests)
                or self._handover_due()
                or self._cancel_taken_by_a_call()
            )
            self._end_if_cancelled()
            if self._handover_due():
                await self._hand_over()  # returns only if a stop arrived meanwhile
                continue
            if self._plan_requests:
                wanted_plan = self._plan_requests.pop(0)
                planned = self._plan(wanted_plan)
                self._served += 1
                await _signal_quietly(wanted_plan.report_to, SIGNAL_PLAN_RESULT, planned.model_dump(mode="json"))
                continue
            if self._browser_requests:
                wanted = self._browser_requests.pop(0)
                outcome = await self._browse(wanted)
                if self._stopped_now:
                    continue  # cancelled by stop_now: nobody waits for the answer
                self._served += 1
                await _signal_quietly(wanted.report_to or "", SIGNAL_BROWSER_RESULT, outcome.model_dump(mode="json"))
                continue
            if self._research_requests:
                asked = self._research_requests.pop(0)
                answer = await self._research(asked)
                if self._stopped_now:
                    continue  # cancelled by stop_now: nobody waits for the answer
                self._served += 1
                await _signal_quietly(asked.report_to or "", SIGNAL_RESEARCH_RESULT, answer.model_dump(mode="json"))
                continue
            if not self._debug_requests:
                await workflow.wait_condition(workflow.all_handlers_finished)
                return
            request = self._debug_requests.pop(0)
            result = await self._debug(request)
            if self._stopped_now:
                continue  # cancelled by stop_now: nobody waits for the answer
            self._served += 1
            await _signal_quietly(request.report_to, SIGNAL_DEBUG_RESULT, result.model_dump(mode="json"))

    def _cancel_taken_by_a_call(self) -> bool:
        return self._ends_on_any_cancel and workflow.cancellation_reason() is not None

    def _end_if_cancelled(self) -> None:
        """A cancel request some call took for its own: the resident ends cancelled, as it would have had the
        cancel come while it waited."""
        if self._cancel_taken_by_a_call():
            raise asyncio.CancelledError

    # --- continue-as-new -----------------------------------------------------------------------------

    def _handover_due(self) -> bool:
        info = workflow.info()
        return handover_due(
            info.get_current_history_length(),
            info.is_continue_as_new_suggested(),
            self._input.continue_as_new_after_events,
            self._stopping,
        )

    def _carry(self) -> ResidentState:
        """Everything this run knows, for the next one (requests not answered yet included)."""
        return ResidentState(
            run=self._run + 1,
            broadcasts=list(self._broadcasts),
            broadcasts_received=self._received,
            requests_served=self._served,
            stopping=self._stopping,
            plan_requests=list(self._plan_requests),
            browser_requests=list(self._browser_requests),
            research_requests=list(self._research_requests),
            debug_requests=list(self._debug_requests),
            rejected_messages=list(self._rejected),
            rejected_total=self._rejected_total,
        )

    async def _hand_over(self) -> None:
        """Continue as new between two requests (none is being served by the loop). Updates in progress
        finish first; signals that arrive meanwhile, or while the hand-over is being recorded, land in the
        carried state (Temporal rejects a continue-as-new that would drop a signal, and the task runs again
        with it). Signals and updates sent after it go to the new run: everyone addresses a resident by its
        workflow id, never by run. The Master's child handle follows the chain: it sees one resident."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._stopping:
            return  # stopping: this run serves what is left and ends
        state = self._carry()
        workflow.logger.info(
            "resident %s continues as new (run %d, %d requests pending)", self._input.role, state.run, state.pending
        )
        workflow.continue_as_new(self._input.model_copy(update={"carried_state": state}))

    def _plan(self, request: PlanRequest) -> PlanAnswer:
        """BATCH_PLAN_READY or COURSE_CORRECTION, computed here by the pure rules (no I/O needed)."""
        if self._input.role != SCRUM_MASTER:
            return PlanAnswer(
                request_id=request.request_id, planner=FALLBACK, error=f"{self._input.role} is not the scrum-master"
            )
        planned = answer(request, SCRUM_MASTER)
        what = "COURSE_CORRECTION" if request.course_correction is not None else "BATCH_PLAN_READY"
        workflow.logger.info("%s for %s%s", what, request.request_id, f": {planned.error}" if planned.error else "")
        return planned

    async def _research(self, request: ResearchRequest) -> ResearchResult:
        if self._input.role != "knowledge-researcher":
            return ResearchResult(
                request_id=request.request_id, story_key=request.story_key, query=request.query,
                status="unavailable", error=f"{self._input.role} is not the knowledge researcher",
            )
        limits = self._input.knowledge_research
        try:
            return await self._in_hand_until_done(workflow.start_activity(
                research,
                ResearchInput(
                    project_root=self._input.project_root,
                    request=request,
                    limits=limits,
                    backend=self._input.agent_backend,
                ),
                task_queue=agents_task_queue_for(workflow.info().task_queue),
                start_to_close_timeout=timedelta(seconds=limits.call_timeout_seconds + 60),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"research {request.request_id} for {request.story_key}",
                **_priority(request.priority),
            ))
        except ActivityError as err:
            return ResearchResult(
                request_id=request.request_id, story_key=request.story_key, query=request.query,
                status="error", error=f"research failed: {err.cause or err}",
            )

    async def _debug(self, request: DebugRequest) -> DebugResult:
        if self._input.role != "debugger":
            return DebugResult(
                debug_id=request.debug_id, story_key=request.story_key, status="unavailable",
                error=f"{self._input.role} is not the debugger",
            )
        scripted = list(self._script.for_story(request.story_key).debug)
        outcome = scripted[request.attempt - 1] if request.attempt <= len(scripted) else "unfixable"
        if not request.session_id:  # sent by hand: its journal section is named after this sprint
            request = request.model_copy(update={"session_id": self._input.session_id})
        try:
            return await self._in_hand_until_done(workflow.start_activity(
                analyze_failure,
                AnalyzeInput(
                    project_root=self._input.project_root,
                    request=request,
                    backend=self._input.agent_backend,
                    scripted=outcome,
                ),
                task_queue=agents_task_queue_for(workflow.info().task_queue),
                start_to_close_timeout=timedelta(seconds=600),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"debug {request.debug_id} for {request.story_key}",
                **_priority(request.priority),
            ))
        except ActivityError as err:
            return DebugResult(
                debug_id=request.debug_id, story_key=request.story_key, status="unavailable",
                error=f"analysis failed: {err.cause or err}",
            )


class RosterKeeper:
    """The Master's side of the residents and the roster (mixed into SprintMasterWorkflow)."""

    _state: Any  # MasterState
    _cancelling: bool  # the Master's: a cancel request came (PATCH_CANCEL_STOPS_RESIDENT_STARTS)

    def _init_roster(self) -> None:
        self._ready_residents: set[str] = set()
        self._resident_handles: dict[str, workflow.ChildWorkflowHandle[Any, Any]] = {}
        self._roster_changes: list[str] = []  # changes not yet broadcast
        self._roster_sender: asyncio.Task[None] | None = None
        self._roster_loop: asyncio.Task[None] | None = None  # the run's sender (PATCH_ROSTER_ALWAYS_HELD)
        self._roster_held_after_flush = False  # PATCH_ROSTER_HELD_AFTER_FLUSH, decided at the run's start
        self._roster_sending = False  # a broadcast on its way (the run's sender)
        self._roster_holds_over = False  # the run ends (its residents stop): changes go out without a hold
        self._roster_hold_timers: list[asyncio.Task[None]] = []  # left to fire, as the Slave's holds
        self._stopped_residents: set[str] = set()
        self._resident_starting: str | None = None  # the workflow id of a resident being started, until taken in
        self._lingering_found = False  # an earlier run's resident was found running
        self._residents_tried = False  # the start of this run's first resident has had its answer
        self._no_residents_under_this_id = False  # an id refused at the start: none could have been started

    @workflow.signal(name=SIGNAL_RESIDENT_STOPPED)
    def resident_stopped(self, role: Any) -> None:
        if isinstance(role, str):
            self._stopped_residents.add(role)

    @workflow.signal(name=SIGNAL_RESIDENT_READY)
    def resident_ready(self, role: Any) -> None:
        if isinstance(role, str):
            self._ready_residents.add(role)

    # --- residents -------------------------------------------------------------------------------

    async def _start_residents(self, project_root: str, simulation: SimulationScript, backend: str) -> None:
        """Start the configured residents in slot order. One that fails degrades the sprint (its requests
        are answered "unavailable"); the scrum-master's failure fails the sprint."""
        s = self._state
        for role in enabled_roles(s.config.resident_slots):
            self._no_start_once_cancelled()
            workflow_id = resident_workflow_id(s.session_id, role)
            self._resident_starting = workflow_id
            failure = await self._start_resident(role, workflow_id, project_root, simulation, backend)
            self._resident_starting = None
            self._residents_tried = True  # a lingering resident would have been found by now (or none lingers)
            if failure is None:
                s.residents[role] = workflow_id
                s.agents_created += 1
                self._roster_changed(with_member(s.roster, "residents", role), f"resident {role} started")
                continue
            reason = f"resident {role} unavailable: {failure}"
            workflow.logger.error(reason)
            if role == ESSENTIAL_RESIDENT:
                await self._stop_residents()
                raise ApplicationError(
                    f"the sprint cannot run without its scrum-master: {reason}", type="ResidentUnavailable",
                    non_retryable=True,
                )
            s.unavailable_residents[role] = reason
            s.errors.append(reason)

    async def _start_resident(
        self, role: str, workflow_id: str, project_root: str, simulation: SimulationScript, backend: str
    ) -> str | None:
        s = self._state
        for attempt in range(1, LINGERING_RESIDENT_TRIES + 1):
            if attempt > 1:
                self._no_start_once_cancelled()
            try:
                handle = await self._start_resident_workflow(role, workflow_id, project_root, simulation, backend)
                break
            except WorkflowAlreadyStartedError as err:
                if attempt == LINGERING_RESIDENT_TRIES or not workflow.patched(PATCH_REPLACES_LINGERING_RESIDENT):
                    return f"could not start: {err}"
                self._lingering_found = True
                if attempt == 1:
                    workflow.logger.warning("resident %s of an earlier run of sprint %s still runs: stopping it",
                                            role, s.session_id)
                await _stop_lingering(workflow_id)  # again each time: it may have continued as new meanwhile
                await workflow.sleep(LINGERING_RESIDENT_WAIT)
            except Exception as err:  # noqa: BLE001 - the start refused for another reason
                return f"could not start: {err}"
        try:
            await workflow.wait_condition(
                lambda: role in self._ready_residents or handle.done(), timeout=RESIDENT_READY_TIMEOUT
            )
        except asyncio.TimeoutError:
            why = f"not ready within {int(RESIDENT_READY_TIMEOUT.total_seconds())}s"
            if not workflow.patched("cancel-unready-resident"):
                return why
            return await _cancel_unready(workflow_id, why)
        if role not in self._ready_residents:
            err = handle.exception() if not handle.cancelled() else None
            cause = err.__cause__ if err is not None and err.__cause__ is not None else err
            return str(cause.message if isinstance(cause, ApplicationError) else cause or "ended while starting")
        self._resident_handles[role] = handle
        return None

    async def _start_resident_workflow(
        self, role: str, workflow_id: str, project_root: str, simulation: SimulationScript, backend: str
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        s = self._state
        return await workflow.start_child_workflow(
            ResidentWorkflow.run,
            ResidentRunInput(
                role=role,
                session_id=s.session_id,
                master_id=workflow.info().workflow_id,
                project_root=project_root,
                simulation=simulation.model_dump(mode="json") if backend == "simulated" else {},
                agent_backend=backend,
                fail_start=role in simulation.residents_fail_start,
                start_delay_seconds=RESIDENT_SLOW_START_SECONDS if role in simulation.residents_slow_start else 0,
                knowledge_research=s.config.research_limits(),
                e2e_live_base_url=s.config.e2e_live_base_url,
                continue_as_new_after_events=resident_handover_limit(s.config),
            ),
            id=workflow_id,
            parent_close_policy=ParentClosePolicy.ABANDON,
            task_timeout=CHILD_WORKFLOW_TASK_TIMEOUT,
            static_summary=f"Resident {role} of sprint {s.session_id}",
            search_attributes=TypedSearchAttributes(
                [SA_SESSION_ID.value_set(s.session_id), SA_PHASE.value_set("resident")]
            ),
        )

    async def _cancel_starting_resident(self) -> None:
        """A cancelled sprint: the resident it was starting is not in the roster yet, and nothing else would stop
        it (ABANDON). From PATCH_CANCEL_STOPS_RESIDENT_STARTS on, a sprint cancelled while it was replacing the
        residents an earlier run left running (a sprint started again after its Master was terminated) stops
        every one of them it has not replaced yet: nothing else would. (Those of this run are stopped with the
        others, _stop_residents.) Only once one was found: each stop of a resident that is not there is a
        command that fails, and the time-skipping test server never answers a cancel of a workflow it does not
        have. A sprint cancelled or failed before the start of its first resident had its answer
        (PATCH_STOPS_UNSEEN_LINGERING) knows of none: it tells every resident id of the sprint stop_now."""
        if self._resident_starting is not None:
            workflow.logger.warning(await _cancel_unready(self._resident_starting, "the sprint was cancelled"))
        if self._cancelling and self._lingering_found and workflow.patched(PATCH_CANCEL_STOPS_RESIDENT_STARTS):
            s = self._state
            for role in enabled_roles(s.config.resident_slots):
                if role not in s.residents:
                    await _stop_lingering(resident_workflow_id(s.session_id, role))
        if not self._residents_tried and not self._no_residents_under_this_id and workflow.patched(
            PATCH_STOPS_UNSEEN_LINGERING
        ):
            # Any role, enabled or not by this run's config; a signal only: one to a resident that is not there
            # fails at once, where the time-skipping test server never answers a cancel of one.
            ids = [resident_workflow_id(self._state.session_id, role) for role in RESIDENT_ROLES]
            await asyncio.gather(*(_stop_now_quietly(workflow_id) for workflow_id in ids))

    def _no_start_once_cancelled(self) -> None:
        """Raise the cancel a delivered signal swallowed (see PATCH_CANCEL_STOPS_RESIDENT_STARTS) before a start."""
        if self._cancelling and workflow.patched(PATCH_CANCEL_STOPS_RESIDENT_STARTS):
            self._resident_starting = None  # none of this run's is starting: the earlier run's are stopped
            raise asyncio.CancelledError

    async def _stop_residents(self, *, now: bool = False) -> None:
        """Stop the residents in reverse start order, each after the one started after it. `now` (a cancelled
        sprint): they drop the requests they hold instead of answering them first."""
        s = self._state
        for role in reversed(list(s.residents)):
            # Every broadcast already sent reaches the resident before its stop: nothing arrives while it ends.
            await self._roster_flushed()
            workflow_id = s.residents.pop(role, None)
            if workflow_id is None:  # a cancelled sprint's own end stopped it meanwhile
                continue
            try:
                await workflow.get_external_workflow_handle(workflow_id).signal(SIGNAL_STOP_NOW if now else SIGNAL_STOP)
                handle = self._resident_handles.pop(role, None)
                if handle is not None:  # started by this run: wait until it has stopped
                    await handle
                else:  # started by an earlier run (continue-as-new): wait for its resident_stopped
                    await workflow.wait_condition(lambda: role in self._stopped_residents, timeout=RESIDENT_READY_TIMEOUT)
            except Exception as err:  # noqa: BLE001 - already gone: it is stopped either way
                workflow.logger.warning("resident %s: %s", role, err)
            s.agents_destroyed += 1
            self._roster_changed(without_member(s.roster, "residents", role), f"resident {role} stopped")

    def _resident_contacts(self) -> dict[str, str]:
        """TASK_ASSIGNMENT's resident_contacts: the running residents an agent may ask (workflow ids)."""
        return {role: wid for role, wid in self._state.residents.items() if role != ESSENTIAL_RESIDENT}

    # --- the roster --------------------------------------------------------------------------------

    def _roster_changed(self, roster: Roster, change: str) -> None:
        """AGENT_ROSTER_BROADCAST with the full roster, to each resident and only to residents (P54).

        One broadcast at a time, each followed by a hold of ROSTER_BROADCAST_HOLD; the changes made meanwhile
        go out together at its end (the latest full roster, `change` naming each change in order). A broadcast
        per change cost every resident a workflow task and the Master two events per resident for each agent
        dispatched and finished."""
        self._state.roster = roster
        self._roster_changes.append(change)
        if self._roster_loop is not None:
            return  # the run's sender takes it (_roster_sender_loop)
        if self._roster_sender is None or self._roster_sender.done():
            self._roster_sender = asyncio.create_task(self._send_roster())

    def _start_roster_sender(self) -> None:
        """PATCH_ROSTER_ALWAYS_HELD: one sender for the whole run, woken by a condition, never a task started by a
        change. A task started by a change sent before what the change's handler did next; a sender woken out of
        its hold sent after it: on replay, where sdk-core joins an empty task (the hold's timer firing) with the
        next one, the broadcast and, say, a signal forwarded to a Slave swapped places, and the failure of one
        (a Slave just ended) was taken for the other's."""
        self._roster_loop = asyncio.create_task(self._roster_sender_loop())

    async def _broadcast(self, changes: list[str]) -> None:
        s = self._state
        s.roster_seq += 1
        message = RosterBroadcast(session_id=s.session_id, seq=s.roster_seq, change="; ".join(changes), roster=s.roster)
        payload = message.model_dump(mode="json")
        await asyncio.gather(
            *(_signal_quietly(workflow_id, SIGNAL_ROSTER_BROADCAST, payload) for workflow_id in s.residents.values())
        )

    async def _send_roster(self) -> None:
        """Sprints started before PATCH_ROSTER_ALWAYS_HELD: a sender per burst of changes, held only when
        changes came while a broadcast was on its way."""
        while self._roster_changes:
            changes, self._roster_changes = self._roster_changes, []
            if not self._state.residents:
                continue
            await self._broadcast(changes)
            if self._roster_changes:  # changes keep coming: gather them a little longer
                await workflow.sleep(ROSTER_BROADCAST_HOLD)

    async def _roster_sender_loop(self) -> None:
        while True:
            await workflow.wait_condition(
                lambda: bool(self._roster_changes) and (self._roster_sender is None or self._roster_sender.done())
            )
            changes, self._roster_changes = self._roster_changes, []
            if not self._state.residents:
                continue
            self._roster_sending = True
            await self._broadcast(changes)
            self._roster_sending = False
            # Whatever came meanwhile waits for the hold's end: whether a change came before the acknowledgements
            # or after them is not the same on replay. Nor whether the run's end did: the hold's timer starts
            # either way, the end only cuts it short.
            if self._roster_held_after_flush or not self._roster_holds_over:
                await hold(ROSTER_BROADCAST_HOLD, self._roster_hold_timers, lambda: self._roster_holds_over)

    async def _roster_flushed(self) -> None:
        """Every change broadcast, none on its way (a resident stopped next must not get one while it ends). Only
        as the run ends (its residents stop): from then on changes go out without a hold."""
        self._roster_holds_over = True
        if self._roster_loop is not None:
            await workflow.wait_condition(
                lambda: not self._roster_changes
                and not self._roster_sending
                and (self._roster_sender is None or self._roster_sender.done())
            )
            return
        while self._roster_sender is not None and not self._roster_sender.done():
            await self._roster_sender

    def _slave_started(self, name: str) -> None:
        self._state.agents_created += 1
        self._roster_changed(with_member(self._state.roster, "slaves", name), f"{name} started")

    def _slave_finished(self, name: str) -> None:
        self._state.agents_destroyed += 1
        self._roster_changed(without_member(self._state.roster, "slaves", name), f"{name} finished")

    def _temp_seen(self, story_key: str, name: str | None) -> None:
        """A story's agent in flight, from the Slave's story_update: a new temp, or its end."""
        s = self._state
        current = s.temps.get(story_key)
        if current == name:
            return
        if current is not None:
            del s.temps[story_key]
            s.agents_destroyed += 1
            self._roster_changed(without_member(s.roster, "temps", current), f"{current} finished")
        if name is not None:
            s.temps[story_key] = name
            s.agents_created += 1
            self._roster_changed(with_member(s.roster, "temps", name), f"{name} dispatched")

    # --- the two-phase creation protocol -------------------------------------------------------------

    @workflow.update(name=UPDATE_AGENT_CREATE)
    def agent_create_request(self, request: Any) -> AgentCreated:
        """AGENT_CREATE_REQUEST -> AGENT_CREATED (the agent joins the roster's temps)."""
        parsed = AgentCreateRequest.model_validate(request)
        s = self._state
        name = f"{parsed.agent_type.value}-{s.agents_created + 1}"
        s.agents_created += 1
        s.external_temps.append(name)
        self._roster_changed(with_member(s.roster, "temps", name), f"{name} created for {parsed.requested_by}")
        return AgentCreated(agent_name=name, agent_type=parsed.agent_type)

    @agent_create_request.validator
    def _validate_agent_create(self, request: Any) -> None:
        try:
            AgentCreateRequest.model_validate(request)
        except ValidationError as err:
            raise ApplicationError(f"AGENT_CREATE_REQUEST rejected: {describe_validation_error(err)}") from None
        most = self._state.config.max_external_agents
        if len(self._state.external_temps) >= most:  # a validator: refused before it reaches history
            raise ApplicationError(
                f"AGENT_CREATE_REQUEST rejected: {most} agents it created are still on the roster "
                "(max_external_agents): destroy one first (AGENT_DESTROY_REQUEST)"
            )

    @workflow.update(name=UPDATE_AGENT_DESTROY)
    def agent_destroy_request(self, request: Any) -> AgentDestroyed:
        """AGENT_DESTROY_REQUEST -> AGENT_DESTROYED (the agent leaves the roster)."""
        parsed = AgentDestroyRequest.model_validate(request)
        s = self._state
        s.external_temps.remove(parsed.agent_name)
        s.agents_destroyed += 1
        self._roster_changed(without_member(s.roster, "temps", parsed.agent_name), f"{parsed.agent_name} destroyed")
        return AgentDestroyed(agent_name=parsed.agent_name)

    @agent_destroy_request.validator
    def _validate_agent_destroy(self, request: Any) -> None:
        try:
            parsed = AgentDestroyRequest.model_validate(request)
        except ValidationError as err:
            raise ApplicationError(f"AGENT_DESTROY_REQUEST rejected: {describe_validation_error(err)}") from None
        if parsed.agent_name not in self._state.external_temps:
            raise ApplicationError(
                f"AGENT_DESTROY_REQUEST rejected: no agent {parsed.agent_name!r} was created by AGENT_CREATE_REQUEST"
            )


def _priority(priority: str | None) -> dict[str, Any]:
    """The request's message priority as the activity's Temporal priority (nothing when it has none)."""
    key = priority_key(priority)
    return {"priority": Priority(priority_key=key)} if key is not None else {}


async def _cancel_unready(workflow_id: str, why: str) -> str:
    """A resident left out of the sprint must not linger: ask it to cancel (it is started with ABANDON)."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).cancel()
    except Exception as err:  # noqa: BLE001 - e.g. it ended meanwhile
        return f"{why}; cancelling it failed: {err}"
    return f"{why}; cancelled"


async def _stop_lingering(workflow_id: str) -> None:
    """A resident an earlier run of the sprint left running: told stop_now, it drops the requests it holds and
    cancels the call in hand (cancelled alone, a resident busy with a request takes the cancel for that call's
    failure and serves on), and cancelled, should it not be serving."""
    handle = workflow.get_external_workflow_handle(workflow_id)
    for stop in (lambda: handle.signal(SIGNAL_STOP_NOW), handle.cancel):
        try:
            await stop()
        except Exception as err:  # noqa: BLE001 - it ended meanwhile
            workflow.logger.info("resident %s: %s", workflow_id, err)


async def _stop_now_quietly(workflow_id: str) -> None:
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(SIGNAL_STOP_NOW)
    except Exception:  # noqa: BLE001 - none there (the usual case)
        return
    workflow.logger.warning("resident %s of an earlier run of the sprint was still running: told stop_now", workflow_id)


async def _signal_quietly(workflow_id: str, signal: str, arg: Any = None) -> None:
    """A signal whose failure must not stop the sender: retried with message-schemas' bound, then logged as
    delivery_failed (workflows/delivery.py)."""
    if arg is None:
        await deliver(workflow_id, signal)
    else:
        await deliver(workflow_id, signal, arg)

