"""The bad-input corpus (tests/corpus/): every bad status file, path, signal and answer gets a clear
error, never a WorkflowTaskFailed event, and the status file stays unchanged (or changes correctly).
Add a file to tests/corpus/status/ and a row to STATUS_CORPUS for every new bad input found."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.backends import simulated
from activities.session_files import SESSION_DIR
from bso.constants import slave_workflow_id
from bso.cli import BsoError, _check_stories
from bso.message_flow import message_flow
from bso.messages import TaskAssignment
from bso.models import DEFAULT_STATUS_FILE
from bso.states import AgentMode, AgentType
from bso.summary import summary_filename
from bso.temporal_client import fetch_sprint_histories
from tests.conftest import bso_worker
from tests.workflow.helpers import (
    make_project,
    poll_until,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    workflow_task_failures,
)
from tests.workflow.test_external_agents import _complete, _pending
from activities.session_files import session_dir_problem
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
K1 = "1-1-login-form"

# corpus file -> text the sprint's failure must contain
STATUS_CORPUS = {
    "malformed_yaml.yaml": "YAML error: expected ',' or ']'",
    "development_status_is_a_list.yaml": "development_status must be a mapping, got a list",
    "story_value_is_a_mapping.yaml": "value of '1-1-login' must be a string, got a mapping",
    "story_value_is_a_number.yaml": "value of '1-1-login' must be a string, got an integer",
    "duplicate_keys.yaml": 'found duplicate key "1-1-login"',
    "dotdot_key.yaml": "invalid key '../../etc/passwd' in development_status",
    "absolute_key.yaml": "invalid key '/etc/passwd' in development_status",
    "non_utf8.yaml": "not valid UTF-8 at byte offset",
    "not_a_mapping.yaml": "top level must be a mapping, got str",
    "empty.yaml": "top level must be a mapping, got an empty document",
    "story_location_outside.yaml": "path escapes the project: '../../outside'",
    # A number Python refuses to read (over 4,300 digits) was a bare ValueError with no line; one of 10 digits
    # made the story's dispatch ids too long for its agents' answers.
    "story_number_too_long.yaml": "line 8, column 5007: YAML error: could not find expected ':'",
    "story_number_of_ten_digits.yaml": "invalid key '1234567890-1-b' in development_status (expected epic-N, "
    "epic-N-retrospective or N-M-slug, numbers of at most 9 digits)",
    # Two values of 900 KB: the batch was terminated (its workflow task's reply over 4 MB), then the Master's
    # task failed on every retry.
    "story_value_too_long.yaml": "line 8, column 15: value of '1-2-logout' is 6000 characters long, 'reviewreview",
    # A story taken from an anchor's map: its agent ran, then the write of its state (on a line of its own) failed.
    "merge_key.yaml": "line 7, column 1: development_status takes '1-1-login' from a YAML merge key (<<)",
    # A story value BSO cannot write in place: its agent ran, then the write of its state failed.
    "story_value_with_an_anchor.yaml": "line 7, column 14: cannot edit the value of '1-1-login' in place: it carries "
    "an anchor (&st); write it plainly on one line: `1-1-login: review`",
    "story_value_an_alias.yaml": "line 8, column 3: cannot edit the value of '1-2-logout' in place: it is an alias",
    "story_value_folded.yaml": "line 7, column 14: cannot edit the value of '1-1-login' in place: it is a block scalar",
    "story_value_continued.yaml": "line 7, column 14: cannot edit the value of '1-1-login' in place: it goes on over "
    "the next line; write it plainly on one line",
    # A line separator in a quoted value: the edit of `last_updated` found the wrong line, or every write failed.
    "unicode_line_break.yaml": "line 3, column 15: a Unicode line break (U+2028), which YAML readers split lines at "
    "differently: BSO cannot edit the file safely",
    # Noticed past the end: the error named a line after the last one, never the line with the unclosed `[`.
    "unclosed_bracket_on_the_last_line.yaml": "the file ends inside a value: see its last line, line 10",
}


async def _fails_with(client: Client, queue: str, inp, expected: str) -> str:
    handle = await start_sprint(client, queue, inp)
    with pytest.raises(WorkflowFailureError) as failure:
        await sprint_result(handle)
    message = str(failure.value.cause)
    assert expected in message
    assert await workflow_task_failures(client, handle.id) == []
    return message


def _install(root: Path, data: bytes) -> Path:
    target = root / DEFAULT_STATUS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def test_every_corpus_file_has_an_expected_error():
    assert sorted(p.name for p in (CORPUS / "status").iterdir()) == sorted(STATUS_CORPUS)


@pytest.mark.parametrize("name", sorted(STATUS_CORPUS))
async def test_bad_status_file(ts_env, tmp_path: Path, name: str):
    data = (CORPUS / "status" / name).read_bytes()
    target = _install(tmp_path, data)
    async with bso_worker(ts_env.client) as queue:
        message = await _fails_with(ts_env.client, queue, sprint_input(tmp_path), STATUS_CORPUS[name])
    assert "sprint-status.yaml" in message  # names the file
    assert target.read_bytes() == data


async def test_ten_megabyte_status_file(ts_env, tmp_path: Path):
    status = make_project(tmp_path, {K1: "review"})
    data = status.read_bytes() + b"# padding padding padding padding padding padding padding\n" * 190_000
    assert len(data) > 10 * 1024 * 1024
    status.write_bytes(data)
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, sprint_input(tmp_path), "file too large")
    assert status.read_bytes() == data


async def test_status_file_symlinked_out_of_the_project(ts_env, tmp_path: Path):
    outside = tmp_path / "outside"
    make_project(outside, {K1: "review"})
    project = tmp_path / "project"
    link = project / DEFAULT_STATUS_FILE
    link.parent.mkdir(parents=True)
    os.symlink(outside / DEFAULT_STATUS_FILE, link)
    before = (outside / DEFAULT_STATUS_FILE).read_bytes()
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, sprint_input(project), "outside the project root")
    assert (outside / DEFAULT_STATUS_FILE).read_bytes() == before


@pytest.mark.parametrize(
    "status_file, expected",
    [
        ("/etc/passwd", "status file is outside the project root"),
        ("../../../etc/passwd", "escapes the project"),
        ("_bmad-output/nothing-here.yaml", "status file does not exist"),
        ("_bmad-output", "status file is not a regular file"),
    ],
)
async def test_bad_status_file_path(ts_env, tmp_path: Path, status_file: str, expected: str):
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, sprint_input(tmp_path, status_file=status_file), expected)
    assert status_values(tmp_path) == before


async def test_missing_project_root(ts_env, tmp_path: Path):
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, sprint_input(tmp_path / "gone"), "project root does not exist")


async def test_relative_project_root(ts_env, tmp_path: Path, monkeypatch):
    """Refused even where it would resolve (the worker's working directory is the project's parent here)."""
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, sprint_input(Path(tmp_path.name)), "is relative")
    assert status_values(tmp_path) == before


async def test_a_timeout_too_long_for_a_workflow_is_refused_at_the_start(ts_env, tmp_path: Path):
    """It passed validation, and the Slave's workflow task then failed on every retry (its timedelta
    overflowed): the sprint hung, its status still 'running'."""
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    inp = sprint_input(tmp_path, config_overrides={"slave_timeout_seconds": 10**20})
    async with bso_worker(ts_env.client) as queue:
        await _fails_with(ts_env.client, queue, inp, "slave_timeout_seconds: at most 31622400 seconds (a year)")
    assert status_values(tmp_path) == before


@pytest.mark.parametrize("keys", [["../1-1"], ["/etc/passwd"], ["9-9"]])
async def test_bad_story_key_selection(ts_env, tmp_path: Path, keys):
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        message = await _fails_with(ts_env.client, queue, sprint_input(tmp_path, story_keys=keys), keys[0])
    assert "InvalidSprintInput" in repr(message) or keys[0] in message
    assert status_values(tmp_path) == before


async def test_unknown_state_is_needs_intervention_and_the_rest_goes_on(ts_env, tmp_path: Path):
    """A valid file with a value no dispatch-table row knows (tests/corpus/odd/unknown_state.yaml)."""
    _install(tmp_path, (CORPUS / "odd" / "unknown_state.yaml").read_bytes())
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, sprint_input(tmp_path))
        report = await sprint_result(handle)
        slave_failures = await workflow_task_failures(ts_env.client, slave_workflow_id(handle.id, 1))
    assert report.stories == {"1-1-login": "done", "1-2-logout": "needs-intervention"}
    errors = [r.error for b in report.batches for r in b.results.story_results if r.error]
    assert any("half-done-maybe" in e and "no dispatch-table row" in e for e in errors)
    values = status_values(tmp_path)
    assert values["1-1-login"] == "done" and values["1-2-logout"] == "needs-intervention"
    assert await workflow_task_failures(ts_env.client, handle.id) == [] and slave_failures == []


async def test_master_signals_with_wrong_shapes_are_ignored(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "ready-for-dev"})
    client = ts_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id="bad-sig"))
        slave_id = slave_workflow_id("bad-sig", 1)
        dispatch_id, agent, mode = await _pending(client, slave_id, ts_env)
        await handle.signal("story_update", {"story_key": 42})  # wrong shape
        await handle.signal("story_update", "nonsense")
        await handle.signal(
            "story_update", {"batch_id": 1, "story_key": "9-9-not-in-sprint", "view": {"state": "done"}}
        )  # unknown story
        forged = {"batch_id": 99, "story_key": K1, "view": {"state": "done"}}  # no batch 99: sent by hand
        await handle.signal("story_update", forged)
        await handle.signal("resume", {"token_limit": -5})  # invalid
        await handle.signal("resume", [1, 2, 3])
        await handle.signal("pause", 12345)  # not a string: paused all the same, the reason saying what came
        await handle.signal("no_such_signal", {"x": 1})
        # Valid JSON no parser here reads (a number of 5,000 digits): the SDK dropped it, said only in the log.
        await handle.signal("resume", RawValue(Payload(
            metadata={"encoding": b"json/plain"}, data=b'{"token_limit": ' + b"9" * 5000 + b"}"
        )))  # fmt: skip
        status = await handle.query(SprintMasterWorkflow.status)
        assert status.rejected_messages[-1].msg_type == "RESUME", status.rejected_messages[-1]
        assert status.rejected_messages[-1].reason.startswith(
            "its input could not be read as JSON: Invalid JSON: number out of range"
        ), status.rejected_messages[-1]
        assert status.phase == "paused"
        assert status.pause_reason == 'paused by operator (its input 12345 is no reason text: send a string, or {"reason": ...})'
        assert "9-9-not-in-sprint" not in status.stories
        assert status.stories[K1].state != "done", "a story update no batch sent set the story's view"
        assert any(r.reason.startswith(f"{K1} is not a story of a running batch 99") for r in status.rejected_messages)
        await handle.signal("resume")
        slave = client.get_workflow_handle(slave_id)
        # Decisions sent straight to the Slave (the Master validates its own first): wrong shapes, no decision due.
        for bad in ({"story_key": 5}, "nonsense", {"story_key": K1, "decision": "force_pass"}):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await slave.execute_update(SprintSlaveWorkflow.decide, bad)
            assert "InvalidDecision" in repr(refused.value.cause), refused.value.cause
            await slave.signal("decision", bad)
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode, story_key="2-2"))  # wrong story
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode, summary="x" * 5000))  # too long
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))  # repeated
        await slave.signal("dependency_update", {"9-9-not-a-dependency": "done"})  # by hand: the batch has none
        nested = b'{"msg_type": "AGENT_COMPLETE", "extra": ' + b"[" * 600 + b"]" * 600 + b"}"  # past the parser's depth
        await slave.signal("agent_complete", RawValue(Payload(metadata={"encoding": b"json/plain"}, data=nested)))
        review_id, agent, mode = await _pending(client, slave_id, ts_env, after=dispatch_id)
        slave_status = await slave.query(SprintSlaveWorkflow.status)
        # The review's answer with half an emoji in its summary (a JS agent cutting a string): valid JSON that
        # pydantic's parser refused, and the SDK dropped the signal; the story then waited for its timeout.
        answer = json.dumps(_complete(review_id, agent, mode, summary="looks good \ud83d")).encode()
        await slave.signal("agent_complete", RawValue(Payload(metadata={"encoding": b"json/plain"}, data=answer)))
        report = await sprint_result(handle)
    reasons = [r.reason for r in slave_status.rejected_messages]
    assert reasons[:3] == [
        "story_key: Input should be a valid string; decision: Field required",
        "(root): Input should be a valid dictionary or instance of DecisionRequest",
        "story '1-1-login-form' is not awaiting a decision (state ready-for-dev)",
    ], reasons
    assert reasons[3] == "story_key '2-2' does not match dispatch (1-1-login-form)"
    assert reasons[4].startswith("validation_failed: summary: String should have at most 2000 characters")
    assert reasons[5] == "already answered"
    unknown_dependency = "ignored for stories no story of this batch depends on: 9-9-not-a-dependency (it depends on: none)"
    assert reasons[6] == unknown_dependency
    assert reasons[7].startswith("its input could not be read as JSON: Invalid JSON: recursion limit exceeded"), reasons
    assert report.stories == {K1: "done"}
    assert status_values(tmp_path)[K1] == "done"
    for workflow_id in (handle.id, slave_id):
        assert await workflow_task_failures(client, workflow_id) == []
    # The refused signals stay readable in the message flow, and the execution summary is still written.
    flow = message_flow(await fetch_sprint_histories(client, handle.id))
    assert any(m.type == "STORY_UPDATE" and m.story == "42" for m in flow)
    updates = [m for m in flow if m.type == "STORY_UPDATE" and m.story == K1]
    assert [m.batch_id for m in updates if m.rejected] == [99], updates  # the forged one, as the Master took it
    assert [m.rejected for m in flow if m.type == "DEPENDENCY_UPDATE"] == [unknown_dependency]  # as the Slave took it
    assert len(updates) > 1
    assert (tmp_path / SESSION_DIR / summary_filename(report.session_id)).is_file()


@pytest.mark.e2e
async def test_agent_output_over_2mb_is_rejected_and_the_sprint_completes(local_env, tmp_path: Path):
    """The server refuses a 3 MB AGENT_COMPLETE (blob size limit), so it never reaches history; the
    agent's proper answer afterwards completes the sprint."""
    make_project(tmp_path, {K1: "review"})
    client = local_env.client
    async with bso_worker(client) as queue:
        handle = await start_sprint(client, queue, sprint_input(tmp_path, agent_backend="external", session_id=f"big-{os.getpid()}-{id(tmp_path)}"))
        slave_id = slave_workflow_id(handle.id, 1)
        dispatch_id, agent, mode = await _pending(client, slave_id, local_env)
        slave = client.get_workflow_handle(slave_id)
        with pytest.raises(RPCError) as refused:
            await slave.signal("agent_complete", _complete(dispatch_id, agent, mode, summary="y" * (3 * 1024 * 1024)))
        history = await slave.fetch_history()
        assert max(len(e.SerializeToString()) for e in history.events) < 100_000
        await slave.signal("agent_complete", _complete(dispatch_id, agent, mode))
        report = await asyncio.wait_for(handle.result(), timeout=120)
    assert "size" in str(refused.value).lower() or "limit" in str(refused.value).lower()
    assert report.stories == {K1: "done"}
    for workflow_id in (handle.id, slave_id):
        assert await workflow_task_failures(client, workflow_id) == []


