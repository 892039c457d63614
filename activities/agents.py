"""The agent activity: one execution per dispatch (P51), on the `bso-agents` task queue.

It runs the agent through the chosen backend and delivers AGENT_COMPLETE to the Slave: as the
activity's result when the assignment asks for it (`answer_in_result`, what the Slave does for agents
that answer in-process), else as a signal. Before delivering it records the answer on disk
(`.sprint-session/dispatches/`, with the workflow run it answers): an activity retried after its agent had
answered (a worker killed at the wrong moment) re-delivers that answer instead of running the agent again. The
Slave ignores the duplicate. An answer another run recorded (a sprint started again under its id reuses the
dispatch ids) is not re-delivered: the agent runs and its answer replaces it.
One attempt of a dispatch runs at a time on a host: a retry that starts while an earlier attempt is still
running (its worker stood still past the heartbeat timeout, as on a closed laptop, and woke with both) waits
for it. If the earlier attempt records its answer before its next heartbeat, the retry re-delivers that
answer; if the heartbeat comes first, the server tells it that it was superseded, it is cancelled, and the
retry runs the agent again (at-least-once, never two at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.backends import command, external, simulated
from activities.session_files import (
    dispatch_answer_path,
    dispatch_lock_path,
    record_dispatch_answer,
    recorded_dispatch_answer,
)
from bso.agent_progress import progress_update
from bso.answer_size import fit_for_history, without_oversized_po_message
from bso.constants import SIGNAL_AGENT_COMPLETE
from bso.messages import AgentComplete, DispatchReceipt, TaskAssignment

Backend = Callable[[TaskAssignment], Awaitable[AgentComplete | None]]

BACKENDS: dict[str, Backend] = {
    "simulated": simulated.run,
    "external": external.run,
    "command": command.run,
}


def _answer_path(assignment: TaskAssignment):
    return dispatch_answer_path(assignment.project_root, assignment.dispatch_id)


LOCK_POLL_SECONDS = 0.1
WAITING_PHASE = "waiting"  # the heartbeat phase of an attempt waiting for an earlier one


def _waiting_update(assignment: TaskAssignment) -> dict:
    """The heartbeat detail of an attempt waiting for the lock: a PROGRESS_UPDATE like every agent heartbeat."""
    return progress_update(
        agent_id=assignment.agent_type.value,
        task_id=assignment.story_key,
        at=datetime.now(UTC),
        percent=0,
        current_activity="waiting for an earlier attempt still running",
        dispatch_id=assignment.dispatch_id,
        phase=WAITING_PHASE,
    )


@contextlib.asynccontextmanager
async def one_attempt_at_a_time(assignment: TaskAssignment) -> AsyncIterator[None]:
    """Hold the dispatch's lock file while this attempt runs. A later attempt that finds it held (the server
    gave up on an attempt whose worker stood still, retried it, and the worker woke with both) heartbeats and
    waits. When it gets the lock, the earlier attempt either recorded its answer (re-delivered, the agent's
    work not done twice) or was cancelled before it could (the agent runs again). The kernel releases the
    lock of a worker that is killed, and closing the descriptor releases it on cancellation."""
    fd = os.open(dispatch_lock_path(assignment.project_root, assignment.dispatch_id), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    activity.logger.info(
                        "dispatch %s: waiting for an earlier attempt still running", assignment.dispatch_id
                    )
                    waited = True
                activity.heartbeat(_waiting_update(assignment))
                await asyncio.sleep(LOCK_POLL_SECONDS)
        yield
    finally:
        os.close(fd)  # releases the lock


async def _deliver(assignment: TaskAssignment, complete: AgentComplete) -> bool:
    handle = activity.client().get_workflow_handle(assignment.report_to)
    try:
        await handle.signal(SIGNAL_AGENT_COMPLETE, complete.model_dump(mode="json"))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            # The Slave is gone (finished or terminated): nobody is waiting for this answer.
            activity.logger.warning("Slave %s no longer running; answer dropped", assignment.report_to)
            return False
        raise
    return True


@activity.defn
async def run_agent(assignment: TaskAssignment) -> DispatchReceipt:
    backend = BACKENDS.get(assignment.backend)
    if backend is None:
        raise ApplicationError(
            f"unknown agent backend {assignment.backend!r}; known: {', '.join(BACKENDS)}",
            type="UnknownBackend",
            non_retryable=True,
        )
    answer_file = _answer_path(assignment)
    info = activity.info()

    def recorded_answer() -> dict | None:
        return recorded_dispatch_answer(answer_file, info.workflow_run_id, info.scheduled_time)

    async with one_attempt_at_a_time(assignment):
        if (answer := recorded_answer()) is not None:
            recorded = _fitted(AgentComplete.model_validate(answer), answer_file)
            if assignment.answer_in_result:
                return _in_result(assignment, recorded, replayed_from_ledger=True)
            delivered = await _deliver(assignment, recorded)
            return DispatchReceipt(
                dispatch_id=assignment.dispatch_id, delivered=delivered, replayed_from_ledger=True
            )

        complete = await backend(assignment)
        if complete is None:
            return DispatchReceipt(dispatch_id=assignment.dispatch_id, delivered=False)
        if recorded_answer() is None:  # a backend may record its answer itself (the simulated one does)
            await asyncio.to_thread(
                record_dispatch_answer, answer_file, complete.model_dump(mode="json"), info.workflow_run_id
            )
    complete = _fitted(complete, answer_file)  # the whole answer stays in the file
    if assignment.answer_in_result:
        return _in_result(assignment, complete)
    delivered = await _deliver(assignment, complete)
    return DispatchReceipt(dispatch_id=assignment.dispatch_id, delivered=delivered)


def _fitted(answer: AgentComplete, answer_file: Path) -> AgentComplete:
    """The answer as it goes into the batch's history (bso.answer_size), pointing at the file with all of it."""
    return fit_for_history(without_oversized_po_message(answer, str(answer_file)), str(answer_file))


def _in_result(assignment: TaskAssignment, complete: AgentComplete, replayed_from_ledger: bool = False) -> DispatchReceipt:
    """AGENT_COMPLETE as the activity's result: the Slave takes it when the activity completes."""
    return DispatchReceipt(
        dispatch_id=assignment.dispatch_id,
        delivered=True,
        replayed_from_ledger=replayed_from_ledger,
        answer=complete.model_dump(mode="json"),
    )
