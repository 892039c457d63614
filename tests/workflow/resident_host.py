"""A stand-in for the Master in resident tests: starts residents as its children (like RosterKeeper), records
what they send back (ready, stopped, DEBUG_RESULT, PLAN_RESULT, RESEARCH_RESULT), stops them on `finish` the
way the Master does (a `stop` signal by workflow id, then awaiting the child handle) and returns their
summaries. Kept apart from the test module so the workflow sandbox imports nothing but this."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from bso.constants import (
        SIGNAL_DEBUG_RESULT,
        SIGNAL_PLAN_RESULT,
        SIGNAL_RESEARCH_RESULT,
        SIGNAL_RESIDENT_READY,
        SIGNAL_RESIDENT_STOPPED,
        SIGNAL_STOP,
    )
    from bso.resident_state import ResidentRunInput
    from bso.roster import ResidentSummary, resident_workflow_id
    from workflows.residents import ResidentWorkflow


class HostInput(BaseModel):
    session_id: str
    project_root: str
    roles: list[str]
    resident_task_queue: str
    continue_as_new_after_events: int | None = None


class HostSeen(BaseModel):
    ready: list[str] = []
    stopped: list[str] = []
    answers: dict[str, list[str]] = {"debug": [], "plan": [], "research": []}


@workflow.defn
class ResidentHost:
    def __init__(self) -> None:
        self._seen = HostSeen()
        self._finish = False

    @workflow.signal(name=SIGNAL_RESIDENT_READY)
    def ready(self, role: Any) -> None:
        self._seen.ready.append(str(role))

    @workflow.signal(name=SIGNAL_RESIDENT_STOPPED)
    def stopped(self, role: Any) -> None:
        self._seen.stopped.append(str(role))

    @workflow.signal(name=SIGNAL_DEBUG_RESULT)
    def debug_result(self, payload: Any) -> None:
        self._seen.answers["debug"].append(payload["debug_id"])

    @workflow.signal(name=SIGNAL_PLAN_RESULT)
    def plan_result(self, payload: Any) -> None:
        self._seen.answers["plan"].append(payload["request_id"])

    @workflow.signal(name=SIGNAL_RESEARCH_RESULT)
    def research_result(self, payload: Any) -> None:
        self._seen.answers["research"].append(payload["request_id"])

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    @workflow.query
    def seen(self) -> HostSeen:
        return self._seen

    @workflow.run
    async def run(self, inp: HostInput) -> list[ResidentSummary]:
        handles = {}
        for role in inp.roles:
            handles[role] = await workflow.start_child_workflow(
                ResidentWorkflow.run,
                ResidentRunInput(
                    role=role,
                    session_id=inp.session_id,
                    master_id=workflow.info().workflow_id,
                    project_root=inp.project_root,
                    continue_as_new_after_events=inp.continue_as_new_after_events,
                ),
                id=resident_workflow_id(inp.session_id, role),
                task_queue=inp.resident_task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
            )
        await workflow.wait_condition(lambda: self._finish and len(self._seen.ready) == len(inp.roles))
        summaries = []
        for role in reversed(inp.roles):
            try:
                await workflow.get_external_workflow_handle(resident_workflow_id(inp.session_id, role)).signal(SIGNAL_STOP)
            except Exception as err:  # noqa: BLE001 - a test stopped it already (stop_now)
                workflow.logger.info("%s not signalled: %s", role, err)
            summaries.append(await handles[role])  # the child handle follows the resident across its runs
        return summaries