@pytest.mark.parametrize("in_the_way", ["file", "claim-dir", "link-out"])
async def test_something_in_the_way_of_the_session_folder_is_named_at_the_start(
    ts_env, tmp_path: Path, tmp_path_factory, in_the_way
):
    """A file named .sprint-session (or a folder where the running sprint is recorded): `bso sprint start` said
    'started', and the sprint then failed on `[Errno 17] File exists`. A .sprint-session linked out of the
    project: agents' prompts and outputs were written wherever it pointed. Now the start refuses each, naming it,
    and a sprint started otherwise fails at once the same way."""
    make_project(tmp_path, {K1: "review"})
    before = status_values(tmp_path)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    if in_the_way == "file":
        (tmp_path / ".sprint-session").write_text("notes\n")
        expected = ".sprint-session is not a directory"
    elif in_the_way == "claim-dir":
        (tmp_path / ".sprint-session" / "running-sprint.json").mkdir(parents=True)
        expected = "running-sprint.json is not a file"
    else:
        (tmp_path / ".sprint-session").symlink_to(elsewhere, target_is_directory=True)
        expected = ".sprint-session is a link out of the project"
    problem = session_dir_problem(tmp_path)
    assert problem is not None and expected in problem  # what `bso sprint start` refuses with
    async with bso_worker(ts_env.client) as queue:
        message = await _fails_with(ts_env.client, queue, sprint_input(tmp_path), expected)
    assert "SessionDirError" in message or "Errno" not in message, message
    assert status_values(tmp_path) == before
    assert list(elsewhere.iterdir()) == []


