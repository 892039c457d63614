"""Names shared by workers, workflows, clients and tests: task queues, signals, search attributes."""

from __future__ import annotations

import re
from datetime import timedelta

from temporalio.common import SearchAttributeKey

SPRINT_TASK_QUEUE = "bso-sprint"
AGENTS_TASK_QUEUE = "bso-agents"

SIGNAL_AGENT_COMPLETE = "agent_complete"
SIGNAL_SHUTDOWN = "shutdown_request"
SIGNAL_STORY_UPDATE = "story_update"
SIGNAL_STORY_UPDATES = "story_updates"  # Slave -> Master: several story_update payloads in one signal
SIGNAL_PAUSE = "pause"
SIGNAL_RESUME = "resume"
QUERY_STATUS = "status"
QUERY_REPORT = "report"  # the Master: an ended sprint's report (a cancelled one's too)
# A workflow refused its start input (workflows/inputs.py): it failed in its init, with no state to query.
FAILURE_MISSING_INPUT = "MissingWorkflowInput"
FAILURE_INVALID_INPUT = "InvalidWorkflowInput"
# Residents and the roster (workflows/residents.py).
SIGNAL_RESIDENT_READY = "resident_ready"  # resident -> Master, once up
SIGNAL_ROSTER_BROADCAST = "roster_broadcast"  # Master -> each resident: AGENT_ROSTER_BROADCAST
SIGNAL_STOP = "stop"  # Master -> resident, at the end of the sprint
SIGNAL_STOP_NOW = "stop_now"  # Master -> resident, the sprint cancelled: drop the requests, cancel those in hand
SIGNAL_RESIDENT_STOPPED = "resident_stopped"  # resident -> Master, once stopped
UPDATE_AGENT_CREATE = "agent_create_request"  # AGENT_CREATE_REQUEST -> AGENT_CREATED
UPDATE_AGENT_DESTROY = "agent_destroy_request"  # AGENT_DESTROY_REQUEST -> AGENT_DESTROYED
SIGNAL_DEBUG_REQUEST = "debug_request"  # requester -> debugger resident: DEBUG_REQUEST
SIGNAL_DEBUG_RESULT = "debug_result"  # debugger resident -> requester: DEBUG_RESULT
SIGNAL_RESEARCH_REQUEST = "research_request"  # requester -> knowledge researcher: RESEARCH_REQUEST
SIGNAL_RESEARCH_RESULT = "research_result"  # knowledge researcher -> report_to: RESEARCH_RESULT
UPDATE_RESEARCH = "research"  # RESEARCH_REQUEST -> RESEARCH_RESULT in one call (for agents, i.e. activities)
SIGNAL_BROWSER_REQUEST = "browser_request"  # requester -> e2e-live: BROWSER_REQUEST
SIGNAL_BROWSER_RESULT = "browser_result"  # e2e-live -> report_to: BROWSER_RESULT
UPDATE_BROWSE = "browse"  # BROWSER_REQUEST -> BROWSER_RESULT in one call (for agents)
SIGNAL_PLAN_REQUEST = "plan_request"  # Master -> scrum-master: plan (BATCH_PLAN_READY) or re-plan (COURSE_CORRECTION)
SIGNAL_PLAN_RESULT = "plan_result"  # scrum-master -> Master: the answer (bso/scrum_master.py)
UPDATE_COURSE_CORRECT = "course_correct"  # CC_TRIGGER -> COURSE_CORRECTION (or CC_REJECTED)
# Human decisions (bso.decisions): an update on the Master or the Slave; the Master forwards by signal.
UPDATE_DECIDE = "decide"
SIGNAL_DECISION = "decision"
# Master -> Slave: the state of stories of other batches that this batch's stories depend on.
SIGNAL_DEPENDENCY_UPDATE = "dependency_update"

# The workflow task timeout of Slaves and residents (Temporal's default is 10 s): a worker killed while it holds
# one of their workflow tasks leaves the sprint waiting this long before another worker may take the task. Their
# histories stay short (a Slave runs one batch; a resident hands over), so even a full replay is far under it.
# The Master keeps the default: its history grows with the sprint until it continues as new.
CHILD_WORKFLOW_TASK_TIMEOUT = timedelta(seconds=5)
# How long a cancelled Master waits for its batches to end cancelled before it stops the residents and closes
# (a batch still running then is terminated with the Master, its children's default parent-close policy).
SLAVE_CANCEL_WAIT = timedelta(seconds=30)

