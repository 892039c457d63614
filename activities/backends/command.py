"""The `command` backend: a real coding-agent CLI (Claude Code, Codex, Gemini, Aider, OpenCode, any
command) run as a child process of the agent activity, in the story's git worktree.

- The profile (bso.agent_profiles) gives the argv (no shell), how the prompt is passed, env, workdir, timeout.
- The process runs in its own process group, under a launcher (activities/agent_launcher.py) that writes its
  transcript and records its exit (`exit.json`) itself; the activity heartbeats (elapsed, last output line),
  enforces the timeout itself and kills the whole group on timeout, cancellation or worker shutdown.
- AGENT_COMPLETE is read from `$BSO_RESULT_FILE`, else from the CLI's final JSON output; token use from
  the CLI's JSON. After a dev-runner: the Git Exit Gate, the scope guard and BSO's own verification.
- Prompt, command (env redacted), stdout/stderr and the result go to `.sprint-session/agents/<dispatch>/`;
  the AGENT_COMPLETE (history) carries only a short summary, the transcript's path and its hash.
- Idempotency: a marker (dispatch id, workflow run, commit) in the worktree's git dir; a retried activity
  whose agent already finished (and whose commit is still the worktree's HEAD) reports the recorded answer.
  An agent that exited after its worker died, or before (BSO was still checking its work), is never run
  again: the launcher's `exit.json` records the exit, and the retry only checks the work again. One still
  running (its worker was killed hard) is adopted: the retry waits for it, heartbeating and holding it to its
  timeout. One killed with its launcher after it wrote its whole answer (the worker killed with all its
  children while the CLI lingered) is taken as exited: its answer stands, the retry only checks its work. Only
  an agent that died unfinished (no answer, or one cut short) runs again (the earlier transcript kept under
  `previous/<n>/`).
  Marker and `exit.json` belong to their workflow run: a sprint started again under its id runs its agents.
  The activity heartbeats through the fix snapshot and the checks too.
- A failed verification is an AGENT_COMPLETE failure with error_type `verification_failed`
  (bso.dispatch routes it to the debugger, then a fix with the output among its findings).
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import po_command
from activities.po_command import heartbeat_detail
from activities.agent_config import config_error, load_agents_file, load_templates
from activities.agent_launcher import CANCELLED_FILE, StreamRedactor, group_mark, marked_pids
from activities.git_ops import (
    StoryFileMoved,
    Worktree,
    back_on_story_branch,
    checkout_work_since,
    committed_paths,
    ensure_worktree,
    exit_gate,
    git,
    git_dir,
    head,
    move_story_file_out,
    put_story_text_back,
    remove_stale_locks,
    set_aside_what_a_reader_left,
    status_file_in_project,
    undo_interrupted_checks,
    undo_status_file_change,
    unmerged_commits,
    verify,
)
from activities.process import group_alive, has_procfs, heartbeating, kill_group, kill_group_now, machine_id
from activities.session_files import (
    SESSION_DIR,
    UnreadableResultFile,
    file_written_at,
    read_result_file,
    safe_name,
    session_path,
    write_json_atomic,
)
from activities.status_file import set_back_story_value, story_value_now
from bso.agent_output import (
    TEXT_TAIL_CHARS,
    CliOutput,
    cli_output,
    lenient_answer,
    line_documents,
    prompt_examples,
    read_cli_output,
)
from bso.agent_progress import progress_update
from bso.agent_profiles import (
    AgentProfileError,
    AgentsFile,
    ResolvedProfile,
    dispatch_session_id,
    env_secret_forms,
    is_secret_env_key,
    redact_env,
    redact_text,
    redact_values,
    render_argv,
    resolve_profile,
)
from bso.config import ConfigError, SprintConfig, resolve_config
from bso.constants import of_sprint
from bso.dispatch import VERIFICATION_FAILED, StopAgentsInput, written_by_this_run
from bso.git_rules import (
    GitRuleError,
    check_ref_part,
    count_passed,
    out_of_scope,
    parse_acceptance_criteria,
    parse_file_scope,
)
from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS, MAX_TOKENS_PER_ANSWER, AgentComplete, Finding, TaskAssignment, describe_validation_error
from bso.po_agent import is_po_answer
from bso.prompting import PromptContext, render_prompt
from bso.sprint_status import resolve_inside
from bso.states import BMAD_AGENT_STORY_VALUES, AgentMode, AgentStatus, AgentType, Severity

LAST_LINE_CHARS = 300
LAUNCHER = Path(__file__).resolve().parents[1] / "agent_launcher.py"
# The launcher holds its agent to the timeout itself this long after the activity would have: a backstop for an
# agent whose worker was killed hard or stopped and whose dispatch no retry adopts (its deadline passed, another
# host, its sprint cancelled and no worker back within STOP_AGENTS_PATIENCE, workflows/sprint_master.py).
LAUNCHER_BACKSTOP_SECONDS = 60
EXIT_POLL_SECONDS = 0.1  # how soon the launcher's exit is seen
OTHER_HOST_SLACK_SECONDS = 30  # another agent host's clock may run this far from ours
TRANSCRIPT_FILES = ("prompt.md", "command.json", "stdout.log", "stderr.log", "complete.json", "launcher-error.log")


def run_dir_for(project_root: str, dispatch_id: str) -> Path:
    path = session_path(project_root, "agents", safe_name(dispatch_id), "result.json").parent
    path.mkdir(parents=True, exist_ok=True)
    return path


def _verification_file(project_root: str, story_key: str) -> Path:
    return session_path(project_root, "agents", "stories", story_key, "last-verification.txt")


def _executable(profile: ResolvedProfile, env: dict[str, str], cwd: str) -> str:
    exe = profile.argv[0]
    if "/" in exe:
        candidate = exe if os.path.isabs(exe) else os.path.join(cwd, exe)
        found = candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    else:
        found = shutil.which(exe, path=env.get("PATH"))
    if found is None:
        raise config_error(
            f"agent profile {profile.name!r}: command {exe!r} is missing or not executable"
        )
    return found


def _validate(a: TaskAssignment) -> str:
    """Story key, session id and story path are checked before any file or command uses them."""
    try:
        check_ref_part(a.story_key, "story key")
        check_ref_part(a.session_id, "session id")
        return resolve_inside(a.project_root, a.story_path)
    except (ValueError, GitRuleError) as err:
        raise config_error(f"unsafe assignment: {err}") from None


def _sprint_config(a: TaskAssignment) -> SprintConfig:
    try:
        return resolve_config(a.config_overrides)
    except ConfigError:  # the Master validated them; the defaults for anything else
        return resolve_config()


def _timeout(a: TaskAssignment, profile: ResolvedProfile) -> float:
    sprint = _sprint_config(a).agent_timeout_seconds.for_agent(a.agent_type)
    return float(min(sprint, profile.timeout_seconds or sprint))


@dataclass
class AgentRun:
    returncode: int | None
    timed_out: bool
    elapsed: float
    last_line: str


def _last_line(path: Path) -> str:
    """The transcript's last non-empty line (the launcher writes it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 8192))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return next((line.strip()[:LAST_LINE_CHARS] for line in reversed(tail.splitlines()) if line.strip()), "")


def _beat_every(agents: AgentsFile) -> float:
    timeout = activity.info().heartbeat_timeout
    if timeout:
        return min(agents.heartbeat_seconds, max(timeout.total_seconds() / 3, 0.5))
    return agents.heartbeat_seconds


