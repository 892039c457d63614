"""`bso` commands run through typer's CliRunner against a stand-in for the server (the recorded example sprint's
histories for `bso messages`), and the update wait of `bso sprint decide` / `cc`: what a new user met first."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHistory,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from typer.testing import CliRunner

import bso.cli
from bso.constants import HANDING_OVER
from bso.cli import (
    CLOSED_QUERY_TIMEOUT,
    FROM_REPORT_NOTE,
    QUERY_TIMEOUT,
    BsoError,
    _describe,
    _update,
    app,
    default_export_dir,
    earlier_export,
)
from bso.models import SlaveResult, SlaveResults, SprintReport, SprintStatusView, StoryResult
from bso.states import BatchStatus, SprintPhase, SprintStatus

HISTORIES = Path(__file__).resolve().parent.parent / "histories"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "demo-project"
SPRINT = "example-sprint"

runner = CliRunner()


@pytest.fixture
def recorded_sprint(monkeypatch):
    """`bso messages` reads the recorded example sprint instead of a server's histories."""
    histories = [
        WorkflowHistory.from_json(p.stem.replace("--", "/"), p.read_text())
        for p in sorted(HISTORIES.glob("example-sprint*.json"))
    ]

    async def client():
        return object()

    async def describe(client, sprint_id):
        return None, None

    async def fetch(client, sprint_id):
        return histories

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "_describe", describe)
    monkeypatch.setattr(bso.cli, "fetch_sprint_histories", fetch)
    return histories


def test_messages_with_jsonl_prints_one_line_not_the_table(recorded_sprint, tmp_path: Path):
    target = tmp_path / "flow.jsonl"
    result = runner.invoke(app, ["messages", SPRINT, "--story", "2-2", "--jsonl", str(target)])
    assert result.exit_code == 0, result.output
    written = target.read_text().splitlines()
    assert written and all(json.loads(line)["story"] == "2-2-expiry-reminder-emails" for line in written)
    assert result.stdout.splitlines() == [f"wrote {len(written)} messages to {target}"], result.stdout


def test_messages_with_jsonl_naming_a_folder_says_so_before_anything_is_printed(recorded_sprint, tmp_path: Path):
    result = runner.invoke(app, ["messages", SPRINT, "--jsonl", str(tmp_path)])
    assert result.exit_code == 1, result.output  # it printed IsADirectoryError's traceback
    assert f"--jsonl {tmp_path} is a folder: name the file to write" in result.output, result.output


@pytest.mark.parametrize("sprint_id", ["  ", "a\nb", "tab\there", "bell\a"])
def test_a_sprint_id_with_spaces_or_control_characters_is_refused_before_the_start(tmp_path: Path, sprint_id):
    project = Path(__file__).resolve().parents[2] / "examples" / "demo-project"
    result = runner.invoke(app, ["sprint", "start", str(project), "--id", sprint_id])
    assert result.exit_code == 1, result.output
    assert "use no spaces, line breaks or other control characters" in result.output, result.output


def test_an_epic_given_twice_is_refused_not_cut_to_the_last(tmp_path: Path):
    """`--epic 1 --epic 3` started a sprint of epic 3 alone, without a word."""
    result = runner.invoke(app, ["sprint", "start", str(EXAMPLE), "--epic", "1", "--epic", "2"])
    assert result.exit_code == 1, result.output
    assert "--epic given 2 times: a sprint takes one epic" in result.output, result.output


def test_a_state_given_with_a_decision_other_than_rearm_is_refused_before_it_is_sent(monkeypatch):
    """`decide ... force_pass --state done` was applied, its --state dropped without a word."""
    monkeypatch.setattr(bso.cli, "_client", lambda: pytest.fail("nothing is sent"))
    result = runner.invoke(app, ["sprint", "decide", "s1", "1-4", "force_pass", "--state", "done"])
    assert result.exit_code == 2, result.output
    assert "--state is for rearm only" in result.output, result.output
    typo = runner.invoke(app, ["sprint", "decide", "s1", "1-4", "rearmm", "--state", "ready-for-dev"])
    assert typo.exit_code == 2 and "invalid decision: " in typo.output, typo.output  # the typo named, first
    # A state no rearm takes: the states it takes (the enum's list offered done, then the sprint refused it).
    for state in ("wip", "done"):
        refused = runner.invoke(app, ["sprint", "decide", "s1", "1-4", "rearm", "--state", state])
        assert refused.exit_code == 2, refused.output
        assert f"cannot rearm to '{state}'; use one of: backlog, story-doc-improved," in refused.output, refused.output


