"""The `bso` command, run as the real console script against the local dev server with a real worker
process (`bso worker`, Prometheus endpoint on): start, watch, status, list, report, messages, exports,
operator actions, the execution summary file, the worker's logs and metrics, and the error paths."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from bench.infra import free_port
from bso.cli import FROM_REPORT_NOTE
from bso.models import DEFAULT_STATUS_FILE
from bso.summary import SECTIONS
from tests.conftest import EXAMPLE_PROJECT, REPO

pytestmark = pytest.mark.e2e

BSO = str(Path(sys.executable).parent / "bso")


@pytest.fixture(scope="module")
def cli_env(local_env, tmp_path_factory):
    """Environment for `bso` subprocesses, and a `bso worker` process serving the default queues."""
    address = local_env.client.service_client.config.target_host
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE=local_env.client.namespace)
    env.pop("COLUMNS", None)
    metrics_port = free_port()
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [BSO, "worker", "--metrics-port", str(metrics_port)], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        yield {"env": env, "metrics_port": metrics_port, "log": log, "address": address}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def bso(cli_env, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BSO, *args], env=cli_env["env"], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _project(tmp_path: Path, duration_ms: int) -> tuple[Path, Path]:
    import shutil

    project = tmp_path / "project"
    shutil.copytree(EXAMPLE_PROJECT, project, ignore=shutil.ignore_patterns(".sprint-session"))
    script = json.loads((EXAMPLE_PROJECT / "simulation.json").read_text())
    script["default"]["duration_ms"] = duration_ms
    for story in script["stories"].values():
        story.pop("duration_ms", None)
    sim = tmp_path / "simulation.json"
    sim.write_text(json.dumps(script))
    return project, sim


def _status(cli_env, sprint_id: str) -> dict:
    result = bso(cli_env, "sprint", "status", sprint_id, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_start_watch_status_list_report_messages(cli_env, tmp_path: Path):
    project, sim = _project(tmp_path, duration_ms=20)
    sprint_id = f"cli-{uuid.uuid4().hex[:6]}"

    started = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id)
    assert started.returncode == 0, started.stderr
    assert f"started sprint {sprint_id}" in started.stdout
    assert "agents:   simulated (the default: scripted answers, no real work" in started.stdout
    assert f"/namespaces/default/workflows/{sprint_id}" in started.stdout
    assert "temporal workflow start" in started.stdout and "--type SprintMasterWorkflow" in started.stdout

    watched = bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3")
    assert watched.returncode == 0, watched.stderr
    assert "overall" in watched.stdout and "5/5 stories" in watched.stdout
    assert "## Results Overview" in watched.stdout and "| status | sprint-partial |" in watched.stdout

    status = _status(cli_env, sprint_id)
    assert status["phase"] == "completed" and status["execution_status"] == "completed"
    assert status["from_report"] is False  # the worker answered the query
    assert status["outcome"] == "sprint-partial" and status["failure"] is None
    assert status["stories"]["2-2-expiry-reminder-emails"]["state"] == "needs-intervention"
    assert status["stories"]["1-3-add-and-list-items-api"]["fix_rounds"] == 2
    table = bso(cli_env, "sprint", "status", sprint_id)
    assert table.returncode == 0 and "1-2-pantry-item-model-and-storage" in table.stdout
    assert f"sprint {sprint_id}: completed (sprint-partial), batches ended 2/2" in table.stdout
    assert "2-2-expiry-reminder-emails: needs-intervention: " in table.stdout  # why, under the table
    # A completed sprint's id is its own: starting again under it would overwrite its summary.
    fresh, _ = _project(tmp_path / "fresh", duration_ms=20)
    again = bso(cli_env, "sprint", "start", str(fresh), "--simulation", str(sim), "--id", sprint_id)
    assert again.returncode == 1 and f"a sprint with id {sprint_id!r} is running or completed" in again.stderr

    listed = _wait_for(
        lambda: (r := bso(cli_env, "sprint", "list", "--session", sprint_id)).returncode == 0 and sprint_id in r.stdout and r,
        "the sprint in the visibility store",
    )
    assert "completed" in listed.stdout
    assert "sprint-partial" in listed.stdout  # the outcome: every sprint that ran to its end is "completed"

    # The execution summary file, and `bso sprint report` printing the same text.
    summary = project / ".sprint-session" / f"execution-summary-{sprint_id}.md"
    text = summary.read_text()
    for section in SECTIONS:
        assert f"\n## {section}\n" in text
    report = bso(cli_env, "sprint", "report", sprint_id)
    assert report.returncode == 0, report.stderr
    assert report.stdout == text

    # The message flow, filtered, as JSON lines and as per-agent files.
    jsonl = tmp_path / "messages.jsonl"
    msgs = bso(
        cli_env, "messages", sprint_id, "--story", "2-2", "--type", "TASK_ASSIGNMENT", "--type", "AGENT_COMPLETE",
        "--jsonl", str(jsonl), "--export",
    )  # fmt: skip
    assert msgs.returncode == 0, msgs.stderr
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records and {r["story"] for r in records} == {"2-2-expiry-reminder-emails"}
    assert {r["type"] for r in records} == {"TASK_ASSIGNMENT", "AGENT_COMPLETE"}
    assert any(r["type"] == "AGENT_COMPLETE" and r["payload"]["status"] == "failure" for r in records)
    exported = project / ".sprint-session" / "messages" / sprint_id  # the sprint's own folder
    files = sorted(str(p.relative_to(exported)) for p in exported.rglob("*.json"))
    assert "dev-runner/AGENT_COMPLETE_001.json" in files and "story-creator/TASK_ASSIGNMENT_001.json" in files
    assert len(files) == len(records)
    assert json.loads((exported / "dev-runner/AGENT_COMPLETE_001.json").read_text())["from"] == "dev-runner"
    # With --jsonl, one line of what was written, not the table.
    assert msgs.stdout.splitlines() == [
        f"wrote {len(records)} messages to {jsonl}", f"exported {len(records)} messages to {exported}"
    ], msgs.stdout
    # A second export into the same folder would renumber from 001 over the first: refused, nothing touched.
    line = _one_line_error(bso(cli_env, "messages", sprint_id, "--export"))
    assert f"{exported} already holds an export" in line, line
    assert sorted(str(p.relative_to(exported)) for p in exported.rglob("*.json")) == files
    everything = bso(cli_env, "messages", sprint_id, "--export-dir", str(tmp_path / "all"))
    assert everything.returncode == 0 and "SLAVE_BATCH_COMPLETE" in everything.stdout
    assert (tmp_path / "all/operator/SPRINT_START_001.json").exists()
    # A story or agent the sprint has not is a typo, as an unknown --type is: said so, with the known ones.
    line = _one_line_error(bso(cli_env, "messages", sprint_id, "--story", "9-9"))
    assert "--story '9-9'" in line and "1-2, 1-3, 2-1, 2-2, 2-2a" in line, line
    line = _one_line_error(bso(cli_env, "messages", sprint_id, "--agent", "dev-runnr"))
    assert "--agent 'dev-runnr'" in line and "dev-runner" in line, line

    # The worker's logs (JSON lines with the dispatch bound) and metrics.
    lines = [json.loads(line) for line in cli_env["log"].read_text().splitlines() if line.startswith("{")]
    assert any(
        r.get("session") == sprint_id and r.get("agent") == "dev-runner" and r.get("dispatch_id") for r in lines
    )
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{cli_env['metrics_port']}/metrics", timeout=10).read().decode()
    assert 'bso_stories_finished{final_state="needs-intervention"' in metrics
    assert "bso_agent_dispatches{" in metrics and "bso_tokens_used{" in metrics


def test_operator_actions(cli_env, tmp_path: Path):
    project, sim = _project(tmp_path, duration_ms=400)
    sprint_id = f"ops-{uuid.uuid4().hex[:6]}"
    started = bso(
        cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id, "--set", "batch_size=1"
    )
    assert started.returncode == 0, started.stderr

    line = _one_line_error(bso(cli_env, "sprint", "resume", sprint_id))  # (it said "resume requested")
    assert f"sprint {sprint_id} is not paused (" in line and "nothing to resume" in line, line
    paused = bso(cli_env, "sprint", "pause", sprint_id, "--reason", "lunch")
    assert paused.returncode == 0 and paused.stdout.strip() == f"pause requested for sprint {sprint_id}"
    _wait_for(lambda: _status(cli_env, sprint_id)["pause_reason"] == "lunch", "the pause")
    # One sprint at a time on a project: a second one would drive the same stories and status file.
    second = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim))
    assert second.returncode == 1 and f"sprint {sprint_id} is already running on {project.resolve()}" in second.stderr

    # A lower budget was said to be applied, and ignored (the sprint only raises it): refused, nothing sent.
    line = _one_line_error(bso(cli_env, "sprint", "resume", sprint_id, "--token-limit", "1000"))
    assert f"--token-limit 1,000 does not raise sprint {sprint_id}'s token budget (" in line, line
    assert _status(cli_env, sprint_id)["pause_reason"] == "lunch"
    resumed = bso(cli_env, "sprint", "resume", sprint_id, "--token-limit", "5000000")
    assert resumed.returncode == 0, resumed.stderr
    status = _wait_for(
        lambda: (s := _status(cli_env, sprint_id))["pause_reason"] is None and s["token_limit"] == 5_000_000 and s,
        "the resume",
    )
    assert status["phase"] in ("running", "completed")

    shutdown = bso(cli_env, "sprint", "shutdown", sprint_id)
    assert shutdown.returncode == 0, shutdown.stderr
    watched = bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3")
    assert watched.returncode == 0, watched.stderr
    assert "| status | sprint-partial |" in watched.stdout  # stopped before all five stories

    again = bso(cli_env, "sprint", "pause", sprint_id)
    assert again.returncode == 1 and again.stderr.strip() == f"bso: error: sprint {sprint_id} is completed, not running"

    victim = f"cancel-{uuid.uuid4().hex[:6]}"
    # A project of its own: the shut-down sprint may have ended every story of the first one (a slow machine
    # reaches the shutdown late), and a sprint with nothing to run is refused.
    (tmp_path / "victim").mkdir()
    project, sim = _project(tmp_path / "victim", duration_ms=400)
    victim_started = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", victim)
    assert victim_started.returncode == 0, victim_started.stderr
    cancelled = bso(cli_env, "sprint", "cancel", victim, "--reason", "wrong branch")
    assert cancelled.returncode == 0, cancelled.stderr
    _wait_for(lambda: _status_name(cli_env, victim) == "canceled", "the cancellation")
    spelled = bso(cli_env, "sprint", "list", "--session", victim, "--status", "cancelled")  # as BSO's texts spell it
    assert spelled.returncode == 0 and victim in spelled.stdout, spelled.stderr
    assert "sprint-cancelled" in spelled.stdout, spelled.stdout
    ended = bso(cli_env, "sprint", "watch", victim)  # ends with the cancelled sprint's summary (it had none)
    assert ended.returncode == 0 and "| status | sprint-cancelled |" in ended.stdout, (ended.stdout, ended.stderr)
    assert "- sprint: sprint cancelled: wrong branch" in ended.stdout, ended.stdout
    report = bso(cli_env, "sprint", "report", victim)
    assert report.returncode == 0 and "| status | sprint-cancelled |" in report.stdout, (report.stdout, report.stderr)
    after = _status(cli_env, victim)
    assert after["phase"] == "canceled" and after["execution_status"] == "canceled", after
    assert "cancel" in after["failure"].lower() and after["outcome"] is None, after
    assert "sprint cancelled: wrong branch" in after["errors"], after
    table = bso(cli_env, "sprint", "status", victim)
    assert "error: sprint cancelled: wrong branch" in table.stdout and "canceled: " not in table.stdout, table.stdout


def _status_name(cli_env, sprint_id: str) -> str:
    listed = bso(cli_env, "sprint", "list", "--session", sprint_id, "--status", "canceled")
    return "canceled" if sprint_id in listed.stdout else ""


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("bso: error: ")
    return lines[0]


def test_error_paths(cli_env, tmp_path: Path):
    closed = free_port()
    line = _one_line_error(bso(cli_env, "--address", f"127.0.0.1:{closed}", "sprint", "status", "x"))
    assert f"cannot reach the Temporal server at 127.0.0.1:{closed}" in line
    tls = {**cli_env, "env": {**cli_env["env"], "TEMPORAL_TLS": "true"}}  # the dev server speaks no TLS
    line = _one_line_error(bso(tls, "sprint", "list"))
    assert "it answered, but not as the TLS / API key settings expect" in line, line
    line = _one_line_error(bso(cli_env, "sprint", "status", "x", "--address", f"127.0.0.1:{closed}"))
    assert "--address goes before the command: `bso --address VALUE sprint status ...`" in line, line
    env_only = {**cli_env, "env": {**cli_env["env"], "TEMPORAL_ADDRESS": f"127.0.0.1:{closed}"}}
    _one_line_error(bso(env_only, "sprint", "list"))
    # The worker waits for a server (BSO_WORKER_CONNECT_SECONDS), then says so in one line: `python -m
    # workers.main` (`make worker`) ended in a traceback.
    impatient = {**env_only, "env": {**env_only["env"], "BSO_WORKER_CONNECT_SECONDS": "1"}}
    waited = bso(impatient, "worker")  # its log says it waits, the last line why it gave up
    assert waited.returncode == 1 and "Traceback" not in waited.stderr, waited.stderr
    line = waited.stderr.splitlines()[-1]
    assert line.startswith(f"bso: error: cannot reach the Temporal server at 127.0.0.1:{closed} (namespace default) after 1 s")
    alone = subprocess.run(
        [sys.executable, "-m", "workers.main"], env=impatient["env"], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert alone.returncode == 1 and "Traceback" not in alone.stderr, alone.stderr
    assert alone.stderr.splitlines()[-1] == line.replace("bso: error: ", "worker: error: "), alone.stderr

    line = _one_line_error(bso(cli_env, "sprint", "status", "no-such-sprint"))
    assert "no sprint with id 'no-such-sprint'" in line
    line = _one_line_error(bso(cli_env, "--namespace", "no-such-namespace", "sprint", "status", "op1"))
    assert f"namespace 'no-such-namespace' does not exist on {cli_env['address']}" in line, line
    _one_line_error(bso(cli_env, "messages", "no-such-sprint"))
    _one_line_error(bso(cli_env, "sprint", "report", "no-such-sprint"))

    project, _ = _project(tmp_path, duration_ms=0)
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--set", "batch_size=zero"))
    assert "batch_size" in line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--set", "no_such_knob=1"))
    assert "no_such_knob" in line
    _one_line_error(bso(cli_env, "sprint", "start", str(project), "--set", "missing-equals"))
    _one_line_error(bso(cli_env, "sprint", "start", str(tmp_path / "nowhere")))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(tmp_path)))  # a directory without BMAD files
    assert "no sprint status file" in line
    _one_line_error(bso(cli_env, "sprint", "start", str(project), "--backend", "carrier-pigeon"))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--task-queue", ""))  # was the server's words
    assert "--task-queue '': a task queue name" in line, line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--epic", "7"))
    assert "unknown epic '7'" in line and "epic-1, epic-2" in line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--story", "9-9"))
    assert "unknown story key '9-9'" in line
    _one_line_error(bso(cli_env, "sprint", "start", str(project), "--no-such-option"))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--id", "zz/resident-debugger"))
    assert "is the id sprint 'zz' gives its resident workflow" in line, line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--id", "s" * 101))
    assert "sprint id of 101 characters: at most 100" in line, line
    greedy = tmp_path / "greedy.json"
    greedy.write_text(json.dumps({"default": {"tokens": 10**30}}))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--simulation", str(greedy)))
    assert line.endswith("greedy.json: tokens of default: at most 1,000,000,000 (no agent run uses more)"), line
    lax = tmp_path / "lax.json"  # `true` was read as 1 token, "5" as 5 ms
    lax.write_text(json.dumps({"default": {"tokens": True}, "stories": {"1-1": {"duration_ms": "5"}}}))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--simulation", str(lax)))
    assert line.endswith("lax.json: default.tokens: Input should be a valid integer; "
                         "stories.1-1.duration_ms: Input should be a valid integer"), line
    huge = tmp_path / "huge.json"  # its copies made the sprint continue as new for ever before its first batch
    huge.write_text(json.dumps({"stories": {"1-1": {"blocking": ["x" * 1000] * 300}}}))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--simulation", str(huge)))
    assert "huge.json: 301,227 bytes, over the 256,000 a script may take" in line, line
    # A story the script or a knob names that the file does not have: a typo, which would be ignored silently.
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"stories": {"1-2": {"duration_ms": 5}, "9-9": {"fail": {"dev": "error"}}}}))
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--simulation", str(typo)))
    assert f"--simulation {typo}: unknown story key '9-9'" in line, line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--set", 'story_priorities={"7-1": "high"}'))
    assert "story_priorities: unknown story key '7-1'" in line, line
    settled = tmp_path / "settled"  # every story done or needs-intervention: nothing a sprint would run
    settled_status = settled / DEFAULT_STATUS_FILE
    settled_status.parent.mkdir(parents=True)
    settled_status.write_text(
        "development_status:\n  epic-1: in-progress\n  1-1-a: done\n  1-2-b: needs-intervention\n", encoding="utf-8"
    )
    line = _one_line_error(bso(cli_env, "sprint", "start", str(settled)))
    assert "nothing to run" in line and "set its state in the status file back" in line
    # Stories that depend on each other (their story files' Depends on: lines): refused before the sprint starts.
    cyclic = tmp_path / "cyclic"
    stories_dir = cyclic / "_bmad-output" / "implementation-artifacts"
    stories_dir.mkdir(parents=True)
    (stories_dir / "sprint-status.yaml").write_text(
        "development_status:\n  epic-1: in-progress\n  1-1-a: ready-for-dev\n  1-2-b: ready-for-dev\n", encoding="utf-8"
    )
    (stories_dir / "1-1-a.md").write_text("# Story 1.1\n\nDepends on: 1-2\n", encoding="utf-8")
    (stories_dir / "1-2-b.md").write_text("# Story 1.2\n\nDepends on: 1-1\n", encoding="utf-8")
    line = _one_line_error(bso(cli_env, "sprint", "start", str(cyclic)))
    assert "dependency cycle among stories: 1-1-a, 1-2-b" in line and "Depends on:" in line, line
    # Another project's status file (with nothing to run in it): refused for where it is, as the sprint refuses it.
    outside = str(settled_status.resolve())
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--status-file", outside))
    assert "status file is outside the project root" in line, line
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--status-file", "../settled/x.yaml"))
    assert "path escapes the project" in line, line
    settled_status.write_text(settled_status.read_text(encoding="utf-8") + "  1-3-c: wip\n", encoding="utf-8")
    line = _one_line_error(bso(cli_env, "sprint", "start", str(settled)))  # the sprint would overwrite `wip`
    assert "no agent starts from the state of 1-3-c: 'wip'" in line and "ready-for-dev" in line, line
    assert "1-3-c: wip" in settled_status.read_text(encoding="utf-8")
    _one_line_error(bso(cli_env, "messages", "x", "--type", "NOT_A_TYPE"))
    # command backend: a reviewer profile that would resume a session (P30) is refused before any agent works
    # (it was found at the story's first review, the dev work done), as is an agents file that does not parse.
    agents = project / ".bso" / "agents.toml"
    agents.parent.mkdir(exist_ok=True)
    agents.write_text(
        '[profiles.resumer]\nargv = ["claude", "--resume", "-p"]\n[agents.review-runner]\nprofile = "resumer"\n',
        encoding="utf-8",
    )
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--backend", "command", "--story", "1-2"))
    assert "profile 'resumer' for review-runner: '--resume' would resume" in line, line
    assert "fix the agents file, then start the sprint" in line, line
    agents.write_text("[profiles.broken\n", encoding="utf-8")
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--backend", "command", "--story", "1-2"))
    assert "agents.toml" in line and "fix it, then start the sprint" in line, line
    agents.unlink()
    # ... and a project that is no repository the command backend can work in (its story's first agents ran)
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--backend", "command", "--story", "1-2"))
    assert "is not a git repository" in line and "before any agent runs" in line, line
    broken_status = project / DEFAULT_STATUS_FILE  # refused before anything starts, with the file's line
    broken_status.write_text(broken_status.read_text(encoding="utf-8") + "  9-9-half-typed: [unclosed\n", encoding="utf-8")
    line = _one_line_error(bso(cli_env, "sprint", "start", str(project), "--story", "1-2"))
    assert "sprint-status.yaml: line" in line and "fix the file, then start the sprint" in line, line


def test_status_of_a_sprint_that_failed_at_its_start(cli_env, tmp_path: Path):
    """Started by hand with the temporal CLI and a bad input, the sprint fails at once: `bso sprint status`
    says why in one line (not a query error, not an empty table), and watch ends with the same reason."""
    temporal = str(Path(sys.executable).parent / "temporal")
    starts = {
        "no input": ([], "needs its input, a SprintInput JSON object"),
        "relative root": (["--input", '{"project_root": "shelfwise"}'], "is relative: give the absolute path"),
        "wrong type": (["--input", '{"project_root": "/tmp", "simulation": [1]}'], "simulation: Input should be a"),
    }
    for what, (extra, expected) in starts.items():
        sprint_id = f"bad-start-{uuid.uuid4().hex[:6]}"
        command = [temporal, "workflow", "start", "--address", cli_env["address"], "--type", "SprintMasterWorkflow"]
        command += ["--task-queue", "bso-sprint", "--workflow-id", sprint_id, *extra]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        line = _wait_for(
            lambda: "is failed" in (r := bso(cli_env, "sprint", "status", sprint_id)).stderr and r.stderr, "the failure"
        )
        assert line.strip() == line.strip().splitlines()[0], line
        assert f"sprint {sprint_id} is failed: " in line and expected in line, (what, line)
        watched = _one_line_error(bso(cli_env, "sprint", "watch", sprint_id))
        assert "did not complete" in watched and expected in watched, (what, watched)
    listed = _wait_for(  # its outcome column (it was blank, though the README promised -failed)
        lambda: (r := bso(cli_env, "sprint", "list", "--status", "failed")).returncode == 0 and sprint_id in r.stdout and r,
        "the failed sprint in the visibility store",
    )
    row = next(line for line in listed.stdout.splitlines() if sprint_id in line)
    assert "sprint-failed" in row, listed.stdout
    # The worker's log stays JSON lines: the SDK's never-awaited run coroutine of a refused start left a
    # Python warning in it, and the SDK core's own warnings were coloured text.
    for line in cli_env["log"].read_text().splitlines():
        assert isinstance(json.loads(line), dict), line


def _prefixed_worker(cli_env, tmp_path: Path, prefix: str, n: int) -> subprocess.Popen[bytes]:
    """A `bso worker` of its own queues (`prefix`), its log in worker-<n>.log."""
    with (tmp_path / f"worker-{n}.log").open("w") as fh:
        return subprocess.Popen(
            [BSO, "worker", "--queue-prefix", prefix], cwd=REPO, env=cli_env["env"], stdout=fh, stderr=subprocess.STDOUT
        )


def test_watch_survives_a_worker_restart(cli_env, tmp_path: Path):
    """Its own worker on its own queues: while it is down, watch notes that it waits, then goes on."""
    prefix = f"t-{uuid.uuid4().hex[:6]}-"
    # ~25 agents of 400 ms: the sprint outlasts the few seconds the polls below take on a busy machine.
    project, sim = _project(tmp_path, duration_ms=400)
    sprint_id = f"restart-{uuid.uuid4().hex[:6]}"

    worker = _prefixed_worker(cli_env, tmp_path, prefix, 1)
    watch = None
    try:
        # The worker names the queues it really polls, prefix and all.
        _wait_for(lambda: "worker polling" in (tmp_path / "worker-1.log").read_text(), "the worker to start")
        assert f"worker polling {prefix}bso-sprint, {prefix}bso-agents on " in (tmp_path / "worker-1.log").read_text()
        started = bso(
            cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id,
            "--task-queue", f"{prefix}bso-sprint",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        with (tmp_path / "watch.out").open("w") as out, (tmp_path / "watch.err").open("w") as err:
            watch = subprocess.Popen(
                [BSO, "sprint", "watch", sprint_id, "--interval", "0.3"], cwd=REPO, env=cli_env["env"],
                stdout=out, stderr=err,
            )  # fmt: skip
        _wait_for(
            lambda: any(s["agents_dispatched"] for s in _status(cli_env, sprint_id)["stories"].values()),
            "the first dispatch",
        )
        worker.terminate()
        worker.wait(timeout=30)
        _wait_for(
            lambda: "no worker answered the status query" in (tmp_path / "watch.err").read_text(),
            "watch to notice that no worker answers",
            timeout=90,
        )
        assert watch.poll() is None  # still waiting
        worker = _prefixed_worker(cli_env, tmp_path, prefix, 2)
        assert watch.wait(timeout=240) == 0, (tmp_path / "watch.err").read_text()
    finally:
        for proc in (worker, watch):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    assert "## Results Overview" in (tmp_path / "watch.out").read_text()
    assert "Traceback" not in (tmp_path / "watch.err").read_text()

    # Closed, and no worker left to replay it for the query: status shows its report, says so, and leaves out
    # the review rounds the report lacks (tests/unit/test_cli_commands.py: after a short wait).
    closed = bso(cli_env, "sprint", "status", sprint_id)
    assert closed.returncode == 0, closed.stderr
    assert f"sprint {sprint_id}: completed (sprint-partial)" in closed.stdout
    assert FROM_REPORT_NOTE in " ".join(closed.stdout.split()), closed.stdout
    (header,) = [line for line in closed.stdout.splitlines() if line.startswith("story ")]
    assert header.split() == ["story", "batch", "state", "fixes", "in", "flight", "agents", "tokens"], header
    shown = _status(cli_env, sprint_id)
    assert shown["from_report"] is True and shown["outcome"] == "sprint-partial"
    assert shown["stories"]["2-2-expiry-reminder-emails"]["state"] == "needs-intervention"


def test_status_says_when_an_agents_worker_went_silent(cli_env, tmp_path: Path):
    """The worker is killed (kill -9) with an agent in flight and started again at once: the agent stays in flight,
    its dead worker's, until its heartbeat timeout runs out, and the status showed it as if all were well (a minute
    that looked like a hang). It says the worker went silent and when the agent starts again, until it has."""
    from tests.workflow.helpers import make_project

    prefix = f"t-{uuid.uuid4().hex[:6]}-"
    key = "1-1-login-form"
    make_project(tmp_path, {key: "review"})
    sim = tmp_path / "simulation.json"
    sim.write_text(json.dumps({"default": {"duration_ms": 8000}}))
    sprint_id = f"silent-{uuid.uuid4().hex[:6]}"

    worker = _prefixed_worker(cli_env, tmp_path, prefix, 1)
    try:
        _wait_for(lambda: "worker polling" in (tmp_path / "worker-1.log").read_text(), "the worker to start")
        started = bso(
            cli_env, "sprint", "start", str(tmp_path), "--simulation", str(sim), "--id", sprint_id,
            "--task-queue", f"{prefix}bso-sprint", "--set", "agent_retry.heartbeat_timeout_seconds=20",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        dispatched = _wait_for(lambda: _status(cli_env, sprint_id)["stories"][key]["dispatch_id"], "the agent in flight")
        worker.kill()  # kill -9: no word to the server
        worker.wait(timeout=30)
        worker = _prefixed_worker(cli_env, tmp_path, prefix, 2)
        _wait_for(lambda: "worker polling" in (tmp_path / "worker-2.log").read_text(), "the new worker to start")

        def silent_worker():  # (a query may still meet the dead worker's sticky queue, and time out)
            answered = bso(cli_env, "sprint", "status", sprint_id, "--json")
            return json.loads(answered.stdout)["silent_worker"] if answered.returncode == 0 else None

        silent = _wait_for(silent_worker, "the silent worker noticed", timeout=60)
        assert (silent["activity_id"], silent["heartbeat_timeout_seconds"]) == (dispatched, 20), silent
        assert 10 <= silent["silent_seconds"] < 30, silent
        shown = " ".join(bso(cli_env, "sprint", "status", sprint_id).stdout.split())
        assert f"agent {dispatched}: no heartbeat from its worker for " in shown, shown
        assert "a live worker starts it again once its heartbeat timeout (20 s) runs out, in ~" in shown, shown
        _wait_for(lambda: _status(cli_env, sprint_id)["phase"] == "completed", "the sprint to complete", timeout=120)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_course_correction_and_human_decision_commands(cli_env, tmp_path: Path):
    project, sim = _project(tmp_path, duration_ms=300)
    script = json.loads(sim.read_text())
    # 1-2's story doc never passes its review: with ask_user it waits for a human decision.
    script["stories"]["1-2"] = {"story_review": ["needs-improve"] * 5}
    sim.write_text(json.dumps(script))
    sprint_id = f"cc-{uuid.uuid4().hex[:6]}"
    started = bso(
        cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id, "--set", "batch_size=1"
    )
    assert started.returncode == 0, started.stderr

    rejected = bso(cli_env, "sprint", "cc", sprint_id, "--drop", "9-9-no-such-story")
    assert rejected.returncode == 1
    assert rejected.stderr.count("\n") == 1 and "CC_REJECTED" in rejected.stderr and "9-9" in rejected.stderr

    dropped = bso(cli_env, "sprint", "cc", sprint_id, "--drop", "2-2", "--text", "reminders move to next sprint")
    assert dropped.returncode == 0, dropped.stderr
    correction = json.loads(dropped.stdout.split("\ncourse correction applied")[0])
    assert correction["msg_type"] == "COURSE_CORRECTION"
    assert correction["dropped"] == ["2-2-expiry-reminder-emails"]

    waiting = _wait_for(
        lambda: (s := _status(cli_env, sprint_id))["stories"]["1-2-pantry-item-model-and-storage"]["awaiting_decision"]
        and s,
        "the story-review decision",
        timeout=120,
    )
    assert waiting["stories"]["1-2-pantry-item-model-and-storage"]["state"] == "story-doc-review"
    shown = bso(cli_env, "sprint", "status", sprint_id).stdout  # the text says so too, with what to run
    assert "waiting for your decision: 1-2-pantry-item-model-and-storage: " in shown, shown
    assert f"bso sprint decide {sprint_id} 1-2-pantry-item-model-and-storage force_pass|skip_story|retry" in shown, shown
    wrong = bso(cli_env, "sprint", "decide", sprint_id, "1-3", "force_pass")
    # 1-3 waits for no decision: the update's validator refuses it, in one line.
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1 and "1-3" in wrong.stderr
    decided = bso(cli_env, "sprint", "decide", sprint_id, "1-2", "force_pass")
    assert decided.returncode == 0, decided.stderr

    watched = bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3")
    assert watched.returncode == 0, watched.stderr
    final = _status(cli_env, sprint_id)["stories"]
    assert final["1-2-pantry-item-model-and-storage"]["state"] == "done"
    assert final["2-2-expiry-reminder-emails"]["state"] == "skipped"
    # Why 2-2 was skipped, with the note given with the correction: in the status, the report and the messages.
    why = "dropped by course correction (user_request): reminders move to next sprint"
    assert final["2-2-expiry-reminder-emails"]["error"] == why
    assert f"- `2-2-expiry-reminder-emails`: skipped: {why}" in bso(cli_env, "sprint", "report", sprint_id).stdout
    jsonl = tmp_path / "cc.jsonl"
    listed = bso(cli_env, "messages", sprint_id, "--type", "CC_TRIGGER", "--type", "COURSE_CORRECTION", "--jsonl", str(jsonl))
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["type"], r["from"], r["to"]) for r in records] == [
        ("CC_TRIGGER", "operator", "sprint-master"), ("COURSE_CORRECTION", "sprint-master", "operator")
    ]
    assert records[0]["detail"] == "user_request (drop 2-2): reminders move to next sprint"


def test_an_update_without_a_worker_says_what_it_waits_for(cli_env, tmp_path: Path):
    """`bso sprint decide` / `cc` wait for a worker to take the update: without one, they said nothing at all.
    They say it once, keep waiting, and end when a worker comes."""
    prefix = f"t-{uuid.uuid4().hex[:6]}-"
    project, sim = _project(tmp_path, duration_ms=20)
    sprint_id = f"noworker-{uuid.uuid4().hex[:6]}"
    started = bso(
        cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id,
        "--task-queue", f"{prefix}bso-sprint",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    err = tmp_path / "decide.err"
    with err.open("w") as fh:
        decide = subprocess.Popen(
            [BSO, "sprint", "decide", sprint_id, "1-2", "force_pass"], cwd=REPO, env=cli_env["env"],
            stdout=subprocess.PIPE, stderr=fh, text=True,
        )  # fmt: skip
    worker = None
    try:
        _wait_for(lambda: "waiting for a worker" in err.read_text(), "the note", timeout=30)
        assert err.read_text() == (
            f"waiting for a worker to take the update (no worker polls {prefix}bso-sprint? start one with "
            f"`bso --address {cli_env['address']} worker --queue-prefix {prefix}`) ...\n"
        )
        assert decide.poll() is None  # still waiting
        with (tmp_path / "worker.log").open("w") as fh:
            worker = subprocess.Popen(
                [BSO, "worker", "--queue-prefix", prefix], cwd=REPO, env=cli_env["env"], stdout=fh,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        decide.wait(timeout=120)  # the worker takes it: 1-2 waits for no decision, so the validator refuses it
        assert decide.returncode == 1 and "1-2" in err.read_text().splitlines()[-1], err.read_text()
    finally:
        if worker is not None:
            bso(cli_env, "sprint", "cancel", sprint_id)  # unless it has finished already
        for proc in (decide, worker):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)



def _terminate(cli_env, sprint_id: str) -> None:
    """A sprint no worker will ever take (its queue mistyped) ends only by termination."""
    from tests.conftest import _binary

    env = cli_env["env"]
    subprocess.run(
        [_binary("temporal"), "workflow", "terminate", "--address", env["TEMPORAL_ADDRESS"],
         "--namespace", env["TEMPORAL_NAMESPACE"], "--workflow-id", sprint_id],
        capture_output=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("mistyped", [True, False], ids=["mistyped-queue", "no-worker-yet"])
def test_start_on_a_queue_no_worker_polls_says_so(cli_env, tmp_path: Path, mistyped: bool):
    """`bso sprint start --task-queue` with a typo (or before any worker of the queue runs) said `started` and
    nothing else: the sprint waited for a worker that never came, unseen until `bso sprint status`. It still
    starts (a worker may come later), and one line on stderr names the queue and the worker it waits for."""
    prefix = f"t-{uuid.uuid4().hex[:6]}-"
    queue = f"{prefix}bso-sprnt" if mistyped else f"{prefix}bso-sprint"
    project, sim = _project(tmp_path, duration_ms=20)
    sprint_id = f"lonely-{uuid.uuid4().hex[:6]}"
    started = bso(
        cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id, "--task-queue", queue,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        assert f"started sprint {sprint_id}" in started.stdout
        said = f"bso: warning: no worker polls task queue {queue}: sprint {sprint_id} waits until one does"
        assert started.stderr.startswith(said) and started.stderr.count("\n") == 1, started.stderr
        if mistyped:
            hint = f"its task queue {queue} is not a sprint queue of any `bso worker`"
            assert hint in started.stderr and "a mistyped --task-queue?" in started.stderr
            assert f"temporal workflow terminate --address {cli_env['address']}" in started.stderr, started.stderr
            assert f"--workflow-id {sprint_id}` and start it again" in started.stderr, started.stderr
            # No worker has set its session attribute: `--session` found nothing, though `list` showed it.
            _wait_for(
                lambda: sprint_id in bso(cli_env, "sprint", "list", "--session", sprint_id).stdout,
                "the sprint no worker took up, listed by its session",
            )
            # It holds the project: the refusal said to shut it down, which a worker would have to carry out.
            again = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", f"{sprint_id}-2")
            said_again = " ".join(again.stderr.split())
            assert again.returncode == 1, again.stdout
            assert f"sprint {sprint_id} is already running on" in said_again, said_again
            assert f"no worker polls its task queue {queue}" in said_again, said_again
            terminate = f"`temporal workflow terminate --address {cli_env['address']} --workflow-id {sprint_id}`"
            assert terminate in said_again, said_again
        else:
            # The worker of that server: it is not the default one here.
            hint = f"start one with `bso --address {cli_env['address']} worker --queue-prefix {prefix}`"
            assert started.stderr == f"{said}; {hint}\n"
        # `bso sprint status` said "start one with `bso worker`" even with a worker running, on another queue.
        status = bso(cli_env, "sprint", "status", sprint_id)
        assert f"no worker answered the status query ({hint}" in " ".join(status.stderr.split()), status.stderr
    finally:
        _terminate(cli_env, sprint_id)
        _terminate(cli_env, f"{sprint_id}-2")  # (started only if the refusal above failed)


def test_start_on_a_queue_a_worker_polls_says_nothing_more(cli_env, tmp_path: Path):
    prefix = f"t-{uuid.uuid4().hex[:6]}-"
    project, sim = _project(tmp_path, duration_ms=20)
    sprint_id = f"served-{uuid.uuid4().hex[:6]}"
    with (tmp_path / "worker.log").open("w") as fh:
        worker = subprocess.Popen(
            [BSO, "worker", "--queue-prefix", prefix], cwd=REPO, env=cli_env["env"], stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(lambda: "worker polling" in (tmp_path / "worker.log").read_text(), "the worker to start")
        started = bso(
            cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id,
            "--task-queue", f"{prefix}bso-sprint",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert f"started sprint {sprint_id}" in started.stdout
        assert started.stderr == ""
        assert bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3").returncode == 0
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_the_printed_temporal_start_refuses_a_running_or_completed_sprint_id(cli_env, tmp_path: Path):
    """`bso sprint start` prints the equivalent `temporal workflow start` (the README's commands are the same),
    said to refuse a sprint id that runs or has completed. Without `--fail-existing` the temporal CLI refused
    neither: on a running sprint's id it printed that run under "Running execution" and exited 0, the second
    project never started, and the user was told nothing."""
    project, sim = _project(tmp_path, duration_ms=300)
    sprint_id = f"twice-{uuid.uuid4().hex[:6]}"
    started = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id)
    assert started.returncode == 0, started.stderr
    printed = next(line for line in started.stdout.splitlines() if line.strip().startswith("temporal: "))
    argv = shlex.split(printed.strip().removeprefix("temporal: "))
    assert argv[:3] == ["temporal", "workflow", "start"], argv
    other, _ = _project(tmp_path / "other", duration_ms=20)
    argv[argv.index("--input") + 1] = json.dumps({"project_root": str(other)})
    temporal = [str(Path(sys.executable).parent / "temporal"), *argv[1:]]

    while_running = subprocess.run(temporal, env=cli_env["env"], capture_output=True, text=True, timeout=60)
    assert while_running.returncode != 0, while_running.stdout
    assert "already running" in while_running.stderr, while_running.stderr
    assert bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3").returncode == 0
    completed = subprocess.run(temporal, env=cli_env["env"], capture_output=True, text=True, timeout=60)
    assert completed.returncode != 0, completed.stdout
    assert "already finished" in completed.stderr, completed.stderr
    assert not (other / ".sprint-session").exists()  # the other project was never touched


def test_a_batch_paused_by_itself_is_shown_and_resumed(cli_env, tmp_path: Path):
    """A pause sent to a batch's Slave itself (`temporal workflow signal --workflow-id ID/batch-1 --name pause`,
    which the Slave takes) stopped the sprint unseen: its status said `running`, nothing in flight, no word of
    the pause, and `bso sprint resume` refused, `not paused (running): nothing to resume`."""
    project, sim = _project(tmp_path, duration_ms=300)
    sprint_id = f"batch-paused-{uuid.uuid4().hex[:6]}"
    started = bso(cli_env, "sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id)
    assert started.returncode == 0, started.stderr
    _wait_for(lambda: _status(cli_env, sprint_id)["running_batches"] == [1], "batch 1 to run")
    temporal = str(Path(sys.executable).parent / "temporal")
    subprocess.run(
        [temporal, "workflow", "signal", "--workflow-id", f"{sprint_id}/batch-1", "--name", "pause", "--input", '"by hand"'],
        env=cli_env["env"], check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    shown = _wait_for(
        lambda: "is paused" in (r := bso(cli_env, "sprint", "status", sprint_id)).stdout and r.stdout, "the pause shown"
    )
    assert f"batch 1 is paused (a pause sent to {sprint_id}/batch-1 itself)" in shown, shown
    assert _status(cli_env, sprint_id)["paused_batches"] == [f"{sprint_id}/batch-1"]
    resumed = bso(cli_env, "sprint", "resume", sprint_id)
    assert resumed.returncode == 0, resumed.stderr
    watched = bso(cli_env, "sprint", "watch", sprint_id, "--interval", "0.3")
    assert watched.returncode == 0 and "| status | sprint-partial |" in watched.stdout, watched.stdout[-2000:]