async def _run_process(
    argv: list[str], cwd: str, env: dict[str, str], stdin_file: Path | None, timeout: float,
    run_dir: Path, agents: AgentsFile, dispatch_id: str, record: dict[str, object],
) -> AgentRun:
    beat_every = _beat_every(agents)
    spec = {
        "run_dir": str(run_dir),
        "stdin": str(stdin_file) if stdin_file else None,
        "secret_keys": sorted(k for k in env if is_secret_env_key(k)),  # names only: the values stay in env
        "record": record,
        "deadline_seconds": timeout + LAUNCHER_BACKSTOP_SECONDS,
        "kill_grace_seconds": agents.kill_grace_seconds,
    }
    # subprocess, not asyncio's: an asyncio child watcher (pidfd, the default from Python 3.12) kills a child still
    # running when the worker's event loop closes, and a worker that stops leaves its agent to the next one.
    proc = subprocess.Popen(
        [sys.executable, "-I", str(LAUNCHER), json.dumps(spec), *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # no pipe to the worker: the agent outlives a worker killed hard
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: killed as a whole
    )
    pgid = proc.pid
    started = time.monotonic()
    next_beat = started + beat_every
    timed_out = left_running = False
    try:
        while proc.poll() is None:
            await asyncio.sleep(EXIT_POLL_SECONDS)
            now = time.monotonic()
            if now < next_beat:
                continue
            next_beat = now + beat_every
            elapsed = now - started
            activity.heartbeat(
                heartbeat_detail(env, dispatch_id, proc.pid, elapsed, timeout, _last_line(run_dir / "stdout.log"))
            )
            if elapsed >= timeout:
                timed_out = True
                reaper = asyncio.ensure_future(_reaped(proc))  # a zombie leader would keep its group "alive"
                await kill_group(pgid, agents.kill_grace_seconds, group_mark(pgid, dispatch_id))
                await reaper
                break
    except asyncio.CancelledError:
        left_running = _leave_to_next_worker(pgid, dispatch_id)
        if not left_running:  # TERMINATE (the Slave cancelled): no orphan agent may remain
            _mark_killed(run_dir)
            kill_group_now(pgid, group_mark(pgid, dispatch_id))
        raise
    finally:
        proc.poll()  # reaps a launcher that has ended
        if not left_running and group_alive(pgid):  # the agent exited but left children behind
            # (In its group only: what left it on purpose, a Gradle or Kotlin daemon say, may serve other
            # stories' builds. Killed with the group on a timeout or a cancel.)
            kill_group_now(pgid)
    exited = None if timed_out else _exit_record(run_dir, dispatch_id)
    if exited is not None:  # the launcher's record of the agent's exit
        return exited[0]
    return AgentRun(proc.returncode, timed_out, time.monotonic() - started, _last_line(run_dir / "stdout.log"))


def _read_record(path: Path) -> dict | None:
    """A JSON object this backend or its launcher wrote (pid.json, exit.json, cancelled.json); None when it is
    missing, unreadable or not an object (a torn or foreign file counts as none)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def _reaped(proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        await asyncio.sleep(EXIT_POLL_SECONDS)


def _mark_killed(run_dir: Path) -> None:
    """This worker kills the agent of the dispatch (a cancel, not a stop of the worker): its pid.json says so, for
    a retry on another host, which would otherwise wait for an exit record the killed launcher never writes."""
    data = _read_record(run_dir / "pid.json")
    try:
        if data is not None:
            write_json_atomic(run_dir / "pid.json", {**data, "killed": True})
    except OSError:  # the agent is killed all the same
        pass


def _leave_to_next_worker(pgid: int, dispatch_id: str) -> bool:
    """Cancelled because the worker stops (Ctrl-C, SIGTERM, a deploy), not by the sprint: the agent goes on
    under its launcher, which holds it to its deadline, and the retry on the next worker of this host adopts it
    (killing it would lose the work it has done). A cancel the sprint asked for before the stop still stops it;
    one that comes after the worker's own is left to the cancelled sprint (stop_sprint_agents)."""
    details = activity.cancellation_details()
    if details is None or not details.worker_shutdown:
        return False
    activity.logger.warning(
        "dispatch %s: the worker stops; its agent (process group %s) goes on for the next worker to adopt",
        dispatch_id, pgid,
    )
    return True


def _someone_elses(pid: int) -> bool:
    """A live process `pid` that is not BSO's launcher (a zombie, or no procfs to tell: taken as the launcher)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return bool(cmdline) and str(LAUNCHER).encode() not in cmdline


def _launcher_running(pid: int, run_dir: Path | None = None) -> bool:
    """The launcher `pid` (its group's leader) still runs: alive, not a zombie, and really BSO's launcher; with
    `run_dir`, the launcher of that folder (its argv holds its spec): a record left by a cancelled dispatch (no
    exit.json) may name a group number someone else has since, which without procfs nothing tells."""
    if not group_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no procfs (macOS): the live group is taken as the launcher's, unless a folder must match
        return run_dir is None and not has_procfs()
    ours = run_dir is None or json.dumps(str(run_dir)).encode() in cmdline
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and str(LAUNCHER).encode() in cmdline and ours


def _pid_record(run_dir: Path, dispatch_id: str) -> dict | None:
    """pid.json of an earlier attempt of this dispatch (this workflow run), well formed; None otherwise."""
    data = _read_record(run_dir / "pid.json")
    try:
        if data is None or int(data["pgid"]) <= 0 or float(data["started_at"]) <= 0:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    if data.get("dispatch_id") != dispatch_id or data.get("run_id") != activity.info().workflow_run_id:
        return None
    return data


def _earlier_launch(run_dir: Path, dispatch_id: str) -> dict | None:
    """pid.json of an earlier attempt of this dispatch (this workflow run) whose agent still runs on this host:
    its worker was killed hard or stopped (the dispatch lock tells that no live attempt holds it)."""
    data = _pid_record(run_dir, dispatch_id)
    if data is None or not _on_this_machine(data):
        return None
    return data if _launcher_running(int(data["pgid"])) else None


def _launch_on_another_host(run_dir: Path, dispatch_id: str) -> dict | None:
    """pid.json of an earlier attempt of this dispatch whose agent was started on another host sharing the
    project (its worker stopped or died there) and has no exit record yet: out of reach, its launcher writes
    exit.json when it ends, or stops it at its deadline."""
    data = _pid_record(run_dir, dispatch_id)
    if data is None or _on_this_host(data):
        return None  # this host's (before a reboot, its agent died with it)
    return None if data.get("killed") else data  # killed by its worker there: nothing to wait for


async def _await_other_host(
    launch: dict, run_dir: Path, agents: AgentsFile, env: dict[str, str], dispatch_id: str, timeout: float
) -> None:
    """Wait, heartbeating, for the exit record of the agent another host runs, until its launcher's deadline
    (plus OTHER_HOST_SLACK_SECONDS for the hosts' clocks) is past: an agent run again here meanwhile would work
    beside it in the same worktree. Killed by its worker there, or past the deadline with no record (that host
    died), the agent runs again here."""
    started = float(launch["started_at"])
    # Its launcher stops it at timeout + backstop, taking up to the kill grace, then writes exit.json.
    deadline = started + timeout + LAUNCHER_BACKSTOP_SECONDS + agents.kill_grace_seconds + OTHER_HOST_SLACK_SECONDS
    activity.logger.warning("dispatch %s: the previous attempt's agent runs on %s: waiting for it",
                            dispatch_id, launch.get("machine"))
    beat_every = _beat_every(agents)
    while (
        not (run_dir / "exit.json").exists()
        and not (_pid_record(run_dir, dispatch_id) or {}).get("killed")
        and not _stopped_by_cancel(run_dir, dispatch_id)
        and time.time() < deadline
    ):
        last = _last_line(run_dir / "stdout.log")
        activity.heartbeat(heartbeat_detail(env, dispatch_id, int(launch["pgid"]), time.time() - started, timeout, last))
        await asyncio.sleep(beat_every)


def _on_this_host(pid_record: dict) -> bool:
    """Recorded on this host, in this boot or an earlier one (records from before the field existed count)."""
    machine = pid_record.get("machine")
    return not isinstance(machine, str) or machine.split("/")[0] == machine_id().split("/")[0]


def _on_this_machine(pid_record: dict) -> bool:
    """Recorded on this host since its last boot (records from before the field existed are taken as such):
    elsewhere (a second agent host sharing the project) or before a reboot, the group id names another process."""
    return pid_record.get("machine") in (None, machine_id())


async def _adopt(
    launch: dict, run_dir: Path, agents: AgentsFile, env: dict[str, str], dispatch_id: str, timeout: float
) -> None:
    """Wait for the earlier attempt's agent, heartbeating and holding it to its timeout (counted from its start),
    until the launcher records its exit. On timeout the group is killed and the timeout recorded; cancelled, the
    group is killed (left running when the worker stops). If the launcher dies without a record, the agent runs
    again."""
    pgid = int(launch["pgid"])
    activity.logger.warning("dispatch %s: the previous attempt's agent still runs (process group %s): waiting for it",
                            dispatch_id, pgid)
    beat_every = _beat_every(agents)
    try:
        while _launcher_running(pgid) and not (run_dir / "exit.json").exists():
            elapsed = time.time() - float(launch["started_at"])
            last = _last_line(run_dir / "stdout.log")
            activity.heartbeat(heartbeat_detail(env, dispatch_id, pgid, elapsed, timeout, last))
            if elapsed >= timeout:
                await kill_group(pgid, agents.kill_grace_seconds, group_mark(pgid, dispatch_id))
                keep = ("dispatch_id", "run_id", "attempt", "before", "passing_before")
                write_json_atomic(
                    run_dir / "exit.json",
                    {**{k: launch.get(k) for k in keep}, "returncode": None, "timed_out": True,
                     "elapsed": elapsed, "last_line": last},
                )
                return
            await asyncio.sleep(beat_every)
    except asyncio.CancelledError:
        if not _leave_to_next_worker(pgid, dispatch_id):
            _mark_killed(run_dir)
            kill_group_now(pgid, group_mark(pgid, dispatch_id))
        raise


def _kill_previous_attempt(run_dir: Path) -> None:
    """What an earlier attempt left running and no one waits for (a launcher that died unfinished, or children
    an exited agent left behind): stop it before the retry goes on."""
    data = _read_record(run_dir / "pid.json")
    if data is not None:
        try:
            pgid = int(data["pgid"])
        except (ValueError, KeyError, TypeError):
            return
        if not _on_this_machine(data):
            activity.logger.warning("the previous attempt ran on %s: its process group is not this host's", data.get("machine"))
            return
        if "machine" in data and _someone_elses(pgid):
            # The group's leader runs and is not BSO's launcher: the number was taken by someone else since.
            # (A record of a worker from before the launcher has no machine: its group was led by the agent.)
            activity.logger.warning("process group %s is not the previous attempt's any more: left alone", pgid)
            return
        mark = group_mark(pgid, data.get("dispatch_id"))
        if group_alive(pgid) or marked_pids(mark):  # its launcher, or what an exited launcher's agent left behind
            activity.logger.warning("killing the previous attempt's agent (process group %s)", pgid)
            kill_group_now(pgid, mark)


def _unfinished_launches(project_root: str) -> list[tuple[Path, dict, int]]:
    """The agents of the project, on any agent host sharing it, whose launcher recorded no exit yet: each one's
    run folder, pid.json record and process group."""
    agents = Path(project_root, SESSION_DIR, "agents")
    found = []
    for pid_file in sorted(agents.glob("*/pid.json")) if agents.is_dir() else []:
        if (pid_file.parent / "exit.json").exists() or (data := _read_record(pid_file)) is None:
            continue
        try:
            pgid = int(data["pgid"])
        except (ValueError, KeyError, TypeError):
            continue
        found.append((pid_file.parent, data, pgid))
    return found


def _live_launchers(project_root: str) -> list[tuple[Path, dict, int]]:
    """The launchers of this host still running an agent of the project (no exit.json yet)."""
    return [
        (run_dir, data, pgid) for run_dir, data, pgid in _unfinished_launches(project_root)
        if _on_this_machine(data) and _launcher_running(pgid, run_dir)
    ]


def _kill_other_dispatches(project_root: str, story_key: str, dispatch_id: str) -> None:
    """A live agent of another dispatch of this story (its worker was killed hard, and the story went on: a
    rearm, a sprint run again) would work in the same worktree as the one about to start: it is stopped."""
    for _, data, pgid in _live_launchers(project_root):
        if data.get("story_key") == story_key and data.get("dispatch_id") != dispatch_id:
            activity.logger.warning("killing the agent of dispatch %s of %s, still running (process group %s)",
                                    data.get("dispatch_id"), story_key, pgid)
            kill_group_now(pgid, group_mark(pgid, data.get("dispatch_id")))


@activity.defn
async def stop_sprint_agents(inp: StopAgentsInput) -> list[str]:
    """The sprint was cancelled: the agents of its batches still running are stopped, this host's at once, those
    of other agent hosts sharing the project by their launchers, which check for the request every second. (A cancel
    reaches a running agent through its activity; one whose worker was down when it came, left running by a
    graceful stop or orphaned by a crash, heard nothing and ran on until its launcher's backstop.) The
    dispatches stopped or asked to stop."""
    stopped = []
    for run_dir, data, pgid in _unfinished_launches(inp.project_root):
        if data.get("killed") or not of_sprint(str(data.get("dispatch_id", "")), inp.session_id):
            continue
        here = _on_this_host(data)
        if here and not (_on_this_machine(data) and _launcher_running(pgid, run_dir)):
            continue  # gone with its worker, or before a reboot: nothing runs
        # First the record: an attempt of the dispatch adopting this agent (a worker back up before the cancel
        # reached the Slave) must not take its end for a crash and run it again. It is also the request to the
        # agent's launcher, on whichever host it runs.
        write_json_atomic(run_dir / CANCELLED_FILE, {k: data.get(k) for k in ("dispatch_id", "run_id")})
        if here:
            activity.logger.warning("sprint cancelled: killing the agent of dispatch %s (process group %s)",
                                    data["dispatch_id"], pgid)
            _mark_killed(run_dir)  # a retry waiting on another host stops waiting
            await asyncio.to_thread(kill_group_now, pgid, group_mark(pgid, data["dispatch_id"]))  # it sleeps: the other agents' heartbeats go on
        else:
            activity.logger.warning("sprint cancelled: the agent of dispatch %s runs on %s: its launcher stops it",
                                    data["dispatch_id"], data.get("machine"))
        stopped.append(str(data["dispatch_id"]))
    return stopped


def _stopped_by_cancel(run_dir: Path, dispatch_id: str) -> bool:
    path = run_dir / CANCELLED_FILE
    data = _read_record(path)
    return data is not None and data.get("dispatch_id") == dispatch_id and _this_runs(data, path)


def _sprint_cancelled(dispatch_id: str) -> ApplicationError:
    return ApplicationError(
        f"dispatch {dispatch_id}: the sprint was cancelled and its agent stopped", type="SprintCancelled",
        non_retryable=True,
    )


def _checks_owner(a: TaskAssignment) -> str:
    """Whose checks a record in the worktree is: only this dispatch's retry, here, undoes what they left."""
    return f"{a.dispatch_id} {activity.info().workflow_run_id} {machine_id()}"


STORY_MOVED_FILE = "story-file-moved.json"  # the story file this dispatch moved to the checkout (a retry rolls it back)
STORY_VALUE_FILE = "story-value.json"  # the story's value in the status file before the dispatch's agent ran


def _noted_story_value(run_dir: Path, a: TaskAssignment) -> dict | None:
    """This dispatch's record of the story's value, written in this workflow run; None if there is none."""
    path = run_dir / STORY_VALUE_FILE
    data = _read_record(path)
    return data if data is not None and data.get("dispatch_id") == a.dispatch_id and _this_runs(data, path) else None


async def _note_story_value(run_dir: Path, a: TaskAssignment) -> None:
    """Before the agent runs (its first run in this workflow run: a rerun after a crash keeps the first value)."""
    if _noted_story_value(run_dir, a) is not None:
        return
    value = await asyncio.to_thread(story_value_now, a.project_root, a.status_file, a.story_key)
    write_json_atomic(
        run_dir / STORY_VALUE_FILE, {"dispatch_id": a.dispatch_id, "run_id": activity.info().workflow_run_id, "value": value}
    )


async def _story_value_set_back(run_dir: Path, a: TaskAssignment) -> Finding | None:
    """BMAD's agent workflows set their story's value in sprint-status.yaml themselves (create-story: ready-for-dev),
    where BSO alone writes it: the Slave's next write, expecting the value it left, found another and stopped the
    story (`changed under the Slave`). Such a change made while the agent ran is set back, and said."""
    if (data := _noted_story_value(run_dir, a)) is None:
        return None
    before = data.get("value")
    now = await asyncio.to_thread(story_value_now, a.project_root, a.status_file, a.story_key)
    if not isinstance(before, str) or now is None or now == before or now not in BMAD_AGENT_STORY_VALUES:
        return None
    try:
        if not await asyncio.to_thread(set_back_story_value, a.project_root, a.status_file, a.story_key, now, before):
            return None
    except ApplicationError as err:  # the file is being saved by hand, say: the Slave's own write will tell
        activity.logger.warning("%s: could not set the story's value back to %r: %s", a.story_key, before, err)
        return None
    activity.logger.warning("%s: the %s set its story to %r in the status file; set back to %r",
                            a.story_key, a.agent_type.value, now, before)
    return Finding(
        severity=Severity.LOW,
        summary=f"set the story to {now!r} in the status file, which BSO alone writes: set back to {before!r}",
    )


def _keep_earlier_transcript(run_dir: Path) -> None:
    """The agent runs again: the earlier run's transcript moves to `previous/<n>/`, its process files go."""
    found = [run_dir / name for name in TRANSCRIPT_FILES if (run_dir / name).exists()]
    if found:
        n = 1
        while (run_dir / "previous" / str(n)).exists():
            n += 1
        kept = run_dir / "previous" / str(n)
        kept.mkdir(parents=True)
        for path in found:
            path.rename(kept / path.name)
    for name in ("pid.json", "exit.json"):
        (run_dir / name).unlink(missing_ok=True)


def _story_file_move_noted(run_dir: Path, moved: StoryFileMoved | None) -> StoryFileMoved | None:
    """This dispatch's move of the story file to the checkout, noted in the run folder: a retry (the worker died
    during the checks) finds the file moved already, and its P20 rollback still puts the text before back."""
    noted = run_dir / STORY_MOVED_FILE
    if moved is not None:
        write_json_atomic(noted, {"run_id": activity.info().workflow_run_id, **dataclasses.asdict(moved)})
        return moved
    if (record := _read_record(noted)) is None or not _this_runs(record, noted):
        return None
    return StoryFileMoved(record.get("kept_as"), record.get("written", ""))


def _agent_started_at(run_dir: Path, run: AgentRun) -> float:
    """When the agent of this dispatch started (a Unix time): its exit record is written as it exits."""
    exit_file = run_dir / "exit.json"
    ended = exit_file.stat().st_mtime if exit_file.exists() else time.time()
    return ended - run.elapsed


def _exit_record(run_dir: Path, dispatch_id: str) -> tuple[AgentRun, str | None, int | None] | None:
    """The agent of this dispatch already exited in an earlier attempt (its worker died while it ran, or while
    BSO checked its work): its run, the commit before it, the fix snapshot; None when it must run."""
    path = run_dir / "exit.json"
    if (data := _read_record(path)) is None:
        return None
    try:
        if data["dispatch_id"] != dispatch_id or not _this_runs(data, path):
            return None  # another run of a workflow with the same id (a session id used again): the agent runs
        run = AgentRun(data["returncode"], bool(data["timed_out"]), float(data["elapsed"]), str(data["last_line"]))
        return run, data.get("before"), data.get("passing_before")
    except (ValueError, KeyError, TypeError):
        return None


def _answer_of_a_killed_agent(run_dir: Path, a: TaskAssignment) -> tuple[AgentRun, str | None, int | None] | None:
    """An earlier attempt of this dispatch (this workflow run) started its agent, which wrote its whole answer
    (the result file) and was then killed before it exited, its launcher with it: no exit record, no launcher
    left (the worker killed with all its children: a container stopped, the OOM killer, a power cut; a CLI
    lingers seconds after its answer). Its answer stands: an exit record is written for it (the exit code
    unknown, None; the answer says success or failure itself), and the retry only checks its work, as after any
    exit (_exit_record). None when it must run again: no answer, or one cut short (killed while writing it).
    (The result file is the launch's: each launch deletes pid.json, then the result file, before the launcher
    writes pid.json again.)"""
    data = _pid_record(run_dir, a.dispatch_id)
    if data is None:
        return None
    result_file = run_dir / "result.json"
    if not result_file.exists():
        activity.logger.warning("dispatch %s: the previous attempt's agent died before it answered: it runs again",
                                a.dispatch_id)
        return None
    if not _whole_answer(a, result_file):
        activity.logger.warning("dispatch %s: the previous attempt's agent died leaving a partial or invalid answer "
                                "in %s: it runs again", a.dispatch_id, result_file)
        return None
    keep = ("dispatch_id", "run_id", "attempt", "before", "passing_before")
    write_json_atomic(
        run_dir / "exit.json",
        {**{k: data.get(k) for k in keep}, "returncode": None, "timed_out": False,
         "elapsed": time.time() - float(data["started_at"]), "last_line": _last_line(run_dir / "stdout.log"),
         "killed_after_answer": True},
    )
    activity.logger.warning("dispatch %s: the previous attempt's agent was killed after it wrote its whole answer "
                            "(no exit record, no launcher): its answer is taken, the agent not run again", a.dispatch_id)
    return _exit_record(run_dir, a.dispatch_id)


def _earlier_start(run_dir: Path, dispatch_id: str) -> tuple[str, int | None] | None:
    """An earlier attempt of this dispatch (this workflow run) started its agent, which died unfinished: the
    commit before it and its fix snapshot; None when none did."""
    data = _pid_record(run_dir, dispatch_id)
    if data is None or not isinstance(data.get("before"), str):
        return None
    passing = data.get("passing_before")
    return data["before"], passing if isinstance(passing, int) else None


# Linux's bound on one argument of a command (MAX_ARG_STRLEN, 32 pages): a longer prompt given as an argument
# failed the agent's start with "Argument list too long", retried five times.
MAX_ARGUMENT_BYTES = 128 * 1024

PO_ANSWER_FILES = ("validation_failed.json", "po-error.json")  # activities/po_command.py copies of the answer


def _redact_file(path: Path, env: dict[str, str]) -> None:
    """A file the agent wrote with the secret values of `env` redacted (redact_text), rewritten only if it held
    one. Read in blocks, its size unbounded (one of hundreds of MB was held whole, and copied)."""
    forms = env_secret_forms(env)
    if not forms or not path.is_file():
        return
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    redactor = StreamRedactor(forms)
    redacting = path.with_name(f".{path.name}.redacting")
    try:
        with open(path, "rb") as src, open(redacting, "w", encoding="utf-8", newline="") as out:
            while block := src.read(_BLOCK_BYTES):
                out.write(redactor.feed(decode(block)))
            out.write(redactor.feed(decode(b"", final=True)) + redactor.finish())
        if redactor.redacted:
            os.replace(redacting, path)
    finally:
        redacting.unlink(missing_ok=True)  # (a disk full midway: no half copy left beside the answer)


CHECKING_PHASE = "checking"  # BSO checks the agent's work: Exit Gate, scope guard, verification
PREPARING_PHASE = "preparing"  # BSO creates the story's worktree (under the repository lock) before the agent
FIX_SNAPSHOT_PHASE = "fix-snapshot"  # P20: BSO counts the passing tests before a fix agent starts


def _beating(a: TaskAssignment, phase: str, doing: str, every: float) -> AbstractAsyncContextManager[None]:
    """Heartbeat (a PROGRESS_UPDATE) while BSO runs the project's checks itself: they can take minutes, longer
    than the heartbeat timeout, and the server would time out and retry the attempt."""
    return heartbeating(
        lambda: progress_update(
            agent_id=a.agent_type.value, task_id=a.story_key, at=datetime.now(UTC), percent=99,
            current_activity=doing, dispatch_id=a.dispatch_id, phase=phase,
        ),
        every,
    )


def _this_runs(record: dict, path: Path) -> bool:
    """Was this record (exit.json, the marker) written by this workflow run? (bso.dispatch.written_by_this_run)"""
    info = activity.info()
    return written_by_this_run(
        record.get("run_id"), info.workflow_run_id, written_at=file_written_at(path),
        first_scheduled_at=info.scheduled_time,
    )


async def _marker_path(wt: Worktree | None, run_dir: Path, dispatch_id: str) -> Path:
    if wt is None:
        return run_dir / "marker.json"
    path = Path(await git_dir(wt.path), "bso-dispatches", f"{safe_name(dispatch_id)}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


async def _recorded(marker: Path, wt: Worktree | None) -> AgentComplete | None:
    if not marker.exists():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        if not _this_runs(data, marker):
            return None  # another run of a workflow with the same id: its answer is not this dispatch's
        if wt is not None and data.get("commit") != await head(wt.path):
            return None  # the worktree moved on (reset by hand): run again
        return AgentComplete.model_validate(data["complete"])
    except (ValueError, KeyError, ValidationError):
        return None


def _given_prompt(run_dir: Path) -> str:
    """The prompt the agent was given (prompt.md; written before it ran)."""
    try:
        return (run_dir / "prompt.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# An output up to this size is read whole, and tried as one JSON document first (Gemini pretty-prints its own);
# a longer one is read line by line, only its end held: hundreds of MB were held whole, then copied to hash them.
WHOLE_OUTPUT_BYTES = 8 * 1024 * 1024
# Past WHOLE_OUTPUT_BYTES, a line up to this size is parsed; a longer one is hashed and passed over, never held
# whole (one of hundreds of MB with no newline was held, and parsed). The events BSO reads (token counts, an error,
# the answer) are short: a line that long is a tool's output relayed (Codex's aggregated_output of a `cat`), or
# an answer text as long as an output read whole (Claude's `result`), still read up to twice that. Past it, what
# the line holds is lost: the answer is the result file's then, or one in plain text at the output's end (the tail).
MAX_LINE_BYTES = 2 * WHOLE_OUTPUT_BYTES
_BLOCK_BYTES = 64 * 1024  # how much of a long output is read at a time


def _bounded_lines(fh: BinaryIO, digest: hashlib._Hash, too_long: list[int]) -> Iterator[str]:
    """The lines of `fh` (each ending at `\n` or `\r`, as line_documents reads them), decoded, every byte hashed
    into `digest`; a line past MAX_LINE_BYTES is not held, only counted in `too_long`."""
    held: list[bytes] = []
    length = 0  # of the line so far, held or not
    while block := fh.read(_BLOCK_BYTES):
        digest.update(block)
        for piece in block.splitlines(keepends=True):  # (bytes split at \n, \r, \r\n only: never inside UTF-8)
            length += len(piece)
            if length <= MAX_LINE_BYTES:
                held.append(piece)
            else:
                held.clear()
            if piece.endswith((b"\n", b"\r")):
                if length <= MAX_LINE_BYTES:
                    yield b"".join(held).decode("utf-8", errors="replace")
                else:
                    too_long[0] += 1
                held.clear()
                length = 0
    if length > MAX_LINE_BYTES:
        too_long[0] += 1
    elif held:
        yield b"".join(held).decode("utf-8", errors="replace")


def _read_output(run_dir: Path, env: dict[str, str] | None = None) -> tuple[CliOutput, str]:
    """What the CLI's output (stdout.log) says (bso.agent_output; the prompt's own example is no answer) and its
    sha256, in one reading. CPU-bound (100 MB took 27 s): run in a thread, where the worker's heartbeats and its
    other activities do not wait for it."""
    # The launcher redacts stdout.log (the secret values of `env`), never prompt.md: an echo of an example that
    # holds a secret's value (a story key 3-1-postgres-schema) is the redacted example.
    examples = prompt_examples(redact_text(_given_prompt(run_dir), env or {}))
    digest = hashlib.sha256()
    try:
        with open(run_dir / "stdout.log", "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= WHOLE_OUTPUT_BYTES:
                data = fh.read()
                digest.update(data)
                return cli_output(data.decode("utf-8", errors="replace"), examples), digest.hexdigest()
            fh.seek(max(0, size - 4 * TEXT_TAIL_CHARS))  # (UTF-8 takes at most 4 bytes a character)
            tail = fh.read().decode("utf-8", errors="replace").strip()[-TEXT_TAIL_CHARS:]
            fh.seek(0)
            too_long = [0]
            output = read_cli_output(line_documents(_bounded_lines(fh, digest, too_long)), tail, examples)
            # One pretty-printed document (Gemini's) is read whole, held whole: only when no line was too long to
            # hold (a document holds its lines) nor the whole (no more is held than a line), and the output starts
            # and ends as one does (a long plain-text log that ends with an answer's `}` was read whole in vain).
            fh.seek(0)
            if (
                not output.documents and not too_long[0] and size <= MAX_LINE_BYTES and tail.endswith(("}", "]"))
                and fh.read(4096).lstrip()[:1] in (b"{", b"[")
            ):
                fh.seek(0)
                try:
                    whole = json.loads(fh.read().decode("utf-8", errors="replace"))
                except (ValueError, RecursionError):
                    pass
                else:
                    output = read_cli_output([whole], tail, examples)
            return output, digest.hexdigest()
    except FileNotFoundError:
        return CliOutput(), digest.hexdigest()


def _answer_base(a: TaskAssignment) -> dict[str, str]:
    return {
        "dispatch_id": a.dispatch_id,
        "story_key": a.story_key,
        "agent_type": a.agent_type.value,
        "mode": a.mode.value,
    }


def _validated_answer(a: TaskAssignment, raw: dict) -> AgentComplete:
    """The agent's answer (its result file's, or its output's) as an AGENT_COMPLETE of this dispatch: it cannot
    re-address it. Raises ValidationError."""
    return AgentComplete.model_validate({**lenient_answer(raw), **_answer_base(a)})


def _whole_answer(a: TaskAssignment, result_file: Path) -> bool:
    """The result file holds an answer the agent finished writing, one _answer takes as such (a PO phase's message,
    or a valid AGENT_COMPLETE): not one cut short by a kill in the middle of its write, nor none."""
    try:
        raw = read_result_file(result_file)
    except UnreadableResultFile:
        return False
    if not isinstance(raw, dict):
        return False
    if po_command.po_phase(a) is not None and is_po_answer(raw):
        return True
    try:
        _validated_answer(a, raw)
    except ValidationError:
        return False
    return True


def _agent_answer(
    a: TaskAssignment, result_file: Path, output: CliOutput, run: AgentRun, timeout: float
) -> AgentComplete:
    base = _answer_base(a)
    if run.timed_out:
        error = f"agent timed out after {int(timeout)}s; process group killed"
        if run.elapsed >= timeout + LAUNCHER_BACKSTOP_SECONDS:  # its worker gone, the launcher's backstop did it
            error += f" by its launcher {int(run.elapsed)}s after it started (no worker watched it then)"
        return AgentComplete(**base, status=AgentStatus.FAILURE, error=error)
    raw = None
    if result_file.exists():
        try:
            raw = read_result_file(result_file)
        except UnreadableResultFile as err:
            return AgentComplete(**base, status=AgentStatus.FAILURE, error=f"BSO_RESULT_FILE {err}")
    if raw is None:
        raw = output.complete
    if not isinstance(raw, dict):
        # A crash says why on stderr, most often (its transcript beside the result file, redacted as it was written).
        said = _last_line(result_file.parent / "stderr.log") if run.returncode else ""
        why = output.cli_error or (
            "no AGENT_COMPLETE of the agent's own: its output only repeats the example answer of its prompt"
            if output.echoed_prompt else "no AGENT_COMPLETE"
        ) + f" (exit code {run.returncode}; last output: {run.last_line!r}" + (
            f"; last error output: {said!r})" if said else ")"
        )
        return AgentComplete(**base, status=AgentStatus.FAILURE, error=why[:1500])
    try:
        complete = _validated_answer(a, raw)
    except ValidationError as err:
        return AgentComplete(**base, status=AgentStatus.FAILURE, error=f"invalid AGENT_COMPLETE: {describe_validation_error(err)}"[:1500])
    # An exit code None, not timed out: the agent was killed after its whole answer (_answer_of_a_killed_agent),
    # its exit unknown. Its answer says success or failure itself.
    if run.returncode not in (0, None) and complete.status is AgentStatus.SUCCESS:
        return complete.model_copy(
            update={"status": AgentStatus.FAILURE, "error": f"agent claimed success but exited with code {run.returncode}"}
        )
    return complete


def _answer(
    a: TaskAssignment, result_file: Path, run_dir: Path, output: CliOutput, run: AgentRun, timeout: float,
    env: dict[str, str],
) -> AgentComplete:
    """The agent's answer (its result file's, else its output's), and the files that hold it redacted. Reads and
    writes files the agent wrote, of any size: run in a thread, as _read_output."""
    complete = po_command.read_answer(a, result_file, run_dir, run.timed_out) or _agent_answer(
        a, result_file, output, run, timeout
    )
    for written in (result_file, *(run_dir / name for name in PO_ANSWER_FILES)):  # the agent's words: no secret
        _redact_file(written, env)
    return complete


async def run(a: TaskAssignment) -> AgentComplete:
    story_file = _validate(a)
    root = a.project_root
    agents = load_agents_file(root)
    try:
        profile = resolve_profile(agents, a.agent_type, a.mode)
    except AgentProfileError as err:
        raise config_error(str(err)) from None
    env = {**os.environ, **profile.env}
    _executable(profile, env, root)
    run_dir = run_dir_for(root, a.dispatch_id)
    wt = None
    if profile.workdir == "worktree":  # `git worktree add` of a large repository, behind other stories' git work
        async with _beating(a, PREPARING_PHASE, "BSO preparing the story's worktree", _beat_every(agents)):
            wt = await ensure_worktree(root, a.session_id, a.story_key)
    workdir = wt.path if wt else root
    marker = await _marker_path(wt, run_dir, a.dispatch_id)
    recorded = await _recorded(marker, wt)
    if recorded is not None:
        activity.logger.info("dispatch %s already finished: recorded answer reported", a.dispatch_id)
        return recorded
    timeout = _timeout(a, profile)
    exited = _exit_record(run_dir, a.dispatch_id)
    beat_env = {**env, "BSO_AGENT_TYPE": a.agent_type.value, "BSO_STORY_KEY": a.story_key, **po_command.env(a)}
    if exited is None and (launch := _earlier_launch(run_dir, a.dispatch_id)) is not None:
        await _adopt(launch, run_dir, agents, beat_env, a.dispatch_id, timeout)
        exited = _exit_record(run_dir, a.dispatch_id)
    elif exited is None and (elsewhere := _launch_on_another_host(run_dir, a.dispatch_id)) is not None:
        await _await_other_host(elsewhere, run_dir, agents, beat_env, a.dispatch_id, timeout)
        exited = _exit_record(run_dir, a.dispatch_id)
    _kill_previous_attempt(run_dir)
    found_before: list[Finding] = []  # what BSO set right in the worktree before the agent
    for lock in await remove_stale_locks(wt, root) if wt is not None else []:
        ref_lock = f"refs/heads/{wt.branch}.lock"  # (a ref's name has no glob characters: git refuses them)
        what = f"story branch's lock {ref_lock}" if lock.match(ref_lock) else f"worktree's {lock.name}"
        found_before.append(Finding(
            severity=Severity.LOW, file=os.path.relpath(lock, root),
            summary=f"a git killed in the middle of its work (an earlier attempt's, or the agent's) left the "
                    f"{what}, which no process held: removed",
        ))
    checks_owner = _checks_owner(a)
    if wt is not None and await undo_interrupted_checks(wt.path, checks_owner):
        activity.logger.warning("dispatch %s: BSO's checks were cut short in %s; what they left is undone",
                                a.dispatch_id, wt.path)
    if exited is None and _stopped_by_cancel(run_dir, a.dispatch_id):
        raise _sprint_cancelled(a.dispatch_id)
    if exited is None:  # its launcher gone without an exit record: did the agent answer before it was killed?
        exited = _answer_of_a_killed_agent(run_dir, a)
    started = None
    if exited is None:
        _kill_other_dispatches(root, a.story_key, a.dispatch_id)
        started = _earlier_start(run_dir, a.dispatch_id)
        _keep_earlier_transcript(run_dir)
        await _note_story_value(run_dir, a)
        # An attempt killed mid-run (a worker stopped or crashed with its agent) may have committed: the diff
        # and the P20 rollback count from where the dispatch began, not from that commit.
        before = started[0] if started else (await head(wt.path) if wt else None)
    else:  # the agent finished in an earlier attempt: check its work, never run it again
        activity.logger.info("dispatch %s: agent already exited; checking its work again", a.dispatch_id)
        before = exited[1]
    po_base = None  # Agent-PO completion phases: the NEXT gate's changed files are the diff since this
    if wt and before and po_command.is_completion(a):
        po_base = await po_command.remember_diff_base(wt.path, a, before)
    passing_before: int | None = exited[2] if exited else (started[1] if started else None)
    checks = agents.verification
    if exited is None and passing_before is None and wt is not None and a.mode is AgentMode.FIX and checks.commands and checks.fix_snapshot:
        # P20: the fix snapshot: how many tests pass before the fix.
        async with _beating(a, FIX_SNAPSHOT_PHASE, "BSO counting the passing tests before the fix", _beat_every(agents)):
            snapshot = await verify(wt.path, checks, {**os.environ, **profile.env}, checks_owner)
        passing_before = count_passed(snapshot.output, checks.passed_pattern)

    # Bytes that are not UTF-8 (a cp1252 editor) failed every attempt; the scope lines are ASCII either way.
    story_text = Path(story_file).read_text(encoding="utf-8", errors="replace") if Path(story_file).is_file() else ""
    scope = parse_file_scope(story_text)
    verification_file = _verification_file(root, a.story_key)
    result_file = run_dir / "result.json"
    if exited is None:
        result_file.unlink(missing_ok=True)
    ctx = PromptContext(
        assignment=a,
        story_file=story_file,
        workdir=workdir,
        result_file=str(result_file),
        acceptance_criteria=parse_acceptance_criteria(story_text),
        file_scope=scope,
        branch=wt.branch if wt else "",
        base_commit=wt.base if wt else "",
        verification_output=verification_file.read_text(encoding="utf-8")
        if a.mode is AgentMode.FIX and verification_file.exists()
        else "",
        approval_score=_sprint_config(a).approval_score,
    )
    template, common = load_templates(root, a.agent_type)
    po_section = po_command.prompt_section(root, a, str(result_file))  # Agent-PO phase, if any
    # Not redacted: the agent has the env anyway, and a secret's value that is also an everyday word (a
    # password "postgres") would garble the story's paths and text the agent is given.
    prompt = render_prompt(template, common, ctx) + po_section
    prompt_file = run_dir / "prompt.md"
    if exited is None:
        prompt_file.write_text(prompt, encoding="utf-8")
    bso_env = {
        "BSO_RESULT_FILE": str(result_file),
        "BSO_DISPATCH_ID": a.dispatch_id,
        "BSO_STORY_KEY": a.story_key,
        "BSO_STORY_FILE": story_file,
        "BSO_AGENT_TYPE": a.agent_type.value,
        "BSO_MODE": a.mode.value,
        "BSO_MODE_ROUND": str(a.mode_round),  # which round of this mode for the story (review 2, fix 1, ...)
        "BSO_WORKDIR": workdir,
        "BSO_PROMPT_FILE": str(prompt_file),
        "BSO_PROJECT_ROOT": root,
        **po_command.env(a),
    }
    env.update(bso_env)
    argv = render_argv(
        profile.argv,
        {
            "prompt": prompt,
            "prompt_file": str(prompt_file),
            "session_id": dispatch_session_id(a.dispatch_id),  # P30: fresh for every dispatch
            "workdir": workdir,
            "result_file": str(result_file),
        },
    )
    if (longest := max((len(arg.encode()) for arg in argv), default=0)) >= MAX_ARGUMENT_BYTES:
        raise config_error(
            f"profile {profile.name!r}: one argument of the command is {longest} bytes (the prompt, with "
            f"prompt_via = \"arg\"), over the {MAX_ARGUMENT_BYTES} one command-line argument can carry: set "
            'prompt_via = "file" (with {prompt_file} in argv) or "stdin" in the profile'
        )
    write_json_atomic(
        run_dir / "command.json",
        {
            "profile": profile.name,
            "argv": [x if x != prompt else "<prompt: prompt.md>" for x in argv],
            "prompt_via": profile.prompt_via,
            "cwd": workdir,
            "env": redact_env({**profile.env, **bso_env}),
            "timeout_seconds": timeout,
            "attempt": activity.info().attempt,
        },
    )
    if exited is None:
        record = {
            "dispatch_id": a.dispatch_id, "run_id": activity.info().workflow_run_id,
            "attempt": activity.info().attempt, "before": before, "passing_before": passing_before,
            "machine": machine_id(), "story_key": a.story_key,
        }
        run = await _run_process(
            argv, workdir, env, prompt_file if profile.prompt_via == "stdin" else None,
            timeout, run_dir, agents, a.dispatch_id, record,
        )
        if _stopped_by_cancel(run_dir, a.dispatch_id):  # by its launcher, asked from another agent host
            raise _sprint_cancelled(a.dispatch_id)
        write_json_atomic(  # the launcher's record, or the timeout's (it killed the launcher)
            run_dir / "exit.json",
            {
                **record, "returncode": run.returncode, "timed_out": run.timed_out, "elapsed": run.elapsed,
                "last_line": run.last_line,
            },
        )
    else:
        run = exited[0]
    async with _beating(a, CHECKING_PHASE, "BSO checking the agent's work", _beat_every(agents)):
        return await _checked(
            a, profile, agents, env, wt, root, run_dir, marker, result_file, run, timeout, before,
            passing_before, scope, verification_file, po_base, found_before,
        )


async def _checked(
    a: TaskAssignment, profile: ResolvedProfile, agents: AgentsFile, env: dict[str, str], wt: Worktree | None,
    root: str, run_dir: Path, marker: Path, result_file: Path, run: AgentRun, timeout: float,
    before: str | None, passing_before: int | None, scope: list[str], verification_file: Path,
    po_base: str | None, found_before: list[Finding],
) -> AgentComplete:
    """After the agent: its answer, the Git Exit Gate, the scope guard, BSO's own verification, the marker."""
    checks = agents.verification
    output, digest = await asyncio.to_thread(_read_output, run_dir, env)  # off the event loop: it may take seconds
    complete = await asyncio.to_thread(_answer, a, result_file, run_dir, output, run, timeout, env)  # as the output
    cli_tokens = output.tokens.weighted(agents.tokens.cache_read_weight, agents.tokens.cache_write_weight)
    findings = [*complete.findings, *found_before]
    if (set_back := await _story_value_set_back(run_dir, a)) is not None:
        findings.append(set_back)
    failure: str | None = None
    failure_type: str | None = None

    if (
        a.agent_type is AgentType.STORY_CREATOR and complete.status is AgentStatus.SUCCESS
        and not Path(_validate(a)).is_file()
    ):  # it wrote the story elsewhere (BMAD's own story folder, say): the review would pass a story with no doc
        failure = (
            f"the story-creator answered success but no story file is at {a.story_path} "
            "(BSO_STORY_FILE: the story must be written there)"
        )
    astray = None
    if wt is not None and a.agent_type is AgentType.DEV_RUNNER and not po_command.is_plan(a):
        astray = await back_on_story_branch(wt)  # before the gate commits anything, on the branch the merge reads
    if astray is not None:
        failure = astray
    elif wt is not None and a.agent_type is AgentType.DEV_RUNNER and before is not None and not po_command.is_plan(a):
        gate = await exit_gate(
            wt.path, agents.git, since=before, agent_type=a.agent_type.value, story_key=a.story_key,
            dispatch_id=a.dispatch_id,
        )
        if again := gate.tracked_again:
            names = ", ".join(again[:10]) + (f" and {len(again) - 10} more" if len(again) > 10 else "")
            summary = (f"untracked {len(again)} file(s) with `git rm --cached` without ignoring them ({names}): "
                       "tracked again, as `git add` would (list them in .gitignore to take them out)")
            findings.append(Finding(severity=Severity.LOW, file=again[0], summary=summary[:MAX_SUMMARY_CHARS]))
        status_files = status_file_in_project(root, a.status_file)
        if status_files and await undo_status_file_change(
            wt, status_files, agent_type=a.agent_type.value, dispatch_id=a.dispatch_id
        ):
            findings.append(Finding(
                severity=Severity.LOW, summary="changed the status file, which BSO alone writes: the change was undone",
                file=status_files[0],
            ))
        story_path = Path(a.story_path).as_posix()
        moved = await move_story_file_out(
            wt, story_path, _validate(a), agent_type=a.agent_type.value, dispatch_id=a.dispatch_id
        )
        moved = _story_file_move_noted(run_dir, moved)
        if moved is not None:
            kept = f" (its text before: `git show {moved.kept_as}:{story_path}`)" if moved.kept_as else ""
            findings.append(Finding(
                severity=Severity.LOW, file=a.story_path,
                summary="wrote the story file in its worktree, where the project does not track it: moved to the "
                        f"project's checkout{kept}",
            ))
        changed = await committed_paths(wt.path, po_base or before)  # PO fix attempts: since the first
        for path in out_of_scope(changed, scope):  # P19
            findings.append(Finding(severity=Severity.MEDIUM, summary="changed outside the story's file scope", file=path))
        if gate.refused:  # P21
            failure = f"secret-looking files refused by the Git Exit Gate: {', '.join(sorted(gate.refused))}"
        elif gate.repositories:
            failure = (
                f"the agent left git repositories of their own in the worktree ({', '.join(sorted(gate.repositories)[:10])}), "
                "which BSO does not commit: one would be a gitlink without its files, lost with the worktree "
                "(remove its .git folder to commit the files, or list it in .gitignore)"
            )
        elif complete.status is AgentStatus.SUCCESS and a.mode is AgentMode.DEV and not changed and not (
            before != wt.base and await unmerged_commits(wt.path, root)
        ):  # a rearmed story's branch may hold its work, not merged yet: a dev run that finds it done changes nothing
            failure = "dev dispatch produced no changes (empty diff)"
            bsos_own = [*status_file_in_project(root, a.status_file), f"{SESSION_DIR}/",
                        f"{Path(os.path.relpath(_validate(a), root)).parent.as_posix()}/"]  # story files
            if (elsewhere := await checkout_work_since(root, _agent_started_at(run_dir, run), bsos_own)) is not None:
                failure += f"; {elsewhere}"
        elif agents.verification.commands and (
            complete.status is AgentStatus.SUCCESS or (passing_before is not None and changed)
        ):  # a success is verified; a failed fix that committed something is still held to P20
            checked = await verify(wt.path, agents.verification, env, _checks_owner(a))
            if complete.status is AgentStatus.SUCCESS and checked.ok:
                verification_file.unlink(missing_ok=True)
            elif complete.status is AgentStatus.SUCCESS:
                verification_file.write_text(redact_text(checked.output, env), encoding="utf-8")
                failure = "verification failed whatever the agent claimed: " + redact_text(checked.output, env)[-600:]
                failure_type = VERIFICATION_FAILED
            passing_after = count_passed(checked.output, checks.passed_pattern)
            if passing_before is not None and (passing_after or 0) < passing_before:
                await git(wt.path, "reset", "-q", "--hard", before)  # P20: roll the fix back
                # The story text the agent wrote tells of the work just rolled back: the text before goes back.
                story_back = moved is not None and await put_story_text_back(wt, story_path, _validate(a), moved)
                failure = (
                    f"fix snapshot (P20): passing tests fell from {passing_before} to {passing_after or 0}; "
                    f"the fix was rolled back to {before[:12]}"
                    + (", the story file's text to its text before the fix" if story_back else "") + ". "
                    + (failure or complete.error or "")
                )
                failure_type = VERIFICATION_FAILED

    elif wt is not None and before is not None and (a.agent_type is not AgentType.DEV_RUNNER or po_command.is_plan(a)):
        # A reviewer (or a plan) changes nothing: what it left is set aside (kept, out of the way) and said.
        for said in await set_aside_what_a_reader_left(wt, before, a.dispatch_id):
            findings.append(Finding(severity=Severity.LOW, summary=f"{a.agent_type.value} {said}"))

    if po_base is not None and wt is not None and failure is None:  # the NEXT gate sees the real diff
        complete = complete.model_copy(update={"findings": findings})
        complete = await po_command.with_real_changes(complete, wt.path, po_base, run_dir)
        findings = list(complete.findings)
    tokens = cli_tokens or complete.tokens_used
    if tokens > MAX_TOKENS_PER_ANSWER:  # a garbled count: the Slave would refuse the answer and wait out its time
        findings.insert(  # first: the answer keeps its first MAX_FINDINGS findings only
            0, Finding(severity=Severity.LOW, summary=f"the agent reported {tokens} tokens, more than any run uses: not counted")
        )
        tokens = 0
    transcript = os.path.relpath(run_dir / "stdout.log", root)
    summary = f"{complete.summary[:400]} [{profile.name}; {int(run.elapsed)}s; transcript {transcript} sha256:{digest[:16]}]"
    update: dict[str, object] = {
        "summary": summary.strip()[:1900],
        "findings": findings[:MAX_FINDINGS],
        "tokens_used": tokens,
    }
    if failure is not None:
        update.update(status=AgentStatus.FAILURE, error=failure[:1900], error_type=failure_type)
    # Whatever the agent or the checks wrote (summary, error, findings, feedback) goes into history: no secret.
    answer = complete.model_copy(update=update).model_dump(mode="json")
    identity = {k: answer[k] for k in ("msg_type", "dispatch_id", "story_key", "agent_type", "mode", "status")}
    complete = AgentComplete.model_validate({**redact_values(answer, env), **identity})  # the texts, not the ids
    write_json_atomic(run_dir / "complete.json", complete.model_dump(mode="json"))
    write_json_atomic(
        marker,
        {
            "dispatch_id": a.dispatch_id,
            "run_id": activity.info().workflow_run_id,
            "commit": await head(wt.path) if wt else None,
            "complete": complete.model_dump(mode="json"),
        },
    )
    return complete