def test_watch_refuses_an_interval_that_would_never_poll_again():
    result = runner.invoke(app, ["sprint", "watch", "any", "--interval", "inf"])
    assert result.exit_code == 2 and "--interval" in result.output, result.output


@pytest.mark.parametrize(
    ("option", "value", "known"),
    [
        ("--story", "9-9", "its stories: 1-2, 1-3, 2-1, 2-2, 2-2a"),
        ("--agent", "dev-runnr", "its agents: dev-runner, review-runner, story-creator, story-reviewer"),
    ],
)
def test_messages_refuses_a_story_or_agent_the_sprint_has_not(recorded_sprint, option, value, known):
    result = runner.invoke(app, ["messages", SPRINT, option, value])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"bso: error: {option} {value!r}: no message of sprint {SPRINT} is " + (
        "about it; " if option == "--story" else "to or from it; "
    ) + known, result.stderr
    # A short key, a full one, and an agent of the sprint are all fine.
    for good in (["--story", "2-2"], ["--story", "2-2a-reminder-digest-settings"], ["--agent", "debugger"]):
        assert runner.invoke(app, ["messages", SPRINT, *good]).exit_code == 0, good


def test_an_export_never_goes_over_an_earlier_one(recorded_sprint, tmp_path: Path):
    folder = tmp_path / "export"
    first = runner.invoke(app, ["messages", SPRINT, "--export-dir", str(folder)])
    assert first.exit_code == 0, first.output
    assignments = sorted((folder / "story-creator").glob("TASK_ASSIGNMENT_*.json"))
    before = {p: p.read_text() for p in folder.rglob("*.json")}
    assert assignments and earlier_export(folder) is not None

    again = runner.invoke(app, ["messages", SPRINT, "--story", "2-2", "--export-dir", str(folder)])
    assert again.exit_code == 1, again.output
    assert again.stderr.startswith(f"bso: error: {folder} already holds an export (") and "--export-dir" in again.stderr
    assert {p: p.read_text() for p in folder.rglob("*.json")} == before  # nothing written, nothing removed

    # The default folder is the sprint's own: two sprints on one project export side by side.
    assert default_export_dir("/p", "sprint-1") == Path("/p/.sprint-session/messages/sprint-1")
    assert default_export_dir("/p", "../x/y").parent == Path("/p/.sprint-session/messages")
    assert default_export_dir("/p", "../x/y").name.startswith("__x_y-")  # nothing above the messages folder
    assert default_export_dir("/p", "a/b") != default_export_dir("/p", "a_b")  # two sprints, two folders
    assert default_export_dir("/p", ".x") != default_export_dir("/p", "x")
    for odd in (".", "..", "../.."):
        assert default_export_dir("/p", odd).parent == Path("/p/.sprint-session/messages"), odd
    assert earlier_export(tmp_path / "none") is None
    (tmp_path / "other" / "notes").mkdir(parents=True)
    (tmp_path / "other" / "notes" / "todo.json").write_text("{}")
    assert earlier_export(tmp_path / "other") is None  # a folder with other files is no earlier export


@pytest.mark.parametrize("option", ["--export-dir", "--jsonl"])
def test_a_folder_that_cannot_be_made_fails_before_the_table(recorded_sprint, tmp_path: Path, option):
    """It printed the whole table, then `FileNotFoundError: [Errno 2] ...`: now the error comes first, and alone."""
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "export"  # under a file: no folder can be made there, even as root
    given = target / "flow.jsonl" if option == "--jsonl" else target
    result = runner.invoke(app, ["messages", SPRINT, option, str(given)])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"bso: error: {option} {given}: cannot make the folder {target}: Not a directory"
    assert result.stdout == ""