async def test_a_story_file_linked_out_of_the_project_is_never_written_through(ts_env, tmp_path: Path, tmp_path_factory):
    """`1-1-login-form.md -> /elsewhere/notes.md`: the load skips it as outside the project, but the simulated
    story-creator checked its path only as text, and overwrote the file outside with a story document."""
    project = tmp_path / "project"
    status = make_project(project, {K1: "backlog"})
    outside = tmp_path_factory.mktemp("outside") / "notes.md"
    outside.write_text("my own notes, not a story\n", encoding="utf-8")
    os.symlink(outside, status.parent / f"{K1}.md")
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(project, session_id="link-out"))
        assert await workflow_task_failures(ts_env.client, "link-out") == []
    assert outside.read_text(encoding="utf-8") == "my own notes, not a story\n"
    errors = [r.error or "" for b in report.batches for r in b.results.story_results]
    assert report.stories[K1] == "needs-intervention", report.stories
    assert any(f"{K1}.md is a link out of the project (to {outside})" in e for e in errors), errors


def test_a_fifo_where_the_story_file_goes_is_refused_not_waited_on(tmp_path: Path):
    """The simulated story-creator opened a FIFO at the story's path (the load skips it), and waited for a writer
    for ever."""
    status = make_project(tmp_path, {K1: "backlog"})
    story = status.parent / f"{K1}.md"
    os.mkfifo(story)
    creating = TaskAssignment(
        dispatch_id="s1/batch-1/1-1/1", agent_type=AgentType.STORY_CREATOR, mode=AgentMode.CREATE, story_key=K1,
        story_path=str(story.relative_to(tmp_path)), session_id="s1", batch_id=1, report_to="s1/batch-1",
        project_root=str(tmp_path), backend="simulated",
    )
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(simulated._write_story_doc, creating)
        try:
            refused = writing.exception(timeout=10)
        finally:
            while not writing.done():  # a writer, then a reader, lets a creator blocked on the FIFO go, the test end
                for flags in (os.O_WRONLY, os.O_RDONLY):
                    with contextlib.suppress(OSError):
                        os.close(os.open(story, flags | os.O_NONBLOCK))
                time.sleep(0.1)
    assert isinstance(refused, ApplicationError) and refused.non_retryable, refused
    assert refused.message == f"story-creator: {story} is not a regular file (a folder, FIFO or device?): move it away for the story file"


