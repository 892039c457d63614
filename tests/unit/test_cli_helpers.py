"""The `bso` command's pure helpers: --set parsing, the equivalent temporal command line, UI links,
the dev server command line, the envconfig-based client configuration."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from temporalio.service import RPCError, RPCStatusCode

from bench.infra import DevServer
from tests.conftest import REPO
from bso.dev_server import dynamic_config_args
from bso.temporal_client import connect_failure_reason
import bso.cli
from bso.cli import (
    agents_said,
    BsoError,
    RejectedSoFar,
    _flow_table,
    _print_markdown,
    _progress,
    _query_status,
    _view_from_report,
    _worker_polls,
    no_worker_warning,
    parse_set,
    server_command,
    sprint_worker_command,
    temporal_start_command,
    ui_link,
    watch_console,
)
from bso.models import SlaveResult, SlaveResults, SprintInput, SprintReport, SprintStatusView, StoryView
from bso.report import batch_errors
from bso.states import AgentBackend, BatchStatus, SprintPhase, SprintStatus
from bso.temporal_client import connect_config


def test_parse_set_reads_json_values_and_checks_knobs():
    assert parse_set(["batch_size=2", "token_budget.limit=5000", "review_strictness=strict", "e2e_enabled=true"]) == {
        "batch_size": 2,
        "token_budget.limit": 5000,
        "review_strictness": "strict",
        "e2e_enabled": True,
    }
    assert parse_set(['e2e_trigger_tags=["ui"]']) == {"e2e_trigger_tags": ["ui"]}
    for bad, words in (
        (["batch_size=two"], "batch_size"),
        (["batch_sise=2"], "batch_sise"),
        (["batch_size"], "key=value"),
        (["=2"], "key=value"),
    ):
        with pytest.raises(BsoError, match=words):
            parse_set(bad)


def test_parse_set_takes_a_whole_float_as_its_integer():
    """`--set token_budget.limit=1e6` was refused (an integer is asked for): a float that is a whole number is
    that integer, in a list or object too; one that is not stays refused."""
    assert parse_set(["token_budget.limit=1e6"]) == {"token_budget.limit": 1_000_000}
    assert parse_set(["token_budget.limit=1000000.0", "batch_size=2.0"]) == {"token_budget.limit": 1_000_000, "batch_size": 2}
    assert parse_set(["token_budget.limit=1.5e3"]) == {"token_budget.limit": 1500}
    assert parse_set(['agent_timeout_seconds={"dev_execution": 3.6e3}']) == {"agent_timeout_seconds": {"dev_execution": 3600}}
    assert parse_set(["token_budget.warning_threshold=0.5"]) == {"token_budget.warning_threshold": 0.5}
    assert type(parse_set(["token_budget.limit=1e6"])["token_budget.limit"]) is int
    with pytest.raises(BsoError, match=r"token_budget\.limit: Input should be a valid integer"):
        parse_set(["token_budget.limit=1.25"])


def test_temporal_start_command_round_trips_the_input():
    inp = SprintInput(project_root="/p q", session_id="s-1", config_overrides={"batch_size": 2}, epic="1")
    line = temporal_start_command(inp, "s-1", "bso-sprint", "localhost:7233", "default")
    argv = shlex.split(line)
    assert argv[:3] == ["temporal", "workflow", "start"] and "--address" not in argv
    assert argv[argv.index("--type") + 1] == "SprintMasterWorkflow"
    assert argv[argv.index("--workflow-id") + 1] == "s-1"
    assert argv[argv.index("--id-reuse-policy") + 1] == "AllowDuplicateFailedOnly"  # as `bso sprint start`
    assert "--fail-existing" in argv  # else a running or completed sprint's id is answered with exit code 0
    # The session id is the workflow id's default: left out, so that an edited --workflow-id is not another sprint's.
    printed = json.loads(argv[argv.index("--input") + 1])
    assert "session_id" not in printed and SprintInput.model_validate(printed) == inp.model_copy(update={"session_id": None})
    remote = shlex.split(temporal_start_command(inp, "s-1", "bso-sprint", "temporal.example:7233", "team"))
    assert remote[remote.index("--address") + 1] == "temporal.example:7233"
    assert remote[remote.index("--namespace") + 1] == "team"


def test_a_hand_written_input_may_spell_every_default_as_null():
    inp = SprintInput.model_validate_json(
        '{"project_root": "/p", "status_file": null, "session_id": null, "epic": null, "story_keys": null,'
        ' "config_overrides": null, "simulation": null}'
    )
    assert inp.config_overrides == {} and inp.simulation == {} and inp == SprintInput(project_root="/p")
    with pytest.raises(ValidationError, match="simulation"):
        SprintInput.model_validate({"project_root": "/p", "simulation": ["not", "an", "object"]})


def test_ui_link(monkeypatch):
    monkeypatch.delenv("BSO_UI_URL", raising=False)
    assert ui_link("localhost:7233", "default", "sprint-1") == "http://localhost:8233/namespaces/default/workflows/sprint-1"
    assert ui_link("127.0.0.1:17233", "default", "a/b").endswith(":18233/namespaces/default/workflows/a%2Fb")
    assert ui_link("ns.acct.tmprl.cloud:7233", "ns.acct", "x").startswith("https://cloud.temporal.io/namespaces/ns.acct/")
    monkeypatch.setenv("BSO_UI_URL", "https://ui.example/")
    assert ui_link("x:7233", "default", "s") == "https://ui.example/namespaces/default/workflows/s"


@pytest.mark.parametrize("ui_port", [None, "9000"])
def test_the_demo_and_make_server_put_the_web_ui_where_bso_links_to(ui_port: str | None, monkeypatch):
    """`BSO_DEMO_PORT=7451 make server` (or `make demo`) put the Web UI on 8233 while `bso sprint start` linked to
    8451: the UI port follows the server's unless BSO_DEMO_UI_PORT says otherwise."""
    monkeypatch.delenv("BSO_UI_URL", raising=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BSO_")} | {"BSO_DEMO_PORT": "7451"}
    if ui_port:
        env["BSO_DEMO_UI_PORT"] = ui_port
    expected = ui_port or urlsplit(ui_link("localhost:7451", "default", "s")).port
    made = subprocess.run(["make", "-n", "server"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert f"--port 7451 --ui-port {expected}\n" in made.stdout
    demo = subprocess.run(
        [sys.executable, "-c", "import demo; print(demo.PORT, demo.UI_PORT)"],
        cwd=REPO / "scripts", env=env, capture_output=True, text=True, check=True,
    )
    assert demo.stdout.split() == ["7451", str(expected)]


def test_a_failed_connection_is_said_in_a_few_words():
    """The worker's warning while the server is away carried the SDK's whole transport error."""
    tonic = RuntimeError(
        'Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(ConnectError('
        '"tcp connect error", 127.0.0.1:1, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })))'
    )
    assert connect_failure_reason(tonic) == "connection refused"
    assert connect_failure_reason(RuntimeError("Failed client connect: dns error (no such host)")) == (
        "Failed client connect: dns error"
    )
    assert connect_failure_reason(TimeoutError()) == "TimeoutError"


def test_server_command_registers_the_search_attributes():
    command = server_command(7233, 8233, ".temporal/bso-dev.db", "default", "127.0.0.1")
    pairs = [command[i + 1] for i, a in enumerate(command) if a == "--search-attribute"]
    assert {"BsoSessionId=Keyword", "BsoBatchId=Int", "BsoPhase=Keyword"} <= set(pairs)
    assert command[command.index("--db-filename") + 1] == ".temporal/bso-dev.db"


def test_every_dev_server_bso_starts_reads_its_transfer_queue_often():
    """The one-shard dev server's default (20 reads/s) made every step wait ~40 ms for its workflow task."""
    setting = "history.transferProcessorMaxPollRPS=1000"
    bso_server = server_command(7233, 8233, "x.db", "default", "127.0.0.1")
    for command in (bso_server, DevServer(Path("x.db"), Path("x.log")).command()):
        values = [command[i + 1] for i, a in enumerate(command) if a == "--dynamic-config-value"]
        assert setting in values, command
    assert dynamic_config_args() == ["--dynamic-config-value", setting]


def test_every_dev_server_bso_starts_keeps_its_file_in_wal_mode():
    """SQLite's rollback journal fsynced a journal and the database for every commit of the server's."""
    for command in (server_command(7233, 8233, "x.db", "default", "127.0.0.1"), DevServer(Path("x.db"), Path("x.log")).command()):
        pragmas = [command[i + 1] for i, a in enumerate(command) if a == "--sqlite-pragma"]
        assert pragmas == ["journal_mode=wal", "synchronous=full"], command


def test_connect_config_from_the_environment(monkeypatch, tmp_path):
    for var in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "none.toml"))
    assert connect_config() == {"target_host": "localhost:7233", "namespace": "default"}
    monkeypatch.setenv("TEMPORAL_ADDRESS", "cluster:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "team")
    monkeypatch.setenv("TEMPORAL_API_KEY", "k")
    config = connect_config()
    assert config["target_host"] == "cluster:7233" and config["namespace"] == "team" and config["api_key"] == "k"
    assert connect_config("other:1", "ns2")["target_host"] == "other:1"


@pytest.mark.parametrize(
    "error",
    [
        RPCError("no poller seen for task queue recently, worker may be down", RPCStatusCode.FAILED_PRECONDITION, b""),
        RPCError("Timeout expired", RPCStatusCode.DEADLINE_EXCEEDED, b""),
        RPCError("Timeout expired", RPCStatusCode.CANCELLED, b""),  # what the dev server answers (2026-11-27)
    ],
    ids=["no-poller", "deadline", "cancelled"],
)
def test_a_status_query_nobody_answers_reads_the_same_however_the_server_says_it(error):
    class Unanswered:
        async def query(self, *args, **kwargs):
            raise error

    view, note = asyncio.run(_query_status(Unanswered()))
    assert view is None and note.startswith("no worker answered the status query (start one with `bso worker`")


def test_a_status_query_the_server_does_not_take_says_the_server_not_the_worker():
    """With the server down (or restarting) the query fails with UNAVAILABLE, `tcp connect error`: `watch` told
    the user to start a worker."""

    class ServerDown:
        async def query(self, *args, **kwargs):
            raise RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")

    view, note = asyncio.run(_query_status(ServerDown()))
    assert view is None and note == "the Temporal server did not answer the status query (tcp connect error): restarting? retrying"


def _rendered(view: SprintStatusView) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(_progress(view, None, view.phase.value))
    return console.export_text()


def test_status_says_which_stories_wait_for_an_external_agents_answer_and_where_it_goes():
    """External agents: nothing is pending on the server once the assignment is published, and the status showed
    only an agent in flight, for ever, with no word of the signal the sprint waits for."""
    in_flight = {"agent_in_flight": "story-creator", "mode_in_flight": "create"}
    stories = {
        "1-2-pantry": StoryView(state="backlog", batch_id=1, dispatch_id="ext/batch-1/1-2/1", **in_flight),
        "2-1-login": StoryView(state="backlog", batch_id=2, dispatch_id="ext/batch-2/2-1/1", **in_flight),
        "2-2-done": StoryView(state="done", batch_id=2),
    }
    view = SprintStatusView(session_id="ext", phase=SprintPhase.RUNNING, agent_backend="external", stories=stories)
    text = " ".join(_rendered(view).split())
    assert "2 stories wait for an external agent's answer (its assignment in .sprint-session/assignments/" in text
    assert "1-2-pantry: story-creator/create, dispatch_id ext/batch-1/1-2/1: signal agent_complete to ext/batch-1" in text
    assert "2-1-login: story-creator/create, dispatch_id ext/batch-2/2-1/1: signal agent_complete to ext/batch-2" in text
    assert "external agent" not in " ".join(_rendered(view.model_copy(update={"agent_backend": "simulated"})).split())


def test_status_says_which_stories_wait_for_a_dependency():
    """A story held by its dependency showed `ready-for-dev` in a running batch, nothing in flight, no reason."""
    stories = {"1-1-base": StoryView(state="review", batch_id=1), "1-2-dep": StoryView(state="ready-for-dev", batch_id=2)}
    view = SprintStatusView(session_id="s", phase=SprintPhase.RUNNING, stories=stories,
                            waiting_for={"1-2-dep": ["1-1-base"]})
    assert "1-2-dep waits for its dependency 1-1-base (not done yet)" in " ".join(_rendered(view).split())


def test_status_shows_the_finished_batches_errors_with_the_sprints():
    """A batch out of time said so only in the report: the status showed nothing of it."""
    view = SprintStatusView(
        session_id="s", phase=SprintPhase.COMPLETED, errors=["sprint stopped"],
        batch_errors={1: ["batch 1 out of time: it worked 60 s"], 2: ["sprint-status.yaml unreadable: gone"]},
    )
    text = _rendered(view)
    assert "error: batch 1 out of time: it worked 60 s" in text
    assert "error: batch 2: sprint-status.yaml unreadable: gone" in text and "error: sprint stopped" in text
    many = view.model_copy(update={"batch_errors": {n: [f"batch {n} out of time"] for n in range(1, 9)}})
    text = _rendered(many)
    assert "... 4 errors before these" in text and "batch 4 out of time" not in text and "batch 8 out of time" in text


def test_status_says_why_stories_stopped_and_what_a_pause_with_nothing_left_waits_for():
    stories = {
        f"1-{n}-story": StoryView(state="needs-intervention", batch_id=1, error=f"dev-runner/dev failed: reason {n}\nmore")
        for n in range(1, 11)
    }
    stories["2-1-done"] = StoryView(state="done", batch_id=2)
    view = SprintStatusView(session_id="s-1", phase=SprintPhase.PAUSED, stories=stories, pause_reason="repeated failures")
    text = _rendered(view)
    assert "1-1-story: needs-intervention: dev-runner/dev failed: reason 1 more" in text
    assert "1-8-story:" in text and "1-9-story:" not in text and "... and 2 more" in text
    assert "2-1-done:" not in text
    assert "nothing left to run: `bso sprint decide s-1 STORY rearm`" in text
    running = view.model_copy(update={"current_batch": 2})
    assert "nothing left to run" not in _rendered(running)
    assert "bso sprint resume s-1 goes on" in _rendered(running)  # the command, not only the word `resume`
    budget = running.model_copy(update={"pause_reason": "token budget exhausted (2,000/1,500); resume with a higher token_limit to go on"})
    assert "bso sprint resume s-1 --token-limit N goes on" in _rendered(budget)
    long = StoryView(state="needs-intervention", batch_id=1, error="x" * 300)
    text = _rendered(view.model_copy(update={"stories": {"1-1-story": long}}))
    assert "1-1-story: needs-intervention: " + "x" * 157 + "..." in text and "reasons shortened" in text


def test_status_marks_every_running_batch_and_says_why_one_waits():
    stories = {
        "1-1-a": StoryView(state="review", batch_id=1),
        "1-2-b": StoryView(state="review", batch_id=2),
        "1-3-c": StoryView(state="review", batch_id=3),
    }
    held = "batch 3 waits: 1-3-c touches src/a.py, as 1-1-a of running batch 1 does"
    view = SprintStatusView(
        session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, current_batch=1, running_batches=[1, 2],
        batch_held=held,
    )
    lines = _rendered(view).splitlines()
    marked = [line.split()[1] for line in lines if line.startswith("batch ") and "(running)" in line]
    assert marked == ["1", "2"], lines  # only the lowest was marked
    assert held in lines


def test_a_finished_batch_keeps_its_bar_after_a_rearm():
    """K1 failed in batch 1 and was rearmed into batch 2: batch 1's bar still counts it (it showed 1/1)."""
    stories = {"1-1-a": StoryView(state="review", batch_id=2), "1-2-b": StoryView(state="done", batch_id=1)}
    view = SprintStatusView(
        session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, current_batch=2, running_batches=[2],
        finished_batches={1: (2, 2)},
    )
    bars = {line.split()[1]: line.split()[-1] for line in _rendered(view).splitlines() if line.startswith("batch ")}
    assert bars == {"1": "2/2", "2": "(running)"}, bars


def test_watch_wraps_a_long_wait_reason_on_a_narrow_terminal():
    """On 80 columns the watch view cut the batch hold's line at the edge (Live crops a soft-wrapping console)."""
    stories = {"1-1-a": StoryView(state="review", batch_id=1), "1-2-b": StoryView(state="review", batch_id=2)}
    held = "batch 2 waits: 1-2-b touches src/app/very/long/module/path.py, as 1-1-a of running batch 1 does; end"
    view = SprintStatusView(
        session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, current_batch=1, running_batches=[1],
        batch_held=held,
    )
    terminal = io.StringIO()
    console = watch_console(file=terminal, width=80, force_terminal=True, color_system=None)
    with Live(_progress(view, None, "running"), console=console, auto_refresh=False, transient=False):
        pass
    shown = " ".join(terminal.getvalue().split())
    assert held in shown, shown


def test_a_narrow_terminal_folds_story_keys_and_wraps_the_summary(monkeypatch):
    """On 80 columns the story table cut keys to `2-2-expiry-…` (2-2 and 2-2a looked alike) and the execution
    summary's reasons ended mid-word: keys fold, the summary wraps."""
    keys = ["2-2-expiry-reminder-emails", "2-2a-reminder-digest-settings", "1-2-pantry-item-model-and-storage"]
    stories = {k: StoryView(state="needs-intervention", batch_id=1, agent_in_flight="dev-runner", mode_in_flight="fix") for k in keys}
    view = SprintStatusView(session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, running_batches=[1])
    terminal = io.StringIO()
    Console(file=terminal, width=80, color_system=None).print(_progress(view, None, "running"), soft_wrap=False)
    table = terminal.getvalue()
    assert "…" not in table, table
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("story"))
    batch_at = lines[header].index("batch")
    folded: list[str] = []  # each row's key, put together from its folded lines
    for line in lines[header + 1:]:
        if line[batch_at:batch_at + 5].strip():  # a row starts: its batch cell
            folded.append("")
        folded[-1] += line[:batch_at].strip()
    assert folded == keys, table
    assert all(line.rstrip().endswith("0") for line in lines[header + 1:] if line[batch_at:batch_at + 5].strip())
    # Narrower still: the review round and fixes columns go, a number is never cut (the table was cropped at the
    # edge, `1234567` shown as `12345`).
    costly = view.model_copy(update={"stories": {k: v.model_copy(update={"tokens_used": 1234567}) for k, v in stories.items()}})
    for width in (60, 70, 80):
        terminal = io.StringIO()
        Console(file=terminal, width=width, color_system=None).print(_progress(costly, None, "running"), soft_wrap=False)
        assert terminal.getvalue().count("1234567") == len(keys) and "…" not in terminal.getvalue(), terminal.getvalue()

    terminal = io.StringIO()
    monkeypatch.setattr(bso.cli, "out", Console(file=terminal, width=80, force_terminal=True, color_system=None))
    reason = "dev-runner/dev failed: simulated dev agent error in the story's third task, after two retries"
    _print_markdown(f"## Stories\n\n- 1-1-login-form: needs-intervention: {reason}\n")
    assert reason in " ".join(terminal.getvalue().split()), terminal.getvalue()


def test_sprint_list_says_where_a_sprint_that_ended_early_was():
    """A sprint that failed at its start showed `planning` in the phase column, as if it still planned."""
    from temporalio.client import WorkflowExecutionStatus as S

    from bso.cli import _phase_shown

    # A sprint fails as a workflow only refusing its input: one wording whichever check refused it (it was
    # `failed`, `ended in starting` or `ended in planning` by the check's place).
    for phase in ("", "starting", "planning", "failed"):
        assert _phase_shown(phase, S.FAILED) == "ended at its start", phase
    assert _phase_shown("running", S.TERMINATED) == "ended in running"
    assert _phase_shown("planning", S.RUNNING) == "planning"
    assert _phase_shown("running", S.CONTINUED_AS_NEW) == "running"  # its next run carries on
    assert _phase_shown("completed", S.COMPLETED) == "completed"
    assert _phase_shown("canceled", S.CANCELED) == "canceled"
    assert _phase_shown("", S.RUNNING) == ""  # no worker has taken it up yet


def test_the_overall_count_says_how_many_of_the_ended_stories_are_done():
    """`4/5 stories` for a sprint whose stories had ended needs-intervention but one: it read as nearly done."""
    states = ["done", "needs-intervention", "needs-intervention", "skipped", "review"]
    stories = {f"1-{i}-story": StoryView(state=state, batch_id=1) for i, state in enumerate(states, 1)}
    view = SprintStatusView(session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, running_batches=[1])
    assert "4/5 stories (1 done)" in _rendered(view)
    all_done = {k: v.model_copy(update={"state": "done"}) for k, v in stories.items()}
    text = _rendered(view.model_copy(update={"stories": all_done}))
    assert "5/5 stories" in text and "done)" not in text, text


def test_the_bars_give_way_on_a_narrow_terminal_and_the_counts_stay_whole():
    """At 45 columns the 40-column bars pushed the counts off: `5…`, `27800/2000…`."""
    stories = {f"1-{i}-story": StoryView(state="done" if i < 3 else "review", batch_id=1) for i in range(1, 6)}
    view = SprintStatusView(
        session_id="s-1", phase=SprintPhase.RUNNING, stories=stories, running_batches=[1],
        token_limit=2_000_000, tokens_used=27_800,
    )
    for width in (45, 60, 120):
        terminal = io.StringIO()
        Console(file=terminal, width=width, color_system=None).print(_progress(view, None, "running"), soft_wrap=False)
        shown = terminal.getvalue()
        assert "2/5 stories" in shown and "2/5 (running)" in shown and "27800/2000000" in shown, shown
        assert "…" not in shown.split("story")[0], shown
        bar = next(line for line in shown.splitlines() if line.startswith("overall"))
        assert len(bar.rstrip()) <= width and bar.count("━") <= 40, bar


def test_batch_errors_leave_out_what_the_sprint_says_already():
    """A batch that ended abnormally has the Master's reason as its error, among the sprint's errors already."""
    def batch(batch_id: int, status: BatchStatus, errors: list[str]) -> SlaveResult:
        nothing = SlaveResults(
            stories_total=0, stories_completed=0, stories_failed=0, stories_skipped=0, story_results=[],
            total_agents_created=0, total_agents_destroyed=0, review_fix_rounds={},
        )
        return SlaveResult(batch_id=batch_id, session_id="s", status=status, results=nothing, errors=errors)

    ran = batch(2, BatchStatus.PARTIAL, ["batch 2 out of time: it worked 60 s"])
    cut = batch(1, BatchStatus.FAILED, ["batch 1 timed out"])
    clean = batch(3, BatchStatus.COMPLETE, [])
    assert batch_errors([ran, cut, clean], ["batch 1 timed out"]) == {2: ["batch 2 out of time: it worked 60 s"]}
    report = SprintReport(session_id="s", status=SprintStatus.PARTIAL, batches=[ran, cut], error="batch 1 timed out")
    view = _view_from_report(report)  # a finished sprint no worker answers for: from its result
    assert (view.batch_errors, view.errors) == ({2: ["batch 2 out of time: it worked 60 s"]}, ["batch 1 timed out"])
    # Its tokens against the budget in force at its end (it showed `2000/0`); an older report has no budget.
    budgeted = _view_from_report(report.model_copy(update={"tokens_used": 2000, "token_limit": 500_000}))
    assert (budgeted.tokens_used, budgeted.token_limit, view.token_limit) == (2000, 500_000, 0)


def test_what_waits_for_a_worker_names_the_worker_to_start():
    from datetime import timedelta

    from bso.cli import WaitingForAWorker

    def told(queue: str, activity_type: str = "run_agent") -> str:
        return WaitingForAWorker(
            activity_type, "s/batch-1/1-1/1", "s/batch-1", queue, timedelta(seconds=95.6)
        ).describe()

    assert "agent s/batch-1/1-1/1 has waited 95 s for a worker of bso-agents" in told("bso-agents")
    assert told("bso-agents").endswith("Start one: `bso worker --queue bso-agents`")
    assert told("team-a-bso-agents").endswith("`bso worker --queue bso-agents --queue-prefix team-a-`")
    # A sprint queue named freely (--task-queue myq) pairs with myq-agents, which no --queue-prefix names.
    assert told("myq-agents").endswith("Start a worker serving myq-agents")
    assert told("bso-agents", "finish_story_git").startswith("finish_story_git of s/batch-1 has waited 95 s")
    as_json = WaitingForAWorker("run_agent", "s/batch-1/1-1/1", "s/batch-1", "bso-agents", timedelta(seconds=95.62)).as_json()
    assert {k: as_json[k] for k in ("activity_id", "workflow_id", "queue", "waited_seconds")} == {
        "activity_id": "s/batch-1/1-1/1", "workflow_id": "s/batch-1", "queue": "bso-agents", "waited_seconds": 95.6
    }


def test_a_started_activity_is_told_silent_once_its_worker_missed_half_its_heartbeat_timeout():
    from datetime import UTC, datetime, timedelta

    from temporalio.api.enums.v1 import PendingActivityState
    from temporalio.api.workflow.v1 import PendingActivityInfo

    from bso.cli import _silent_worker

    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)

    def activity(activity_id: str, quiet_s: float, timeout_s: int = 60, started: bool = True, beat: bool = True,
                 started_s_ago: float = 120, attempt: int = 1):
        info = PendingActivityInfo(activity_id=activity_id, attempt=attempt, maximum_attempts=5, state=(
            PendingActivityState.PENDING_ACTIVITY_STATE_STARTED if started
            else PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        ))  # fmt: skip
        info.activity_type.name = "run_agent"
        info.activity_options.heartbeat_timeout.FromTimedelta(timedelta(seconds=timeout_s))
        info.last_started_time.FromDatetime(now - timedelta(seconds=quiet_s if not beat else started_s_ago))
        if beat:
            info.last_heartbeat_time.FromDatetime(now - timedelta(seconds=quiet_s))
        return info

    def silent(*activities):
        return _silent_worker([("s/batch-1", a) for a in activities], now)

    assert silent(activity("a", 5)) is None  # heartbeats come
    assert silent(activity("a", 29)) is None  # under half the timeout
    assert silent(activity("a", 40, timeout_s=0)) is None  # heartbeats nothing: no timeout to run out
    assert silent(activity("a", 0, started=False)) is None  # not started: WaitingForAWorker's to say
    assert silent(activity("a", 12, timeout_s=10)).silent == timedelta(seconds=12)  # past the timeout: still silent
    assert silent(activity("a", 8, timeout_s=10)) is None  # under SILENCE_NOTICED_AFTER, whatever the timeout
    told = silent(activity("a", 31), activity("b", 45, beat=False), activity("c", 35))
    assert (told.activity_id, told.silent) == ("b", timedelta(seconds=45)), told  # no heartbeat yet: since its start
    assert told.describe() == (
        "agent b: no heartbeat from its worker for 45 s (the worker stopped?): a live worker starts it again once "
        "its heartbeat timeout (60 s) runs out, in ~15 s"
    )
    # A retry just started: the heartbeat the server still shows is its earlier attempt's.
    assert silent(activity("a", 90, started_s_ago=2, attempt=2)) is None
    assert silent(activity("a", 40, attempt=5)).describe().endswith(
        "(the worker stopped?): it fails (its last attempt) once its heartbeat timeout (60 s) runs out, in ~20 s"
    )