def test_sprint_list_shows_a_continued_sprint_once_from_its_first_start(monkeypatch):
    """A sprint that had continued as new twice was listed three times, the last row with the time of its last
    hand-over; an earlier sprint under the same id (failed, then started again) is not taken for its start."""
    from datetime import UTC, datetime

    def at(minute: int) -> datetime:
        return datetime(2026, 11, 29, 10, minute, tzinfo=UTC)

    def run(run_id, status, start, close):
        return SimpleNamespace(
            id="s-1", run_id=run_id, status=status, start_time=at(start), close_time=close and at(close),
            typed_search_attributes=TypedSearchAttributes.empty,
        )

    continued = WorkflowExecutionStatus.CONTINUED_AS_NEW
    runs = [
        run("r0", WorkflowExecutionStatus.FAILED, 1, 2),  # an earlier sprint under the id
        run("r1", continued, 5, 7),
        run("r2", continued, 7, 9),
        run("r3", WorkflowExecutionStatus.RUNNING, 9, None),
    ]
    queries: list[str] = []

    class Client:
        async def list_workflows(self, query, limit=None):
            queries.append(query)
            for wf in runs:
                if ('!= "ContinuedAsNew"' in query) is (wf.status is not continued):  # the list, or the walk back
                    yield wf

    async def client():
        return Client()

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "out", Console(file=(terminal := io.StringIO()), width=120, color_system=None))
    assert runner.invoke(app, ["sprint", "list"]).exit_code == 0
    rows = [line.split() for line in terminal.getvalue().splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == [("s-1", "failed"), ("s-1", "running")], rows
    assert "2026-11-29 10:01:00" in terminal.getvalue() and "2026-11-29 10:05:00" in terminal.getvalue()
    assert 'WorkflowId IN ("s-1")' in queries[-1]


def test_sprint_list_takes_cancelled_as_canceled(monkeypatch):
    queries: list[str] = []

    class Client:
        async def list_workflows(self, query, limit):
            queries.append(query)
            return
            yield

    async def client():
        return Client()

    monkeypatch.setattr(bso.cli, "_client", client)
    for spelling in ("cancelled", "canceled", "Cancelled"):
        result = runner.invoke(app, ["sprint", "list", "--status", spelling])
        assert result.exit_code == 0, result.output
        assert queries.pop().endswith('AND ExecutionStatus = "Canceled"')
    assert runner.invoke(app, ["sprint", "list", "--status", "cancel"]).exit_code == 1
    # A session that is no sprint id made the server answer "malformed SQL query"
    refused = runner.invoke(app, ["sprint", "list", "--session", "abc\\"])
    assert refused.exit_code == 1 and "not a sprint id" in refused.output and not queries
    assert runner.invoke(app, ["sprint", "list", "--session", "sprint-1"]).exit_code == 0
    # (its id too: a sprint no worker has taken up yet has no session attribute, and was not found)
    assert queries.pop().endswith('AND (BsoSessionId = "sprint-1" OR WorkflowId = "sprint-1")')


def _not_found(message: str) -> RPCError:
    return RPCError(message, RPCStatusCode.NOT_FOUND, b"")


def _client_of(namespace_exists: bool | RPCError):
    async def describe_workflow():
        raise _not_found(f"Namespace {'nons'} is not found." if namespace_exists is False else "workflow not found")

    async def describe_namespace(request, timeout=None):
        assert request.namespace == "nons"
        if isinstance(namespace_exists, RPCError):
            raise namespace_exists
        if namespace_exists is False:
            raise _not_found("Namespace nons is not found.")

    return SimpleNamespace(
        namespace="nons",
        service_client=SimpleNamespace(config=SimpleNamespace(target_host="localhost:7233")),
        workflow_service=SimpleNamespace(describe_namespace=describe_namespace),
        get_workflow_handle=lambda *a, **k: SimpleNamespace(describe=describe_workflow),
    )


def test_a_missing_namespace_is_named_as_such_not_as_a_missing_sprint():
    with pytest.raises(BsoError, match=r"^namespace 'nons' does not exist on localhost:7233 \(--namespace"):
        asyncio.run(_describe(_client_of(False), "op1"))
    with pytest.raises(BsoError, match=r"^no sprint with id 'op1' in namespace nons$"):
        asyncio.run(_describe(_client_of(True), "op1"))
    denied = RPCError("not allowed", RPCStatusCode.PERMISSION_DENIED, b"")  # a Cloud API key may not describe it
    with pytest.raises(BsoError, match=r"^no sprint with id 'op1'"):
        asyncio.run(_describe(_client_of(denied), "op1"))


class _OneRun:
    """The runs of a sprint (bso.cli.SprintRuns) that does not hand over: always `handle`."""

    def __init__(self, handle) -> None:
        self._handle, self.sprint_id = handle, "s-1"

    def handle(self):
        return self._handle

    async def next(self) -> bool:
        return False


class _PendingUpdate:
    """A sprint whose update waits for a worker: the status query says whether one answers."""

    def __init__(self, worker_answers: bool) -> None:
        self.worker_answers = worker_answers
        self.worker_back = asyncio.Event()

    async def execute_update(self, name, arg, id=None, result_type=None):
        await self.worker_back.wait()
        return {"state": "done"}

    async def query(self, *args, **kwargs):
        if self.worker_answers:
            return SprintStatusView(session_id="s-1", phase=SprintPhase.RUNNING)
        raise RPCError("no poller seen for task queue recently, worker may be down", RPCStatusCode.FAILED_PRECONDITION, b"")

    async def describe(self):
        return SimpleNamespace(task_queue="tq-bso-sprint", id="op1")


@pytest.mark.parametrize("worker_answers", [False, True], ids=["no-worker", "busy-worker"])
def test_an_update_nobody_takes_says_so_once_and_keeps_waiting(monkeypatch, worker_answers):
    notes = io.StringIO()
    monkeypatch.setattr(bso.cli, "err_console", Console(file=notes, width=200))
    monkeypatch.setattr(bso.cli, "UPDATE_NOTE_AFTER_SECONDS", 0.05)
    handle = _PendingUpdate(worker_answers)

    async def scenario():
        update = asyncio.create_task(_update(_OneRun(handle), "decide", {}))
        await asyncio.sleep(0.5)  # many times the note's delay
        assert not update.done()  # still waiting
        handle.worker_back.set()
        return await update

    assert asyncio.run(scenario()) == {"state": "done"}  # applied once a worker comes back
    expected = "waiting for a worker to take the update (no worker polls tq-bso-sprint? start one with `bso worker --queue-prefix tq-`) ...\n"
    assert notes.getvalue() == ("" if worker_answers else expected)


class _ServerAway:
    """A server that goes away (killed, restarting) `away` times while the update is sent, then answers."""

    def __init__(self, away: int) -> None:
        self.away, self.ids = away, []

    status = RPCStatusCode.UNAVAILABLE

    async def execute_update(self, name, arg, id=None, result_type=None):
        self.ids.append(id)
        if len(self.ids) <= self.away:
            raise RPCError("tcp connect error", self.status, b"")
        return {"applied": True}

    id = "s-1"


def test_an_update_the_server_did_not_answer_is_asked_again_with_its_id(monkeypatch):
    """The server killed after the sprint took a course correction: `bso sprint cc` said `error: Temporal server:
    UNAVAILABLE` and exited 1, and the correction was applied. It asks again under the same update id (the server
    answers that one with its outcome, it does not apply it twice) and says so once; for a while only."""
    notes = io.StringIO()
    monkeypatch.setattr(bso.cli, "err_console", Console(file=notes, width=300))
    monkeypatch.setattr(bso.cli, "UPDATE_SERVER_RETRY_INTERVAL", 0.01)
    handle = _ServerAway(away=3)
    assert asyncio.run(_update(_OneRun(handle), "course_correct", {})) == {"applied": True}
    assert len(handle.ids) == 4 and len(set(handle.ids)) == 1 and handle.ids[0], handle.ids
    assert notes.getvalue().count("may have taken the course_correct already") == 1, notes.getvalue()
    monkeypatch.setattr(bso.cli, "UPDATE_SERVER_WAIT_SECONDS", 0.05)
    with pytest.raises(BsoError, match=r"the course_correct may or may not have been applied; `bso sprint status s-1` says"):
        asyncio.run(_update(_OneRun(_ServerAway(away=10**6)), "course_correct", {}))
    first, second = _ServerAway(away=0), _ServerAway(away=0)  # each sending of the command its own id
    asyncio.run(_update(_OneRun(first), "decide", {}))
    asyncio.run(_update(_OneRun(second), "decide", {}))
    assert first.ids != second.ids


class _NotFoundWhileRunning(_OneRun):
    """A server just back that answers NOT_FOUND of a run still running, once."""

    async def next(self):
        return None  # the run runs: no close event to wait for


def test_an_update_not_found_in_a_run_still_running_is_asked_again(monkeypatch):
    monkeypatch.setattr(bso.cli, "err_console", Console(file=io.StringIO(), width=300))
    monkeypatch.setattr(bso.cli, "UPDATE_SERVER_RETRY_INTERVAL", 0.01)
    handle = _ServerAway(away=1)
    handle.status = RPCStatusCode.NOT_FOUND
    assert asyncio.run(_update(_NotFoundWhileRunning(handle), "decide", {})) == {"applied": True}
    assert len(handle.ids) == 2 and len(set(handle.ids)) == 1


class _HandingOver:
    """A sprint whose Master refuses the update `refusals` times while it hands over to its next run."""

    def __init__(self, refusals: int, why: str = f"CC_REJECTED: {HANDING_OVER}; send it again in a few seconds") -> None:
        self.refusals, self.why, self.sent = refusals, why, 0

    async def execute_update(self, name, arg, id=None, result_type=None):
        self.sent += 1
        if self.sent <= self.refusals:
            raise WorkflowUpdateFailedError(ApplicationError(self.why))
        return {"applied": True}


def test_an_update_refused_while_the_sprint_hands_over_is_sent_again(monkeypatch):
    """A sprint that hands over often (continue-as-new) refused 6 of 22 course corrections sent in a row: the
    operator had to send each again. `bso` does, for a while, saying so once."""
    notes = io.StringIO()
    monkeypatch.setattr(bso.cli, "err_console", Console(file=notes, width=200))
    monkeypatch.setattr(bso.cli, "HANDOVER_RETRY_INTERVAL", 0.01)
    handle = _HandingOver(refusals=3)
    assert asyncio.run(_update(_OneRun(handle), "course_correct", {})) == {"applied": True}
    assert handle.sent == 4 and notes.getvalue().count("sending it again") == 1, notes.getvalue()
    # For a while only: then the refusal is the operator's error, as any other.
    monkeypatch.setattr(bso.cli, "HANDOVER_RETRY_SECONDS", 0.05)
    with pytest.raises(BsoError, match="handing over"):
        asyncio.run(_update(_OneRun(_HandingOver(refusals=1000)), "course_correct", {}))
    other = _HandingOver(refusals=1, why="CC_REJECTED: unknown story '9-9'")  # any other refusal: at once
    with pytest.raises(BsoError, match="^CC_REJECTED: unknown story '9-9'$"):
        asyncio.run(_update(_OneRun(other), "course_correct", {}))
    assert other.sent == 1


class _ClosedSprint:
    """A completed sprint no worker replays: its status query runs out its deadline (or fails as `failure` says);
    its result is its report."""

    def __init__(self, report: SprintReport, failure: Exception | None = None) -> None:
        self.report = report
        self.failure = failure or RPCError("context deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")
        self.query_deadlines: list[timedelta] = []

    async def query(self, name, *, result_type=None, rpc_timeout=None):
        self.query_deadlines.append(rpc_timeout)
        raise self.failure

    async def result(self, **kwargs):
        return self.report

    async def fetch_history_events(self, **kwargs):  # its input, for its budget: none read (the budget held)
        return
        yield


def test_a_closed_sprint_no_worker_answers_for_is_shown_from_its_report_after_a_short_wait(monkeypatch):
    """Its query waited out the 5 s a running sprint's gets, then showed the report as if the worker had
    answered, review rounds as 0."""
    story = StoryResult(story_key="1-1-login", final_state="done", agents_dispatched=4, tokens_used=4000)
    report = SprintReport(
        session_id="s-1", status=SprintStatus.COMPLETE, stories={"1-1-login": "done"}, tokens_used=4000,
        batches=[SlaveResult(
            status=BatchStatus.COMPLETE, batch_id=1, session_id="s-1",
            results=SlaveResults(
                stories_total=1, stories_completed=1, stories_failed=0, stories_skipped=0, story_results=[story],
                total_agents_created=4, total_agents_destroyed=4, review_fix_rounds={"1-1-login": 1},
            ),
        )],
    )  # fmt: skip
    handle = _ClosedSprint(report)

    async def client():
        return object()

    async def describe(client, sprint_id):
        return handle, SimpleNamespace(status=WorkflowExecutionStatus.COMPLETED, task_queue="bso-sprint", id="op1")

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "_describe", describe)
    shown = runner.invoke(app, ["sprint", "status", "s-1"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert handle.query_deadlines == [CLOSED_QUERY_TIMEOUT] and CLOSED_QUERY_TIMEOUT < QUERY_TIMEOUT
    assert "sprint s-1: completed (sprint-complete), batches ended 1/1" in shown.stdout
    assert FROM_REPORT_NOTE in " ".join(shown.stdout.split()), shown.stdout
    (header,) = [line for line in shown.stdout.splitlines() if line.startswith("story ")]
    assert header.split() == ["story", "batch", "state", "fixes", "in", "flight", "agents", "tokens"], header
    (row,) = [line for line in shown.stdout.splitlines() if line.startswith("1-1-login ")]
    assert row.split() == ["1-1-login", "1", "done", "1", "4", "4000"], row
    assert "no worker answered the status query within 2 s" in " ".join(shown.stdout.split()), shown.stdout
    as_json = json.loads(runner.invoke(app, ["sprint", "status", "s-1", "--json"]).stdout)
    assert as_json["from_report"] is True and as_json["outcome"] == "sprint-complete"
    # A query that failed for another reason (a newer worker cannot replay it) says that reason, not "no worker".
    handle.failure = WorkflowQueryFailedError("Nondeterminism error: activity type mismatch")
    shown = " ".join(runner.invoke(app, ["sprint", "status", "s-1"], terminal_width=200).stdout.split())
    assert "status query failed: Nondeterminism error: activity type mismatch; " + FROM_REPORT_NOTE in shown, shown
    assert "no worker answered" not in shown


def test_a_sprint_started_where_no_worker_polls_is_not_held_for_its_claim(monkeypatch):
    """Nothing claims the project without a worker: `bso sprint start` waited 3 s for the claim all the same,
    saying nothing, before its warning."""
    started: list[str] = []

    class _Server:
        async def start_workflow(self, workflow, arg, *, id, **kwargs):
            started.append(id)

    async def client():
        return _Server()

    async def nothing_running(*args):
        return None

    async def no_worker(client, task_queue):
        return False

    async def claim_waited(*args):
        raise AssertionError("waited for the claim")

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "_sprint_running_on", nothing_running)
    monkeypatch.setattr(bso.cli, "_worker_polls", no_worker)
    monkeypatch.setattr(bso.cli, "_refused_at_its_claim", claim_waited)
    result = runner.invoke(app, ["sprint", "start", str(EXAMPLE), "--id", "s-unserved"])
    assert result.exit_code == 0, result.output
    assert started == ["s-unserved"] and "started sprint s-unserved" in result.stdout
    assert "bso: warning: no worker polls task queue bso-sprint: sprint s-unserved waits until one does" in result.stderr


@pytest.mark.parametrize("polled", [True, False], ids=["served", "on-a-queue-no-worker-polls"])
def test_a_sprint_in_the_way_on_a_queue_no_worker_polls_is_said_to_need_a_terminate(monkeypatch, polled):
    """A sprint started on a mistyped queue held the project: the refusal said to shut it down, which (carried
    out by a worker) never happened."""

    class _Handle:
        async def describe(self):
            return SimpleNamespace(task_queue="bso-sprnt")

    class _Server:
        def get_workflow_handle(self, workflow_id):
            assert workflow_id == "tq1"
            return _Handle()

    async def client():
        return _Server()

    async def running(*args):
        return "tq1"

    async def worker_polls(client, task_queue):
        assert task_queue == "bso-sprnt"
        return polled

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "_sprint_running_on", running)
    monkeypatch.setattr(bso.cli, "_worker_polls", worker_polls)
    result = runner.invoke(app, ["sprint", "start", str(EXAMPLE), "--id", "tq2"])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "sprint tq1 is already running on" in said, said
    if polled:
        assert "(wait for it, or `bso sprint shutdown tq1` first)" in said, said
    else:
        assert "no worker polls its task queue bso-sprnt, so a shutdown or cancel would wait for one too: " in said
        # (the server's address, as every command BSO prints: another server's terminate would end the wrong sprint)
        args = ["--address", "temporal.example:7233", "sprint", "start", str(EXAMPLE), "--id", "tq2"]
        said = " ".join(runner.invoke(app, args).output.split())
        assert "`temporal workflow terminate --address temporal.example:7233 --workflow-id tq1`" in said, said


