"""The agent activity: one execution per dispatch (P51), on the `bso-agents` task queue.

It runs the agent through the chosen backend and delivers AGENT_COMPLETE to the Slave: as the
activity's result when the assignment asks for it (`answer_in_result`, what the Slave does for agents
that answer in-process), else as a signal. Before delivering it records the answer on disk (`.sprint-session/dispatches/`): an activity retried
after its agent had answered (a worker killed at the wrong moment) re-delivers that answer instead
of running the agent again. The Slave ignores the duplicate.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.backends import command, external, simulated
from activities.session_files import dispatch_answer_path, write_json_atomic
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
    if answer_file.exists():
        recorded = AgentComplete.model_validate(json.loads(answer_file.read_text(encoding="utf-8")))
        if assignment.answer_in_result:
            return _in_result(assignment, recorded, replayed_from_ledger=True)
        delivered = await _deliver(assignment, recorded)
        return DispatchReceipt(dispatch_id=assignment.dispatch_id, delivered=delivered, replayed_from_ledger=True)

    complete = await backend(assignment)
    if complete is None:
        return DispatchReceipt(dispatch_id=assignment.dispatch_id, delivered=False)
    if not answer_file.exists():  # a backend may record its answer itself (the simulated one does)
        await asyncio.to_thread(write_json_atomic, answer_file, complete.model_dump(mode="json"))
    if assignment.answer_in_result:
        return _in_result(assignment, complete)
    delivered = await _deliver(assignment, complete)
    return DispatchReceipt(dispatch_id=assignment.dispatch_id, delivered=delivered)


def _in_result(assignment: TaskAssignment, complete: AgentComplete, replayed_from_ledger: bool = False) -> DispatchReceipt:
    """AGENT_COMPLETE as the activity's result: the Slave takes it when the activity completes."""
    return DispatchReceipt(
        dispatch_id=assignment.dispatch_id,
        delivered=True,
        replayed_from_ledger=replayed_from_ledger,
        answer=complete.model_dump(mode="json"),
    )