# Why the Master refuses a rearm or a course correction for a few seconds; `bso` sends such an update again.
HANDING_OVER = "the sprint is handing over to its next run (continue-as-new)"
MASTER_TYPE = "SprintMasterWorkflow"  # the Sprint Master's workflow type, as the server lists it
SA_SESSION_ID = SearchAttributeKey.for_keyword("BsoSessionId")
SA_BATCH_ID = SearchAttributeKey.for_int("BsoBatchId")
SA_PHASE = SearchAttributeKey.for_keyword("BsoPhase")
SEARCH_ATTRIBUTES = (SA_SESSION_ID, SA_BATCH_ID, SA_PHASE)


def slave_workflow_id(session_id: str, batch_id: int) -> str:
    return f"{session_id}/batch-{batch_id}"


# What a sprint names its children: slave_workflow_id above, bso.roster.resident_workflow_id.
_CHILD_ID = re.compile(r"/(batch-\d+|resident-[^/]*)$")


def sprint_id_error(sprint_id: str) -> str | None:
    """Why a sprint id is refused at the start (bso sprint start, and the Master whoever started it), or None."""
    return sprint_id_length_error(sprint_id) or sprint_id_collision(sprint_id)


def sprint_id_collision(sprint_id: str) -> str | None:
    """A sprint id that is the id a sprint gives its batch or resident (`zz/batch-1`, `zz/resident-debugger`)
    would collide with sprint `zz`'s own workflow of that id: refused, saying why; None when it is fine."""
    if (found := _CHILD_ID.search(sprint_id)) is None:
        return None
    owner = sprint_id[: found.start()]
    return (f"sprint id {sprint_id!r} is the id sprint {owner!r} gives its {found.group(1).split('-')[0]} "
            f"workflow: choose an id that does not end in /batch-<n> or /resident-<role>")


def session_id_error(session_id: str, workflow_id: str) -> str | None:
    """A sprint's batches and residents take their ids from its session id: one other than its workflow id may be
    another sprint's, whose residents it would talk to and stop (the input `bso sprint start` prints, its
    --workflow-id changed and not its session_id). Refused, saying why; None when they are the same."""
    if session_id == workflow_id:
        return None
    return (f"session_id {session_id!r} is not the sprint's workflow id {workflow_id!r}: its batches and residents "
            f"would take the ids of sprint {session_id!r}'s; leave session_id out (it is the workflow id)")


# Every dispatch id is `<sprint id>/batch-<n>/<story>/<n>[/impl-<n>]` and an answer's dispatch id holds at most
# 200 characters (bso.messages.AgentComplete): a longer sprint id failed every story of the sprint.
MAX_SPRINT_ID_CHARS = 100


def sprint_id_characters_error(sprint_id: str) -> str | None:
    """An id `bso sprint start` refuses: blank, or with spaces, line breaks or control characters (it is typed in
    commands and shown in the Web UI)."""
    if sprint_id.strip() and not any(c.isspace() or not c.isprintable() for c in sprint_id):
        return None
    return (f"sprint id {sprint_id!r}: use no spaces, line breaks or other control characters (it is typed in "
            "commands and shown in the Web UI)")


def sprint_id_length_error(sprint_id: str) -> str | None:
    if len(sprint_id) <= MAX_SPRINT_ID_CHARS:
        return None
    return (f"sprint id of {len(sprint_id)} characters: at most {MAX_SPRINT_ID_CHARS} (its agents' dispatch ids "
            "carry it)")


def of_sprint(dispatch_id: str, session_id: str) -> bool:
    """Is this the id of a dispatch of one of the sprint's batches (`<Slave's id>/<story>/<n>`)?"""
    return dispatch_id.startswith(f"{session_id}/batch-")


IN_PROCESS_AGENT_BACKENDS = ("simulated",)


def agent_task_queue(backend: str, sprint_task_queue: str) -> str:
    """Where a Slave dispatches its agents. Simulated agents need no agent host: they run on the sprint's
    own queue, where the SDK starts the activity eagerly with the workflow task that schedules it (no
    matching round trip through the server). Real agents (external, command) go to the agents queue,
    whose workers offer as many slots as their host can run agents."""
    if backend in IN_PROCESS_AGENT_BACKENDS:
        return sprint_task_queue
    return agents_task_queue_for(sprint_task_queue)


def agents_task_queue_for(sprint_task_queue: str) -> str:
    """The agents queue paired with a sprint queue: `bso-sprint` -> `bso-agents`,
    `team-a-bso-sprint` -> `team-a-bso-agents` (tests and teams run side by side this way)."""
    if sprint_task_queue.endswith(SPRINT_TASK_QUEUE):
        return sprint_task_queue[: -len(SPRINT_TASK_QUEUE)] + AGENTS_TASK_QUEUE
    return f"{sprint_task_queue}-agents"