# An agent's error as test runners write it (colours, a screen clear), a carriage return, a NUL, Rich markup.
HOSTILE_TEXT = "[/x] \x1b[2J\x1b[31mRED\x1b[0m \x00 nul\r [bold]b[/bold] \x07"


def _no_terminal_codes(text: str) -> None:
    assert not any(c in text for c in "\x1b\x00\r\x07"), repr(text)
    assert "[/x] \\x1b[2J\\x1b[31mRED\\x1b[0m \\x00 nul" in text and "[bold]b[/bold]" in text, text


def test_what_agents_and_operators_wrote_is_shown_not_obeyed_by_the_terminal():
    """bso sprint status / watch printed an agent's error raw: the screen cleared, the rest turned red."""
    from bso.messages import RejectedMessage

    view = SprintStatusView(
        session_id="s", phase=SprintPhase.PAUSED, errors=[HOSTILE_TEXT], pause_reason=HOSTILE_TEXT,
        stories={"1-1-a": StoryView(state="needs-intervention", batch_id=1, error=HOSTILE_TEXT)},
    )
    rejected = {"s/batch-1": RejectedSoFar(rejected_messages=[RejectedMessage(msg_type="X", reason=HOSTILE_TEXT)], rejected_total=1)}
    terminal = io.StringIO()
    Console(file=terminal, width=400, color_system=None).print(_progress(view, HOSTILE_TEXT, "running", rejected))
    _no_terminal_codes(terminal.getvalue())