async def test_a_story_file_not_in_utf8_is_revised_past_its_odd_bytes(ts_env, tmp_path: Path):
    """A story file a cp1252 editor saved (`café`): the load read it, bytes replaced, but the simulated
    story-creator failed on a bare UnicodeDecodeError at every attempt, naming no file."""
    status = make_project(tmp_path, {K1: "backlog"})
    (status.parent / f"{K1}.md").write_bytes("# Story 1.1: Login caf\u00e9\n\nStatus: backlog\n".encode("cp1252"))
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, session_id="not-utf8"))
        assert await workflow_task_failures(ts_env.client, "not-utf8") == []
    assert report.stories[K1] == "done", report


async def test_a_session_folder_linked_out_mid_sprint_is_not_written_through(ts_env, tmp_path: Path, tmp_path_factory):
    """The start refuses a .sprint-session linked out of the project (above), but nothing checked it again: one
    moved out and linked while the sprint ran had the agents go on writing through the link."""
    project = tmp_path / "project"
    make_project(project, {K1: "review"})
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "session"
    session = project / SESSION_DIR
    ledger = session / "simulated-agent-ledger.jsonl"

    async def reviewer_started() -> bool:
        return ledger.exists() and ledger.read_text() != ""

    inp = sprint_input(project, session_id="linked-out", simulation={"default": {"duration_ms": 4000}})
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await poll_until(reviewer_started, "the reviewer started")
        session.rename(elsewhere)  # the folder moved out, a link left in its place
        session.symlink_to(elsewhere, target_is_directory=True)
        report = await sprint_result(handle)
        assert await workflow_task_failures(ts_env.client, handle.id) == []
    ledger_out = [json.loads(line) for line in (elsewhere / ledger.name).read_text().splitlines() if line.strip()]
    assert [e for e in ledger_out if e.get("event") == "finished"] == [], ledger_out
    assert report.stories[K1] == "needs-intervention", report.stories
    errors = [r.error or "" for b in report.batches for r in b.results.story_results]
    assert any(f"{SESSION_DIR} is a link out of the project (to {elsewhere})" in e for e in errors), errors