@pytest.mark.parametrize(("limit", "refused"), [(None, True), (6000, True), (8000, True), (8001, False)])
def test_a_resume_to_a_limit_not_above_the_tokens_used_is_refused(monkeypatch, limit, refused):
    """Paused on its budget (5,000, 8,000 used), `resume --token-limit 6000` was taken: the sprint ran one story
    and paused again; a plain `resume` set the Master spinning (it now stays paused, saying so)."""
    view = SprintStatusView(session_id="s1", phase=SprintPhase.PAUSED, token_limit=5000, tokens_used=8000,
                            pause_reason="token budget exhausted")
    signals: list = []

    class Handle:
        async def signal(self, name, arg):
            signals.append((name, arg))

    async def query_status(handle):
        return view, None

    async def connected():
        return None

    async def running_sprint(client, sprint_id):
        return Handle(), None

    async def no_batch_paused_by_itself(client, desc):
        return {}

    monkeypatch.setattr(bso.cli, "_query_status", query_status)
    monkeypatch.setattr(bso.cli, "_client", connected)
    monkeypatch.setattr(bso.cli, "_running_sprint", running_sprint)
    monkeypatch.setattr(bso.cli, "_children_status", no_batch_paused_by_itself)
    monkeypatch.setattr(bso.cli, "_run", asyncio.run)  # a BsoError raised, not printed
    if refused:
        why = (
            "sprint s1 has used its token budget \\(8,000 of 5,000 tokens\\): resume it with --token-limit above 8,000"
            if limit is None else f"--token-limit {limit:,} is not above the 8,000 tokens sprint s1"
        )
        with pytest.raises(bso.cli.BsoError, match=why):
            bso.cli.sprint_resume("s1", token_limit=limit, reason="")
        assert signals == []
    else:
        bso.cli.sprint_resume("s1", token_limit=limit, reason="")
        assert signals == [("resume", {"token_limit": limit, "reason": ""})]
    # Paused by the operator (or the budget off: its limit is the default's): a plain resume goes.
    signals.clear()
    view.pause_reason = "operator check"
    bso.cli.sprint_resume("s1", token_limit=None, reason="")
    assert signals == [("resume", {"reason": ""})]


def test_sprint_start_says_which_depends_on_names_no_story(tmp_path: Path, capsys):
    """A story file's `Depends on:` naming no story of the file is ignored: `bso sprint start` says so (it was in
    the worker's log only); BMAD's dotted `Story 1.1` is the story 1-1, said nothing of."""
    stories_dir = tmp_path / "_bmad-output" / "implementation-artifacts"
    stories_dir.mkdir(parents=True)
    (stories_dir / "sprint-status.yaml").write_text(
        "development_status:\n  epic-1: in-progress\n  1-1-a: ready-for-dev\n  1-2-b: ready-for-dev\n", encoding="utf-8"
    )
    (stories_dir / "1-2-b.md").write_text("# Story 1.2: B\n\nDepends on: Story 1.1, 7.1\n", encoding="utf-8")
    bso.cli._check_stories(tmp_path, None, ["1-1-a", "1-2-b"])
    err = capsys.readouterr().err
    assert "bso: warning: 1-2-b.md: Depends on '7-1' ignored: unknown story key '7-1'" in err, err
    assert err.count("warning") == 1, err