def test_the_message_table_shows_markup_and_escapes_as_text():
    """A `[/x]` in a message's detail made `bso messages` fail with Rich's MarkupError."""
    from datetime import UTC, datetime

    from bso.message_flow import FlowMessage

    flow = [FlowMessage(time=datetime(2026, 11, 26, tzinfo=UTC), workflow_id="s/batch-1", event_id=5, type="AGENT_COMPLETE",
                        sender="dev-runner", recipient="s/batch-1", story="1-1-a", detail=HOSTILE_TEXT)]
    terminal = io.StringIO()
    Console(file=terminal, width=400, color_system=None).print(_flow_table(flow))
    _no_terminal_codes(terminal.getvalue())


def test_the_summary_printed_shows_control_characters_as_escapes(monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(bso.cli, "out", Console(file=terminal, width=400, color_system=None))
    _print_markdown(f"# Summary\n\n{HOSTILE_TEXT}\n")
    _no_terminal_codes(terminal.getvalue())


def test_the_worker_a_sprint_queue_waits_for_is_named():
    assert sprint_worker_command("bso-sprint") == "bso worker"
    assert sprint_worker_command("team-a-bso-sprint") == "bso worker --queue-prefix team-a-"
    assert sprint_worker_command("bso-sprnt") is None  # no `bso worker` serves it
    assert sprint_worker_command("bso-agents") is None  # a worker's activities queue, not its sprints'
    # On another server: the worker that polls that one (it polled localhost:7233).
    assert sprint_worker_command("team-a-bso-sprint", "localhost:7591", "team") == (
        "bso --address localhost:7591 --namespace team worker --queue-prefix team-a-"
    )
    said = "bso: warning: no worker polls task queue bso-sprint: sprint s-1 waits until one does"
    assert no_worker_warning("bso-sprint", "s-1", "localhost:7233", "default") == f"{said}; start one with `bso worker`"
    typo = no_worker_warning("bso-sprnt", "s-1", "tq.example:7233", "team")
    assert typo.startswith("bso: warning: no worker polls task queue bso-sprnt: sprint s-1 waits until one does: its task queue bso-sprnt is not ")
    assert "a mistyped --task-queue?" in typo and "\n" not in typo
    assert typo.endswith(
        "End the sprint with `temporal workflow terminate --address tq.example:7233 --namespace team "
        "--workflow-id s-1` and start it again"
    )


class _Pollers:
    """A server's DescribeTaskQueue: these pollers, an error, or no answer at all."""

    def __init__(self, *ages_seconds: float, error: RPCError | None = None, hang: bool = False) -> None:
        self.requests: list = []
        self.ages, self.error, self.hang = ages_seconds, error, hang

    async def describe_task_queue(self, request, timeout=None):
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueResponse

        self.requests.append((request, timeout))
        if self.hang:
            await asyncio.sleep(3600)
        if self.error is not None:
            raise self.error
        answer = DescribeTaskQueueResponse()
        for age in self.ages:  # as long ago as the server saw each poll
            answer.pollers.add(identity="w@host").last_access_time.FromDatetime(datetime.now(UTC) - timedelta(seconds=age))
        return answer


@pytest.mark.parametrize(
    ("pollers", "polls"),
    [
        (_Pollers(), False),  # never polled: a mistyped queue, or no worker started yet
        (_Pollers(600), False),  # a worker stopped minutes ago, still listed by the server
        (_Pollers(600, 5), True),
        (_Pollers(error=RPCError("denied", RPCStatusCode.PERMISSION_DENIED, b"")), True),  # unsaid when unknown
        (_Pollers(hang=True), True),
    ],
    ids=["none", "stale", "lately", "refused", "no-answer"],
)
def test_whether_a_worker_polls_the_sprint_queue_is_one_quick_call(monkeypatch, pollers, polls):
    from temporalio.api.enums.v1 import TaskQueueType

    monkeypatch.setattr(bso.cli, "POLLERS_TIMEOUT", timedelta(seconds=0.1))
    client = SimpleNamespace(namespace="ns", workflow_service=pollers)
    started = time.monotonic()
    assert asyncio.run(_worker_polls(client, "bso-sprnt")) is polls
    assert time.monotonic() - started < 5  # a server that does not answer never holds the CLI
    (request, timeout), = pollers.requests
    assert (request.namespace, request.task_queue.name) == ("ns", "bso-sprnt")
    assert request.task_queue_type == TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW and timeout == timedelta(seconds=0.1)


def test_a_finished_sprints_batches_from_its_report_count_those_a_correction_planned():
    """No worker answers for the ended sprint: its view comes from its report, whose `batch_plan` is the first plan.
    A course correction that renumbered the pending batches made it `batches 2/3` (`0/2` with every pending story
    dropped), with the dropped story in a batch that never ran."""
    from bso.messages import BatchPlanReady, BatchSpec
    from bso.models import CorrectionRecord, StoryResult

    def ran(batch_id: int, key: str) -> SlaveResult:
        return SlaveResult(batch_id=batch_id, session_id="s", status=BatchStatus.COMPLETE, results=SlaveResults(
            stories_total=1, stories_completed=1, stories_failed=0, stories_skipped=0,
            story_results=[StoryResult(story_key=key, final_state="done", agents_dispatched=1)],
            total_agents_created=1, total_agents_destroyed=1, review_fix_rounds={key: 0},
        ))

    plan = BatchPlanReady(session_id="s", total_stories=3, batches=[
        BatchSpec(batch_id=1, stories=["1-1-a"]), BatchSpec(batch_id=2, stories=["1-2-b"]), BatchSpec(batch_id=3, stories=["1-3-c"])
    ])
    cc = CorrectionRecord(reason="user_request", text="later", dropped=["1-2-b"], impact="user_request: 1 dropped")
    report = SprintReport(
        session_id="s", status=SprintStatus.PARTIAL, batch_plan=plan, batches=[ran(4, "1-1-a"), ran(5, "1-3-c")],
        stories={"1-1-a": "done", "1-2-b": "skipped", "1-3-c": "done"}, course_corrections=[cc], unstarted_batches=[],
    )
    view = _view_from_report(report)
    assert (view.batches_done, view.batches_total) == (2, 2)
    assert {k: v.batch_id for k, v in view.stories.items()} == {"1-1-a": 4, "1-2-b": None, "1-3-c": 5}
    assert view.stories["1-2-b"].error == "dropped by course correction (user_request): later"
    assert view.course_corrections == ["user_request: 1 dropped"]
    everything_dropped = report.model_copy(update={"batches": [], "stories": dict.fromkeys(report.stories, "skipped")})
    assert (_view_from_report(everything_dropped).batches_done, _view_from_report(everything_dropped).batches_total) == (0, 0)
    # A shutdown left batch 5 unstarted: it counts, and its story shows in it.
    stopped = report.model_copy(update={"batches": report.batches[:1], "unstarted_batches": [BatchSpec(batch_id=5, stories=["1-3-c"])],
                                        "stories": {**report.stories, "1-3-c": "review"}})
    view = _view_from_report(stopped)
    assert (view.batches_done, view.batches_total, view.stories["1-3-c"].batch_id) == (1, 2, 5)
    # A report made before the unstarted batches were kept: the first plan's, as before.
    old = report.model_copy(update={"unstarted_batches": None, "course_corrections": []})
    assert _view_from_report(old).batches_total == 3


def test_start_names_the_agents_file_the_command_backend_reads(tmp_path: Path):
    """With no agents file it said `.bso/agents.toml` all the same; every story then failed on a missing `claude`."""
    assert "the built-in `claude` profile for every agent" in agents_said(AgentBackend.COMMAND, tmp_path)
    (tmp_path / ".bso").mkdir()
    (tmp_path / ".bso" / "agents.yaml").write_text("{}\n")
    assert agents_said(AgentBackend.COMMAND, tmp_path).startswith("command (the coding-agent CLIs of .bso/agents.yaml,")
    assert agents_said(AgentBackend.SIMULATED, tmp_path).startswith("simulated (the default")