async def test_a_folder_where_the_status_files_lock_goes_is_refused_at_the_start(ts_env, tmp_path: Path):
    """The sprint started, ran each story's first agent, and then every story ended needs-intervention on
    'cannot open lock file' (and the sprint paused for repeated failures). Its start now fails, naming it."""
    status = make_project(tmp_path, {K1: "review"})
    Path(f"{status}.lock").mkdir()
    before = status_values(tmp_path)
    async with bso_worker(ts_env.client) as queue:
        message = await _fails_with(ts_env.client, queue, sprint_input(tmp_path), "sprint-status.yaml.lock: Is a directory")
    assert "needed to claim the project at the sprint's start" in message
    assert status_values(tmp_path) == before


def _story_file_listing_files(key: str, count: int) -> str:
    number = key.split("-")[1]
    return f"# Story 1.{number}: Big\n\nFiles: " + ", ".join(f"src/module_{i:06d}.py" for i in range(count)) + "\n"


@pytest.mark.parametrize(
    ("stories", "expected"),
    [
        # Each story file names 24,000 files (~550 KB): three make more state than a sprint may carry; the
        # sprint ran until its first hand-over, whose workflow task then failed on every retry.
        (3, "3 stories make ~1.7 MB of sprint state with their story files' titles, Depends on, Tags and Files: "
            "a sprint carries at most 1.5 MB"),
        # Four are more than the first read may even hand on: the sprint failed with the SDK's bare TMPRL1103.
        (4, "hand on (1.9 MB; Temporal's payloads hold 2 MB): split it into several files (--status-file)"),
    ],
    ids=["over-what-a-sprint-carries", "over-what-a-read-hands-on"],
)
async def test_stories_too_large_for_a_sprints_state_are_refused_at_the_start(ts_env, tmp_path: Path, stories, expected):
    keys = [f"1-{n}-big" for n in range(1, stories + 1)]
    status = make_project(tmp_path, dict.fromkeys(keys, "review"), {k: _story_file_listing_files(k, 24_000) for k in keys})
    before = status.read_text(encoding="utf-8")
    async with bso_worker(ts_env.client) as queue:
        message = await _fails_with(ts_env.client, queue, sprint_input(tmp_path), expected)
    assert status.read_text(encoding="utf-8") == before, message
    if stories == 3:  # `bso sprint start` says it before it starts anything
        with pytest.raises(BsoError, match=r"^3 stories make ~1\.7 MB of sprint state"):
            _check_stories(tmp_path, None, keys)
